package alloc

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"testing"
)

// firstFit is the baseline the bins are measured against: a free list
// sorted by address, searched first-fit from the start, with neighbours
// merged on free. Both operations are linear in the number of free blocks.
type firstFit struct {
	free []Range
}

func newFirstFit(base, size uint64) *firstFit {
	return &firstFit{free: []Range{{base, size &^ (Align - 1)}}}
}

func (f *firstFit) Alloc(n uint64) (uint64, error) {
	n = roundUp(n)
	for i, r := range f.free {
		if r.Len >= n {
			if r.Len == n {
				f.free = slices.Delete(f.free, i, i+1)
			} else {
				f.free[i] = Range{r.Addr + n, r.Len - n}
			}
			return r.Addr, nil
		}
	}
	return 0, ErrNoSpace
}

func (f *firstFit) Free(addr, n uint64) error {
	r := Range{addr, roundUp(n)}
	i, _ := slices.BinarySearchFunc(f.free, addr, func(x Range, a uint64) int {
		switch {
		case x.Addr < a:
			return -1
		case x.Addr > a:
			return 1
		}
		return 0
	})
	if i > 0 && f.free[i-1].Addr+f.free[i-1].Len == r.Addr {
		i--
		r = Range{f.free[i].Addr, f.free[i].Len + r.Len}
		f.free = slices.Delete(f.free, i, i+1)
	}
	if i < len(f.free) && r.Addr+r.Len == f.free[i].Addr {
		r.Len += f.free[i].Len
		f.free = slices.Delete(f.free, i, i+1)
	}
	f.free = slices.Insert(f.free, i, r)
	return nil
}

type allocFreer interface {
	Alloc(n uint64) (uint64, error)
	Free(addr, n uint64) error
}

// kvWorkload keeps live objects of KV-cache-like sizes (16 KiB to 256 KiB,
// about 130 GiB at 1M objects) and replaces a random one per step.
type kvWorkload struct {
	rng  sizeGen
	live []Range
}

func (w *kvWorkload) size() uint64 { return 16<<10 + w.rng.next()%(256<<10-16<<10) }

func (w *kvWorkload) fill(tb testing.TB, a allocFreer, live int) {
	w.live = slices.Grow(w.live[:0], live)
	for range live {
		n := w.size()
		addr, err := a.Alloc(n)
		if err != nil {
			tb.Fatalf("fill to %d: %v", live, err)
		}
		w.live = append(w.live, Range{addr, n})
	}
}

// step frees a random live object and allocates a new one in its place.
func (w *kvWorkload) step(tb testing.TB, a allocFreer) {
	k := w.rng.next() % uint64(len(w.live))
	r := w.live[k]
	if err := a.Free(r.Addr, r.Len); err != nil {
		tb.Fatal(err)
	}
	n := w.size()
	addr, err := a.Alloc(n)
	if err != nil {
		tb.Fatalf("alloc(%d) at %d live: %v", n, len(w.live), err)
	}
	w.live[k] = Range{addr, n}
}

// BenchmarkAllocFree times one Free plus one Alloc in a 1 TiB space at 1k,
// 1M and 4M live objects, for the TLSF allocator and the first-fit
// baseline. From 1k to 1M the TLSF cost grows only as much as cache misses
// make a plain map grow (BenchmarkMapReference), and from 1M to 4M, both
// out of cache, it stays flat: O(1). The baseline's growth with the number
// of free blocks is why there are bins.
func BenchmarkAllocFree(b *testing.B) {
	for _, impl := range []string{"tlsf", "firstfit"} {
		for _, live := range []int{1000, 1000000, 4000000} {
			if impl == "firstfit" && live > 1000000 {
				continue // minutes per run, and the point is made at 1M
			}
			b.Run(fmt.Sprintf("impl=%s/live=%d", impl, live), func(b *testing.B) {
				const base, space = 0x7f0000000000, 1 << 40
				var a allocFreer
				if impl == "tlsf" {
					a, _ = New(base, space)
				} else {
					a = newFirstFit(base, space)
				}
				w := &kvWorkload{rng: sizeGen{state: 0x9E3779B97F4A7C15}}
				w.fill(b, a, live)
				// Churn to a fragmented steady state (bounded so that the
				// baseline's setup stays short).
				for range min(live, 20000) {
					w.step(b, a)
				}
				b.ResetTimer()
				for b.Loop() {
					w.step(b, a)
				}
			})
		}
	}
}

// BenchmarkMapReference does what any address-keyed metadata must do per
// replaced object, a Go map delete plus insert at random keys, at the same
// live counts. Its slowdown from 1k to 1M is cache and TLB misses alone,
// the yardstick for BenchmarkAllocFree's: an O(1) structure of 1M entries
// cannot stay in cache either.
func BenchmarkMapReference(b *testing.B) {
	for _, live := range []int{1000, 1000000, 4000000} {
		b.Run(fmt.Sprintf("live=%d", live), func(b *testing.B) {
			rng := sizeGen{state: 0x9E3779B97F4A7C15}
			keys := make([]uint64, live)
			m := make(map[uint64]uint32, live)
			for i := range keys {
				keys[i] = rng.next()
				m[keys[i]] = uint32(i)
			}
			b.ResetTimer()
			for b.Loop() {
				k := rng.next() % uint64(live)
				delete(m, keys[k])
				keys[k] = rng.next()
				m[keys[k]] = uint32(k)
			}
		})
	}
}

// heapBytes returns the live heap after a full collection.
func heapBytes() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// bytesPerAllocation builds an allocator with live allocations in a 1 TiB
// space, churned so that free blocks and spare nodes exist too, and
// returns its heap per live allocation.
func bytesPerAllocation(tb testing.TB, live int) float64 {
	w := &kvWorkload{rng: sizeGen{state: 0x9E3779B97F4A7C15}, live: make([]Range, 0, live)}
	before := heapBytes()
	a, err := New(0x7f0000000000, 1<<40)
	if err != nil {
		tb.Fatal(err)
	}
	w.fill(tb, a, live)
	for range live / 4 {
		w.step(tb, a)
	}
	after := heapBytes()
	runtime.KeepAlive(a)
	runtime.KeepAlive(w) // counted in before: it must not be collected by after
	return float64(after-before) / float64(live)
}

// BenchmarkBytesPerAllocation reports the allocator's heap per live
// allocation (nodes, index, bins) at 1M live objects. The store's budget is
// 300 bytes of metadata per object in total.
func BenchmarkBytesPerAllocation(b *testing.B) {
	var per float64
	for b.Loop() {
		per = bytesPerAllocation(b, 1000000)
	}
	b.ReportMetric(per, "B/alloc")
}

// BenchmarkEmptyAllocator reports the fixed heap of one allocator (bins
// and bitmaps scale with log2 of the space) for a 64 MiB region and a 1 TiB
// segment: what carving a segment into many regions costs.
func BenchmarkEmptyAllocator(b *testing.B) {
	for _, size := range []uint64{64 << 20, 1 << 40} {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			const count = 1000
			keep := make([]*Allocator, count)
			var per float64
			for b.Loop() {
				clear(keep)
				before := heapBytes()
				for i := range keep {
					keep[i], _ = New(0, size)
				}
				per = float64(heapBytes()-before) / count
			}
			b.ReportMetric(per, "B/allocator")
		})
	}
}

// TestBytesPerAllocation holds the per-allocation heap to the budget the
// store planned for (64 bytes, of 300 per object in total).
func TestBytesPerAllocation(t *testing.T) {
	if per := bytesPerAllocation(t, 200000); per > 64 {
		t.Fatalf("%.1f heap bytes per live allocation, budget 64", per)
	} else {
		t.Logf("%.1f heap bytes per live allocation", per)
	}
}

// TestFirstFitBaseline keeps the benchmark's baseline honest: it must agree
// with the model like the real allocator does.
func TestFirstFitBaseline(t *testing.T) {
	f := newFirstFit(0x1000, 1<<20)
	m := newModel(0x1000, 1<<20)
	w := &kvWorkload{rng: sizeGen{state: 7}}
	for i := 0; i < 2000; i++ {
		n := 1 + w.rng.next()%(64<<10)
		if addr, err := f.Alloc(n); err == nil {
			if err := m.add(addr, n); err != nil {
				t.Fatal(err)
			}
			w.live = append(w.live, Range{addr, n})
		} else if !errors.Is(err, ErrNoSpace) {
			t.Fatal(err)
		}
		if len(w.live) > 0 && i%3 == 0 {
			k := int(w.rng.next() % uint64(len(w.live)))
			r := w.live[k]
			w.live = slices.Delete(w.live, k, k+1)
			if err := f.Free(r.Addr, r.Len); err != nil {
				t.Fatal(err)
			}
			delete(m.live, r.Addr)
		}
		gaps, err := m.gaps()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(gaps, f.free) {
			t.Fatalf("step %d: first-fit free list %v, model %v", i, f.free, gaps)
		}
	}
}

// BenchmarkNewWithUsed rebuilds an allocator from 1M used ranges in random
// order, as a master does when a segment holding 1M replicas re-mounts.
func BenchmarkNewWithUsed(b *testing.B) {
	const base, space = 0x7f0000000000, 1 << 40
	a, _ := New(base, space)
	w := &kvWorkload{rng: sizeGen{state: 0x9E3779B97F4A7C15}}
	w.fill(b, a, 1000000)
	for range 250000 {
		w.step(b, a) // leave holes
	}
	for b.Loop() {
		if _, err := NewWithUsed(base, space, w.live); err != nil {
			b.Fatal(err)
		}
	}
}
