package policy

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// ref is a tiny reference implementation of every policy: a slice of
// entries with explicit counters, O(n) per operation.
type ref struct {
	name  string
	items []refItem
	clock int
}

type refItem struct {
	key          int
	hits         int
	last, added  int
	depth, order int
}

func (r *ref) find(k int) int {
	return slices.IndexFunc(r.items, func(it refItem) bool { return it.key == k })
}

func (r *ref) add(k, depth int) {
	r.clock++
	r.items = append(r.items, refItem{key: k, hits: 1, last: r.clock, added: r.clock, depth: min(depth, MaxDepth-1), order: r.clock})
}

func (r *ref) touch(k, depth int) {
	r.clock++
	i := r.find(k)
	r.items[i].hits++
	if r.name != "fifo" {
		r.items[i].last = r.clock
	}
	if r.name == "length-aware" {
		r.items[i].depth = min(depth, MaxDepth-1)
	}
}

func (r *ref) remove(k int) { r.items = slices.Delete(r.items, r.find(k), r.find(k)+1) }

// victim is the entry each policy must evict first.
func (r *ref) victim() int {
	if len(r.items) == 0 {
		return -1
	}
	best := 0
	for i, it := range r.items[1:] {
		b := r.items[best]
		var better bool
		switch r.name {
		case "lru":
			better = it.last < b.last
		case "fifo":
			better = it.added < b.added
		case "lfu":
			better = it.hits < b.hits || it.hits == b.hits && it.last < b.last
		case "length-aware":
			better = it.depth > b.depth || it.depth == b.depth && it.last < b.last
		}
		if better {
			best = i + 1
		}
	}
	return r.items[best].key
}

func TestPoliciesAgainstReference(t *testing.T) {
	for _, name := range Names {
		t.Run(name, func(t *testing.T) {
			for seed := uint64(1); seed <= 20; seed++ {
				rng := rand.New(rand.NewPCG(seed, seed))
				p, err := New[int](name)
				if err != nil {
					t.Fatal(err)
				}
				r := &ref{name: name}
				entries := map[int]*Entry[int]{}
				for step := 0; step < 2000; step++ {
					k := rng.IntN(40)
					depth := rng.IntN(8)
					if rng.IntN(100) == 0 {
						depth = MaxDepth + 5
					}
					switch e := entries[k]; {
					case e == nil:
						e = &Entry[int]{V: k}
						entries[k] = e
						p.Add(e, depth)
						r.add(k, depth)
					case rng.IntN(4) == 0:
						p.Remove(e)
						r.remove(k)
						delete(entries, k)
					default:
						p.Touch(e, depth)
						r.touch(k, depth)
					}
					if rng.IntN(7) == 0 && p.Len() > 0 {
						// Evict the victim, as a full cache does.
						v := p.Victim()
						if want := r.victim(); v.V != want {
							t.Fatalf("seed %d step %d: victim %d, want %d", seed, step, v.V, want)
						}
						p.Remove(v)
						r.remove(v.V)
						delete(entries, v.V)
					}
					if p.Len() != len(r.items) {
						t.Fatalf("seed %d step %d: Len %d, want %d", seed, step, p.Len(), len(r.items))
					}
				}
				// Victims walks the whole order, best victim first.
				var order []int
				p.Victims(func(e *Entry[int]) bool { order = append(order, e.V); return true })
				for _, k := range order {
					if want := r.victim(); k != want {
						t.Fatalf("seed %d: Victims order gives %d, want %d", seed, k, want)
					}
					r.remove(k)
				}
				if len(r.items) != 0 {
					t.Fatalf("seed %d: Victims missed %d entries", seed, len(r.items))
				}
			}
		})
	}
}

func TestVictimsMayRemove(t *testing.T) {
	for _, name := range Names {
		p, _ := New[int](name)
		es := make([]*Entry[int], 10)
		for i := range es {
			es[i] = &Entry[int]{V: i}
			p.Add(es[i], i%3)
		}
		n := 0
		p.Victims(func(e *Entry[int]) bool {
			p.Remove(e)
			n++
			return n < 6
		})
		if p.Len() != 4 || n != 6 {
			t.Fatalf("%s: removed %d in Victims, %d left; want 6 and 4", name, n, p.Len())
		}
	}
}

func TestNewUnknown(t *testing.T) {
	if _, err := New[int]("arc"); err == nil {
		t.Fatal("unknown policy accepted")
	}
	if p, err := New[int]("length_aware"); err != nil || p.Name() != "length-aware" {
		t.Fatalf("length_aware spelling: %v", err)
	}
}

func BenchmarkPolicy(b *testing.B) {
	for _, name := range Names {
		b.Run(name, func(b *testing.B) {
			p, _ := New[int](name)
			const n = 1 << 16
			es := make([]Entry[int], n)
			for i := range es {
				p.Add(&es[i], i%64)
			}
			rng := rand.New(rand.NewPCG(1, 2))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				e := &es[rng.IntN(n)]
				p.Touch(e, i%64)
				v := p.Victim()
				p.Remove(v)
				p.Add(v, i%64)
			}
		})
	}
}
