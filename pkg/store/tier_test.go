package store_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/master"
)

// tierNode starts a node with a segment of segSize and a disk tier of
// capacity bytes in dir.
func (c *cluster) tierNode(segSize uint64, dir string, capacity uint64) (*store.Client, *store.TierNode) {
	c.t.Helper()
	return c.tierNodeWith(segSize, store.TierConfig{Dir: dir, Capacity: capacity})
}

// tierNodeWith starts a node with a segment of segSize and the disk tier
// cfg.
func (c *cluster) tierNodeWith(segSize uint64, cfg store.TierConfig) (*store.Client, *store.TierNode) {
	c.t.Helper()
	node := c.client(segSize)
	tn, err := store.StartTier(context.Background(), node, cfg)
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
// object only on disk is served (staged through the node's staging pool,
// not its segment) with the exact bytes; the second read promotes it
// back into DRAM; a staged copy that was not promoted is freed as soon
// as its reader is done with it.
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
	waitFor(t, "4 offloads", 20*time.Second, func() bool { return c.m.TierTotals().Offloads == 4 })
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
	if mem, file := gauge(t, c.m, "mem_cache_nums_"), gauge(t, c.m, "file_cache_nums_"); mem != 4 || file != 4 {
		t.Fatalf("mem_cache_nums_ %g, file_cache_nums_ %g; want 4 and 4", mem, file)
	}
	// First read: from disk, exact, not promoted.
	got, err := cl.Get(ctx, "k0")
	if err != nil || !bytes.Equal(got, vals["k0"]) {
		t.Fatalf("get of a disk object: %v (equal %v)", err, bytes.Equal(got, vals["k0"]))
	}
	if tt := c.m.TierTotals(); tt.DiskHits != 1 || tt.Promotions != 0 {
		t.Fatalf("after one disk read: %+v", tt)
	}
	// The read took no DRAM: the object is still on disk only.
	if !diskOnly(t, cl, "k0") {
		t.Fatal("k0 has a DRAM replica after a disk read (staged into the segment?)")
	}
	// The staging range starts on a page, so with O_DIRECT and no huge
	// pages the node read the value straight into it; with huge pages it
	// read through them (tier.Tier.readRecord).
	if s := tn.Tier().Stats(); s.Direct {
		want := map[bool]uint64{false: 1, true: 0}[s.HugePages]
		if s.ReadsInPlace != want {
			t.Fatalf("the node's tier (huge pages %v) read %d values in place, want %d", s.HugePages, s.ReadsInPlace, want)
		}
	}
	// Its staging copy goes once the reader hands it back, long before
	// the lease or the staging TTL would end.
	waitFor(t, "the staged read to be handed back", 2*time.Second, func() bool {
		return c.m.Tiers()[0].StagingUsed == 0 && c.m.TierTotals().StagedReleased == 1
	})
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
	waitFor(t, "k4..k7 offloaded", 20*time.Second, func() bool { return c.m.TierTotals().Offloads-offloads == 4 })
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
	waitFor(t, "the node to drop k2's record", 20*time.Second, func() bool {
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
	// Room being offloaded frees once the disk writes land: on a loaded
	// machine (fsync behind other work) that can take seconds.
	for deadline := time.Now().Add(30 * time.Second); ; {
		err := cl.Put(context.Background(), key, v)
		if err == nil {
			return
		}
		if !errors.Is(err, store.ErrNoAvailableHandle) || time.Now().After(deadline) {
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
		got, err := getRetry(cl, k)
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
	waitFor(t, "the offload of big to fail as full", 20*time.Second, func() bool { return c.m.TierTotals().OffloadFull == 1 })
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
		waitFor(t, k+" offloaded", 20*time.Second, func() bool { return diskOnly(t, cl, k) })
	}
	// The tier holds three; f0..f2 went with its oldest files.
	if s := tn.Stats(); s.Records != 3 || s.EvictedRecords != 3 {
		t.Fatalf("node tier: %d records, %d evicted; want 3 and 3", s.Records, s.EvictedRecords)
	}
	waitFor(t, "the master to forget f0..f2", 20*time.Second, func() bool { return c.m.Stats().Keys == 3 })
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

// offloadAll puts vals and evicts them all to the node's disk.
func offloadAll(t *testing.T, c *cluster, cl *store.Client, vals map[string][]byte) {
	t.Helper()
	for k, v := range vals {
		putRetry(t, cl, k, v)
	}
	c.m.Evict(1 << 40)
	waitFor(t, "every object offloaded", 20*time.Second, func() bool {
		for k := range vals {
			if !diskOnly(t, cl, k) {
				return false
			}
		}
		return true
	})
}

// offloadThenRestart puts vals through a master with a tier node,
// offloads them all, stops the node and the master, and starts a new
// master without HA on the same address: the records are on the tier's
// directory dir, its node not started again.
func offloadThenRestart(t *testing.T, cfg master.Config, vals map[string][]byte) (*cluster, *store.Client, string) {
	t.Helper()
	c := startMaster(t, cfg)
	dir := t.TempDir()
	node, tn := c.tierNode(16<<20, dir, 64<<20)
	cl := c.client(0)
	offloadAll(t, c, cl, vals)
	tn.Close()
	node.Close(context.Background())
	addr := c.addr
	c.stop()
	return startMasterOn(t, addr, cfg), cl, dir
}

func checkGets(t *testing.T, cl *store.Client, vals map[string][]byte) {
	t.Helper()
	for k, v := range vals {
		got, err := getRetry(cl, k)
		if err != nil || !bytes.Equal(got, v) {
			t.Fatalf("get %s: %v (equal %v)", k, err, bytes.Equal(got, v))
		}
	}
}

// getRetry gets k, again when the read outlived its lease: the tests'
// 100 ms leases (quick eviction) can pass during a 1 MiB get on a loaded
// machine under -race, and the client then refuses the bytes and says to
// get again, as a caller would (CI: TestWatermarkOffloads, a read that
// ended 111 ms after its replica list).
func getRetry(cl *store.Client, k string) ([]byte, error) {
	got, err := cl.Get(context.Background(), k)
	for try := 0; try < 5 && store.CodeOf(err) == store.LeaseExpired; try++ {
		got, err = cl.Get(context.Background(), k)
	}
	return got, err
}

// A node restarted on the same --ssd-dir (the master staying up) gets
// its disk objects back; versions decide: a key removed or re-put while
// it was away loses its old record.
func TestTierNodeRestart(t *testing.T) {
	c := startMaster(t, master.Config{KVLeaseTTL: 100 * time.Millisecond})
	dir := t.TempDir()
	node, tn := c.tierNode(16<<20, dir, 64<<20)
	cl := c.client(0)
	ctx := context.Background()
	vals := map[string][]byte{"a": value(300_000, 1), "b": value(1<<20, 2), "removed": value(5000, 3), "reput": value(7000, 4)}
	offloadAll(t, c, cl, vals)
	c.client(16 << 20) // a second node, no tier, for the re-put
	tn.Close()
	node.Close(ctx)
	waitFor(t, "the tier to go offline", 20*time.Second, func() bool { return !c.m.Tiers()[0].Online })
	// Away: its objects are known but not readable.
	if _, err := cl.Get(ctx, "a"); !errors.Is(err, store.ErrObjectNotFound) {
		t.Fatalf("get of an object on an absent node's disk: %v", err)
	}
	if err := cl.Remove(ctx, "removed", false); err != nil {
		t.Fatal(err)
	}
	if err := cl.Remove(ctx, "reput", false); err != nil {
		t.Fatal(err)
	}
	fresh := value(7000, 99)
	if err := cl.Put(ctx, "reput", fresh); err != nil {
		t.Fatal(err)
	}
	_, tn2 := c.tierNode(16<<20, dir, 64<<20)
	checkGets(t, cl, map[string][]byte{"a": vals["a"], "b": vals["b"], "reput": fresh})
	if _, err := cl.Get(ctx, "removed"); !errors.Is(err, store.ErrObjectNotFound) {
		t.Fatalf("get of a key removed while its node was away: %v", err)
	}
	waitFor(t, "the stale records to be dropped", 20*time.Second, func() bool {
		_, r := tn2.Tier().Lookup("removed")
		_, p := tn2.Tier().Lookup("reput")
		return !r && !p
	})
}

// A key removed while its node is up is not resurrected by that node's
// restart: the node's drop log keeps the record out of its rescan, and
// were it reported, its version is one this master handed out for an
// object it no longer has, so the master would drop the record rather
// than re-add it. A key re-put and then removed meanwhile goes the same
// way.
func TestTierRemovedStaysRemoved(t *testing.T) {
	c := startMaster(t, master.Config{KVLeaseTTL: 100 * time.Millisecond})
	dir := t.TempDir()
	node, tn := c.tierNode(16<<20, dir, 64<<20)
	cl := c.client(0)
	ctx := context.Background()
	vals := map[string][]byte{"kept": value(300_000, 1), "gone": value(5000, 2), "reput": value(7000, 3)}
	offloadAll(t, c, cl, vals)
	c.client(16 << 20) // a second node, no tier, for the re-put
	if err := cl.Remove(ctx, "gone", false); err != nil {
		t.Fatal(err)
	}
	if err := cl.Remove(ctx, "reput", false); err != nil {
		t.Fatal(err)
	}
	if err := cl.Put(ctx, "reput", value(7000, 99)); err != nil {
		t.Fatal(err)
	}
	if err := cl.Remove(ctx, "reput", false); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the node to drop the removed records", 20*time.Second, func() bool {
		_, g := tn.Tier().Lookup("gone")
		_, r := tn.Tier().Lookup("reput")
		return !g && !r
	})
	tn.Close()
	node.Close(ctx)
	waitFor(t, "the tier to go offline", 20*time.Second, func() bool { return !c.m.Tiers()[0].Online })
	_, tn2 := c.tierNode(16<<20, dir, 64<<20)
	checkGets(t, cl, map[string][]byte{"kept": vals["kept"]})
	for _, k := range []string{"gone", "reput"} {
		if _, err := cl.Get(ctx, k); !errors.Is(err, store.ErrObjectNotFound) {
			t.Fatalf("get of %s, removed before its node restarted: %v", k, err)
		}
	}
	waitFor(t, "the restarted node to drop the stale records", 20*time.Second, func() bool {
		_, g := tn2.Tier().Lookup("gone")
		_, r := tn2.Tier().Lookup("reput")
		return !g && !r
	})
}

// A node away longer than the grace (3 x client_ttl) loses its disk
// objects on the master, but they come back with it, exact, unless the
// key was put again meanwhile (then removed: the old record stays gone).
func TestTierGivenUpComesBack(t *testing.T) {
	c := startMaster(t, master.Config{KVLeaseTTL: 100 * time.Millisecond, ClientTTL: 200 * time.Millisecond})
	dir := t.TempDir()
	node, tn := c.tierNode(16<<20, dir, 64<<20)
	cl := c.client(0)
	ctx := context.Background()
	vals := map[string][]byte{"back": value(100_000, 1), "superseded": value(6000, 2)}
	offloadAll(t, c, cl, vals)
	c.client(16 << 20) // a second node, no tier, for the re-put
	tn.Close()
	node.Close(ctx)
	waitFor(t, "the master to give up on the tier", 20*time.Second, func() bool {
		c.m.Maintain()
		return c.m.Stats().Keys == 0
	})
	if err := cl.Put(ctx, "superseded", value(6000, 99)); err != nil {
		t.Fatal(err)
	}
	if err := cl.Remove(ctx, "superseded", false); err != nil {
		t.Fatal(err)
	}
	c.tierNode(16<<20, dir, 64<<20)
	waitFor(t, "the returning node's object", 20*time.Second, func() bool { return c.m.Stats().Keys == 1 })
	checkGets(t, cl, map[string][]byte{"back": vals["back"]})
	if _, err := cl.Get(ctx, "superseded"); !errors.Is(err, store.ErrObjectNotFound) {
		t.Fatalf("get of a key put and removed while its old record's node was away: %v", err)
	}
}

// A master restarted without HA knows nothing; the nodes re-mount and
// their tiers re-attach, and the disk objects come back.
func TestTierMasterRestart(t *testing.T) {
	c := startMaster(t, master.Config{KVLeaseTTL: 100 * time.Millisecond})
	c.tierNode(16<<20, t.TempDir(), 64<<20)
	cl := c.client(0)
	vals := map[string][]byte{"x": value(100_000, 1), "y": value(2<<20, 2)}
	offloadAll(t, c, cl, vals)
	addr := c.addr
	c.stop()
	c2 := startMasterOn(t, addr, master.Config{KVLeaseTTL: 100 * time.Millisecond})
	waitFor(t, "the tier to re-attach to the new master", 10*time.Second, func() bool { return c2.m.Stats().Keys == 2 })
	// The client reconnects by itself, within gRPC's reconnect backoff
	// (at most a second); until then a single master's calls fail fast.
	waitFor(t, "the client to reach the new master", 10*time.Second, func() bool {
		_, err := cl.Exist(context.Background(), "x")
		return err == nil
	})
	checkGets(t, cl, vals)
}

// A flipped byte in a record on disk: the node's read fails its CRC, the
// get gets a clear error (never the bytes), and the object is gone.
func TestTierFlippedByte(t *testing.T) {
	c := startMaster(t, master.Config{KVLeaseTTL: 100 * time.Millisecond})
	dir := t.TempDir()
	c.tierNode(16<<20, dir, 64<<20)
	cl := c.client(0)
	offloadAll(t, c, cl, map[string][]byte{"v": value(50_000, 5)})
	files, _ := filepath.Glob(filepath.Join(dir, "*.mct"))
	if len(files) != 1 {
		t.Fatalf("data files %v", files)
	}
	f, err := os.OpenFile(files[0], os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{0xff, 0x00, 0xff}, 20_000); err != nil {
		t.Fatal(err)
	}
	f.Close()
	_, err = cl.Get(context.Background(), "v")
	if !errors.Is(err, store.ErrObjectNotFound) || !strings.Contains(err.Error(), "checksum") {
		t.Fatalf("get of a corrupt disk record: %v, want OBJECT_NOT_FOUND naming the checksum", err)
	}
	if _, err := cl.Get(context.Background(), "v"); !errors.Is(err, store.ErrObjectNotFound) {
		t.Fatalf("second get: %v", err)
	}
	if tt := c.m.TierTotals(); tt.LoadFailures != 1 {
		t.Fatalf("load failures %d, want 1", tt.LoadFailures)
	}
}

// A node SIGKILLed while the master has it offloading objects, and again
// while it loads them back for reads that promote them, then restarted on the same
// directory: every object the master had as on disk before the kill
// reads back exactly; nothing is ever served wrong (a get succeeds with
// the right bytes or fails).
func TestTierSIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("runs child node processes")
	}
	// PromoteAfter 1: every load of phase 2 is a promotion.
	c := startMaster(t, master.Config{ClientTTL: 500 * time.Millisecond, KVLeaseTTL: 200 * time.Millisecond, PromoteAfter: 1})
	dir := t.TempDir()
	env := "MC_STORE_TEST_TIER_DIR=" + dir
	child, _ := startChildNode(t, c.addr, env)
	waitFor(t, "the child's tier to attach", 10*time.Second, func() bool { ts := c.m.Tiers(); return len(ts) == 1 && ts[0].Online })
	cl := c.client(0)
	ctx := context.Background()
	vals := map[string][]byte{}
	for i := range 24 {
		k := fmt.Sprintf("s%02d", i)
		vals[k] = value(1<<20+i*999, byte(i))
		if err := cl.Put(ctx, k, vals[k]); err != nil {
			t.Fatal(err)
		}
	}
	onDisk := func() []string {
		var ks []string
		for k := range vals {
			if diskOnly(t, cl, k) {
				ks = append(ks, k)
			}
		}
		return ks
	}
	// Kill 1: offloads under way.
	c.m.Evict(1 << 40)
	waitFor(t, "the first offload to land", 10*time.Second, func() bool { return c.m.TierTotals().Offloads >= 1 })
	child.Process.Kill()
	child.Wait()
	acked := onDisk()
	t.Logf("killed during offloads: %d of 24 on disk (acknowledged)", len(acked))
	// Only what is exact may come back; the rest may be gone.
	checkSome := func(must []string) {
		t.Helper()
		for k, v := range vals {
			got, err := cl.Get(ctx, k)
			if err == nil && !bytes.Equal(got, v) {
				t.Fatalf("get %s: wrong bytes", k)
			}
			if err != nil && slices.Contains(must, k) {
				t.Fatalf("get %s (on disk before the kill): %v", k, err)
			}
		}
	}
	child, _ = startChildNode(t, c.addr, env)
	waitFor(t, "the restarted tier to attach", 10*time.Second, func() bool { ts := c.m.Tiers(); return len(ts) == 1 && ts[0].Online })
	checkSome(acked)

	// Kill 2: loads under way (reads of disk objects). A fresh set, all
	// on the restarted node's disk first.
	vals2 := map[string][]byte{}
	for i := range 16 {
		vals2[fmt.Sprintf("t%02d", i)] = value(1<<20+i*777, byte(100+i))
	}
	offloadAll(t, c, cl, vals2)
	maps.Copy(vals, vals2)
	hits := c.m.TierTotals().DiskHits
	var wg sync.WaitGroup
	for k := range vals2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, err := cl.Get(ctx, k)
			if err == nil && !bytes.Equal(got, vals[k]) {
				t.Errorf("get %s during the kill: wrong bytes", k)
			}
		}()
	}
	waitFor(t, "the first load", 10*time.Second, func() bool { return c.m.TierTotals().DiskHits > hits })
	child.Process.Kill()
	child.Wait()
	wg.Wait()
	t.Logf("killed during promotions: %d of 16 disk reads served (and promoted) before", c.m.TierTotals().DiskHits-hits)
	startChildNode(t, c.addr, env)
	waitFor(t, "the tier to attach a third time", 10*time.Second, func() bool { ts := c.m.Tiers(); return len(ts) == 1 && ts[0].Online })
	acked = slices.Collect(maps.Keys(vals2))
	checkSome(acked)
}

// Writers' regions can cover a node's whole segment with room inside
// them: a read of a disk object borrows that room to stage it.
func TestStagingBorrowsWritersRegions(t *testing.T) {
	c := startMaster(t, master.Config{KVLeaseTTL: 100 * time.Millisecond, EvictionInterval: time.Hour})
	c.tierNode(4<<20, t.TempDir(), 64<<20) // regions of 1 MiB: four
	cl := c.client(0)
	ctx := context.Background()
	vals := map[string][]byte{}
	for i := range 8 {
		k := fmt.Sprintf("r%d", i)
		vals[k] = value(400<<10, byte(i))
		if err := cl.Put(ctx, k, vals[k]); err != nil {
			t.Fatal(err)
		}
	}
	if s := c.m.Segments()[0]; s.Regions != 4 {
		t.Fatalf("%d regions, want the writer holding all four", s.Regions)
	}
	// Read the second object of each region, so eviction takes the first
	// ones and every region keeps an object (none goes back whole).
	for i := 1; i < 8; i += 2 {
		if _, err := cl.Get(ctx, fmt.Sprintf("r%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(150 * time.Millisecond) // the leases end
	c.m.Evict(4 * 400 << 10)
	waitFor(t, "four offloads", 20*time.Second, func() bool { return c.m.TierTotals().Offloads == 4 })
	if s := c.m.Segments()[0]; s.Regions != 4 {
		t.Fatalf("%d regions after the offloads, want all four still the writer's", s.Regions)
	}
	checkGets(t, cl, vals)
	// Staging borrowed room: it evicted nothing more to make some.
	if n := c.m.TierTotals().Offloads; n != 4 {
		t.Fatalf("%d offloads after reading the disk objects, want still 4", n)
	}
}

// gauge reads one unlabelled metric of the master's registry.
func gauge(t *testing.T, m *master.Master, name string) float64 {
	t.Helper()
	fams, err := m.Metrics().Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name && len(f.GetMetric()) == 1 {
			if g := f.GetMetric()[0].GetGauge(); g != nil {
				return g.GetValue()
			}
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// A removal survives restarts of both the node and a master without HA.
// The master that removes the key has only re-added its record from the
// node's hello (it restarted after the offload), so it knows nothing of
// the version; the master after it knows nothing at all. Only the node's
// drop log keeps the removed record from being reported, and re-added,
// after the node restarts.
func TestTierRemovalSurvivesRestarts(t *testing.T) {
	cfg := master.Config{KVLeaseTTL: 100 * time.Millisecond}
	c := startMaster(t, cfg)
	dir := t.TempDir()
	node, tn := c.tierNode(16<<20, dir, 64<<20)
	cl := c.client(0)
	ctx := context.Background()
	vals := map[string][]byte{"gone": value(200_000, 1), "kept": value(1<<20, 2), "also-kept": value(5000, 3)}
	offloadAll(t, c, cl, vals)

	addr := c.addr
	c.stop()
	c2 := startMasterOn(t, addr, cfg)
	waitFor(t, "the tier to re-attach to the second master", 20*time.Second, func() bool { return c2.m.Stats().Keys == len(vals) })
	waitFor(t, "the client to reach the second master", 20*time.Second, func() bool {
		_, err := cl.Exist(ctx, "kept")
		return err == nil
	})
	if err := cl.Remove(ctx, "gone", false); err != nil {
		t.Fatalf("remove from the second master: %v", err)
	}
	waitFor(t, "the node to drop the removed record", 20*time.Second, func() bool {
		_, ok := tn.Tier().Lookup("gone")
		return !ok
	})
	if s := tn.Stats(); s.Removed != 1 {
		t.Fatalf("node tier: %d drops recorded, want 1", s.Removed)
	}

	tn.Close()
	node.Close(ctx)
	c2.stop()
	c3 := startMasterOn(t, addr, cfg)
	_, tn3 := c3.tierNode(16<<20, dir, 64<<20)
	// Attached means the master has taken in the hello: every record the
	// node reported is re-added by now.
	waitFor(t, "the restarted node to attach to the third master", 20*time.Second, func() bool { return tn3.Stats().Attached })
	if _, ok := tn3.Tier().Lookup("gone"); ok {
		t.Fatal("the restarted node's tier has the removed record again")
	}
	// The client dialled while no master was there: gRPC waits out its
	// reconnect backoff before it reaches the third one.
	waitFor(t, "the client to reach the third master", 20*time.Second, func() bool {
		_, err := cl.Exist(ctx, "kept")
		return err == nil
	})
	if ok, err := cl.Exist(ctx, "gone"); err != nil || ok {
		t.Fatalf("Exist of a key removed before both restarts: %v, %v; want false", ok, err)
	}
	if _, err := cl.Get(ctx, "gone"); !errors.Is(err, store.ErrObjectNotFound) {
		t.Fatalf("get of a key removed before both restarts: %v, want OBJECT_NOT_FOUND", err)
	}
	delete(vals, "gone")
	if n := c3.m.Stats().Keys; n != len(vals) {
		t.Fatalf("third master has %d keys, want %d", n, len(vals))
	}
	checkGets(t, cl, vals)
}

// A master restarted without HA, with a tier's node still away: a key
// the new master puts and then removes (or evicts) before that node's
// tier attaches again must not come back from the node's older record.
// The record's version is from before this master, so only the key's
// history on this master can tell it is stale (the soak test found a
// removed key read back with its earlier bytes).
func TestTierMasterRestartNoResurrection(t *testing.T) {
	cfg := master.Config{KVLeaseTTL: 100 * time.Millisecond}
	c := startMaster(t, cfg)
	dir := t.TempDir()
	node, tn := c.tierNode(16<<20, dir, 64<<20)
	cl := c.client(0)
	ctx := context.Background()
	old := map[string][]byte{"removed": value(100_000, 1), "evicted": value(90_000, 2), "kept": value(80_000, 3)}
	offloadAll(t, c, cl, old)
	tn.Close()
	node.Close(ctx)
	addr := c.addr
	c.stop()

	c2 := startMasterOn(t, addr, cfg)
	c2.client(16 << 20) // a node without a tier takes the new puts
	waitFor(t, "the client to reach the new master", 20*time.Second, func() bool {
		_, err := cl.Exist(ctx, "kept")
		return err == nil
	})
	for _, k := range []string{"removed", "evicted"} {
		if err := cl.Put(ctx, k, value(5000, 9)); err != nil {
			t.Fatalf("put %s on the new master: %v", k, err)
		}
	}
	if err := cl.Remove(ctx, "removed", false); err != nil {
		t.Fatalf("remove: %v", err)
	}
	time.Sleep(150 * time.Millisecond) // the put's lease against eviction ends
	c2.m.Evict(1 << 40)
	waitFor(t, "the new put to be evicted", 10*time.Second, func() bool {
		ok, err := cl.Exist(ctx, "evicted")
		return err == nil && !ok
	})

	_, tn2 := c2.tierNode(16<<20, dir, 64<<20)
	waitFor(t, "the node's tier to attach to the new master", 20*time.Second, func() bool { return tn2.Stats().Attached })
	for _, k := range []string{"removed", "evicted"} {
		got, err := cl.Get(ctx, k)
		if err == nil {
			t.Errorf("get %q after the new master removed its newer value: got %d bytes (the record from before the restart came back), want OBJECT_NOT_FOUND", k, len(got))
		} else if !errors.Is(err, store.ErrObjectNotFound) {
			t.Errorf("get %q: %v, want OBJECT_NOT_FOUND", k, err)
		}
	}
	checkGets(t, cl, map[string][]byte{"kept": old["kept"]})
}

// A node that comes back to a master restarted without HA after the
// master's first 3 x client_ttl: what that master did with the keys of
// its records from before it is no longer known, so they are dropped,
// not served.
func TestTierMasterRestartLateNode(t *testing.T) {
	cfg := master.Config{KVLeaseTTL: 100 * time.Millisecond, ClientTTL: 300 * time.Millisecond}
	c2, cl, dir := offloadThenRestart(t, cfg, map[string][]byte{"late": value(70_000, 4)})
	ctx := context.Background()
	time.Sleep(3*cfg.ClientTTL + 300*time.Millisecond)
	_, tn2 := c2.tierNode(16<<20, dir, 64<<20)
	waitFor(t, "the node's tier to attach to the new master", 20*time.Second, func() bool { return tn2.Stats().Attached })
	waitFor(t, "the client to reach the new master", 20*time.Second, func() bool {
		_, err := cl.Exist(ctx, "late")
		return err == nil
	})
	if got, err := cl.Get(ctx, "late"); !errors.Is(err, store.ErrObjectNotFound) {
		t.Fatalf("get of a record from before the master, reported after its first era: %d bytes, %v; want OBJECT_NOT_FOUND", len(got), err)
	}
	waitFor(t, "the node to drop the record", 20*time.Second, func() bool {
		_, ok := tn2.Tier().Lookup("late")
		return !ok
	})
}
