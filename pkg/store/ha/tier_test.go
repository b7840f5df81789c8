package ha_test

import (
	"bytes"
	"context"
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
