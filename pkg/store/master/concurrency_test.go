package master

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/store"
)

// Mooncake #346 / #727: writers racing to put one key. Exactly one
// PutStart wins each round, the losers get OBJECT_ALREADY_EXISTS, and only
// the winner's PutEnd completes the key.
func TestConcurrentPutsOfOneKey(t *testing.T) {
	m, _ := newTestMaster(t, Config{})
	mount(t, m, "node", "a", "127.0.0.1", 0, 256*MiB)
	const writers, rounds = 16, 50
	for round := range rounds {
		key := fmt.Sprint("key-", round)
		var started, ended, exists atomic.Int32
		var wg sync.WaitGroup
		start := make(chan struct{})
		for w := range writers {
			wg.Go(func() {
				id := uuidOf(fmt.Sprint("writer-", w))
				<-start
				r := m.BatchPutStart(id, "", []PutItem{{key, 4096}}, one())[0]
				switch store.CodeOf(r.Err) {
				case store.OK:
					started.Add(1)
					if err := m.BatchPutEnd(id, []string{key})[0]; err == nil {
						ended.Add(1)
					} else {
						t.Errorf("round %d: the winner's put end: %v", round, err)
					}
				case store.ObjectAlreadyExists:
					exists.Add(1)
					// A loser's End must not complete anything.
					if err := m.BatchPutEnd(id, []string{key})[0]; err == nil {
						ended.Add(1)
					}
				default:
					t.Errorf("round %d: put start: %v", round, r.Err)
				}
			})
		}
		close(start)
		wg.Wait()
		if started.Load() != 1 || exists.Load() != writers-1 || ended.Load() != 1 {
			t.Fatalf("round %d: %d started, %d refused, %d ended; want 1, %d, 1", round, started.Load(), exists.Load(), ended.Load(), writers-1)
		}
		if g := get(m, key); g.Err != nil || len(g.Replicas) != 1 {
			t.Fatalf("round %d: get %+v", round, g)
		}
	}
	if s := m.Stats(); s.Keys != rounds || s.Used != rounds*4096 || s.Processing != 0 {
		t.Fatalf("stats %+v", s)
	}
	mustInvariants(t, m)
}

// A mixed load on 1000 keys from many goroutines: puts, upserts, gets,
// exists, removes, evictions, housekeeping and clock jumps. At the end the
// metadata and the space must agree, and every complete key must read.
func TestConcurrentMixedLoad(t *testing.T) {
	m, clk := newTestMaster(t, Config{KVLeaseTTL: 50 * time.Millisecond})
	for i := range 3 {
		mount(t, m, fmt.Sprint("node", i), fmt.Sprint("seg", i), fmt.Sprintf("127.0.0.%d", i+1), uint64(i)<<40, 48*MiB)
	}
	const workers, ops, keys = 8, 3000, 1000
	var wg sync.WaitGroup
	stop := make(chan struct{})
	// Housekeeping while the workers run: nodes keep pinging, the clock
	// moves, abandoned puts are discarded and released, eviction runs.
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			clk.Advance(20 * time.Second)
			maintain(m, "node0", "node1", "node2")
			m.EvictIfNeeded()
			time.Sleep(time.Millisecond)
		}
	})
	var workersWG sync.WaitGroup
	for w := range workers {
		workersWG.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 99))
			id := uuidOf(fmt.Sprint("w", w))
			for range ops {
				key := fmt.Sprint("k", rng.IntN(keys))
				size := uint64(1+rng.IntN(8)) * 16 * KiB
				rc := store.ReplicateConfig{ReplicaNum: 1 + rng.IntN(3), SoftPin: rng.IntN(10) == 0}
				switch rng.IntN(10) {
				case 0, 1:
					if r := m.BatchPutStart(id, "", []PutItem{{key, size}}, rc)[0]; r.Err == nil && rng.IntN(8) != 0 {
						if rng.IntN(5) == 0 {
							m.BatchPutRevoke(id, []string{key})
						} else {
							m.BatchPutEnd(id, []string{key})
						}
					}
				case 2:
					if r := m.BatchUpsertStart(id, "", []PutItem{{key, size}}, rc)[0]; r.Err == nil {
						m.BatchUpsertEnd(id, []string{key})
					}
				case 3, 4, 5:
					for _, r := range m.BatchGetReplicaList([]string{key, fmt.Sprint("k", rng.IntN(keys))}) {
						if r.Err == nil && len(r.Replicas) == 0 {
							t.Errorf("get of %s: no replica and no error", key)
						}
					}
				case 6:
					m.BatchExistKey([]string{key})
				case 7:
					m.BatchRemove([]string{key}, rng.IntN(2) == 0)
				case 8:
					m.BatchQuery([]string{key})
					m.Stats()
				case 9:
					m.Evict(uint64(rng.IntN(4)) * MiB)
				}
			}
		})
	}
	workersWG.Wait()
	close(stop)
	wg.Wait()
	mustInvariants(t, m)
	var complete []string
	m.Keys("", func(k string, _ uint64) bool { complete = append(complete, k); return true })
	if len(complete) != m.KeyCount() {
		t.Fatalf("Keys lists %d, KeyCount %d", len(complete), m.KeyCount())
	}
	for _, r := range m.BatchQuery(complete) {
		if r.Err != nil || len(r.Replicas) == 0 {
			t.Fatalf("a listed key does not read: %+v", r)
		}
	}
	// Everything released in the end.
	clk.Advance(time.Hour)
	maintain(m, "node0", "node1", "node2")
	m.RemoveAll()
	if s := m.Stats(); s.Keys != 0 || s.Processing != 0 || s.Used != 0 {
		t.Fatalf("after releasing everything: %+v", s)
	}
	mustInvariants(t, m)
}
