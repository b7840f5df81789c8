package store_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/master"
)

// rosterRestart puts old under key k, offloads it to a tier node's disk,
// waits for a node without a tier to hear the pool's roster, then takes
// the tier node away and restarts the master without HA. It returns the
// new master, the pure client, the tier's directory and id.
func rosterRestart(t *testing.T, cfg master.Config, old []byte) (*cluster, *store.Client, string, string, *store.Client) {
	t.Helper()
	c := startMaster(t, cfg)
	dir := t.TempDir()
	node, tn := c.tierNode(16<<20, dir, 64<<20)
	cl := c.client(0)
	offloadAll(t, c, cl, map[string][]byte{"k": old})
	d := c.client(16 << 20) // no tier: it keeps the roster for the next master
	id := tn.Tier().ID()
	waitFor(t, "the node without a tier to hear the roster", 10*time.Second, func() bool { return slices.Contains(store.TierRoster(d), id) })
	tn.Close()
	node.Close(context.Background())
	addr := c.addr
	c.stop()
	c2 := startMasterOn(t, addr, cfg)
	waitFor(t, "the node to re-mount on the new master and name the tier", 10*time.Second, func() bool {
		_, ids, _ := c2.m.Roster(0)
		return slices.Contains(ids, id) && c2.m.Stats().Segments > 0
	})
	return c2, cl, dir, id, d
}

// TestTierSettleAfterRestart: a master restarted without HA acknowledged
// puts before a disk tier that the pool had came back; the tier held a
// record of a put key, and when this master died as well the next one
// re-added that record: a get after an acknowledged upsert returned the
// version before it (the soak: three master kills within 4 s, 5 stale
// gets). Nodes now name the pool's tiers when they re-mount, and the
// master holds puts until those tiers have attached and dropped their
// stale records.
func TestTierSettleAfterRestart(t *testing.T) {
	cfg := master.Config{KVLeaseTTL: 100 * time.Millisecond, TierSettle: 30 * time.Second}
	old := value(100_000, 1)
	c2, cl, dir, _, _ := rosterRestart(t, cfg, old)
	ctx := context.Background()
	done := make(chan error, 1)
	go func() { done <- cl.Upsert(ctx, "k", value(100_000, 2)) }()
	select {
	case err := <-done:
		t.Fatalf("upsert answered (%v) while the tier holding the key's old record is away", err)
	case <-time.After(1500 * time.Millisecond):
	}
	_, tn2 := c2.tierNode(16<<20, dir, 64<<20)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("upsert once the tier attached: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("upsert still waits after the tier attached")
	}
	if _, ok := tn2.Tier().Lookup("k"); ok {
		t.Fatal("upsert acknowledged before the tier dropped the old record")
	}
	// The master dies too: the next one must not bring the old bytes back.
	addr := c2.addr
	c2.stop()
	c3 := startMasterOn(t, addr, cfg)
	waitFor(t, "the tier to attach to the third master", 20*time.Second, func() bool {
		ts := c3.m.Tiers()
		return len(ts) == 1 && ts[0].Online
	})
	waitFor(t, "the client to reach the third master", 10*time.Second, func() bool {
		_, err := cl.Exist(ctx, "k")
		return err == nil
	})
	if got, err := cl.Get(ctx, "k"); err == nil && bytes.Equal(got, old) {
		t.Fatal("get after an acknowledged upsert returned the version before it")
	}
}

// TestTierSettleBound: a tier that does not come back holds puts for
// TierSettle at most; it is then fenced and not waited for again.
func TestTierSettleBound(t *testing.T) {
	cfg := master.Config{KVLeaseTTL: 100 * time.Millisecond, TierSettle: 2 * time.Second}
	c2, cl, _, id, _ := rosterRestart(t, cfg, value(50_000, 1))
	ctx := context.Background()
	start := time.Now()
	if err := cl.Put(ctx, "other", value(50_000, 3)); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if took < 500*time.Millisecond || took > 10*time.Second {
		t.Fatalf("a put with a named tier away took %s, want it held up to the 2 s bound", took)
	}
	if _, ids, fenced := c2.m.Roster(0); slices.Contains(ids, id) || !hasFence(fenced, id) {
		t.Fatalf("tier %s: roster %v, fenced %v after the bound, want it fenced", id, ids, fenced)
	}
	start = time.Now()
	if err := cl.Put(ctx, "another", value(50_000, 4)); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("a put after the bound took %s", took)
	}
	if n := gauge(t, c2.m, "mc_store_tier_settle_timeouts_total"); n != 1 {
		t.Fatal("the bound's expiry is not counted in mc_store_tier_settle_timeouts_total")
	}
}

// TestTierSettleKeptRoster: a tier node restarted together with its
// master (`mc serve store`, one process) has no roster in memory; its
// tier directory keeps the last one, and its hello names the pool's
// other tiers to the new master.
func TestTierSettleKeptRoster(t *testing.T) {
	cfg := master.Config{KVLeaseTTL: 100 * time.Millisecond, TierSettle: 30 * time.Second}
	c := startMaster(t, cfg)
	dir1, dir2 := t.TempDir(), t.TempDir()
	n1, t1 := c.tierNode(16<<20, dir1, 64<<20)
	n2, t2 := c.tierNode(16<<20, dir2, 64<<20)
	waitFor(t, "the first tier's directory to keep the roster", 10*time.Second, func() bool {
		ids, _ := t1.Tier().Roster()
		return slices.Contains(ids, t2.Tier().ID())
	})
	id2 := t2.Tier().ID()
	for _, tn := range []*store.TierNode{t1, t2} {
		tn.Close()
	}
	n1.Close(context.Background())
	n2.Close(context.Background())
	addr := c.addr
	c.stop()
	c2 := startMasterOn(t, addr, cfg)
	c2.tierNode(16<<20, dir1, 64<<20)
	waitFor(t, "the restarted tier node to name the other tier", 10*time.Second, func() bool {
		_, ids, _ := c2.m.Roster(0)
		return slices.Contains(ids, id2)
	})
	cl := c2.client(0)
	done := make(chan error, 1)
	go func() { done <- cl.Put(context.Background(), "k", value(10_000, 1)) }()
	select {
	case err := <-done:
		t.Fatalf("put answered (%v) while a tier the pool had is away", err)
	case <-time.After(time.Second):
	}
	c2.tierNode(16<<20, dir2, 64<<20)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("put still waits after the tier attached")
	}
}

// TestTierFencedAfterSettle: a tier not back within the settle bound is
// fenced. The master after the next restart hears so from the nodes
// and drops that tier's old records when it attaches: the master that
// gave up on it acknowledged puts meanwhile, and without HA nothing
// else remembers them. Before, the tier only left the roster, and its
// record of an upserted key came back after the second restart.
func TestTierFencedAfterSettle(t *testing.T) {
	cfg := master.Config{KVLeaseTTL: 100 * time.Millisecond, TierSettle: time.Second}
	old := value(100_000, 1)
	c2, cl, dir, id, d := rosterRestart(t, cfg, old)
	ctx := context.Background()
	if err := cl.Upsert(ctx, "k", value(100_000, 2)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the client to hear the tier is fenced", 10*time.Second, func() bool { return hasFence(store.FencedTiers(cl), id) })
	// The node goes too: only the client tells the next master of the
	// fence, before the tier attaches.
	d.Close(ctx)
	addr := c2.addr
	c2.stop()
	c3 := startMasterOn(t, addr, cfg)
	waitFor(t, "the client to name the fenced tier to the next master", 10*time.Second, func() bool {
		_, _, fenced := c3.m.Roster(0)
		return hasFence(fenced, id)
	})
	_, tn := c3.tierNode(16<<20, dir, 64<<20)
	waitFor(t, "the fenced tier to attach and drop its old record", 20*time.Second, func() bool {
		_, ok := tn.Tier().Lookup("k")
		return !ok
	})
	if got, err := cl.Get(ctx, "k"); err == nil && bytes.Equal(got, old) {
		t.Fatal("get after an acknowledged upsert returned the version before it")
	}
	waitFor(t, "the tier to be back in the roster", 10*time.Second, func() bool {
		_, ids, _ := c3.m.Roster(0)
		return slices.Contains(ids, id)
	})
}

// TestTierFencedLate: the fence reaches the master after the tier has
// attached and its old records were re-added (the node that knew of it
// re-mounted last): they are dropped then, never served after.
func TestTierFencedLate(t *testing.T) {
	cfg := master.Config{KVLeaseTTL: 100 * time.Millisecond, TierSettle: 30 * time.Second}
	c := startMaster(t, cfg)
	dir := t.TempDir()
	node, tn := c.tierNode(16<<20, dir, 64<<20)
	cl := c.client(0)
	old := value(100_000, 1)
	offloadAll(t, c, cl, map[string][]byte{"k": old})
	id := tn.Tier().ID()
	tn.Close()
	node.Close(context.Background())
	addr := c.addr
	c.stop()
	c2 := startMasterOn(t, addr, cfg)
	_, tn2 := c2.tierNode(16<<20, dir, 64<<20)
	// Re-added, no fence known yet: served once the early hold is over
	// (TestTierFencedTierAttachesFirst).
	checkGets(t, cl, map[string][]byte{"k": old})
	// A node that knew of the fence re-mounts.
	fence := fmt.Sprintf("%s@%d", id, time.Now().UnixNano())
	c2.m.NameTiers(nil, []string{fence})
	if _, err := cl.Get(context.Background(), "k"); err == nil {
		t.Fatal("a fenced tier's re-added record is still served")
	}
	waitFor(t, "the tier to drop the record", 10*time.Second, func() bool {
		_, ok := tn2.Tier().Lookup("k")
		return !ok
	})
	// What the tier holds from after the fence stays, whoever names the
	// fence again.
	newer := map[string][]byte{"k2": value(100_000, 2)}
	offloadAll(t, c2, cl, newer)
	c2.m.NameTiers(nil, []string{fence})
	checkGets(t, cl, newer)
}

// hasFence reports whether a roster's fences (id@version) name tier id.
func hasFence(fenced []string, id string) bool {
	return slices.ContainsFunc(fenced, func(f string) bool { return strings.HasPrefix(f, id+"@") })
}
