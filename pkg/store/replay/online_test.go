package replay

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine"
	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/master"
)

var quiet = slog.New(slog.DiscardHandler)

// startStore runs a master and a node with a segment of segBytes on
// loopback, and returns a pure client of it.
func startStore(t *testing.T, cfg master.Config, segBytes uint64) (*store.Client, *master.Master) {
	t.Helper()
	m, err := master.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	m.Start()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := master.Serve(m, lis)
	t.Cleanup(func() { srv.Stop(); m.Close() })
	ecfg := engine.Config{BindAddress: "127.0.0.1", HandshakeAddr: "127.0.0.1:0"}
	ctx := context.Background()
	node, err := store.New(ctx, store.Config{Master: lis.Addr().String(), EngineConfig: ecfg, SegmentSize: segBytes, StagingSize: 4 << 20, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { node.Close(ctx) })
	c, err := store.New(ctx, store.Config{Master: lis.Addr().String(), EngineConfig: ecfg, StagingSize: 8 << 20, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(ctx) })
	return c, m
}

// A store sized to C blocks gives the offline hit ratio at C, within 2
// points. Leases are short (a replayed read is over before the next
// request) and the watermark loop is off, so the store holds exactly C
// blocks and evicts only inside puts, as the offline replay does.
func TestOnlineMatchesOffline(t *testing.T) {
	tr := loadTrace(t, "conversation_trace.jsonl")
	const n, capacity, block = 2500, 5000, 4096
	tr.Requests, tr.Blocks = tr.Requests[:n], tr.Blocks[:n]
	off, err := Run(tr, "lru", capacity)
	if err != nil {
		t.Fatal(err)
	}
	c, m := startStore(t, master.Config{
		KVLeaseTTL: 200 * time.Millisecond, HighWatermark: 1, EvictionInterval: time.Hour, Logger: quiet,
	}, capacity*block)
	on, err := Online(context.Background(), c, tr, OnlineConfig{BlockBytes: block, Label: "lru", CapacityBlocks: capacity})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("offline %.4f (prefix %.4f), online %.4f (prefix %.4f); %d put failures, %d get failures, %.3f GB/s",
		off.HitRatio, off.PrefixHitRatio, on.HitRatio, on.PrefixHitRatio, on.PutFailures, on.GetFailures, on.GBPerSec)
	if on.Blocks != off.Blocks || on.Requests != n {
		t.Fatalf("online counted %d blocks in %d requests, offline %d", on.Blocks, on.Requests, off.Blocks)
	}
	if math.Abs(on.HitRatio-off.HitRatio) > 0.02 {
		t.Errorf("online hit ratio %.4f, offline %.4f: more than 2 points apart", on.HitRatio, off.HitRatio)
	}
	if on.BytesWritten != uint64(on.Blocks-on.HitBlocks-on.PutFailures)*block || on.BytesRead == 0 {
		t.Errorf("bytes moved: read %d, written %d", on.BytesRead, on.BytesWritten)
	}
	if s := m.Stats(); s.Keys > capacity || s.EvictedKeys == 0 {
		t.Errorf("store holds %d keys (capacity %d), evicted %d", s.Keys, capacity, s.EvictedKeys)
	}
}

// Online against a store whose node has a disk tier: hits split into
// DRAM and disk, the disk turning misses of DRAM alone into hits.
func TestOnlineWithDiskTier(t *testing.T) {
	tr := loadTrace(t, "conversation_trace.jsonl")
	const n, capacity, ssd, block = 1500, 1000, 3000, 4096
	tr.Requests, tr.Blocks = tr.Requests[:n], tr.Blocks[:n]
	dramOnly, _ := Run(tr, "lru", capacity)
	off, _ := RunTiered(tr, "lru", capacity, ssd, 2)
	m, err := master.New(master.Config{KVLeaseTTL: 200 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	m.Start()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := master.Serve(m, lis)
	t.Cleanup(func() { srv.Stop(); m.Close() })
	ecfg := engine.Config{BindAddress: "127.0.0.1", HandshakeAddr: "127.0.0.1:0"}
	ctx := context.Background()
	node, err := store.New(ctx, store.Config{Master: lis.Addr().String(), EngineConfig: ecfg, SegmentSize: capacity * block, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { node.Close(ctx) })
	tn, err := store.StartTier(ctx, node, store.TierConfig{Dir: t.TempDir(), Capacity: ssd * 2 * block, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tn.Close() })
	c, err := store.New(ctx, store.Config{Master: lis.Addr().String(), EngineConfig: ecfg, StagingSize: 8 << 20, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(ctx) })
	for deadline := time.Now().Add(5 * time.Second); len(m.Tiers()) == 0 || !m.Tiers()[0].Online; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("tier not attached")
		}
	}
	hits := func(context.Context) (uint64, uint64, error) {
		tt := m.TierTotals()
		return tt.MemHits, tt.DiskHits, nil
	}
	on, err := Online(ctx, c, tr, OnlineConfig{BlockBytes: block, Label: "lru", CapacityBlocks: capacity, SSDCapacityBlocks: ssd, PromoteAfter: 2, TierHits: hits})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("DRAM only (offline) %.4f; two tiers offline %.4f (DRAM %.4f, disk %.4f); online %.4f (DRAM %.4f, disk %.4f), %d put failures, %d get failures",
		dramOnly.HitRatio, off.HitRatio, off.DRAMHitRatio, off.DiskHitRatio, on.HitRatio, on.DRAMHitRatio, on.DiskHitRatio, on.PutFailures, on.GetFailures)
	if on.DiskHitBlocks == 0 || on.DRAMHitBlocks == 0 {
		t.Fatalf("online split: %d DRAM, %d disk hits", on.DRAMHitBlocks, on.DiskHitBlocks)
	}
	// The master counts a hit per answer, as mooncake_master does. A get
	// of a disk record that the node dropped between the master's answer
	// and the reader's direct read asks the master once more: a second
	// answer, a second hit counted for one get (CI saw 17 such in 3,267
	// hits). Up to 2% more than the client's hits is that, plus as many
	// as the gets that found their record gone (on a loaded machine the
	// churn that fails gets also sends others back to the master: make
	// test saw 149 more in 3,655 hits with 395 such failures); more would
	// be a miscount.
	if got := on.DRAMHitBlocks + on.DiskHitBlocks; got < on.HitBlocks-on.GetFailures || got > on.HitBlocks+on.HitBlocks/50+on.GetFailures {
		t.Fatalf("split %d + %d does not account for %d hits (%d gone before the read)", on.DRAMHitBlocks, on.DiskHitBlocks, on.HitBlocks, on.GetFailures)
	}
	if on.HitRatio <= dramOnly.HitRatio+0.02 {
		t.Fatalf("online with a disk tier %.4f, DRAM alone (offline) %.4f: the disk tier should add hits", on.HitRatio, dramOnly.HitRatio)
	}
}

// Each online run has keys of its own and removes them when it ends: a
// second run against the same store finds none of the first's (issue
// 35.4: the second of two runs read the first's keys, hit ratio 1.000
// instead of 0.080, and 7,814 replay/* keys were left behind), and an
// interrupted run leaves nothing either.
func TestOnlineRunsAreIndependent(t *testing.T) {
	tr := loadTrace(t, "conversation_trace.jsonl")
	const n, block = 400, 4096
	tr.Requests, tr.Blocks = tr.Requests[:n], tr.Blocks[:n]
	c, m := startStore(t, master.Config{Logger: quiet}, 64<<20) // holds every block: no eviction
	ctx := context.Background()
	first, err := Online(ctx, c, tr, OnlineConfig{BlockBytes: block})
	if err != nil {
		t.Fatal(err)
	}
	if k := m.Stats().Keys; k != 0 || first.KeysRemoved == 0 || !strings.HasPrefix(first.KeyPrefix, "replay/") {
		t.Fatalf("after the first run the store holds %d keys; it removed %d under %q", k, first.KeysRemoved, first.KeyPrefix)
	}
	second, err := Online(ctx, c, tr, OnlineConfig{BlockBytes: block})
	if err != nil {
		t.Fatal(err)
	}
	if second.HitRatio != first.HitRatio || second.KeyPrefix == first.KeyPrefix {
		t.Fatalf("second run: hit ratio %.4f under %q, first %.4f under %q: want the same figures under another prefix",
			second.HitRatio, second.KeyPrefix, first.HitRatio, first.KeyPrefix)
	}
	if second.KeysRemoved != first.KeysRemoved || m.Stats().Keys != 0 {
		t.Fatalf("second run removed %d keys (first %d); %d left", second.KeysRemoved, first.KeysRemoved, m.Stats().Keys)
	}
	cctx, cancel := context.WithCancel(ctx)
	calls := 0
	_, err = Online(cctx, c, tr, OnlineConfig{BlockBytes: block, TierHits: func(context.Context) (uint64, uint64, error) {
		if calls++; calls == 1 {
			go func() { time.Sleep(20 * time.Millisecond); cancel() }()
		}
		return 0, 0, nil
	}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("%v, want the run interrupted", err)
	}
	if k := m.Stats().Keys; k != 0 {
		t.Fatalf("an interrupted run left %d keys", k)
	}
}
