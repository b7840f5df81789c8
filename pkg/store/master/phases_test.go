package master

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/store"
)

// fullPool is a 4 MiB segment in 1 MiB regions: writer a holds two
// regions (a0..a5), writer b the other two (b0..b5), 300 KiB objects, three
// to a region, so no region has room for a fourth.
func fullPool(t *testing.T, cfg Config, ra, rb store.ReplicateConfig) (*Master, *fakeClock) {
	t.Helper()
	m, clk := newTestMaster(t, cfg)
	mount(t, m, "node", "seg", "127.0.0.1", 0, 4*MiB)
	for i := range 6 {
		put(t, m, "a", fmt.Sprint("a", i), 300*KiB, ra)
	}
	for i := range 6 {
		put(t, m, "b", fmt.Sprint("b", i), 300*KiB, rb)
	}
	return m, clk
}

func plain() store.ReplicateConfig { return store.ReplicateConfig{ReplicaNum: 1} }

func names(prefix string, idx ...int) []string {
	out := make([]string, len(idx))
	for i, n := range idx {
		out[i] = fmt.Sprint(prefix, n)
	}
	return out
}

func wantPresent(t *testing.T, m *Master, want bool, keys ...string) {
	t.Helper()
	for i, ok := range present(m, keys...) {
		if ok != want {
			t.Errorf("%s present=%v, want %v", keys[i], ok, want)
		}
	}
}

func TestPhase1EvictsOwnLRU(t *testing.T) {
	m, clk := fullPool(t, Config{}, plain(), plain())
	get(m, "a0") // a0 becomes a's most recently used; a1 its least
	clk.Advance(DefaultKVLeaseTTL)
	put(t, m, "a", "a6", 300*KiB)
	wantPresent(t, m, false, "a1")
	wantPresent(t, m, true, "a0", "a2", "a3", "a4", "a5", "a6")
	wantPresent(t, m, true, names("b", 0, 1, 2, 3, 4, 5)...)
	if got := m.TakeEvictedKeys(uuidOf("a")); !slices.Equal(got, []string{"a1"}) {
		t.Errorf("a is told %v, want [a1]", got)
	}
	if got := m.TakeEvictedKeys(uuidOf("b")); len(got) != 0 {
		t.Errorf("b is told %v, want nothing", got)
	}
	if metric(t, m, "master_eviction_keys_total", "phase", "own_regions") != 1 ||
		metric(t, m, "master_eviction_keys_total", "phase", "other_regions") != 0 ||
		metric(t, m, "master_evicted_key_count") != 1 || metric(t, m, "master_evicted_size_bytes") != float64(300*KiB) {
		t.Error("phase-1 metrics did not count one eviction of 300 KiB")
	}
	if metric(t, m, "master_put_start_alloc_failures_total") != 0 {
		t.Error("a put that eviction made room for counts as an allocation failure")
	}
	mustInvariants(t, m)
}

// A batch adds up its shortage and evicts once for all its items.
func TestPhase1BatchEvictsOnce(t *testing.T) {
	m, clk := fullPool(t, Config{}, plain(), plain())
	// Past the lease TTL: objects put a moment ago would be spared by a
	// first try (TestFreshObjectsEvictedLast).
	clk.Advance(DefaultKVLeaseTTL + time.Second)
	items := []PutItem{{"a6", 300 * KiB}, {"a7", 300 * KiB}, {"a8", 300 * KiB}}
	for i, r := range m.BatchPutStart(uuidOf("a"), "", items, plain()) {
		if r.Err != nil {
			t.Fatalf("item %d: %v", i, r.Err)
		}
	}
	if n := metric(t, m, "master_eviction_rounds_total", "phase", "own_regions"); n != 1 {
		t.Errorf("%v phase-1 rounds for one batch, want 1", n)
	}
	wantPresent(t, m, false, "a0", "a1", "a2")
	wantPresent(t, m, true, "a3", "a4", "a5")
	wantPresent(t, m, true, names("b", 0, 1, 2, 3, 4, 5)...)
	mustInvariants(t, m)
}

// Phase 3: a writer with no region of its own takes a whole region of the
// instance with the lowest reference count, and its owner is told.
func TestPhase3TakesLowestRefCountRegion(t *testing.T) {
	// b's objects are soft-pinned: they weigh more, so a's region goes.
	m, _ := fullPool(t, Config{}, plain(), store.ReplicateConfig{ReplicaNum: 1, SoftPin: true})
	put(t, m, "c", "c0", 300*KiB)
	gone := 0
	for _, ok := range present(m, names("a", 0, 1, 2, 3, 4, 5)...) {
		if !ok {
			gone++
		}
	}
	if gone != 3 {
		t.Errorf("%d of a's objects evicted, want one whole region of 3", gone)
	}
	wantPresent(t, m, true, names("b", 0, 1, 2, 3, 4, 5)...)
	if got := m.TakeEvictedKeys(uuidOf("a")); len(got) != 3 {
		t.Errorf("a is told %v, want its 3 evicted keys", got)
	}
	if metric(t, m, "master_eviction_keys_total", "phase", "other_regions") != 3 {
		t.Error("phase-3 metric did not count 3 keys")
	}
	// c now owns the taken region.
	if own := m.space.ownRegions(uuidOf("c")); len(own) != 1 {
		t.Errorf("c holds %d regions, want 1", len(own))
	}
	mustInvariants(t, m)
}

func TestPhase3PrefersFewerObjects(t *testing.T) {
	m, _ := newTestMaster(t, Config{})
	mount(t, m, "node", "seg", "127.0.0.1", 0, 4*MiB)
	for i := range 6 { // a: two regions of 3
		put(t, m, "a", fmt.Sprint("a", i), 300*KiB)
	}
	for i := range 18 { // b: two regions of 9
		put(t, m, "b", fmt.Sprint("b", i), 100*KiB)
	}
	put(t, m, "c", "c0", 900*KiB)
	if s := m.Stats(); s.Keys != 6-3+18+1 {
		t.Fatalf("%d keys, want a's lighter region gone", s.Keys)
	}
	wantPresent(t, m, true, names("b", 0, 5, 10, 17)...)
	mustInvariants(t, m)
}

func TestHardPinNeverEvicted(t *testing.T) {
	hard := store.ReplicateConfig{ReplicaNum: 1, HardPin: true}
	m, clk := fullPool(t, Config{}, hard, hard)
	clk.Advance(time.Hour)
	for _, w := range []string{"a", "c"} {
		r := m.BatchPutStart(uuidOf(w), "", []PutItem{{w + "-new", 300 * KiB}}, plain())[0]
		wantCode(t, "put into a pool of hard-pinned objects", r.Err, store.NoAvailableHandle)
		if !contains(r.Err.Error(), "nothing evictable") || !contains(r.Err.Error(), "12 hard-pinned") {
			t.Errorf("message %q does not say all 12 are hard-pinned", r.Err)
		}
	}
	if f := m.EvictIfNeeded(); f != 0 {
		t.Errorf("watermark eviction freed %d bytes of hard-pinned objects", f)
	}
	if m.Stats().Keys != 12 {
		t.Error("a hard-pinned object was evicted")
	}
	mustInvariants(t, m)
}

func TestAllLeasedSaysSo(t *testing.T) {
	m, _ := fullPool(t, Config{}, plain(), plain())
	for _, k := range append(names("a", 0, 1, 2, 3, 4, 5), names("b", 0, 1, 2, 3, 4, 5)...) {
		get(m, k)
	}
	r := m.BatchPutStart(uuidOf("c"), "", []PutItem{{"c", 300 * KiB}}, plain())[0]
	wantCode(t, "put while every object is read", r.Err, store.NoAvailableHandle)
	if !contains(r.Err.Error(), "12 leased") {
		t.Errorf("message %q does not say all 12 are leased", r.Err)
	}
	r = m.BatchPutStart(uuidOf("c"), "", []PutItem{{"c", 8 * MiB}}, plain())[0]
	if !contains(r.Err.Error(), "larger than any segment") {
		t.Errorf("message %q does not say the value is larger than any segment", r.Err)
	}
	if metric(t, m, "master_put_start_alloc_failures_total") != 2 {
		t.Error("refused puts are not counted as allocation failures")
	}
}

// Soft-pinned objects go only when nothing else is left, and only when
// allowed; an expired soft pin is no pin.
func TestSoftPinKeptUntilAllowed(t *testing.T) {
	soft := store.ReplicateConfig{ReplicaNum: 1, SoftPin: true}
	no := false
	m, clk := fullPool(t, Config{AllowEvictSoftPinned: &no}, soft, soft)
	r := m.BatchPutStart(uuidOf("a"), "", []PutItem{{"a6", 300 * KiB}}, plain())[0]
	wantCode(t, "put into soft-pinned objects, not allowed", r.Err, store.NoAvailableHandle)
	if !contains(r.Err.Error(), "soft-pinned") {
		t.Errorf("message %q does not name the soft pins", r.Err)
	}
	clk.Advance(DefaultSoftPinTTL + time.Second) // the pins expire
	put(t, m, "a", "a6", 300*KiB)
	wantPresent(t, m, false, "a0")

	// Allowed (the default): plain objects go first, then soft-pinned.
	m, _ = newTestMaster(t, Config{})
	mount(t, m, "node", "seg", "127.0.0.1", 0, 4*MiB)
	for i := range 12 {
		cfg := soft
		if i%2 == 1 {
			cfg = plain()
		}
		put(t, m, "a", fmt.Sprint("a", i), 300*KiB, cfg)
	}
	put(t, m, "a", "n0", 300*KiB)
	wantPresent(t, m, false, "a1")
	wantPresent(t, m, true, "a0", "a2")
	mustInvariants(t, m)
}

// --max-regions-per-instance makes a writer evict its own objects in a
// pool that has plenty of room.
func TestPhase1MaxRegionsForcesEviction(t *testing.T) {
	m, _ := newTestMaster(t, Config{MaxRegionsPerInstance: 2})
	mount(t, m, "node", "seg", "127.0.0.1", 0, 1*GiB)
	for i := range 20 {
		put(t, m, "w", fmt.Sprint("k", i), 300*KiB)
	}
	if own := m.space.ownRegions(uuidOf("w")); len(own) != 2 {
		t.Fatalf("w holds %d regions, want 2", len(own))
	}
	// 20 puts into 2 regions of 3: the 6 most recent remain.
	wantPresent(t, m, true, names("k", 14, 15, 16, 17, 18, 19)...)
	wantPresent(t, m, false, names("k", 0, 5, 13)...)
	if u := m.Stats().Used; u != 6*300*KiB {
		t.Errorf("used %d, want 6 objects of 300 KiB", u)
	}
	mustInvariants(t, m)
}

// Phase 3 does not take the region of a writer whose put is in flight.
func TestPhase3SkipsRegionsBeingWritten(t *testing.T) {
	m, _ := newTestMaster(t, Config{})
	mount(t, m, "node", "seg", "127.0.0.1", 0, 4*MiB)
	for i := range 12 {
		w := "a"
		if i >= 3 {
			w = "b"
		}
		if i == 0 {
			putStart(t, m, w, "writing", 300*KiB) // never ended
			continue
		}
		put(t, m, w, fmt.Sprint("k", i), 300*KiB)
	}
	put(t, m, "c", "c0", 300*KiB)
	wantPresent(t, m, true, "k1", "k2")
	if r := m.BatchPutEnd(uuidOf("a"), []string{"writing"})[0]; r != nil {
		t.Fatalf("the put in flight was disturbed: %v", r)
	}
	mustInvariants(t, m)
}

// Eviction follows the active policy master-wide.
func TestPolicyOrderAcrossShards(t *testing.T) {
	cases := []struct {
		policy string
		prep   func(m *Master)
		gone   []string
	}{
		// fifo: reading k0..k9 does not save them.
		{"fifo", func(m *Master) { m.BatchGetReplicaList(keyRange(0, 10)) }, keyRange(0, 10)},
		// lru: it does.
		{"lru", func(m *Master) { m.BatchGetReplicaList(keyRange(0, 10)) }, keyRange(10, 20)},
		// lfu: k10..k19 read twice, k0..k9 once: the unread ones go.
		{"lfu", func(m *Master) {
			m.BatchGetReplicaList(keyRange(10, 20))
			m.BatchGetReplicaList(keyRange(10, 20))
			m.BatchGetReplicaList(keyRange(0, 10))
		}, keyRange(20, 30)},
		// length-aware: read as one request, later positions go first.
		{"length-aware", func(m *Master) { m.BatchGetReplicaList(keyRange(0, 95)) }, keyRange(85, 95)},
	}
	for _, c := range cases {
		t.Run(c.policy, func(t *testing.T) {
			m, clk := evictFixture(t, Config{EvictionPolicy: c.policy}, 95)
			c.prep(m)
			clk.Advance(DefaultKVLeaseTTL)
			if freed := m.EvictIfNeeded(); freed != 10*MiB {
				t.Fatalf("freed %d, want 10 MiB", freed)
			}
			wantPresent(t, m, false, c.gone...)
			mustInvariants(t, m)
		})
	}
}

// Concurrent writers into a full store: eviction in their puts, reads in
// between; no key is readable once evicted, and the invariants hold.
func TestConcurrentPutsIntoFullStore(t *testing.T) {
	var evicted sync.Map
	m, _ := newTestMaster(t, Config{Now: time.Now, KVLeaseTTL: time.Millisecond, OnChange: func(c Change) {
		if c.Op == OpEvict {
			evicted.Store(c.Key, true)
		}
	}})
	mount(t, m, "n1", "s1", "127.0.0.1", 0, 8*MiB)
	mount(t, m, "n2", "s2", "127.0.0.2", 1<<40, 8*MiB)
	var bad atomic.Int64
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			writer := uuidOf(fmt.Sprint("w", w))
			var mine []string
			for i := range 300 {
				var items []PutItem
				for j := range 1 + rng.IntN(4) {
					items = append(items, PutItem{fmt.Sprintf("w%d/%d/%d", w, i, j), uint64(64+rng.IntN(400)) * KiB})
				}
				var ok []string
				for j, r := range m.BatchPutStart(writer, "", items, store.ReplicateConfig{ReplicaNum: 1 + rng.IntN(2)}) {
					if r.Err == nil {
						ok = append(ok, items[j].Key)
					}
				}
				m.BatchPutEnd(writer, ok)
				mine = append(mine, ok...)
				for _, k := range mine[max(0, len(mine)-5):] {
					_, gone := evicted.Load(k) // before the read: evicted then
					if r := get(m, k); gone && r.Err == nil {
						bad.Add(1)
					}
				}
			}
		}()
	}
	wg.Wait()
	evicted.Range(func(k, _ any) bool {
		if present(m, k.(string))[0] {
			bad.Add(1)
		}
		return true
	})
	if bad.Load() != 0 {
		t.Fatalf("%d reads found an evicted key", bad.Load())
	}
	for _, phase := range []string{"own_regions", "other_regions"} {
		if metric(t, m, "master_eviction_keys_total", "phase", phase) == 0 {
			t.Errorf("no eviction in phase %s: the store never filled enough", phase)
		}
	}
	mustInvariants(t, m)
}

// TestFullStoreConcurrentWritersNeverFail: four goroutines of one client
// (as the callers of one process share a store client) put 1 MiB values
// into a 32 MiB store without pause. Every complete, unleased object is
// evictable, so no put may fail for want of room, however the writers
// race for the space one of them freed.
func TestFullStoreConcurrentWritersNeverFail(t *testing.T) {
	m, _ := newTestMaster(t, Config{Now: time.Now})
	mount(t, m, "n1", "s1", "127.0.0.1", 0, 32*MiB)
	writer := uuidOf("bench")
	var failed atomic.Int64
	var first atomic.Value
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 400 {
				k := fmt.Sprintf("w%d/%d", w, i)
				r := m.BatchPutStart(writer, "", []PutItem{{k, MiB}}, store.ReplicateConfig{ReplicaNum: 1})
				if r[0].Err != nil {
					failed.Add(1)
					first.CompareAndSwap(nil, r[0].Err.Error())
					continue
				}
				if errs := m.BatchPutEnd(writer, []string{k}); errs[0] != nil {
					t.Error(errs[0])
				}
			}
		}()
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d of 1600 puts failed in a store full of evictable objects; first: %v", n, first.Load())
	}
	mustInvariants(t, m)
}

// A put that eviction cannot make room for evicts nothing: freeing every
// evictable object would still leave it short (issue 35, item 3).
func TestPutThatCannotFitEvictsNothing(t *testing.T) {
	hard := store.ReplicateConfig{ReplicaNum: 1, HardPin: true}
	// a's six objects (1800 KiB) may go, b's six are hard-pinned: at most
	// 496 KiB free + 1800 KiB evictable, short of 3 MiB.
	m, clk := fullPool(t, Config{}, plain(), hard)
	clk.Advance(time.Hour)
	for _, w := range []string{"a", "c"} {
		r := m.BatchPutStart(uuidOf(w), "", []PutItem{{w + "-big", 3 * MiB}}, plain())[0]
		wantCode(t, "put larger than free plus evictable space", r.Err, store.NoAvailableHandle)
		for _, want := range []string{"3145728 bytes", "6 hard-pinned", "evicted nothing"} {
			if !contains(r.Err.Error(), want) {
				t.Errorf("writer %s: message %q does not say %q", w, r.Err, want)
			}
		}
	}
	wantPresent(t, m, true, names("a", 0, 1, 2, 3, 4, 5)...)
	wantPresent(t, m, true, names("b", 0, 1, 2, 3, 4, 5)...)
	if n := metric(t, m, "master_evicted_key_count"); n != 0 {
		t.Errorf("%v objects evicted for puts that could not succeed", n)
	}
	// One that freeing can make room for still evicts, when the next
	// watermark round leaves it be (2 MiB would be that round's only
	// victim: TestPutFittingOnlyAfterEvictionSurvivesWatermark).
	put(t, m, "c", "c-fits", 1*MiB)
	if n := metric(t, m, "master_evicted_key_count"); n == 0 {
		t.Errorf("no object evicted for a put that needed room")
	}
	m.EvictIfNeeded()
	wantPresent(t, m, true, "c-fits")
	mustInvariants(t, m)
}
