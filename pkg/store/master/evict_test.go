package master

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/store"
)

// evictFixture is a 100 MiB segment in 4 MiB regions, filled by one
// writer with 1 MiB objects key000, key001, ... in put order.
func evictFixture(t *testing.T, cfg Config, n int, rc ...store.ReplicateConfig) (*Master, *fakeClock) {
	t.Helper()
	cfg.RegionSize = 4 * MiB
	m, clk := newTestMaster(t, cfg)
	mount(t, m, "node", "seg", "127.0.0.1", 0, 100*MiB)
	for i := range n {
		put(t, m, "w", fmt.Sprintf("key%03d", i), MiB, rc...)
	}
	return m, clk
}

func present(m *Master, keys ...string) []bool {
	out := make([]bool, len(keys))
	for i, r := range m.BatchQuery(keys) {
		out[i] = r.Err == nil
	}
	return out
}

func keyRange(from, to int) []string {
	var out []string
	for i := from; i < to; i++ {
		out = append(out, fmt.Sprintf("key%03d", i))
	}
	return out
}

func TestEvictBelowWatermark(t *testing.T) {
	m, _ := evictFixture(t, Config{}, 89)
	if f := m.EvictIfNeeded(); f != 0 {
		t.Fatalf("evicted %d bytes at 89%% used (watermark 90%%)", f)
	}
	if m.Stats().Keys != 89 || metric(t, m, "master_attempted_evictions_total") != 0 {
		t.Fatalf("eviction ran below the watermark: %+v", m.Stats())
	}
}

func TestEvictLRUFirst(t *testing.T) {
	m, clk := evictFixture(t, Config{}, 95)
	// Read the ten oldest: they become the most recently used.
	for _, k := range keyRange(0, 10) {
		if r := get(m, k); r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	clk.Advance(DefaultKVLeaseTTL)
	freed := m.EvictIfNeeded()
	// 95% used, watermark 90%, ratio 5%: max(5%, 95-90+5 %) = 10 MiB.
	if freed < 10*MiB {
		t.Fatalf("freed %d bytes, want at least 10 MiB", freed)
	}
	n := int(freed / MiB)
	if s := m.Stats(); s.Keys != 95-n || s.Used != uint64(95-n)*MiB {
		t.Fatalf("after evicting %d: %+v", n, s)
	}
	for i, ok := range present(m, keyRange(0, 10)...) {
		if !ok {
			t.Errorf("key%03d, read after the others, was evicted", i)
		}
	}
	for i, ok := range present(m, keyRange(10, 95)...) {
		if want := i >= n; ok != want {
			t.Errorf("key%03d present=%v, want %v: %d objects should go, the least recently used first", i+10, ok, want, n)
		}
	}
	if got := metric(t, m, "master_evicted_key_count"); got != float64(n) {
		t.Errorf("master_evicted_key_count %v, want %d", got, n)
	}
	if got := metric(t, m, "master_evicted_size_bytes"); got != float64(freed) {
		t.Errorf("master_evicted_size_bytes %v, want %d", got, freed)
	}
	if metric(t, m, "master_attempted_evictions_total") != 1 || metric(t, m, "master_successful_evictions_total") != 1 {
		t.Error("eviction round metrics did not move")
	}
	mustInvariants(t, m)
}

func TestEvictSkipsLeasedAndHardPinned(t *testing.T) {
	m, _ := evictFixture(t, Config{}, 95, store.ReplicateConfig{ReplicaNum: 1, HardPin: true})
	if f := m.EvictIfNeeded(); f != 0 || m.Stats().Keys != 95 {
		t.Fatalf("evicted %d bytes of hard-pinned objects", f)
	}
	if metric(t, m, "master_attempted_evictions_total") != 1 || metric(t, m, "master_successful_evictions_total") != 0 {
		t.Fatal("an eviction round that found nothing must count as attempted, not successful")
	}

	m, clk := evictFixture(t, Config{}, 95)
	for _, k := range keyRange(0, 95) {
		get(m, k)
	}
	if f := m.EvictIfNeeded(); f != 0 {
		t.Fatalf("evicted %d bytes of leased objects", f)
	}
	clk.Advance(DefaultKVLeaseTTL)
	if f := m.EvictIfNeeded(); f < 10*MiB {
		t.Fatalf("evicted %d bytes once the leases ended", f)
	}
	mustInvariants(t, m)
}

func TestEvictSoftPinned(t *testing.T) {
	soft := store.ReplicateConfig{ReplicaNum: 1, SoftPin: true}
	fill := func(cfg Config) (*Master, *fakeClock) {
		// key090..key094 unpinned, then key000..key089 soft-pinned: the
		// unpinned ones first, since an unpinned put that took the store
		// over the watermark with only soft-pinned objects left would be
		// refused (TestPutOverWatermarkWithRestUnevictable).
		cfg.RegionSize = 4 * MiB
		m, clk := newTestMaster(t, cfg)
		mount(t, m, "node", "seg", "127.0.0.1", 0, 100*MiB)
		for i := 90; i < 95; i++ {
			put(t, m, "w", fmt.Sprintf("key%03d", i), MiB)
		}
		for i := range 90 {
			put(t, m, "w", fmt.Sprintf("key%03d", i), MiB, soft)
		}
		return m, clk
	}
	// Enough unpinned objects: soft pins are kept.
	m, _ := evictFixture(t, Config{}, 40, soft)
	for i := 40; i < 95; i++ {
		put(t, m, "w", fmt.Sprintf("key%03d", i), MiB)
	}
	if m.Stats().SoftPinned != 40 || metric(t, m, "master_soft_pin_key_count") != 40 {
		t.Fatalf("soft-pinned count: %+v", m.Stats())
	}
	m.EvictIfNeeded()
	if slices.Contains(present(m, keyRange(0, 40)...), false) {
		t.Fatal("a soft-pinned object was evicted while unpinned ones were left")
	}

	// Not enough: the second pass takes soft-pinned ones.
	m, _ = fill(Config{})
	if f := m.EvictIfNeeded(); f < 10*MiB {
		t.Fatalf("freed %d, want 10 MiB with soft-pinned objects evictable", f)
	}
	if slices.Contains(present(m, keyRange(90, 95)...), true) {
		t.Fatal("unpinned objects survived while soft-pinned ones were evicted")
	}
	mustInvariants(t, m)

	// Never when --allow_evict_soft_pinned_objects=false.
	no := false
	m, clk := fill(Config{AllowEvictSoftPinned: &no})
	if f := m.EvictIfNeeded(); f != 5*MiB {
		t.Fatalf("freed %d, want only the 5 unpinned objects", f)
	}
	if slices.Contains(present(m, keyRange(0, 90)...), false) {
		t.Fatal("a soft-pinned object was evicted with allow_evict_soft_pinned_objects=false")
	}
	// Until the pin's TTL (default 30 min) has passed.
	// 90% used now: the watermark is reached again.
	clk.Advance(DefaultSoftPinTTL)
	if f := m.EvictIfNeeded(); f < 5*MiB {
		t.Fatalf("freed %d once the soft pins expired", f)
	}
	mustInvariants(t, m)
}

func TestSoftPinTTLCapped(t *testing.T) {
	no := false
	cfg := Config{AllowEvictSoftPinned: &no, MaxSoftPinTTL: time.Minute, DefaultSoftPinTTL: time.Minute}
	m, clk := evictFixture(t, cfg, 95, store.ReplicateConfig{ReplicaNum: 1, SoftPin: true, SoftPinTTL: time.Hour})
	if f := m.EvictIfNeeded(); f != 0 {
		t.Fatalf("evicted %d bytes of soft-pinned objects", f)
	}
	clk.Advance(time.Minute)
	if f := m.EvictIfNeeded(); f < 10*MiB {
		t.Fatalf("freed %d: a 1 h soft pin must be capped at max_kv_soft_pin_ttl (1 min)", f)
	}
}

// TestEvictGlobalLRUModel puts, reads and evicts at random and checks
// that each eviction round takes exactly the least recently used
// evictable objects of the whole master, as a slice model orders them.
func TestEvictGlobalLRUModel(t *testing.T) {
	m, clk := newTestMaster(t, Config{RegionSize: 4 * MiB, KVLeaseTTL: time.Millisecond})
	mount(t, m, "node", "seg", "127.0.0.1", 0, 100*MiB)
	rng := rand.New(rand.NewPCG(3, 4))
	var model []string // least recently used first
	touch := func(k string) {
		model = slices.DeleteFunc(model, func(x string) bool { return x == k })
		model = append(model, k)
	}
	next := 0
	for round := range 200 {
		for m.Stats().Used < 95*MiB {
			k := fmt.Sprintf("k%d", next)
			next++
			put(t, m, "w", k, MiB)
			touch(k)
		}
		for range rng.IntN(20) {
			k := model[rng.IntN(len(model))]
			if get(m, k).Err != nil {
				t.Fatal("get of a live key failed")
			}
			touch(k)
		}
		clk.Advance(time.Millisecond) // leases end
		freed := m.EvictIfNeeded()
		n := int(freed / MiB)
		if n == 0 {
			t.Fatalf("round %d: nothing evicted at %d used", round, m.Stats().Used)
		}
		for i, ok := range present(m, model...) {
			if want := i >= n; ok != want {
				t.Fatalf("round %d: %s (LRU position %d) present=%v, want %v: %d evicted", round, model[i], i, ok, want, n)
			}
		}
		model = model[n:]
	}
	mustInvariants(t, m)
}

// A value above the high watermark on its own would be evicted by the
// next watermark round right after the put acknowledged it (Mooncake
// 3b5a594 does just that): the put is refused up front instead, and
// replicas are capped at what the watermark keeps (issue 35, item 2).
func TestPutAboveWatermarkRefused(t *testing.T) {
	m, _ := newTestMaster(t, Config{})
	mount(t, m, "node", "seg", "127.0.0.1", 0, 64*MiB)
	r := m.BatchPutStart(uuidOf("w"), "", []PutItem{{"w59", 59 * MiB}}, plain())[0]
	wantCode(t, "59 MiB into 64 MiB at watermark 0.90", r.Err, store.NoAvailableHandle)
	for _, want := range []string{"61865984 bytes", "high watermark", "0.90"} {
		if !contains(r.Err.Error(), want) {
			t.Errorf("message %q does not say %q", r.Err, want)
		}
	}
	if s := m.Stats(); s.Keys != 0 || s.Used != 0 {
		t.Errorf("a refused put holds space: %+v", s)
	}
	// Just below the watermark: kept, and kept by the watermark loop.
	put(t, m, "w", "w57", 57*MiB)
	m.EvictIfNeeded()
	wantPresent(t, m, true, "w57")

	// Two segments: two replicas of 59 MiB (92%) would both go; one
	// (46%) stays.
	m, _ = newTestMaster(t, Config{})
	mount(t, m, "node", "s1", "127.0.0.1", 0, 64*MiB)
	mount(t, m, "node2", "s2", "127.0.0.2", 1<<40, 64*MiB)
	reps := put(t, m, "w", "w59", 59*MiB, store.ReplicateConfig{ReplicaNum: 2})
	if len(reps) != 1 {
		t.Errorf("%d replicas of 59 MiB in 128 MiB at watermark 0.90, want 1", len(reps))
	}
	m.EvictIfNeeded()
	wantPresent(t, m, true, "w59")

	// Without eviction nothing is dropped: the put is kept.
	m, _ = newTestMaster(t, Config{EvictionPolicy: policyNone})
	mount(t, m, "node", "seg", "127.0.0.1", 0, 64*MiB)
	put(t, m, "w", "w59", 59*MiB)
	mustInvariants(t, m)
}
