package store_test

import (
	"bytes"
	"context"
	"slices"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/master"
)

// rosterRestart puts old under key k, offloads it to a tier node's disk,
// waits for a node without a tier to hear the pool's roster, then takes
// the tier node away and restarts the master without HA. It returns the
// new master, the pure client, the tier's directory and id.
func rosterRestart(t *testing.T, cfg master.Config, old []byte) (*cluster, *store.Client, string, string) {
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
		_, ids := c2.m.Roster(0)
		return slices.Contains(ids, id) && c2.m.Stats().Segments > 0
	})
	return c2, cl, dir, id
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
	c2, cl, dir, _ := rosterRestart(t, cfg, old)
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
// TierSettle at most; it then leaves the roster and is not waited for
// again.
func TestTierSettleBound(t *testing.T) {
	cfg := master.Config{KVLeaseTTL: 100 * time.Millisecond, TierSettle: 2 * time.Second}
	c2, cl, _, id := rosterRestart(t, cfg, value(50_000, 1))
	ctx := context.Background()
	start := time.Now()
	if err := cl.Put(ctx, "other", value(50_000, 3)); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if took < 500*time.Millisecond || took > 10*time.Second {
		t.Fatalf("a put with a named tier away took %s, want it held up to the 2 s bound", took)
	}
	if _, ids := c2.m.Roster(0); slices.Contains(ids, id) {
		t.Fatalf("tier %s still in the roster %v after the bound", id, ids)
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
		return slices.Contains(t1.Tier().Roster(), t2.Tier().ID())
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
		_, ids := c2.m.Roster(0)
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
