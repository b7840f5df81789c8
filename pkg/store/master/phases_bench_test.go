package master

import (
	"fmt"
	"testing"

	"github.com/kvcache-ops/mc/pkg/store"
)

// BenchmarkPutEviction is issue 12's cost check of eviction on the put
// path (Go API, no RPC), 4 KiB objects in 1 MiB regions:
//
//   - fits/none and fits/lru: a put cycle (PutStart, PutEnd, Remove) into
//     a store with room, eviction off (policy none) and on but not
//     triggered: the two should be within noise.
//   - phase1: PutStart+PutEnd into a full store by its only writer: each
//     evicts the writer's least recently used object.
//   - phase3: a 512 KiB put (a region of its own, so no borrowing) by a
//     writer with no region into the same full store: each takes a whole
//     region of the instance with the lowest reference count, walking
//     every object twice (objects=N sets N).
//
// Run: go test ./pkg/store/master -run '^$' -bench PutEviction
func BenchmarkPutEviction(b *testing.B) {
	rc := store.ReplicateConfig{ReplicaNum: 1}
	const size = 4 * KiB
	fill := func(b *testing.B, policy string, seg uint64, n int) *Master {
		m, _ := newTestMaster(b, Config{EvictionPolicy: policy})
		mount(b, m, "node", "seg", "127.0.0.1", 0, seg)
		for i := range n {
			put(b, m, "owner", fmt.Sprint("fill/", i), size)
		}
		return m
	}
	// loop puts new keys as w; remove drops each at once (the store keeps
	// its size).
	loop := func(b *testing.B, m *Master, w store.UUID, remove bool) {
		i := 0
		for b.Loop() {
			k := fmt.Sprint("new/", i)
			i++
			if r := m.BatchPutStart(w, "", []PutItem{{k, size}}, rc); r[0].Err != nil {
				b.Fatal(r[0].Err)
			}
			m.BatchPutEnd(w, []string{k})
			if remove {
				m.BatchRemove([]string{k}, false)
			}
		}
	}
	for _, policy := range []string{"none", "lru"} {
		b.Run("fits/"+policy, func(b *testing.B) {
			loop(b, fill(b, policy, 1*GiB, 10000), uuidOf("owner"), true)
		})
	}
	const full = 64 * MiB
	n := int(full / size)
	b.Run(fmt.Sprintf("phase1/objects=%d", n), func(b *testing.B) {
		m := fill(b, "lru", full, n)
		loop(b, m, uuidOf("owner"), false)
		if metric(b, m, "master_eviction_keys_total", "phase", "own_regions") == 0 {
			b.Fatal("no phase-1 eviction")
		}
	})
	b.Run(fmt.Sprintf("phase3/objects=%d", n), func(b *testing.B) {
		m := fill(b, "lru", full, n)
		i := 0
		for b.Loop() {
			k := fmt.Sprint("new/", i)
			w := uuidOf(k) // a writer with no region yet
			i++
			if r := m.BatchPutStart(w, "", []PutItem{{k, 512 * KiB}}, rc); r[0].Err != nil {
				b.Fatal(r[0].Err)
			}
			m.BatchPutEnd(w, []string{k})
		}
		if rounds := metric(b, m, "master_eviction_rounds_total", "phase", "other_regions"); rounds < 0.9*float64(b.N) {
			b.Fatalf("%v phase-3 rounds for %d puts", rounds, b.N)
		}
	})
}
