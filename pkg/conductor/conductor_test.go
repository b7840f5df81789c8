package conductor

import (
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/trace"
)

// fixedDecode is a DecodeView with set loads.
type fixedDecode struct{ now, later []DecodeLoad }

func (f *fixedDecode) Decodes() int                                  { return len(f.now) }
func (f *fixedDecode) Load(d int) DecodeLoad                         { return f.now[d] }
func (f *fixedDecode) PredictLoad(d int, _ time.Duration) DecodeLoad { return f.later[d] }

// simpleCost: prefill 1 ms per token, no base or attention; transfer
// 10 ms per block; decode step 10 ms + 1 ms per sequence.
func simpleCost() CostModel {
	return CostModel{PrefillTokensPerSec: 1000, DecodeBase: 10 * time.Millisecond, DecodePerSeq: time.Millisecond,
		BlockBytes: 1e7, LinkGBps: 1, DecodeKVTokens: 0}
}

func ids(n int, from int64) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = from + int64(i)
	}
	return out
}

func newConductor(t *testing.T, sched Scheduler, rej Rejection, threshold float64, caches [][]int64, dec *fixedDecode) *Conductor {
	t.Helper()
	var ps []*PrefillInstance
	for _, held := range caches {
		c, _ := NewCache(0, "lru")
		c.Use(held)
		ps = append(ps, &PrefillInstance{Cache: c})
	}
	if dec == nil {
		dec = &fixedDecode{now: []DecodeLoad{{}}, later: []DecodeLoad{{}}}
	}
	c, err := New(Config{Scheduler: sched, Rejection: rej, TTFTSLO: 10 * time.Second, TBTSLO: 100 * time.Millisecond,
		BalancingThreshold: threshold, Cost: simpleCost()}, ps, dec)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestCostModelUnits(t *testing.T) {
	c := simpleCost()
	if got := c.Prefill(1000, 5000); got != time.Second {
		t.Fatalf("prefill of 1000 tokens at 1000/s: %s", got)
	}
	if got := c.Transfer(3); got != 30*time.Millisecond {
		t.Fatalf("3 blocks of 10 MB at 1 GB/s: %s", got)
	}
	if got := c.DecodeStep(5, 0); got != 15*time.Millisecond {
		t.Fatalf("decode step of 5: %s", got)
	}
	if got := c.MaxBatchFor(100*time.Millisecond, 0); got != 90 {
		t.Fatalf("max batch for 100 ms: %d", got)
	}
	d := DefaultCostModel()
	if d.BlockBytes != 160<<20 {
		t.Fatalf("default block: %d bytes, want 160 MiB (512 tokens × 320 KiB)", d.BlockBytes)
	}
	if err := (CostModel{}).Check(); err == nil {
		t.Fatal("zero cost model accepted")
	}
}

// Under the threshold an instance prefills from its own prefix even when
// another holds more; above it, the remote prefix is fetched.
func TestAlgorithm1Threshold(t *testing.T) {
	req := Request{Tokens: 10 * 512, Blocks: ids(10, 0)}
	caches := [][]int64{ids(4, 0), ids(6, 0)} // instance 1 holds the longer prefix
	// Instance 1 is busy for a long time, so reusing its prefix locally
	// is slow; fetching it to idle instance 0 is the better plan.
	c := newConductor(t, KVCacheCentric, NoRejection, 1.4, caches, nil)
	c.Prefill[1].BusyUntil = time.Hour
	d := c.Schedule(0, req)
	if d.Prefill != 0 || d.Source != 1 || d.UsedPrefix != 6 || d.LocalPrefix != 4 || d.Migrated() != 2 {
		t.Fatalf("above the threshold (6 >= 1.4×4): %+v, want instance 0 fetching 2 blocks from 1", d)
	}
	if !c.Prefill[0].Cache.Has(5) {
		t.Fatal("fetched blocks were not kept by the instance that fetched them (hot-spot migration)")
	}
	c = newConductor(t, KVCacheCentric, NoRejection, 2, caches, nil)
	c.Prefill[1].BusyUntil = time.Hour
	d = c.Schedule(0, req)
	if d.Prefill != 0 || d.Source != -1 || d.UsedPrefix != 4 {
		t.Fatalf("under the threshold (6 < 2×4): %+v, want a local prefill of instance 0", d)
	}
	// With both idle, the longer local prefix wins without any transfer.
	c = newConductor(t, KVCacheCentric, NoRejection, 1.4, caches, nil)
	if d = c.Schedule(0, req); d.Prefill != 1 || d.Migrated() != 0 {
		t.Fatalf("idle instances: %+v, want instance 1 reusing its own prefix", d)
	}
	// A transfer slower than recomputing is not taken.
	c = newConductor(t, KVCacheCentric, NoRejection, 1, [][]int64{nil, ids(10, 0)}, nil)
	c.cfg.Cost.LinkGBps = 0.001
	c.Prefill[1].BusyUntil = time.Hour
	if d = c.Schedule(0, req); d.Prefill != 0 || d.Source != -1 {
		t.Fatalf("slow link: %+v, want a recompute on instance 0", d)
	}
}

func TestSchedulers(t *testing.T) {
	req := Request{Tokens: 4 * 512, Blocks: ids(4, 0)}
	caches := [][]int64{nil, ids(4, 0), nil}
	c := newConductor(t, LoadBalancing, NoRejection, 1.5, caches, nil)
	c.Prefill[0].BusyUntil, c.Prefill[1].BusyUntil, c.Prefill[2].BusyUntil = 3*time.Second, 2*time.Second, time.Second
	if d := c.Schedule(0, req); d.Prefill != 2 {
		t.Fatalf("load-balancing chose %d, want the shortest queue (2)", d.Prefill)
	}
	c = newConductor(t, CacheAware, NoRejection, 1.5, caches, nil)
	if d := c.Schedule(0, req); d.Prefill != 1 || d.UsedPrefix != 4 {
		t.Fatalf("cache-aware chose %+v, want the holder of the prefix (1)", d)
	}
	// Cache-aware weighs the queue: a long one outweighs the hit.
	c = newConductor(t, CacheAware, NoRejection, 1.5, caches, nil)
	c.Prefill[1].BusyUntil = time.Minute
	if d := c.Schedule(0, req); d.Prefill == 1 {
		t.Fatalf("cache-aware chose the holder behind a minute of queue: %+v", d)
	}
	// Random is seeded: the same seed, the same choices.
	pick := func() []int {
		c := newConductor(t, Random, NoRejection, 1.5, [][]int64{nil, nil, nil, nil}, nil)
		var out []int
		for range 20 {
			out = append(out, c.Schedule(0, req).Prefill)
		}
		return out
	}
	if a, b := pick(), pick(); !reflect.DeepEqual(a, b) {
		t.Fatalf("random with one seed: %v then %v", a, b)
	}
}

func TestRejectionModes(t *testing.T) {
	req := Request{Tokens: 512, OutTokens: 10, Blocks: ids(1, 0)}
	// Decode holds 85 sequences now (step 95 ms: one more fits), but 95
	// are predicted by the time the request gets there.
	dec := &fixedDecode{now: []DecodeLoad{{Batch: 85}}, later: []DecodeLoad{{Batch: 95}}}
	for _, c := range []struct {
		rej    Rejection
		reject bool
	}{{NoRejection, false}, {EarlyRejection, false}, {PredictedRejection, true}} {
		cd := newConductor(t, LoadBalancing, c.rej, 1.5, [][]int64{nil}, dec)
		d := cd.Schedule(0, req)
		if d.Reject != c.reject {
			t.Errorf("%s: reject %v (%s), want %v", c.rej, d.Reject, d.Why, c.reject)
		}
		if d.Reject && !strings.Contains(d.Why, "predicted") {
			t.Errorf("%s: reason %q does not say it was predicted", c.rej, d.Why)
		}
		// A rejected request leaves no trace in the queue or cache.
		if d.Reject && (cd.Prefill[0].BusyUntil != 0 || cd.Prefill[0].Cache.Len() != 0) {
			t.Errorf("%s: rejected request changed state", c.rej)
		}
	}
	// TTFT over its SLO: early and predicted refuse, none admits.
	busy := newConductor(t, LoadBalancing, EarlyRejection, 1.5, [][]int64{nil}, nil)
	busy.Prefill[0].BusyUntil = time.Minute
	if d := busy.Schedule(0, req); !d.Reject || !strings.Contains(d.Why, "TTFT") {
		t.Fatalf("TTFT over the SLO: %+v", d)
	}
}

// Events at one time run in creation order, and a decode step ends after
// its prefill and transfer: a request's TTFT and TBT follow the cost
// model exactly on an idle cluster.
func TestSimEventOrderAndTimes(t *testing.T) {
	reqs := []trace.Request{
		{Timestamp: 0, InputLength: 1000, OutputLength: 3, HashIDs: []int64{1, 2}},
		{Timestamp: 0, InputLength: 1000, OutputLength: 1, HashIDs: []int64{1, 2}},
	}
	cost := simpleCost()
	res, err := Simulate(SimConfig{Prefill: 1, Decode: 1, Scheduler: LoadBalancing, Rejection: NoRejection,
		TTFTSLO: 10 * time.Second, TBTSLO: time.Second, Cost: cost}, reqs)
	if err != nil {
		t.Fatal(err)
	}
	// First: prefill 1 s. Second queues behind it and reuses both blocks
	// (cached by the first): 0 uncached tokens, prefill 0 s, done at 1 s.
	if res.Accepted != 2 || res.TTFTP50 != 1 || res.TTFTP99 != 1 {
		t.Fatalf("%+v: want both done with TTFT 1 s", res)
	}
	// Decode: 2 tokens at one step of 11 ms each.
	if res.TBTP50 != 0.011 {
		t.Fatalf("TBT %g, want 0.011", res.TBTP50)
	}
	if res.CacheHitRatio != 0.5 {
		t.Fatalf("hit ratio %g, want 0.5 (2 of 4 blocks)", res.CacheHitRatio)
	}
}

func sharedTrace(t testing.TB, name string) []trace.Request {
	path := "../../../shared/traces/" + name
	if _, err := os.Stat(path); err != nil {
		t.Skipf("shared traces not found at %s: %v", path, err)
	}
	reqs, err := trace.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return reqs
}

// The same inputs give the same output; and the paper's TTFT ordering
// holds on the conversation trace at its own pace.
func TestDeterministicAndOrdering(t *testing.T) {
	reqs := sharedTrace(t, "conversation_trace.jsonl")
	run := func(s Scheduler) Result {
		r, err := Simulate(SimConfig{Prefill: 4, Decode: 2, Scheduler: s, Rejection: NoRejection, TTFTSLO: 10 * time.Second,
			TBTSLO: 100 * time.Millisecond, CacheBlocks: 20000, Cost: DefaultCostModel(), Seed: 7}, reqs)
		if err != nil {
			t.Fatal(err)
		}
		r.Load = nil
		return r
	}
	a, b := run(Random), run(Random)
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("two runs differ:\n%+v\n%+v", a, b)
	}
	var p50 []float64
	for _, s := range Schedulers {
		p50 = append(p50, run(s).TTFTP50)
	}
	for i := 1; i < len(p50); i++ {
		if p50[i] >= p50[i-1] {
			t.Fatalf("TTFT p50 by scheduler %v: want strictly decreasing random > load-balancing > cache-aware > kvcache-centric", p50)
		}
	}
}

func BenchmarkSimulateConversation(b *testing.B) {
	reqs := sharedTrace(b, "conversation_trace.jsonl")
	for i := 0; i < b.N; i++ {
		if _, err := Simulate(SimConfig{Prefill: 4, Decode: 2, Scheduler: KVCacheCentric, Rejection: PredictedRejection, TTFTSLO: 10 * time.Second,
			TBTSLO: 100 * time.Millisecond, CacheBlocks: 20000, Cost: DefaultCostModel()}, reqs); err != nil {
			b.Fatal(err)
		}
	}
}
