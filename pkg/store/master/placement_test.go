package master

import (
	"fmt"
	"slices"
	"testing"

	"github.com/kvcache-ops/mc/pkg/store"
)

func TestReplicasOnDistinctSegments(t *testing.T) {
	m, _ := newTestMaster(t, Config{})
	mount(t, m, "n1", "a", "127.0.0.1", 0, 64*MiB)
	mount(t, m, "n2", "b", "127.0.0.2", 0, 64*MiB)
	for i := range 20 {
		reps := put(t, m, "w", fmt.Sprint("k", i), 1000, store.ReplicateConfig{ReplicaNum: 3})
		if len(reps) != 2 || reps[0].Segment == reps[1].Segment {
			t.Fatalf("replica_num 3 on 2 segments: %+v, want 2 replicas on distinct segments", reps)
		}
	}
	if u := m.Stats().Used; u != 20*2*1000 {
		t.Fatalf("used %d", u)
	}
	mustInvariants(t, m)
}

func TestPreferredAndLocalPlacement(t *testing.T) {
	for _, tc := range []struct {
		name     string
		strategy string
		cfg      store.ReplicateConfig
		host     string
		want     string
	}{
		{"preferred", "", store.ReplicateConfig{ReplicaNum: 1, PreferredSegments: []string{"none", "c"}}, "", "c"},
		{"local_first", strategyLocalFirst, store.ReplicateConfig{ReplicaNum: 1}, "127.0.0.2", "b"},
		{"prefer_local", "", store.ReplicateConfig{ReplicaNum: 1, PreferLocal: true}, "127.0.0.3", "c"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, _ := newTestMaster(t, Config{AllocationStrategy: tc.strategy})
			mount(t, m, "n1", "a", "127.0.0.1", 0, 64*MiB)
			mount(t, m, "n2", "b", "127.0.0.2", 0, 64*MiB)
			mount(t, m, "n3", "c", "127.0.0.3", 0, 64*MiB)
			for i := range 30 {
				// Fresh writers too: each new region must honour it.
				w := uuidOf(fmt.Sprint("w", i%3))
				r := m.BatchPutStart(w, tc.host, []PutItem{{fmt.Sprint("k", i), 300 * KiB}}, tc.cfg)[0]
				if r.Err != nil || len(r.Replicas) != 1 || r.Replicas[0].Segment != tc.want {
					t.Fatalf("put %d: %+v, want one replica on %s", i, r, tc.want)
				}
			}
			mustInvariants(t, m)
		})
	}
}

// Each writer instance's objects live in its own regions: two writers'
// replicas never fall in one region-sized slot of a fresh segment (its
// regions are carved in order), and the master's region table agrees.
func TestWritersNeverShareARegion(t *testing.T) {
	m, _ := newTestMaster(t, Config{})
	seg := mount(t, m, "n", "a", "127.0.0.1", 0x100000, 64*MiB)
	slots := map[string]map[uint64]bool{"wa": {}, "wb": {}}
	for i := range 200 {
		w := []string{"wa", "wb"}[i%2]
		reps := put(t, m, w, fmt.Sprint("k", i), 50*KiB)
		slot := (reps[0].Addr - seg.Base) / MiB
		if end := (reps[0].Addr + reps[0].Len - 1 - seg.Base) / MiB; end != slot {
			t.Fatalf("replica 0x%x+%d crosses a region boundary", reps[0].Addr, reps[0].Len)
		}
		slots[w][slot] = true
	}
	for s := range slots["wa"] {
		if slots["wb"][s] {
			t.Fatalf("writers wa and wb both have replicas in region slot %d", s)
		}
	}
	if len(slots["wa"]) < 2 || len(slots["wb"]) < 2 {
		t.Fatalf("regions used: %d and %d, want several each", len(slots["wa"]), len(slots["wb"]))
	}
	mustInvariants(t, m)
}

// With eviction off (TestPhase1MaxRegionsForcesEviction has it on).
func TestMaxRegionsPerInstance(t *testing.T) {
	m, _ := newTestMaster(t, Config{MaxRegionsPerInstance: 1, EvictionPolicy: "none"})
	mount(t, m, "n", "a", "127.0.0.1", 0, 64*MiB)
	for i := range 3 {
		put(t, m, "w", fmt.Sprint("k", i), 300*KiB)
	}
	r := m.BatchPutStart(uuidOf("w"), "", []PutItem{{"k3", 300 * KiB}}, one())[0]
	wantCode(t, "a put needing a second region", r.Err, store.NoAvailableHandle)
	if !contains(r.Err.Error(), "max_regions_per_instance") {
		t.Fatalf("message %q does not name max_regions_per_instance", r.Err)
	}
	// Another instance has its own budget.
	put(t, m, "other", "k3", 300*KiB)
	mustInvariants(t, m)
}

func TestPutInvalid(t *testing.T) {
	m, _ := newTestMaster(t, Config{})
	mount(t, m, "n", "a", "127.0.0.1", 0, 64*MiB)
	mount(t, m, "n", "b", "127.0.0.1", 1<<30, 32*MiB)
	w := uuidOf("w")
	r := m.BatchPutStart(w, "", []PutItem{{"big", 65 * MiB}}, one())[0]
	wantCode(t, "a value larger than any segment", r.Err, store.NoAvailableHandle)
	if msg := r.Err.Error(); !contains(msg, fmt.Sprint(65*MiB)) || !contains(msg, fmt.Sprint(64*MiB)) {
		t.Fatalf("message %q does not name the value's and the largest segment's sizes", msg)
	}
	wantCode(t, "0-byte value", m.BatchPutStart(w, "", []PutItem{{"zero", 0}}, one())[0].Err, store.InvalidParams)
	r = m.BatchPutStart(w, "", []PutItem{{fmt.Sprintf("%0*d", store.MaxKeyLength+1, 0), 10}}, one())[0]
	wantCode(t, "over-long key", r.Err, store.InvalidKey)
	if !contains(r.Err.Error(), fmt.Sprint(store.MaxKeyLength)) {
		t.Fatalf("message %q does not name the key limit", r.Err)
	}
	wantCode(t, "empty key", m.BatchPutStart(w, "", []PutItem{{"", 10}}, one())[0].Err, store.InvalidKey)
	wantCode(t, "replica_num 17", m.BatchPutStart(w, "", []PutItem{{"k", 10}}, store.ReplicateConfig{ReplicaNum: 17})[0].Err, store.InvalidParams)
	wantCode(t, "replica_num -1", m.BatchUpsertStart(w, "", []PutItem{{"k", 10}}, store.ReplicateConfig{ReplicaNum: -1})[0].Err, store.InvalidParams)
	if s := m.Stats(); s.Used != 0 || s.Processing != 0 {
		t.Fatalf("refused puts left state: %+v", s)
	}
	// With no segment at all.
	m2, _ := newTestMaster(t, Config{})
	wantCode(t, "put with no segment", m2.BatchPutStart(w, "", []PutItem{{"k", 10}}, one())[0].Err, store.NoAvailableHandle)
}

func segRegions(m *Master, name string) int {
	for _, s := range m.Segments() {
		if s.Info.Name == name {
			return s.Regions
		}
	}
	return -1
}

// A region whose objects are all gone goes back to its segment at once,
// the writer's newest too (keeping it starved other writers), where
// another writer can take it.
func TestEmptiedRegionReturns(t *testing.T) {
	m, _ := newTestMaster(t, Config{EvictionPolicy: "none"}) // a full segment stays full
	mount(t, m, "n", "a", "127.0.0.1", 0, 4*MiB)
	// Three regions of three 300 KiB objects each.
	for i := range 9 {
		put(t, m, "w", fmt.Sprint("k", i), 300*KiB)
	}
	if n := segRegions(m, "a"); n != 3 {
		t.Fatalf("%d regions, want 3", n)
	}
	// The rest of the segment goes to a dedicated object.
	put(t, m, "x", "filler", MiB)
	wantCode(t, "full segment", m.BatchPutStart(uuidOf("y"), "", []PutItem{{"y", MiB}}, one())[0].Err, store.NoAvailableHandle)
	// Emptying the newest region returns it too.
	if errs := m.BatchRemove([]string{"k6", "k7", "k8"}, false); slices.ContainsFunc(errs, func(e error) bool { return e != nil }) {
		t.Fatal(errs)
	}
	if n := segRegions(m, "a"); n != 3 {
		t.Fatalf("%d regions after emptying the newest, want 3 (2 + the dedicated one)", n)
	}
	// Emptying an older one returns it.
	m.BatchRemove([]string{"k0", "k1", "k2"}, false)
	if n := segRegions(m, "a"); n != 2 {
		t.Fatalf("%d regions after emptying an older one, want 2", n)
	}
	put(t, m, "y", "y", MiB)
	mustInvariants(t, m)
}

// Segments far larger than 64 GiB, at high addresses.
func TestHugeSegments(t *testing.T) {
	m, _ := newTestMaster(t, Config{RegionSize: DefaultRegionSize})
	const base = 0x7f0000000000
	a := mount(t, m, "n1", "tib", "127.0.0.1", base, TiB)
	b := mount(t, m, "n2", "16tib", "127.0.0.2", base+TiB, 16*TiB)
	if s := m.Stats(); s.Capacity != 17*TiB {
		t.Fatalf("capacity %d, want 17 TiB", s.Capacity)
	}
	want := map[string]uint64{}
	type obj struct {
		seg  store.SegmentInfo
		size uint64
	}
	objs := []obj{{a, 100 * GiB}, {b, 4 * MiB}, {a, 900 * GiB}, {a, 12345}, {b, TiB - 64*MiB}}
	for range 15 { // to the end of the 16 TiB segment
		objs = append(objs, obj{b, store.MaxValueSize})
	}
	for i, tc := range objs {
		reps := put(t, m, "w", fmt.Sprint("k", i), tc.size, store.ReplicateConfig{ReplicaNum: 1, PreferredSegments: []string{tc.seg.Name}})
		r := reps[0]
		if r.Segment != tc.seg.Name || r.Addr < tc.seg.Base || r.Addr+r.Len > tc.seg.Base+tc.seg.Size {
			t.Fatalf("put %d of %d bytes: %+v, want inside %s", i, tc.size, r, tc.seg.Name)
		}
		want[tc.seg.Name] += tc.size
	}
	for _, s := range m.Segments() {
		if s.Used != want[s.Info.Name] {
			t.Errorf("segment %s used %d, want %d", s.Info.Name, s.Used, want[s.Info.Name])
		}
	}
	if s := m.Stats(); s.Used != want["tib"]+want["16tib"] {
		t.Errorf("used %d, want %d", s.Used, want["tib"]+want["16tib"])
	}
	mustInvariants(t, m)
}

// Mooncake #3688: a node that restarted empty must not attract every new
// writer's put. Two segments are 70% full, the third is empty; 60 new
// writer instances put one object each with the default strategy.
// Uniform random placement sends each to the empty one with p = 1/3, so
// taking more than 36 of 60 happens with probability below 1e-4.
func TestEmptySegmentDoesNotTakeEveryPut(t *testing.T) {
	m, _ := newTestMaster(t, Config{})
	mount(t, m, "n1", "full-1", "127.0.0.1", 0, 256*MiB)
	mount(t, m, "n2", "full-2", "127.0.0.2", 0, 256*MiB)
	for _, seg := range []string{"full-1", "full-2"} {
		for i := range 179 { // 179 MiB of 256: 70%
			put(t, m, "old-writer", fmt.Sprint(seg, i), MiB, store.ReplicateConfig{ReplicaNum: 1, PreferredSegments: []string{seg}})
		}
	}
	mount(t, m, "n3", "restarted", "127.0.0.3", 0, 256*MiB)
	count := map[string]int{}
	for i := range 60 {
		reps := put(t, m, fmt.Sprint("new-writer-", i), fmt.Sprint("new", i), 100*KiB)
		count[reps[0].Segment]++
	}
	if n := count["restarted"]; n > 36 || n < 1 {
		t.Fatalf("the empty segment took %d of 60 new writers' puts (%v), want between 1 and 36", n, count)
	}
	mustInvariants(t, m)
}

// A staging range for a disk read starts on a page when one can be had
// (a node without huge pages then reads the value with O_DIRECT straight
// into it), and anywhere when none can: alignment saves a copy, it never
// fails a read.
func TestStagingAlignedWhenItCan(t *testing.T) {
	m, _ := newTestMaster(t, Config{})
	const size = 1_050_000
	a := mount(t, m, "n1", "a", "127.0.0.1", 0x7f0000010040, 4*MiB)     // 64 bytes past a page
	b := mount(t, m, "n2", "b", "127.0.0.2", 0x7f0000020040, size+64-1) // room for exactly one range, none aligned
	// A small object first, so a's free space starts off any boundary.
	putStart(t, m, "n1", "small", 100, store.ReplicateConfig{ReplicaNum: 1, PreferredSegments: []string{"a"}})
	ra, err := m.space.placeOn(uuidOf("n1"), a.ID, size)
	if err != nil {
		t.Fatal(err)
	}
	if ra.addr%stagingAlign != 0 {
		t.Fatalf("staging range on segment a at %#x, want it on a %d-byte boundary", ra.addr, stagingAlign)
	}
	rb, err := m.space.placeOn(uuidOf("n2"), b.ID, size)
	if err != nil {
		t.Fatalf("staging range on segment b, where only an unaligned one fits: %v", err)
	}
	if rb.addr != b.Base {
		t.Fatalf("staging range on segment b at %#x, want its start %#x", rb.addr, b.Base)
	}
	// Given back as a load that failed gives them back.
	m.space.free([]replicaRef{ra}, size)
	m.space.free([]replicaRef{rb}, size)
	mustInvariants(t, m)
}
