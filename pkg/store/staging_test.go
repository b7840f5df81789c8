package store_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/master"
	"github.com/kvcache-ops/mc/pkg/store/storepb"
)

// The scan of issue 36: a node of 64 MiB DRAM with a 1 GiB disk tier,
// 200 objects of 1 MiB put (most end up on disk only), then read back one
// after another as fast as the client goes, then again by 8 concurrent
// readers. Every get returns the exact bytes (reads wait for staging room
// rather than fail), and the reads take no DRAM: the objects in DRAM
// before the scan are there after it, and nothing more was offloaded.
func TestStagingScanLargerThanDRAM(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 200 MiB to disk")
	}
	// Promotion off: it is the one read that may take DRAM, by design.
	c := startMaster(t, master.Config{PromoteAfter: -1})
	_, tn := c.tierNodeWith(64<<20, store.TierConfig{Dir: t.TempDir(), Capacity: 1 << 30, StagingSize: 16 << 20})
	cl := c.client(0)
	ctx := context.Background()
	const n = 200
	key := func(i int) string { return fmt.Sprintf("k%d", i) }
	val := func(i int) []byte { return value(1<<20, byte(i)) }
	for i := range n {
		putRetry(t, cl, key(i), val(i))
	}
	// Let the offloads the puts caused land.
	waitFor(t, "the offloads to land", 60*time.Second, func() bool { return c.m.TierTotals().Inflight == 0 })
	time.Sleep(200 * time.Millisecond)
	inDRAM := map[string]bool{}
	for i := range n {
		if !diskOnly(t, cl, key(i)) {
			inDRAM[key(i)] = true
		}
	}
	offloads, used := c.m.TierTotals().Offloads, c.m.Stats().Used
	if len(inDRAM) == 0 || len(inDRAM) > 64 || offloads < n-64 {
		t.Fatalf("%d objects in DRAM and %d offloaded before the scan; want most of the 200 on disk only", len(inDRAM), offloads)
	}
	check := func(i int) error {
		got, err := cl.Get(ctx, key(i))
		if err != nil {
			return fmt.Errorf("get %s: %w", key(i), err)
		}
		if !bytes.Equal(got, val(i)) {
			return fmt.Errorf("get %s: wrong bytes", key(i))
		}
		return nil
	}
	for i := range n {
		if err := check(i); err != nil {
			t.Fatalf("sequential scan: %v", err)
		}
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				if err := check(i); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	var failed []string
	for err := range errs {
		failed = append(failed, err.Error())
	}
	if len(failed) > 0 {
		t.Fatalf("8 concurrent readers: %d of %d gets failed, first: %s", len(failed), n, failed[0])
	}
	for k := range inDRAM {
		if diskOnly(t, cl, k) {
			t.Fatalf("%s was in DRAM before the scan and is not after it: the reads evicted it", k)
		}
	}
	if tt := c.m.TierTotals(); tt.Offloads != offloads || c.m.Stats().Used != used {
		t.Fatalf("after the scan: %d offloads (was %d), %d bytes of DRAM used (was %d); the reads took DRAM", tt.Offloads, offloads, c.m.Stats().Used, used)
	}
	if tt := c.m.TierTotals(); tt.DiskHits < uint64(2*(n-len(inDRAM))) {
		t.Fatalf("%d disk hits, want at least %d", tt.DiskHits, 2*(n-len(inDRAM)))
	}
	waitFor(t, "every staged read handed back", 5*time.Second, func() bool { return c.m.Tiers()[0].StagingUsed == 0 })
	if tt := c.m.TierTotals(); tt.StagedReclaimed != 0 {
		t.Fatalf("%d staged reads reclaimed by the TTL; every reader handed its reads back", tt.StagedReclaimed)
	}
	_ = tn
}

// A read that finds its node's staging pool full waits for room (it is
// counted), and is served as soon as a staged read is handed back.
func TestStagingWaitsForRoom(t *testing.T) {
	c := startMaster(t, master.Config{PromoteAfter: -1, StagingTTL: time.Minute})
	c.tierNodeWith(16<<20, store.TierConfig{Dir: t.TempDir(), Capacity: 64 << 20, StagingSize: 2 << 20})
	cl := c.client(0)
	ctx := context.Background()
	vals := map[string][]byte{}
	for i := range 3 {
		vals[fmt.Sprintf("k%d", i)] = value(1<<20, byte(i))
	}
	offloadAll(t, c, cl, vals)
	// A reader (the master's own API: it hands nothing back) holds two
	// staged reads: the 2 MiB pool is full.
	var held []uint64
	for _, r := range c.m.BatchGetReplicaList([]string{"k0", "k1"}) {
		if r.Err != nil || r.Staged == 0 {
			t.Fatalf("staged read: %+v", r)
		}
		held = append(held, r.Staged)
	}
	// The pool is the node's: its use reaches the master with its stats.
	waitFor(t, "the node to report its pool full", 2*time.Second, func() bool { return c.m.Tiers()[0].StagingUsed == 2<<20 })
	if ts := c.m.Tiers()[0]; ts.StagingUsed != 2<<20 || ts.StagingSize != 2<<20 {
		t.Fatalf("staging pool %d of %d used, want all 2 MiB", ts.StagingUsed, ts.StagingSize)
	}
	go func() {
		time.Sleep(300 * time.Millisecond)
		c.m.ReleaseStaged(held[:1])
	}()
	t0 := time.Now()
	got, err := cl.Get(ctx, "k2")
	if err != nil || !bytes.Equal(got, vals["k2"]) {
		t.Fatalf("get k2 with the staging pool full: %v (equal %v); want it to wait for room", err, bytes.Equal(got, vals["k2"]))
	}
	if d := time.Since(t0); d < 250*time.Millisecond {
		t.Fatalf("get k2 returned after %s, before any room was freed", d)
	}
	waitFor(t, "the node to report the wait", 2*time.Second, func() bool { return c.m.Tiers()[0].StagingWaits > 0 })
	if ts := c.m.Tiers()[0]; ts.StagingWaits != 1 {
		t.Fatalf("%d reads waited for staging room, want 1", ts.StagingWaits)
	}
	if tt := c.m.TierTotals(); tt.StagingWaits != 1 {
		t.Fatalf("totals: %d staging waits, want 1", tt.StagingWaits)
	}
	// A pool that stays full fails the read once its wait is over, with
	// a reason, never a wrong byte.
	c.m.BatchGetReplicaList([]string{"k0"}) // k0's copy: a second reader
	r := c.m.BatchGetReplicaListBy(time.Now().Add(200*time.Millisecond), []string{"k2"})[0]
	if !errors.Is(r.Err, store.ErrNoAvailableHandle) || !strings.Contains(r.Err.Error(), "staging pool") {
		t.Fatalf("read with the pool held full past its deadline: %v, want NO_AVAILABLE_HANDLE naming the staging pool", r.Err)
	}
}

// A reader SIGKILLed while it holds staged reads: the master frees them
// when the staging TTL passes and counts them as reclaimed; later reads
// are served.
func TestStagingReaderKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a child reader process")
	}
	const ttl = 500 * time.Millisecond
	c := startMaster(t, master.Config{PromoteAfter: -1, StagingTTL: ttl})
	c.tierNodeWith(16<<20, store.TierConfig{Dir: t.TempDir(), Capacity: 64 << 20, StagingSize: 4 << 20})
	cl := c.client(0)
	vals := map[string][]byte{}
	for i := range 4 {
		vals[fmt.Sprintf("k%d", i)] = value(1<<20, byte(i))
	}
	offloadAll(t, c, cl, vals)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "MC_STORE_TEST_READER="+c.addr, "MC_STORE_TEST_KEYS=k0,k1,k2,k3")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "HOLDING 4") {
		t.Fatalf("child reader: %q, %v", line, err)
	}
	waitFor(t, "the node to report its pool held", 2*time.Second, func() bool { return c.m.Tiers()[0].StagingUsed == 4<<20 })
	cmd.Process.Kill()
	cmd.Wait()
	waitFor(t, "the dead reader's staged reads to be reclaimed", 10*ttl, func() bool { return c.m.Tiers()[0].StagingUsed == 0 })
	if tt, ts := c.m.TierTotals(), c.m.Tiers()[0]; tt.StagedReclaimed != 4 || ts.StagingReclaimed != 4 || tt.StagedReleased != 0 {
		t.Fatalf("reclaimed %d (tier %d), released %d; want 4 reclaimed by the TTL, none released", tt.StagedReclaimed, ts.StagingReclaimed, tt.StagedReleased)
	}
	checkGets(t, cl, vals)
	waitFor(t, "the later gets to hand their staged reads back", 5*time.Second, func() bool { return c.m.TierTotals().StagedReleased == 4 })
}

// runChildReader reads keys in one batch and stops before handing the
// staged reads back, saying so, until it is killed.
func runChildReader(addr string, keys []string) {
	c, err := store.New(context.Background(), store.Config{Master: addr, EngineConfig: engineConfig(), PingInterval: 50 * time.Millisecond})
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	store.SetBeforeStagedRelease(func(ids []uint64) {
		fmt.Println("HOLDING", len(ids))
		select {}
	})
	_, errs := c.BatchGet(context.Background(), keys)
	fmt.Println("ERR batch get returned", errs)
	os.Exit(1)
}

// A staging pool larger than the host's memory is refused when the tier
// opens, in one line naming the flag.
func TestStagingLargerThanMemory(t *testing.T) {
	_, err := store.OpenTier(store.TierConfig{Dir: t.TempDir(), Capacity: 64 << 20, StagingSize: 1 << 50})
	if err == nil || !strings.Contains(err.Error(), "--ssd-staging-size") || !strings.Contains(err.Error(), "memory") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("OpenTier with a 1 PiB staging pool: %v; want one line naming --ssd-staging-size and the host's memory", err)
	}
}

// A reader over Mooncake's wire, which has no call to hand a staged read
// back (as Mooncake's Python client reads mc's disk tier), scans more
// disk objects than the staging pool holds: a read that finds the pool
// full waits for the staged-read TTL to free a range instead of failing
// (the interop run lost 2 of 48 gets: the copies were held for the 5 s
// staging TTL though their readers were told a 500 ms lease, and the wait
// for room gave up after 4 s).
func TestStagingScanOverMooncakeWire(t *testing.T) {
	c := startMaster(t, master.Config{PromoteAfter: -1, KVLeaseTTL: 500 * time.Millisecond})
	c.tierNodeWith(16<<20, store.TierConfig{Dir: t.TempDir(), Capacity: 256 << 20, StagingSize: 4 << 20})
	writer := c.client(0)
	ctx := context.Background()
	const n = 24
	key := func(i int) string { return fmt.Sprintf("m%d", i) }
	val := func(i int) []byte { return value(1<<20, byte(i)) }
	for i := range n {
		putRetry(t, writer, key(i), val(i))
	}
	waitFor(t, "the offloads to land", 60*time.Second, func() bool { return c.m.TierTotals().Inflight == 0 })
	onDisk := 0
	for i := range n {
		if diskOnly(t, writer, key(i)) {
			onDisk++
		}
	}
	if onDisk <= 4 {
		t.Fatalf("%d of %d objects on disk only; want more than the 4 MiB staging pool holds", onDisk, n)
	}
	reader := c.mooncakeClient(0)
	for i := range n {
		got, err := reader.Get(ctx, key(i))
		if err != nil || !bytes.Equal(got, val(i)) {
			t.Fatalf("get %s over Mooncake's wire (%d on disk, 4 staged at most): %v (%d bytes)", key(i), onDisk, err, len(got))
		}
	}
	if tt := c.m.TierTotals(); tt.StagingWaits == 0 || tt.StagedReclaimed == 0 {
		t.Fatalf("%+v: want reads that waited for room and copies freed by the TTL", tt)
	}
}

// A node SIGKILLed while a reader holds staged reads of its disk objects
// and has not moved their bytes yet (issue 36 item 6): the reader gets an
// error for each key, never wrong bytes; the master frees the dead
// node's staging ranges when its stream ends (not a TTL later), so no
// read is granted a copy in memory that is gone; and once the node is
// back on the same directory the objects read back exactly.
func TestStagingNodeKilledMidRead(t *testing.T) {
	if testing.Short() {
		t.Skip("runs child node processes")
	}
	// A TTL far longer than the test: only the node's end may free the
	// ranges.
	c := startMaster(t, master.Config{PromoteAfter: -1, StagingTTL: time.Hour})
	env := "MC_STORE_TEST_TIER_DIR=" + t.TempDir()
	child, _ := startChildNode(t, c.addr, env)
	waitFor(t, "the child's tier to attach", 10*time.Second, func() bool { ts := c.m.Tiers(); return len(ts) == 1 && ts[0].Online })
	cl := c.client(0)
	vals := map[string][]byte{}
	var keys []string
	for i := range 4 {
		k := fmt.Sprintf("d%d", i)
		keys = append(keys, k)
		vals[k] = value(1<<20+i*4096, byte(40+i))
	}
	offloadAll(t, c, cl, vals)

	reader := c.client(0)
	granted, resume := make(chan struct{}), make(chan struct{})
	var once sync.Once
	// Registered after the reader's client: runs before its Close, which
	// waits for the stalled get.
	unstall := sync.OnceFunc(func() { close(resume) })
	t.Cleanup(unstall)
	store.SetBeforeTransfer(reader, func() {
		once.Do(func() {
			close(granted)
			<-resume
		})
	})
	type result struct {
		vals [][]byte
		errs []error
	}
	done := make(chan result, 1)
	go func() {
		v, errs := reader.BatchGet(context.Background(), keys)
		done <- result{v, errs}
	}()
	select {
	case <-granted:
	case <-time.After(20 * time.Second):
		t.Fatal("the reader was not granted its staged reads")
	}
	waitFor(t, "the node to report the reader's staged reads", 2*time.Second, func() bool { return c.m.Tiers()[0].StagingUsed != 0 })
	child.Process.Kill()
	child.Wait()
	waitFor(t, "the master to see the tier go", 10*time.Second, func() bool { return !c.m.Tiers()[0].Online })
	waitFor(t, "the dead node's staging ranges to be freed", 2*time.Second, func() bool { return c.m.Tiers()[0].StagingUsed == 0 })
	unstall()
	r := <-done
	for i, k := range keys {
		if r.errs[i] == nil && !bytes.Equal(r.vals[i], vals[k]) {
			t.Fatalf("get %s from a node killed mid-read: wrong bytes", k)
		}
		if r.errs[i] == nil {
			// Only a same-host mapping that outlived the process can
			// serve it, and then with the staged (exact) bytes.
			t.Logf("get %s from the killed node: served its staged bytes", k)
		}
	}
	// While the node is away its disk objects are a clear error, not a
	// grant of the copy that went with it.
	for _, k := range keys {
		if got, err := cl.Get(context.Background(), k); err == nil && !bytes.Equal(got, vals[k]) {
			t.Fatalf("get %s with its node dead: wrong bytes", k)
		} else if err == nil {
			t.Fatalf("get %s with its node dead succeeded", k)
		}
	}
	child, _ = startChildNode(t, c.addr, env)
	waitFor(t, "the restarted tier to attach", 10*time.Second, func() bool { ts := c.m.Tiers(); return len(ts) == 1 && ts[0].Online })
	checkGets(t, cl, vals)

	// Again with no stall: four readers get the disk objects over and
	// over, and the node is killed whenever their transfers are.
	var stop atomic.Bool
	var served, failed atomic.Int64
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rd := c.client(0)
			for i := g; !stop.Load(); i++ {
				k := keys[i%len(keys)]
				got, err := rd.Get(context.Background(), k)
				switch {
				case err == nil && !bytes.Equal(got, vals[k]):
					t.Errorf("get %s while its node was killed: wrong bytes", k)
				case err == nil:
					served.Add(1)
				default:
					failed.Add(1)
				}
			}
		}()
	}
	waitFor(t, "the readers to be served", 10*time.Second, func() bool { return served.Load() >= 8 })
	child.Process.Kill()
	child.Wait()
	waitFor(t, "the master to see the tier go again", 10*time.Second, func() bool { return !c.m.Tiers()[0].Online })
	waitFor(t, "the killed node's staging ranges to be freed", 2*time.Second, func() bool { return c.m.Tiers()[0].StagingUsed == 0 })
	time.Sleep(200 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	t.Logf("readers during the second kill: %d gets served exact, %d failed", served.Load(), failed.Load())
	if failed.Load() == 0 {
		t.Fatalf("no get failed with the node dead for 200ms")
	}
}

// One hop fewer (issue 36 item 3): mc's client reads disk objects by
// asking their node itself, one call per node for a batch; the master
// only says where the records are. The master sends its node no staging
// command for them (the node's count of the master's loads stays put)
// and holds no staged copy; the node counts one direct batch per get and
// the reader hands each back. A reader over Mooncake's wire, which
// cannot ask a node, still goes through the master.
func TestStagingDirectSkipsMaster(t *testing.T) {
	c := startMaster(t, master.Config{PromoteAfter: -1, StagingTTL: time.Minute})
	_, tn := c.tierNodeWith(16<<20, store.TierConfig{Dir: t.TempDir(), Capacity: 64 << 20, StagingSize: 8 << 20})
	cl := c.client(0)
	ctx := context.Background()
	vals := map[string][]byte{}
	var keys []string
	for i := range 3 {
		k := fmt.Sprintf("k%d", i)
		keys = append(keys, k)
		vals[k] = value(1<<20+i*4096, byte(i))
	}
	offloadAll(t, c, cl, vals)
	loads := tn.Stats().Loads
	for round := range 2 {
		got, errs := cl.BatchGet(ctx, keys)
		for i, k := range keys {
			if errs[i] != nil || !bytes.Equal(got[i], vals[k]) {
				t.Fatalf("round %d: get %s: %v (equal %v)", round, k, errs[i], bytes.Equal(got[i], vals[k]))
			}
		}
	}
	st := tn.Stats()
	if st.Loads != loads {
		t.Fatalf("the node did %d loads for the master during mc's gets (was %d): the master staged them", st.Loads, loads)
	}
	if st.DirectBatches != 2 {
		t.Fatalf("%d batches asked of the node directly, want 2 (one per batch get of 3 keys)", st.DirectBatches)
	}
	// Asked on the staged read's own wire, not through gRPC.
	if n := store.TierWireExchanges(cl); n != 2 {
		t.Fatalf("%d staged reads answered on the node's wire, want 2", n)
	}
	waitFor(t, "the reads handed back to the node", 5*time.Second, func() bool {
		s := tn.Stats()
		return s.StagingReleased == 6 && s.StagingUsed == 0
	})
	waitFor(t, "the node's counts to reach the master", 5*time.Second, func() bool { return c.m.TierTotals().DirectBatches == 2 })
	if tt := c.m.TierTotals(); tt.DiskHits != 6 || tt.DirectBatches != 2 {
		t.Fatalf("master: %d disk hits, %d direct batches; want 6 and 2", tt.DiskHits, tt.DirectBatches)
	}
	// Mooncake's wire: the master stages, through the node's pool.
	got, err := c.mooncakeClient(0).Get(ctx, "k0")
	if err != nil || !bytes.Equal(got, vals["k0"]) {
		t.Fatalf("get k0 over Mooncake's wire: %v", err)
	}
	if st := tn.Stats(); st.Loads != loads+1 || st.DirectBatches != 2 {
		t.Fatalf("after a Mooncake-wire get: %d master loads (want %d), %d direct batches (want 2)", st.Loads, loads+1, st.DirectBatches)
	}
}

// The node's read service names what it serves: a record of another
// version (re-put or dropped since the master answered) or another tier
// directory behind the same address is OBJECT_NOT_FOUND, never other
// bytes; a release of a batch it does not hold (freed by its TTL, or of
// an earlier incarnation of the node) frees nothing; a batch larger
// than the pool is refused naming the pool.
func TestStagingDirectFencing(t *testing.T) {
	c := startMaster(t, master.Config{PromoteAfter: -1})
	_, tn := c.tierNodeWith(16<<20, store.TierConfig{Dir: t.TempDir(), Capacity: 64 << 20, StagingSize: 2 << 20})
	cl := c.client(0)
	ctx := context.Background()
	offloadAll(t, c, cl, map[string][]byte{"a": value(1<<20, 1)})
	var version uint64
	for _, r := range tn.Tier().Records() {
		if r.Key == "a" {
			version = r.Version
		}
	}
	if version == 0 {
		t.Fatal("no record of a on the node's disk")
	}
	rd := store.DialTierRead(t, tn.ServiceAddress())
	ask := func(tierID string, v, size uint64) (*storepb.BatchGetStagedResponse, error) {
		return rd.BatchGetStaged(ctx, &storepb.BatchGetStagedRequest{TierId: tierID, Keys: []string{"a"}, Versions: []uint64{v}, Sizes: []uint64{size}})
	}
	for _, tc := range []struct {
		name    string
		tier    string
		version uint64
	}{{"another version", tn.Tier().ID(), version + 1}, {"another tier", "0123456789abcdef", version}} {
		resp, err := ask(tc.tier, tc.version, 1<<20)
		if err != nil || resp.Codes[0] != int32(store.ObjectNotFound) || resp.Addrs[0] != 0 {
			t.Fatalf("%s: %v %v, want OBJECT_NOT_FOUND and no range", tc.name, resp, err)
		}
	}
	resp, err := ask(tn.Tier().ID(), version, 1<<20)
	if err != nil || resp.Codes[0] != 0 || resp.Addrs[0] == 0 || resp.GcTtlMs == 0 || resp.BatchId == 0 {
		t.Fatalf("staged read of a: %v %v", resp, err)
	}
	if _, err := rd.ReleaseStaged(ctx, &storepb.ReleaseStagedBatch{BatchId: resp.BatchId + 1}); err != nil {
		t.Fatal(err)
	}
	if st := tn.Stats(); st.StagingUsed != 1<<20 || st.StagingReleased != 0 {
		t.Fatalf("after releasing a batch the node never gave: %d bytes held, %d released; want a's 1 MiB held", st.StagingUsed, st.StagingReleased)
	}
	if _, err := rd.ReleaseStaged(ctx, &storepb.ReleaseStagedBatch{BatchId: resp.BatchId}); err != nil {
		t.Fatal(err)
	}
	if st := tn.Stats(); st.StagingUsed != 0 || st.StagingReleased != 1 {
		t.Fatalf("after its release: %d bytes held, %d released", st.StagingUsed, st.StagingReleased)
	}
	big, err := rd.BatchGetStaged(ctx, &storepb.BatchGetStagedRequest{TierId: tn.Tier().ID(), Keys: []string{"a", "a", "a"}, Versions: []uint64{version, version, version}, Sizes: []uint64{1 << 20, 1 << 20, 1 << 20}})
	if err != nil || big.Codes[0] != int32(store.NoAvailableHandle) || !strings.Contains(big.Messages[0], "staging pool") {
		t.Fatalf("a batch of 3 MiB from a 2 MiB pool: %v %v, want NO_AVAILABLE_HANDLE naming the staging pool", big, err)
	}
}

// Disk reads are background work while DRAM puts into their node's
// segment are under way (issue 36: reads that never starve DRAM): the
// master tells the node when it places a put there (WRITES), and the
// node's staged reads then go one at a time and paced, still byte-exact;
// with no puts for a while they run as they come.
func TestStagingYieldsToPuts(t *testing.T) {
	c := startMaster(t, master.Config{PromoteAfter: -1})
	_, tn := c.tierNodeWith(16<<20, store.TierConfig{Dir: t.TempDir(), Capacity: 64 << 20, StagingSize: 8 << 20})
	cl := c.client(0)
	ctx := context.Background()
	vals := map[string][]byte{}
	var keys []string
	for i := range 4 {
		k := fmt.Sprintf("d%d", i)
		keys = append(keys, k)
		vals[k] = value(1<<20, byte(i+1))
	}
	offloadAll(t, c, cl, vals)
	readAll := func(what string) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make([]error, len(keys))
		for i, k := range keys {
			wg.Add(1)
			go func() {
				defer wg.Done()
				got, err := cl.Get(ctx, k)
				if err == nil && !bytes.Equal(got, vals[k]) {
					err = errors.New("wrong bytes")
				}
				errs[i] = err
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("%s: get %s: %v", what, keys[i], err)
			}
		}
	}
	waitFor(t, "the offloads' puts to be over", 5*time.Second, func() bool { return !tn.Stats().YieldingToPuts })
	readAll("no puts")
	if st := tn.Stats(); st.PacedReads != 0 || st.DirectReads != 4 {
		t.Fatalf("no puts under way: %d paced reads of %d; want none paced", st.PacedReads, st.DirectReads)
	}
	// A writer upserting into the node's segment the whole time.
	stop := make(chan struct{})
	wdone := make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				wdone <- nil
				return
			default:
			}
			if err := cl.Upsert(ctx, "w", value(64<<10, byte(i))); err != nil {
				wdone <- err
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	waitFor(t, "the node to hear of the puts", 5*time.Second, func() bool { return tn.Stats().YieldingToPuts })
	readAll("during puts")
	close(stop)
	if err := <-wdone; err != nil {
		t.Fatalf("writer: %v", err)
	}
	paced := tn.Stats().PacedReads
	if paced == 0 {
		t.Fatal("4 disk reads while puts went on: none paced")
	}
	waitFor(t, "the node to hear the puts are over", 5*time.Second, func() bool { return !tn.Stats().YieldingToPuts })
	// A WRITES the stream delivered late would start another window.
	time.Sleep(200 * time.Millisecond)
	waitFor(t, "the node to hear the puts are over", 5*time.Second, func() bool { return !tn.Stats().YieldingToPuts })
	readAll("after the puts")
	if st := tn.Stats(); st.PacedReads != paced {
		t.Fatalf("puts over: %d more reads paced", st.PacedReads-paced)
	}
}

// A reader reading on hands its finished staged reads back with its next
// read from the same node (BatchGetStagedRequest.release), freed before
// that read takes its ranges; what no read carries goes in one call
// (ReleaseStaged with more batches), at the latest when the client
// closes.
func TestStagingReleaseRidesWithNextRead(t *testing.T) {
	c := startMaster(t, master.Config{PromoteAfter: -1, StagingTTL: time.Minute})
	_, tn := c.tierNodeWith(16<<20, store.TierConfig{Dir: t.TempDir(), Capacity: 64 << 20, StagingSize: 8 << 20})
	cl := c.client(0)
	ctx := context.Background()
	vals := map[string][]byte{"a": value(1<<20, 1), "b": value(1<<20, 2), "c": value(1<<20, 3)}
	offloadAll(t, c, cl, vals)

	// The node's side: a read carrying an earlier batch frees it first;
	// a release call frees all it names.
	var versions = map[string]uint64{}
	for _, r := range tn.Tier().Records() {
		versions[r.Key] = r.Version
	}
	rd := store.DialTierRead(t, tn.ServiceAddress())
	ask := func(key string, release ...uint64) *storepb.BatchGetStagedResponse {
		t.Helper()
		resp, err := rd.BatchGetStaged(ctx, &storepb.BatchGetStagedRequest{TierId: tn.Tier().ID(), Keys: []string{key},
			Versions: []uint64{versions[key]}, Sizes: []uint64{1 << 20}, Release: release})
		if err != nil || resp.Codes[0] != 0 {
			t.Fatalf("staged read of %s: %v %v", key, resp, err)
		}
		return resp
	}
	ra := ask("a")
	rb := ask("b", ra.BatchId)
	if st := tn.Stats(); st.StagingUsed != 1<<20 || st.StagingReleased != 1 {
		t.Fatalf("a read carrying a's batch back: %d bytes held, %d released; want b's 1 MiB held, a released", st.StagingUsed, st.StagingReleased)
	}
	rc := ask("c")
	if _, err := rd.ReleaseStaged(ctx, &storepb.ReleaseStagedBatch{BatchId: rb.BatchId, More: []uint64{rc.BatchId}}); err != nil {
		t.Fatal(err)
	}
	if st := tn.Stats(); st.StagingUsed != 0 || st.StagingReleased != 3 {
		t.Fatalf("after releasing b and c in one call: %d bytes held, %d released", st.StagingUsed, st.StagingReleased)
	}

	// The client's side, with a delay no read beats by chance: each get
	// carries the one before it back; the last goes when the client
	// closes.
	store.SetReleaseDelay(time.Hour)
	defer store.SetReleaseDelay(2 * time.Millisecond)
	rdr := c.client(0)
	for i, k := range []string{"a", "b", "c"} {
		got, err := rdr.Get(ctx, k)
		if err != nil || !bytes.Equal(got, vals[k]) {
			t.Fatalf("get %s: %v", k, err)
		}
		if st := tn.Stats(); st.StagingUsed != 1<<20 || st.StagingReleased != 3+uint64(i) {
			t.Fatalf("after get %d (%s): %d bytes held, %d released; want the last get's 1 MiB held, %d released", i, k, st.StagingUsed, st.StagingReleased, 3+i)
		}
	}
	if err := rdr.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if st := tn.Stats(); st.StagingUsed != 0 || st.StagingReleased != 6 {
		t.Fatalf("after the reader closed: %d bytes held, %d released; want none held", st.StagingUsed, st.StagingReleased)
	}
}

// A record of several read chunks is read as a stream: the reader moves
// each chunk while the node reads the next; a batch with such a record
// goes as one stream, its small records too, and returns them exact.
func TestStagingStreamsLargeRecords(t *testing.T) {
	c := startMaster(t, master.Config{PromoteAfter: -1})
	_, tn := c.tierNodeWith(32<<20, store.TierConfig{Dir: t.TempDir(), Capacity: 128 << 20, StagingSize: 16 << 20})
	cl := c.client(0)
	vals := map[string][]byte{"big": value(5<<20+4096+7, 3), "small": value(1<<20, 4)}
	offloadAll(t, c, cl, vals)
	got, errs := cl.BatchGet(context.Background(), []string{"big", "small"})
	for i, k := range []string{"big", "small"} {
		if errs[i] != nil || !bytes.Equal(got[i], vals[k]) {
			t.Fatalf("get %s: %v (equal %v)", k, errs[i], bytes.Equal(got[i], vals[k]))
		}
	}
	if moves, keys := store.StreamCounts(cl); moves < 3 || keys != 2 {
		t.Fatalf("%d chunk transfers while the node read, %d keys read so; want at least 3 and 2", moves, keys)
	}
	waitFor(t, "the read handed back", 5*time.Second, func() bool { return tn.Stats().StagingUsed == 0 })
}

// A streamed record whose last chunk fails its checksum: its earlier
// chunks reached the reader's buffer, but the get fails naming the
// checksum (never the bytes), the record is dropped, and a get after it
// finds nothing.
func TestStagingStreamCorruptLastChunk(t *testing.T) {
	c := startMaster(t, master.Config{PromoteAfter: -1})
	dir := t.TempDir()
	c.tierNodeWith(32<<20, store.TierConfig{Dir: dir, Capacity: 128 << 20, StagingSize: 16 << 20})
	cl := c.client(0)
	n := 6 << 20
	offloadAll(t, c, cl, map[string][]byte{"v": value(n, 5)})
	files, _ := filepath.Glob(filepath.Join(dir, "*.mct"))
	if len(files) != 1 {
		t.Fatalf("data files %v", files)
	}
	f, err := os.OpenFile(files[0], os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	// The value starts on the block after its header (MCT2).
	if _, err := f.WriteAt([]byte{0xff, 0x00, 0xff}, 4096+int64(n)-100); err != nil {
		t.Fatal(err)
	}
	f.Close()
	ctx := context.Background()
	buf, err := cl.RegisterBuffer(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	_, err = cl.GetInto(ctx, "v", store.Slice{Buf: buf, Len: n})
	if !errors.Is(err, store.ErrObjectNotFound) || !strings.Contains(err.Error(), "checksum") {
		t.Fatalf("get of a record corrupt in its last chunk: %v, want OBJECT_NOT_FOUND naming the checksum", err)
	}
	if moves, keys := store.StreamCounts(cl); moves == 0 || keys != 0 {
		t.Fatalf("%d chunk transfers while the node read, %d keys declared read: want some, and none", moves, keys)
	}
	if _, err := cl.Get(ctx, "v"); !errors.Is(err, store.ErrObjectNotFound) {
		t.Fatalf("second get: %v", err)
	}
}

// A node of a build before the stream (BatchGetStagedStream
// unimplemented) still serves large records to a reader of this build:
// it reads them whole.
func TestStagingStreamOlderNode(t *testing.T) {
	store.SetNoStagedStream(true)
	t.Cleanup(func() { store.SetNoStagedStream(false) })
	c := startMaster(t, master.Config{PromoteAfter: -1})
	c.tierNodeWith(32<<20, store.TierConfig{Dir: t.TempDir(), Capacity: 128 << 20, StagingSize: 16 << 20})
	cl := c.client(0)
	v := value(5<<20, 6)
	offloadAll(t, c, cl, map[string][]byte{"big": v})
	got, err := cl.Get(context.Background(), "big")
	if err != nil || !bytes.Equal(got, v) {
		t.Fatalf("get from a node without the stream: %v (equal %v)", err, bytes.Equal(got, v))
	}
	if moves, _ := store.StreamCounts(cl); moves != 0 {
		t.Fatalf("%d chunks moved from a node without the stream", moves)
	}
}

// A node SIGKILLed while readers stream its large records (a reader
// each, so every read streams): a get returns the exact bytes or fails,
// never bytes moved before the node died that its checksum had not
// vouched for.
func TestStagingStreamNodeKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("runs child node processes")
	}
	c := startMaster(t, master.Config{PromoteAfter: -1})
	env := "MC_STORE_TEST_TIER_DIR=" + t.TempDir()
	child, _ := startChildNode(t, c.addr, env)
	waitFor(t, "the child's tier to attach", 10*time.Second, func() bool { ts := c.m.Tiers(); return len(ts) == 1 && ts[0].Online })
	cl := c.client(0)
	vals := map[string][]byte{}
	var keys []string
	for i := range 3 {
		k := fmt.Sprintf("s%d", i)
		keys = append(keys, k)
		vals[k] = value(6<<20+i*4096, byte(60+i))
	}
	offloadAll(t, c, cl, vals)
	var stop atomic.Bool
	var served, failed atomic.Int64
	var wg sync.WaitGroup
	readers := make([]*store.Client, 2)
	for g := range readers {
		readers[g] = c.client(0)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; !stop.Load(); i++ {
				k := keys[i%len(keys)]
				got, err := readers[g].Get(context.Background(), k)
				switch {
				case err == nil && !bytes.Equal(got, vals[k]):
					t.Errorf("get %s while its node was killed: wrong bytes", k)
				case err == nil:
					served.Add(1)
				default:
					failed.Add(1)
				}
			}
		}()
	}
	waitFor(t, "the readers to be served", 20*time.Second, func() bool { return served.Load() >= 6 })
	child.Process.Kill()
	child.Wait()
	time.Sleep(300 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	var moves uint64
	for _, r := range readers {
		m, _ := store.StreamCounts(r)
		moves += m
	}
	t.Logf("%d gets served exact, %d failed; %d chunks moved while the node read", served.Load(), failed.Load(), moves)
	if failed.Load() == 0 || moves == 0 {
		t.Fatalf("%d gets failed with the node dead, %d chunks streamed: the test shows nothing", failed.Load(), moves)
	}
}
