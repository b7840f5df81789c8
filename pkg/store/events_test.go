package store_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/store/master"
)

// eventLog records a master's KV events (master.Events).
type eventLog struct {
	mu  sync.Mutex
	got []string
}

func (l *eventLog) Stored(key, medium string)  { l.add("stored " + key + " " + medium) }
func (l *eventLog) Removed(key, medium string) { l.add("removed " + key + " " + medium) }
func (l *eventLog) add(s string) {
	l.mu.Lock()
	l.got = append(l.got, s)
	l.mu.Unlock()
}

func (l *eventLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.got
	l.got = nil
	return out
}

// A disk tier changes no KV event, as in mooncake_master (which publishes
// only in PutEnd, Remove and its evictions): an offload, the DRAM copy
// going while the disk copy stays, and a promotion say nothing; a remove
// reports where the key was held (disk for a disk-only key); the master
// dropping keys itself (a node given up with its disk) reports cpu, as
// mooncake_master's evictions do.
func TestEventsDiskTierAsMooncake(t *testing.T) {
	var ev eventLog
	c := startMaster(t, master.Config{Events: &ev, KVLeaseTTL: 200 * time.Millisecond, ClientTTL: 200 * time.Millisecond})
	node, tn := c.tierNode(16<<20, t.TempDir(), 64<<20)
	cl := c.client(0)
	ctx := context.Background()
	var want []string
	for i := range 4 {
		k := fmt.Sprintf("k%d", i)
		if err := cl.Put(ctx, k, value(1<<20, byte(i))); err != nil {
			t.Fatal(err)
		}
		want = append(want, "stored "+k+" cpu")
	}
	if got := ev.take(); !slices.Equal(got, want) {
		t.Fatalf("puts: events %q, want %q", got, want)
	}
	c.m.Evict(64 << 20)
	waitFor(t, "4 offloads", 20*time.Second, func() bool { return c.m.TierTotals().Offloads == 4 })
	for i := range 4 {
		if k := fmt.Sprintf("k%d", i); !diskOnly(t, cl, k) {
			t.Fatalf("%s has DRAM replicas after its offload", k)
		}
	}
	for range 2 { // the second read promotes k1
		if _, err := cl.Get(ctx, "k1"); err != nil {
			t.Fatal(err)
		}
	}
	if tt := c.m.TierTotals(); tt.Promotions != 1 {
		t.Fatalf("after two reads of k1: %d promotions, want 1", tt.Promotions)
	}
	time.Sleep(400 * time.Millisecond) // the read leases end
	c.m.Evict(64 << 20)                // k1's DRAM copy goes, its record stays
	if !diskOnly(t, cl, "k1") {
		t.Fatal("k1 still in DRAM after evicting everything")
	}
	if got := ev.take(); len(got) != 0 {
		t.Fatalf("offloads, a promotion and DRAM copies dropped: events %q, want none (as mooncake_master)", got)
	}
	if err := cl.Remove(ctx, "k2", true); err != nil {
		t.Fatal(err)
	}
	if err := cl.Put(ctx, "dram", value(4096, 7)); err != nil {
		t.Fatal(err)
	}
	if err := cl.Remove(ctx, "dram", true); err != nil {
		t.Fatal(err)
	}
	want = []string{"removed k2 disk", "stored dram cpu", "removed dram cpu"}
	if got := ev.take(); !slices.Equal(got, want) {
		t.Fatalf("removes: events %q, want %q", got, want)
	}
	tn.Close()
	node.Close(ctx)
	waitFor(t, "the master to give up on the tier", 20*time.Second, func() bool {
		c.m.Maintain()
		return c.m.Stats().Keys == 0
	})
	got := ev.take()
	slices.Sort(got)
	if want := []string{"removed k0 cpu", "removed k1 cpu", "removed k3 cpu"}; !slices.Equal(got, want) {
		t.Fatalf("a disk lost: events %q, want %q", got, want)
	}
}
