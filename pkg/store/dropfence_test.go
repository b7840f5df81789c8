package store_test

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/master"
)

// TestTierDropFence: without HA, a put or remove of a key whose old
// version is a disk record is acknowledged only once the node confirms
// dropping that record. Before, the master acknowledged at once and sent
// the DROP after: a master that died before the node applied it left the
// record on disk, and the next master (knowing nothing of the upsert)
// re-added it, so a get after an acknowledged upsert returned the
// version before it. The DROPs are lost here (as with a master killed
// before sending them): the put and the remove must still be waiting
// when the master goes, never acknowledged.
func TestTierDropFence(t *testing.T) {
	cfg := master.Config{KVLeaseTTL: 100 * time.Millisecond, DropFence: 5 * time.Second}
	c := startMaster(t, cfg)
	_, tn := c.tierNode(16<<20, t.TempDir(), 64<<20)
	cl := c.client(0)
	ctx := context.Background()
	old := map[string][]byte{"upserted": value(100_000, 1), "removed": value(90_000, 2)}
	offloadAll(t, c, cl, old)

	// A master restarted without HA re-adds the records (its first era).
	addr := c.addr
	c.stop()
	c2 := startMasterOn(t, addr, cfg)
	waitFor(t, "the tier to re-attach to the second master", 10*time.Second, func() bool { return c2.m.Stats().Keys == 2 })
	waitFor(t, "the client to reach the second master", 10*time.Second, func() bool {
		_, err := cl.Exist(ctx, "upserted")
		return err == nil
	})

	store.SetTierDropHook(func(key string) bool { return old[key] != nil })
	defer store.SetTierDropHook(nil)
	type result struct {
		what string
		err  error
	}
	done := make(chan result, 2)
	newer := value(100_000, 7)
	go func() { done <- result{"upsert", cl.Upsert(ctx, "upserted", newer)} }()
	go func() { done <- result{"remove", cl.Remove(ctx, "removed", false)} }()
	select {
	case r := <-done:
		t.Fatalf("%s acknowledged (err %v) while its node had not dropped the old disk record", r.what, r.err)
	case <-time.After(time.Second):
	}
	// Dies with both unacknowledged (the master first: stopping the
	// server first would wait for the calls, and they would time out).
	c2.m.Close()
	c2.stop()
	acked := map[string]bool{}
	for range 2 {
		select {
		case r := <-done:
			acked[r.what] = r.err == nil
			t.Logf("%s: %v", r.what, r.err)
		case <-time.After(30 * time.Second):
			t.Fatal("an operation still waits after its master stopped")
		}
	}
	store.SetTierDropHook(nil)

	c3 := startMasterOn(t, addr, cfg)
	waitFor(t, "the tier to re-attach to the third master", 10*time.Second, func() bool { return tn.Stats().Attached && len(c3.m.Tiers()) == 1 && c3.m.Tiers()[0].Online })
	waitFor(t, "the client to reach the third master", 10*time.Second, func() bool {
		_, err := cl.Exist(ctx, "upserted")
		return err == nil
	})
	got, err := cl.Get(ctx, "upserted")
	if acked["upsert"] && err == nil && bytes.Equal(got, old["upserted"]) {
		t.Fatal("get after an acknowledged upsert returned the version before it")
	}
	if _, err := cl.Get(ctx, "removed"); acked["remove"] && err == nil {
		t.Fatal("get after an acknowledged remove found the object")
	}

	// Confirmed DROPs release the fence at once, and the record is gone
	// by the time the caller hears back.
	offloadAll(t, c3, cl, map[string][]byte{"again": value(80_000, 3)})
	start := time.Now()
	if err := cl.Upsert(ctx, "again", value(80_000, 4)); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("an upsert with its DROP confirmed took %s", took)
	}
	if _, ok := tn.Tier().Lookup("again"); ok {
		t.Fatal("upsert acknowledged before its node dropped the old record")
	}
}

// TestTierDropFenceOldNode: a node that does not answer DROPs (one from
// before the answer) is not waited for.
func TestTierDropFenceOldNode(t *testing.T) {
	store.SetTierDropAcks(false)
	defer store.SetTierDropAcks(true)
	c := startMaster(t, master.Config{KVLeaseTTL: 100 * time.Millisecond, DropFence: 20 * time.Second})
	c.tierNode(16<<20, t.TempDir(), 64<<20)
	cl := c.client(0)
	ctx := context.Background()
	offloadAll(t, c, cl, map[string][]byte{"k": value(50_000, 1)})
	start := time.Now()
	if err := cl.Upsert(ctx, "k", value(50_000, 2)); err != nil {
		t.Fatal(err)
	}
	if err := cl.Remove(ctx, "k", false); err != nil && !errors.Is(err, store.ErrObjectNotFound) {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("an upsert and remove on a node without drop answers took %s", took)
	}
}

// TestTierOffloadDropFence: a remove of a key whose offload is under way
// is acknowledged once the record the offload writes is dropped. Before,
// the remove was answered at once and the record dropped after the
// offload, unfenced: a master killed in between left it on disk, and the
// next one re-added it (the soak: a get after an acknowledged remove
// returned the removed version).
func TestTierOffloadDropFence(t *testing.T) {
	c := startMaster(t, master.Config{KVLeaseTTL: 100 * time.Millisecond, DropFence: 20 * time.Second})
	_, tn := c.tierNode(16<<20, t.TempDir(), 64<<20)
	cl := c.client(0)
	ctx := context.Background()
	putRetry(t, cl, "k", value(100_000, 1))
	free := holdOffload(t, c, "k")
	done := make(chan error, 1)
	go func() { done <- cl.Remove(ctx, "k", false) }()
	select {
	case err := <-done:
		t.Fatalf("remove answered (%v) while the key's offload is under way", err)
	case <-time.After(time.Second):
	}
	free()
	removeAcked(t, done, "remove still waits after the offload ended")
	if _, ok := tn.Tier().Lookup("k"); ok {
		t.Fatal("remove acknowledged before the offloaded record was dropped")
	}
}

// TestTierSlowDropFenced: a node that does not confirm a DROP within the
// drop fence (stalled, or its answer lost) no longer leaves the call's
// acknowledgement unguarded. Before, the remove was acknowledged after
// the fence with the record still on disk, and a master restarted
// without HA before the node applied the DROP re-added the record when
// the node attached again: a get after an acknowledged remove returned
// the removed object. Now the master fences the node's tier in the pool's
// roster before it acknowledges (and waits for a node to hold that
// roster), so the next master drops the tier's records from before.
func TestTierSlowDropFenced(t *testing.T) {
	cfg := slowDropConfig(300 * time.Millisecond)
	old := map[string][]byte{"removed": value(90_000, 2)}
	c, tn, cl, id := slowDropCluster(t, cfg, old)
	ctx := context.Background()
	d := c.client(16 << 20) // no tier: it carries the roster to the next master
	waitFor(t, "the node without a tier to hear the roster", 10*time.Second, func() bool { return slices.Contains(store.TierRoster(d), id) })

	store.SetTierDropHook(func(key string) bool { return key == "removed" })
	defer store.SetTierDropHook(nil)
	if err := cl.Remove(ctx, "removed", false); err != nil {
		t.Fatalf("remove with its DROP unconfirmed: %v, want acknowledged after the fence", err)
	}
	if _, _, fenced := c.m.Roster(0); !hasFence(fenced, id) {
		t.Errorf("remove acknowledged with its DROP unconfirmed, and tier %s not fenced (roster fences %v)", id, fenced)
	}
	if !hasFence(store.FencedTiers(d), id) && !hasFence(store.FencedTiers(cl), id) {
		t.Error("remove acknowledged before any node held the roster fencing the slow tier")
	}
	if _, ok := tn.Tier().Lookup("removed"); !ok {
		t.Fatal("the node applied a DROP the test withheld")
	}

	// The master dies before the node applies the DROP; the node and
	// its record outlive it.
	restartRemoved(t, c, cl, cfg, "removed", old["removed"])
	waitFor(t, "the fenced tier to drop its old record", 20*time.Second, func() bool {
		_, ok := tn.Tier().Lookup("removed")
		return !ok
	})
}

// TestTierSlowDropFenceLifted: the fence of a tier that was only slow is
// lifted once it confirms the DROPs, so a later restart keeps its
// records; and a DROP confirmed within the fence fences nothing.
func TestTierSlowDropFenceLifted(t *testing.T) {
	c, _, cl, id := slowDropCluster(t, slowDropConfig(300*time.Millisecond), map[string][]byte{"slow": value(50_000, 1), "quick": value(50_000, 2)})
	ctx := context.Background()
	release := make(chan struct{})
	var once sync.Once
	unstall := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unstall) // before the cluster's own cleanup, whatever fails
	store.SetTierDropHook(func(key string) bool {
		if key == "slow" {
			<-release // the node stalls on it
		}
		return false
	})
	defer store.SetTierDropHook(nil)
	if err := cl.Remove(ctx, "slow", false); err != nil {
		t.Fatal(err)
	}
	if _, _, fenced := c.m.Roster(0); !hasFence(fenced, id) {
		t.Fatalf("tier %s not fenced after its DROP outlived the fence (roster fences %v)", id, fenced)
	}
	unstall()
	waitFor(t, "the fence to be lifted once the DROP is confirmed", 10*time.Second, func() bool {
		_, _, fenced := c.m.Roster(0)
		return !hasFence(fenced, id)
	})
	if err := cl.Remove(ctx, "quick", false); err != nil {
		t.Fatal(err)
	}
	if _, _, fenced := c.m.Roster(0); hasFence(fenced, id) {
		t.Fatal("a DROP confirmed within the fence fenced its tier")
	}
	if got := gauge(t, c.m, "mc_store_tier_drop_fence_timeouts_total"); got != 1 {
		t.Fatalf("mc_store_tier_drop_fence_timeouts_total %v, want 1", got)
	}
}

// TestTierSlowDropFenceMasterStops: a master that stops while a call
// waits for a node to hear of the slow tier's fence does not acknowledge
// the call: the next master may not know of the fence.
func TestTierSlowDropFenceMasterStops(t *testing.T) {
	c, _, cl, id := slowDropCluster(t, slowDropConfig(200*time.Millisecond), map[string][]byte{"k": value(50_000, 1)})
	ctx := context.Background()
	store.SetTierDropHook(func(key string) bool { return key == "k" })
	defer store.SetTierDropHook(nil)
	done := make(chan error, 1)
	go func() { done <- cl.Remove(ctx, "k", false) }()
	// A node reports the new roster in the ping after the one that
	// brought it, a ping interval (1 s) after the fence at the least.
	waitFor(t, "the slow tier to be fenced", 5*time.Second, func() bool {
		_, _, fenced := c.m.Roster(0)
		return hasFence(fenced, id)
	})
	c.m.Close()
	c.stop()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("remove acknowledged by a master that stopped before any node heard of the fence")
		}
		t.Logf("remove: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the remove still waits after its master stopped")
	}
}

// TestTierSlowDropRefenced: a second slow DROP on a tier already fenced
// for one, of a record written after that fence, moves the fence past
// it: a fence left where it was would let the next master re-add that
// record.
func TestTierSlowDropRefenced(t *testing.T) {
	cfg := slowDropConfig(300 * time.Millisecond)
	c, tn, cl, id := slowDropCluster(t, cfg, map[string][]byte{"a": value(50_000, 1)})
	ctx := context.Background()
	// The client carries the roster to the next master (the tier's node
	// holds every segment, so that b is offloaded to it too).
	waitFor(t, "the client to hear the roster", 10*time.Second, func() bool { return slices.Contains(store.TierRoster(cl), id) })
	store.SetTierDropHook(func(key string) bool { return key == "a" || key == "b" })
	defer store.SetTierDropHook(nil)
	if err := cl.Remove(ctx, "a", false); err != nil {
		t.Fatal(err)
	}
	first := fenceOf(t, c.m, id)
	old := value(50_000, 2)
	offloadAll(t, c, cl, map[string][]byte{"b": old})
	rec, ok := tn.Tier().Lookup("b")
	if !ok || rec.Version <= first {
		t.Fatalf("record b (%v, version %d) not written after the first fence at %d", ok, rec.Version, first)
	}
	if err := cl.Remove(ctx, "b", false); err != nil {
		t.Fatal(err)
	}
	if v := fenceOf(t, c.m, id); v <= rec.Version {
		t.Errorf("tier fenced at %d after a slow DROP of its record of version %d (first fence %d): the record is not covered", v, rec.Version, first)
	}
	restartRemoved(t, c, cl, cfg, "b", old)
}

// holdOffload has c's master offload everything and holds the offload
// of key once it is under way, until free is called (at the latest when
// the test ends).
func holdOffload(t *testing.T, c *cluster, key string) (free func()) {
	t.Helper()
	held, release := make(chan struct{}, 1), make(chan struct{})
	var once sync.Once
	free = func() { once.Do(func() { close(release) }) }
	store.SetTierOffloadHook(func(k string) {
		if k == key {
			select {
			case held <- struct{}{}:
			default:
			}
			<-release
		}
	})
	t.Cleanup(func() {
		free()
		store.SetTierOffloadHook(nil)
	})
	c.m.Evict(1 << 40)
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the offload did not start")
	}
	return free
}

// removeAcked waits for a remove's answer on done (at most 15 s, then
// fails with late) and fails unless it succeeded.
func removeAcked(t *testing.T, done <-chan error, late string) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("remove: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal(late)
	}
}

// slowDropConfig is a master without HA whose drop fence is bound (and
// leases short, for quick eviction).
func slowDropConfig(bound time.Duration) master.Config {
	return master.Config{KVLeaseTTL: 100 * time.Millisecond, DropFence: bound}
}

// slowDropCluster starts a master with cfg and a node with a disk tier,
// whose segment is the pool's only one, offloads vals to it, and returns
// the cluster, the tier node, a client and the tier's id.
func slowDropCluster(t *testing.T, cfg master.Config, vals map[string][]byte) (*cluster, *store.TierNode, *store.Client, string) {
	t.Helper()
	c := startMaster(t, cfg)
	_, tn := c.tierNode(16<<20, t.TempDir(), 64<<20)
	cl := c.client(0)
	if len(vals) > 0 {
		offloadAll(t, c, cl, vals)
	}
	return c, tn, cl, tn.Tier().ID()
}

// restartRemoved stops c's master (the DROP hook lifted: the node applies
// what comes next), starts another on its address without HA, waits for
// the single tier to attach and cl to reach it, and fails if key, whose
// remove was acknowledged (its value was old), can be read.
func restartRemoved(t *testing.T, c *cluster, cl *store.Client, cfg master.Config, key string, old []byte) {
	t.Helper()
	ctx := context.Background()
	addr := c.addr
	c.stop()
	store.SetTierDropHook(nil)
	c2 := startMasterOn(t, addr, cfg)
	waitFor(t, "the tier to attach to the next master", 20*time.Second, func() bool {
		ts := c2.m.Tiers()
		return len(ts) == 1 && ts[0].Online
	})
	waitFor(t, "the client to reach the next master", 10*time.Second, func() bool {
		_, err := cl.Exist(ctx, key)
		return err == nil
	})
	if got, err := cl.Get(ctx, key); err == nil {
		t.Fatalf("get after an acknowledged remove returned %d bytes (the removed ones: %v)", len(got), bytes.Equal(got, old))
	}
}

// fenceOf is the version m's roster fences tier id at (fails if none).
func fenceOf(t *testing.T, m *master.Master, id string) uint64 {
	t.Helper()
	_, _, fenced := m.Roster(0)
	for _, f := range fenced {
		if v, ok := strings.CutPrefix(f, id+"@"); ok {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				t.Fatalf("fence %q: %v", f, err)
			}
			return n
		}
	}
	t.Fatalf("tier %s not fenced (roster fences %v)", id, fenced)
	return 0
}

// TestTierSlowOffloadDropFenced: the DROP of a record an offload under
// way was writing when its key was removed, unconfirmed within the fence,
// fences the offload's tier too (its DROP names that tier, not the
// object's holder of a disk replica, which it has none of yet).
func TestTierSlowOffloadDropFenced(t *testing.T) {
	c, tn, cl, id := slowDropCluster(t, slowDropConfig(300*time.Millisecond), nil)
	ctx := context.Background()
	putRetry(t, cl, "k", value(100_000, 1))
	store.SetTierDropHook(func(key string) bool { return key == "k" })
	defer store.SetTierDropHook(nil)
	free := holdOffload(t, c, "k")
	done := make(chan error, 1)
	go func() { done <- cl.Remove(ctx, "k", false) }()
	time.Sleep(100 * time.Millisecond)
	free()
	removeAcked(t, done, "remove still waits")
	if _, ok := tn.Tier().Lookup("k"); !ok {
		t.Fatal("the node applied a DROP the test withheld")
	}
	if _, _, fenced := c.m.Roster(0); !hasFence(fenced, id) {
		t.Fatalf("remove acknowledged with the offloaded record's DROP unconfirmed, and tier %s not fenced (roster fences %v)", id, fenced)
	}
}

// TestTierFencedTierAttachesFirst: a tier fenced for a DROP it never
// confirmed, whose node was the stalled one and so never heard the
// fence, attaches to a master restarted without HA before any node that
// knows of the fence has re-mounted there. Before, the master re-added
// its records as current and a get after the acknowledged remove
// returned the removed bytes until such a node came back. Now reads of
// records re-added in the master's first settle bound wait for the
// bound, or for the fence that drops them.
func TestTierFencedTierAttachesFirst(t *testing.T) {
	cfg := slowDropConfig(300 * time.Millisecond)
	cfg.TierSettle = 5 * time.Second
	old := map[string][]byte{"removed": value(90_000, 2)}
	c := startMaster(t, cfg)
	node, tn := c.tierNode(16<<20, t.TempDir(), 64<<20)
	id := tn.Tier().ID()
	cl := c.client(0)
	offloadAll(t, c, cl, old)
	d := c.client(16 << 20) // carries the fence to the next master
	ctx := context.Background()
	waitFor(t, "the node without a tier to hear the roster", 10*time.Second, func() bool { return slices.Contains(store.TierRoster(d), id) })

	// The tier's node stalls (pings and DROPs), the remove is
	// acknowledged once the others hold the fence.
	store.HoldPings(node, true)
	time.Sleep(200 * time.Millisecond) // a ping under way lands
	store.SetTierDropHook(func(key string) bool { return key == "removed" })
	defer store.SetTierDropHook(nil)
	if err := cl.Remove(ctx, "removed", false); err != nil {
		t.Fatalf("remove with its DROP unconfirmed: %v, want acknowledged after the fence", err)
	}
	if hasFence(store.FencedTiers(node), id) {
		t.Fatal("the stalled node heard the fence: the test would not test the case")
	}
	if !hasFence(store.FencedTiers(d), id) && !hasFence(store.FencedTiers(cl), id) {
		t.Fatal("remove acknowledged before any node held the roster fencing the slow tier")
	}

	// The nodes that know of the fence stall in turn, the master dies,
	// and the tier's node is the first back on the next one.
	store.HoldPings(d, true)
	store.HoldPings(cl, true)
	addr := c.addr
	c.stop()
	store.SetTierDropHook(nil)
	c2 := startMasterOn(t, addr, cfg)
	store.HoldPings(node, false)
	waitFor(t, "the fenced tier to attach to the next master", 20*time.Second, func() bool {
		ts := c2.m.Tiers()
		return len(ts) == 1 && ts[0].Online
	})
	if _, _, fenced := c2.m.Roster(0); hasFence(fenced, id) {
		t.Fatal("the next master heard the fence from the tier's own node: the test would not test the case")
	}
	type result struct {
		b   []byte
		err error
	}
	got := make(chan result, 1)
	go func() {
		b, err := cl.Get(ctx, "removed")
		got <- result{b, err}
	}()
	select {
	case r := <-got:
		if r.err == nil {
			t.Fatalf("get after an acknowledged remove returned %d bytes (the removed ones: %v) before the nodes that know of the fence came back", len(r.b), bytes.Equal(r.b, old["removed"]))
		}
		t.Fatalf("get answered (%v) before the settle bound or the fence", r.err)
	case <-time.After(500 * time.Millisecond):
	}
	store.HoldPings(d, false)
	store.HoldPings(cl, false)
	select {
	case r := <-got:
		if r.err == nil {
			t.Fatalf("get after an acknowledged remove returned %d bytes (the removed ones: %v)", len(r.b), bytes.Equal(r.b, old["removed"]))
		}
		if !errors.Is(r.err, store.ErrObjectNotFound) {
			t.Errorf("get of a record dropped by the fence: %v, want OBJECT_NOT_FOUND", r.err)
		}
	case <-time.After(cfg.TierSettle + 5*time.Second):
		t.Fatal("get still held after the settle bound")
	}
	if n := gauge(t, c2.m, "mc_store_tier_early_reads_held_total"); n != 1 {
		t.Errorf("mc_store_tier_early_reads_held_total %v, want 1", n)
	}
	waitFor(t, "the fenced tier to drop its old record", 20*time.Second, func() bool {
		_, ok := tn.Tier().Lookup("removed")
		return !ok
	})
}

// TestTierEarlyReadServed: with no fence to hear, a read of a record
// re-added after a restart waits out the settle bound and then gets the
// record's bytes; one whose caller's deadline is shorter gets
// RPC_TIMEOUT, not a miss; a read past the bound is not held.
func TestTierEarlyReadServed(t *testing.T) {
	cfg := master.Config{KVLeaseTTL: 100 * time.Millisecond, TierSettle: 2 * time.Second}
	c := startMaster(t, cfg)
	_, tn := c.tierNode(16<<20, t.TempDir(), 64<<20)
	cl := c.client(0)
	vals := map[string][]byte{"a": value(70_000, 1), "b": value(60_000, 2)}
	offloadAll(t, c, cl, vals)
	addr := c.addr
	c.stop()
	c2 := startMasterOn(t, addr, cfg)
	waitFor(t, "the tier to attach to the next master", 20*time.Second, func() bool {
		ts := c2.m.Tiers()
		return len(ts) == 1 && ts[0].Online && c2.m.Stats().Keys == 2
	})
	short, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := cl.Get(short, "b"); err == nil || store.CodeOf(err) != store.RPCTimeout && !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("held get with a 100 ms deadline: %v, want RPC_TIMEOUT", err)
	}
	start := time.Now()
	got, err := cl.Get(context.Background(), "a")
	took := time.Since(start)
	if err != nil || !bytes.Equal(got, vals["a"]) {
		t.Fatalf("get after the bound: %d bytes, %v; want the record's %d bytes", len(got), err, len(vals["a"]))
	}
	if took < 300*time.Millisecond {
		t.Errorf("a read of a re-added record was answered after %s, inside the settle bound", took)
	}
	if n := gauge(t, c2.m, "mc_store_tier_early_reads_held_total"); n < 2 {
		t.Errorf("mc_store_tier_early_reads_held_total %v, want 2", n)
	}
	// Past the bound: not held.
	start = time.Now()
	if got, err := cl.Get(context.Background(), "b"); err != nil || !bytes.Equal(got, vals["b"]) {
		t.Fatalf("get past the bound: %d bytes, %v", len(got), err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("a read past the settle bound took %s", took)
	}
	_ = tn
}
