package store_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/master"
)

// tierNode starts a node with a segment of segSize and a disk tier of
// capacity bytes in dir.
func (c *cluster) tierNode(segSize uint64, dir string, capacity uint64) (*store.Client, *store.TierNode) {
	c.t.Helper()
	node := c.client(segSize)
	tn, err := store.StartTier(context.Background(), node, store.TierConfig{Dir: dir, Capacity: capacity})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { tn.Close() })
	waitFor(c.t.(*testing.T), "the disk tier to attach", 5*time.Second, func() bool { return tn.Stats().Attached || len(c.m.Tiers()) == 1 && c.m.Tiers()[0].Online })
	return node, tn
}

func diskOnly(t *testing.T, cl *store.Client, key string) bool {
	t.Helper()
	reps, err := cl.Query(context.Background(), key)
	return err == nil && len(reps) == 0
}

// Eviction offloads to the node's disk instead of dropping; a get of an
// object only on disk is served (staged through the node's segment) with
// the exact bytes; the second read promotes it back into DRAM; a staged
// copy that was not promoted is freed when its lease ends.
func TestOffloadReadPromote(t *testing.T) {
	c := startMaster(t, master.Config{KVLeaseTTL: 200 * time.Millisecond})
	_, tn := c.tierNode(16<<20, t.TempDir(), 64<<20)
	cl := c.client(0)
	ctx := context.Background()
	vals := map[string][]byte{}
	for i := range 8 {
		k := fmt.Sprintf("k%d", i)
		vals[k] = value(1<<20+i*4096, byte(i))
		if err := cl.Put(ctx, k, vals[k]); err != nil {
			t.Fatal(err)
		}
	}
	used := c.m.Stats().Used
	// Evict the oldest half: they go to disk, and their DRAM is freed
	// once the node says they are durable.
	if freed := c.m.Evict(4 << 20); freed != 0 {
		t.Fatalf("Evict freed %d bytes at once; want 0 (all offloaded)", freed)
	}
	waitFor(t, "4 offloads", 5*time.Second, func() bool { return c.m.TierTotals().Offloads == 4 })
	if s := c.m.Stats(); s.Keys != 8 || s.Used >= used-4<<20 {
		t.Fatalf("after offloading 4: %d keys, %d used (was %d); want 8 keys and 4 MiB less", s.Keys, s.Used, used)
	}
	for i := range 4 {
		if k := fmt.Sprintf("k%d", i); !diskOnly(t, cl, k) {
			t.Fatalf("%s has DRAM replicas after its offload", k)
		}
	}
	if s := tn.Stats(); s.Records != 4 || s.Offloads != 4 {
		t.Fatalf("node tier: %d records, %d offloads; want 4 and 4", s.Records, s.Offloads)
	}
	// First read: from disk, exact, not promoted.
	got, err := cl.Get(ctx, "k0")
	if err != nil || !bytes.Equal(got, vals["k0"]) {
		t.Fatalf("get of a disk object: %v (equal %v)", err, bytes.Equal(got, vals["k0"]))
	}
	if tt := c.m.TierTotals(); tt.DiskHits != 1 || tt.Promotions != 0 {
		t.Fatalf("after one disk read: %+v", tt)
	}
	// Its staging copy goes with the lease.
	waitFor(t, "the staging copy to be freed", 3*time.Second, func() bool { return diskOnly(t, cl, "k0") })
	// k1: two reads promote it; the copy stays after the lease.
	for range 2 {
		got, err := cl.Get(ctx, "k1")
		if err != nil || !bytes.Equal(got, vals["k1"]) {
			t.Fatalf("get k1: %v", err)
		}
	}
	if tt := c.m.TierTotals(); tt.Promotions != 1 {
		t.Fatalf("after two reads of k1: %d promotions, want 1", tt.Promotions)
	}
	time.Sleep(400 * time.Millisecond)
	c.m.Maintain()
	if diskOnly(t, cl, "k1") {
		t.Fatal("promoted k1 lost its DRAM copy after the lease")
	}
	// Evicting the promoted copy costs no write: its disk record is there.
	offloads := c.m.TierTotals().Offloads
	c.m.Evict(64 << 20)
	if !diskOnly(t, cl, "k1") {
		t.Fatal("k1 still in DRAM after evicting everything")
	}
	waitFor(t, "k4..k7 offloaded", 3*time.Second, func() bool { return c.m.TierTotals().Offloads-offloads == 4 })
	if s := tn.Stats(); s.Records != 8 || s.Offloads != 8 {
		t.Fatalf("node tier: %d records, %d offloads; want 8 and 8 (k1 was not written again)", s.Records, s.Offloads)
	}
	for k, v := range vals {
		got, err := cl.Get(ctx, k)
		if err != nil || !bytes.Equal(got, v) {
			t.Fatalf("get %s from disk: %v", k, err)
		}
	}
	// Remove drops the record on the node's disk.
	time.Sleep(300 * time.Millisecond)
	if err := cl.Remove(ctx, "k2", true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the node to drop k2's record", 3*time.Second, func() bool {
		_, ok := tn.Tier().Lookup("k2")
		return !ok
	})
	if _, err := cl.Get(ctx, "k2"); !errors.Is(err, store.ErrObjectNotFound) {
		t.Fatalf("get removed disk object: %v", err)
	}
}

// putRetry puts, retrying while the store is full and eviction (with its
// offloads) makes room: a put never waits for a disk write itself.
func putRetry(t *testing.T, cl *store.Client, key string, v []byte) {
	t.Helper()
	for try := 0; ; try++ {
		err := cl.Put(context.Background(), key, v)
		if err == nil {
			return
		}
		if !errors.Is(err, store.ErrNoAvailableHandle) || try == 200 {
			t.Fatalf("put %s: %v", key, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The watermark loop offloads: far more is put than DRAM holds, and
// every object stays readable, exactly.
func TestWatermarkOffloads(t *testing.T) {
	c := startMaster(t, master.Config{KVLeaseTTL: 100 * time.Millisecond})
	_, tn := c.tierNode(16<<20, t.TempDir(), 128<<20)
	cl := c.client(0)
	vals := map[string][]byte{}
	t0 := time.Now()
	for i := range 48 {
		k := fmt.Sprintf("w%02d", i)
		vals[k] = value(1<<20, byte(i))
		putRetry(t, cl, k, vals[k])
	}
	if s := c.m.Stats(); s.Keys != 48 || s.Used > s.Capacity {
		t.Fatalf("stats %+v: want all 48 keys kept", s)
	}
	t.Logf("puts took %s; tier totals %+v, master %+v", time.Since(t0), c.m.TierTotals(), c.m.Stats())
	t0 = time.Now()
	defer func() { t.Logf("gets took %s", time.Since(t0)) }()
	if tt := c.m.TierTotals(); tt.Offloads < 32 || tt.OffloadFull+tt.OffloadFailed != 0 {
		t.Fatalf("tier totals %+v: want at least 32 offloads, no failure", tt)
	}
	for k, v := range vals {
		got, err := cl.Get(context.Background(), k)
		if err != nil || !bytes.Equal(got, v) {
			t.Fatalf("get %s: %v", k, err)
		}
	}
	if s := tn.Stats(); s.Records < 32 || s.Full != 0 {
		t.Fatalf("node tier %+v", s)
	}
}

// Disk full: a tier too small for an object skips its offload (counted)
// and the object is dropped as without a tier; a tier that fills evicts
// its oldest files and the master forgets those objects. Either way the
// store goes on serving.
func TestTierFull(t *testing.T) {
	c := startMaster(t, master.Config{KVLeaseTTL: 100 * time.Millisecond})
	_, tn := c.tierNode(16<<20, t.TempDir(), 3<<20+64<<10) // three 1 MiB records
	cl := c.client(0)
	ctx := context.Background()
	big := value(4<<20, 9)
	if err := cl.Put(ctx, "big", big); err != nil {
		t.Fatal(err)
	}
	c.m.Evict(4 << 20)
	waitFor(t, "the offload of big to fail as full", 3*time.Second, func() bool { return c.m.TierTotals().OffloadFull == 1 })
	if _, err := cl.Get(ctx, "big"); !errors.Is(err, store.ErrObjectNotFound) {
		t.Fatalf("get of an object whose offload found the disk full: %v, want OBJECT_NOT_FOUND (dropped)", err)
	}
	vals := map[string][]byte{}
	for i := range 6 {
		k := fmt.Sprintf("f%d", i)
		vals[k] = value(1<<20, byte(i))
		if err := cl.Put(ctx, k, vals[k]); err != nil {
			t.Fatal(err)
		}
		c.m.Evict(1 << 20) // one at a time, oldest first
		waitFor(t, k+" offloaded", 3*time.Second, func() bool { return diskOnly(t, cl, k) })
	}
	// The tier holds three; f0..f2 went with its oldest files.
	if s := tn.Stats(); s.Records != 3 || s.EvictedRecords != 3 {
		t.Fatalf("node tier: %d records, %d evicted; want 3 and 3", s.Records, s.EvictedRecords)
	}
	waitFor(t, "the master to forget f0..f2", 3*time.Second, func() bool { return c.m.Stats().Keys == 3 })
	for i := range 6 {
		k := fmt.Sprintf("f%d", i)
		got, err := cl.Get(ctx, k)
		if i < 3 {
			if !errors.Is(err, store.ErrObjectNotFound) {
				t.Fatalf("get %s (evicted from disk): %v", k, err)
			}
			continue
		}
		if err != nil || !bytes.Equal(got, vals[k]) {
			t.Fatalf("get %s: %v", k, err)
		}
	}
	if err := cl.Put(ctx, "after", value(1000, 1)); err != nil {
		t.Fatalf("put after the tier filled: %v", err)
	}
}
