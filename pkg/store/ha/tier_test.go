package ha_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/store"
)

// Disk replicas go through the op log: after a failover the new leader
// knows which objects live on which node's disk, the node's tier attaches
// to it, and they read back exactly, as does an object promoted back into
// DRAM before the failover.
func TestFailoverKeepsDiskReplicas(t *testing.T) {
	h := newHarness(t)
	h.candidate()
	h.candidate()
	old := h.leader(5 * time.Second)
	node := h.client(16 << 20)
	tn, err := store.StartTier(context.Background(), node, store.TierConfig{Dir: t.TempDir(), Capacity: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer tn.Close()
	cl := h.client(0)
	ctx := context.Background()
	vals := map[string][]byte{}
	for i := range 6 {
		k := fmt.Sprintf("d%d", i)
		vals[k] = value(k, 300_000+i)
		if err := cl.Put(ctx, k, vals[k]); err != nil {
			t.Fatal(err)
		}
	}
	m := old.Master()
	waitTier := func(what string, f func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !f(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	waitTier("the tier to attach", func() bool { ts := m.Tiers(); return len(ts) == 1 && ts[0].Online })
	m.Evict(1 << 40)
	waitTier("six offloads", func() bool { return m.TierTotals().Offloads == 6 })
	for range 2 { // promote d0
		if got, err := cl.Get(ctx, "d0"); err != nil || !bytes.Equal(got, vals["d0"]) {
			t.Fatalf("get d0: %v", err)
		}
	}
	if m.TierTotals().Promotions != 1 {
		t.Fatalf("promotions %d, want 1", m.TierTotals().Promotions)
	}
	time.Sleep(200 * time.Millisecond) // let the op log commit
	h.forget(old)
	old.Kill()
	next := h.leader(testLease + 3*time.Second)
	nm := next.Master()
	waitTier("the tier to attach to the new leader", func() bool { ts := nm.Tiers(); return len(ts) == 1 && ts[0].Online && ts[0].Replicas == 6 })
	for k, v := range vals {
		got, err := cl.Get(ctx, k)
		if err != nil || !bytes.Equal(got, v) {
			t.Fatalf("get %s after the failover: %v", k, err)
		}
	}
	if nm.Stats().Keys != 6 {
		t.Fatalf("new leader has %d keys, want 6", nm.Stats().Keys)
	}
}

// Removals are not undone by a node's disk after a failover: a key removed
// while its node is away (the old leader's reminder to drop it dies with
// that leader), one removed while the node was up (the node's drop only
// left its index, and its restart rescans the record), and one re-put and
// removed meanwhile all stay gone once the restarted node re-attaches to
// the new leader, whose op log says they were removed; the node drops the
// stale records. A key left alone reads back exactly.
func TestFailoverDoesNotResurrectRemoved(t *testing.T) {
	h := newHarness(t)
	h.candidate()
	h.candidate()
	old := h.leader(5 * time.Second)
	dir := t.TempDir()
	ctx := context.Background()
	node := h.client(16 << 20)
	tn, err := store.StartTier(ctx, node, store.TierConfig{Dir: dir, Capacity: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	cl := h.client(0)
	keys := []string{"kept", "gone-online", "gone-away", "reput"}
	vals := map[string][]byte{}
	for _, k := range keys {
		vals[k] = value(k, 200_000)
		if err := cl.Put(ctx, k, vals[k]); err != nil {
			t.Fatal(err)
		}
	}
	m := old.Master()
	wait := func(what string, f func() bool) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); !f(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	wait("the tier to attach", func() bool { ts := m.Tiers(); return len(ts) == 1 && ts[0].Online })
	m.Evict(1 << 40)
	wait("four offloads", func() bool { return m.TierTotals().Offloads == 4 })
	if err := cl.Remove(ctx, "gone-online", false); err != nil {
		t.Fatal(err)
	}
	wait("the node to drop gone-online", func() bool { _, ok := tn.Tier().Lookup("gone-online"); return !ok })
	tn.Close()
	node.Close(ctx)
	wait("the tier to go offline", func() bool { ts := m.Tiers(); return len(ts) == 1 && !ts[0].Online })
	h.client(16 << 20) // a node without a tier, for the re-put
	if err := cl.Remove(ctx, "gone-away", false); err != nil {
		t.Fatal(err)
	}
	if err := cl.Remove(ctx, "reput", false); err != nil {
		t.Fatal(err)
	}
	if err := cl.Put(ctx, "reput", value("fresh", 7000)); err != nil {
		t.Fatal(err)
	}
	if err := cl.Remove(ctx, "reput", false); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // let the op log commit
	h.forget(old)
	old.Kill()
	next := h.leader(testLease + 3*time.Second)
	nm := next.Master()
	node2 := h.client(16 << 20)
	tn2, err := store.StartTier(ctx, node2, store.TierConfig{Dir: dir, Capacity: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer tn2.Close()
	wait("the restarted tier to attach to the new leader", func() bool {
		for _, ts := range nm.Tiers() {
			if ts.Online {
				return true
			}
		}
		return false
	})
	if got, err := cl.Get(ctx, "kept"); err != nil || !bytes.Equal(got, vals["kept"]) {
		t.Fatalf("get kept after the failover: %v", err)
	}
	for _, k := range keys[1:] {
		if _, err := cl.Get(ctx, k); !errors.Is(err, store.ErrObjectNotFound) {
			t.Fatalf("get of %s, removed before the failover: %v, want not found", k, err)
		}
	}
	wait("the node to drop the stale records", func() bool {
		for _, k := range keys[1:] {
			if _, ok := tn2.Tier().Lookup(k); ok {
				return false
			}
		}
		return true
	})
	if n := nm.Stats().Keys; n != 1 {
		t.Fatalf("new leader has %d keys, want 1", n)
	}
}
