package alloc

import (
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"testing"
)

// check walks every structure of a and returns its free blocks in address
// order, or what is inconsistent. Node 0 is always the first block: a block
// is only ever merged into its predecessor, and the first has none.
func check(a *Allocator) ([]Range, error) {
	var free []Range
	var used uint64
	allocs := 0
	freeSet := map[uint32]bool{}
	prev := nilIdx
	var at uint64
	prevFree := false
	steps := uint32(0)
	for i := uint32(0); i != nilIdx; i = a.n(i).nextPhys {
		if steps++; steps > a.nNodes {
			return nil, fmt.Errorf("physical list has a cycle")
		}
		nd := a.n(i)
		if nd.prevPhys != prev {
			return nil, fmt.Errorf("node %d: prevPhys %d, want %d", i, nd.prevPhys, prev)
		}
		if off := nd.off &^ freeBit; off != at {
			return nil, fmt.Errorf("node %d: offset %d, want %d (blocks not contiguous)", i, off, at)
		}
		s := a.size(i)
		if s == 0 || at+s > a.granules {
			return nil, fmt.Errorf("node %d: size %d at %d in %d granules", i, s, at, a.granules)
		}
		isFree := nd.off&freeBit != 0
		if isFree {
			if prevFree {
				return nil, fmt.Errorf("node %d: two adjacent free blocks (not coalesced)", i)
			}
			free = append(free, Range{a.base + at*Align, s * Align})
			freeSet[i] = true
		} else {
			used += s
			allocs++
			if a.idxFind(at) != i {
				return nil, fmt.Errorf("node %d at offset %d: not found by the index", i, at)
			}
		}
		prevFree = isFree
		prev = i
		at += s
	}
	if at != a.granules {
		return nil, fmt.Errorf("blocks cover %d of %d granules", at, a.granules)
	}
	if used != a.used || allocs != a.allocs || allocs != a.idx.count {
		return nil, fmt.Errorf("used %d allocs %d (index %d), counters say %d and %d", used, allocs, a.idx.count, a.used, a.allocs)
	}
	inBins := 0
	for fl := uint32(0); fl < a.flCount; fl++ {
		for sl := uint32(0); sl < slCount; sl++ {
			h := a.heads[fl*slCount+sl]
			bit := a.slBitmap[fl]&(1<<sl) != 0
			if bit != (h != nilIdx) {
				return nil, fmt.Errorf("bin %d/%d: bitmap %v, list empty %v", fl, sl, bit, h == nilIdx)
			}
			p := nilIdx
			for j := h; j != nilIdx; j = a.n(j).nextFree {
				if !freeSet[j] {
					return nil, fmt.Errorf("bin %d/%d holds node %d, which is not a free block", fl, sl, j)
				}
				if a.n(j).prevFree != p {
					return nil, fmt.Errorf("bin %d/%d: node %d prevFree %d, want %d", fl, sl, j, a.n(j).prevFree, p)
				}
				if f, s := binOf(a.size(j)); f != fl || s != sl {
					return nil, fmt.Errorf("node %d of size %d in bin %d/%d, belongs in %d/%d", j, a.size(j), fl, sl, f, s)
				}
				p = j
				inBins++
			}
		}
		if (a.slBitmap[fl] != 0) != (a.flBitmap&(1<<fl) != 0) {
			return nil, fmt.Errorf("first-level bit %d disagrees with its second level", fl)
		}
	}
	if inBins != len(freeSet) {
		return nil, fmt.Errorf("%d free blocks, %d in bins", len(freeSet), inBins)
	}
	return free, nil
}

// model is the brute-force reference: the set of live ranges.
type model struct {
	base, capacity uint64
	live           map[uint64]uint64 // addr -> rounded length
}

func newModel(base, capacity uint64) *model {
	return &model{base: base, capacity: capacity, live: map[uint64]uint64{}}
}

func roundUp(n uint64) uint64 { return (n + Align - 1) &^ (Align - 1) }

// add records a new allocation, failing when it is out of bounds or starts
// where a live one does; gaps finds any other overlap.
func (m *model) add(addr, n uint64) error {
	l := roundUp(n)
	if addr < m.base || addr+l > m.base+m.capacity || (addr-m.base)%Align != 0 {
		return fmt.Errorf("alloc(%d) = %#x: outside [%#x, +%d) or unaligned", n, addr, m.base, m.capacity)
	}
	if _, dup := m.live[addr]; dup {
		return fmt.Errorf("alloc(%d) = %#x: already live", n, addr)
	}
	m.live[addr] = l
	return nil
}

func (m *model) used() uint64 {
	var u uint64
	for _, l := range m.live {
		u += l
	}
	return u
}

// gaps returns the maximal free runs in address order (what the
// allocator's free blocks must be when it coalesces), or the first two live
// ranges that overlap.
func (m *model) gaps() ([]Range, error) {
	addrs := make([]uint64, 0, len(m.live))
	for a := range m.live {
		addrs = append(addrs, a)
	}
	slices.Sort(addrs)
	var g []Range
	at := m.base
	for k, a := range addrs {
		if a < at {
			p := addrs[k-1]
			return nil, fmt.Errorf("live [%#x, +%d) overlaps live [%#x, +%d)", a, m.live[a], p, m.live[p])
		}
		if a > at {
			g = append(g, Range{at, a - at})
		}
		at = a + m.live[a]
	}
	if end := m.base + m.capacity; end > at {
		g = append(g, Range{at, end - at})
	}
	return g, nil
}

// largest returns the largest gap and how many gaps share its bin.
func largest(gaps []Range) (uint64, int) {
	var big uint64
	for _, g := range gaps {
		big = max(big, g.Len)
	}
	if big == 0 {
		return 0, 0
	}
	bf, bs := binOf(big / Align)
	same := 0
	for _, g := range gaps {
		if f, s := binOf(g.Len / Align); f == bf && s == bs {
			same++
		}
	}
	return big, same
}

// compare checks a against m exactly: counters, free blocks (so
// coalescing), and LargestFree.
func compare(a *Allocator, m *model) error {
	free, err := check(a)
	if err != nil {
		return err
	}
	if a.Used() != m.used() || a.Allocations() != len(m.live) || a.Available() != a.Capacity()-m.used() {
		return fmt.Errorf("used %d allocations %d available %d, model %d %d", a.Used(), a.Allocations(), a.Available(), m.used(), len(m.live))
	}
	gaps, err := m.gaps()
	if err != nil {
		return err
	}
	if !slices.Equal(free, gaps) {
		return fmt.Errorf("free blocks %v, model gaps %v", free, gaps)
	}
	big, same := largest(gaps)
	lf := a.LargestFree()
	if lf > big || (same <= scanLimit && lf != big) {
		return fmt.Errorf("LargestFree %d, largest gap %d (%d gaps in its bin)", lf, big, same)
	}
	return nil
}

// sizeGen draws request sizes: small, odd, power-of-two and large ones
// relative to the space.
type sizeGen struct {
	state    uint64
	capacity uint64
}

func (s *sizeGen) next() uint64 {
	s.state ^= s.state << 13
	s.state ^= s.state >> 7
	s.state ^= s.state << 17
	return s.state
}

func (s *sizeGen) size() uint64 {
	r := s.next()
	switch r % 8 {
	case 0:
		return 1 + r>>3%Align // below one granule
	case 1:
		return 1 << (r >> 3 % uint64(bits.Len64(s.capacity))) // powers of two
	case 2:
		return 1 + r>>3%(s.capacity/4) // large
	case 3:
		return s.capacity // all of it
	default:
		return 1 + r>>3%(s.capacity/64+1)
	}
}

// runModel drives ops random operations against a and the model, checking
// every checkEvery operations and at the end, then frees everything and
// expects one free block of the whole capacity.
func runModel(t *testing.T, a *Allocator, m *model, seed uint64, ops, checkEvery int) {
	t.Helper()
	g := &sizeGen{state: seed | 1, capacity: a.Capacity()}
	var addrs []uint64
	req := map[uint64]uint64{} // addr -> size as requested
	for op := 0; op < ops; op++ {
		r := g.next()
		if r%5 < 3 || len(addrs) == 0 {
			n := g.size()
			if r%7 == 0 {
				n = a.LargestFree() // must fit whenever it is not 0
			}
			if n == 0 {
				continue
			}
			lf := a.LargestFree()
			addr, err := a.Alloc(n)
			if err != nil {
				if !errors.Is(err, ErrNoSpace) {
					t.Fatalf("op %d: alloc(%d): %v", op, n, err)
				}
				if n <= lf {
					t.Fatalf("op %d: alloc(%d) failed though LargestFree was %d: %v", op, n, lf, err)
				}
				continue
			}
			if err := m.add(addr, n); err != nil {
				t.Fatalf("op %d: %v", op, err)
			}
			addrs = append(addrs, addr)
			req[addr] = n
		} else {
			k := int(g.next() % uint64(len(addrs)))
			addr := addrs[k]
			addrs[k] = addrs[len(addrs)-1]
			addrs = addrs[:len(addrs)-1]
			if err := a.Free(addr, req[addr]); err != nil {
				t.Fatalf("op %d: free(%#x, %d): %v", op, addr, req[addr], err)
			}
			delete(m.live, addr)
			delete(req, addr)
		}
		if op%checkEvery == 0 {
			if err := compare(a, m); err != nil {
				t.Fatalf("op %d: %v", op, err)
			}
		}
	}
	if err := compare(a, m); err != nil {
		t.Fatalf("after %d ops: %v", ops, err)
	}
	for _, addr := range addrs {
		if err := a.Free(addr, req[addr]); err != nil {
			t.Fatalf("free all: free(%#x, %d): %v", addr, req[addr], err)
		}
		delete(m.live, addr)
	}
	free, err := check(a)
	if err != nil {
		t.Fatal(err)
	}
	if want := []Range{{a.base, a.Capacity()}}; !slices.Equal(free, want) || a.Used() != 0 || a.Allocations() != 0 {
		t.Fatalf("after freeing everything: free blocks %v used %d allocations %d, want %v", free, a.Used(), a.Allocations(), want)
	}
	if a.LargestFree() != a.Capacity() {
		t.Fatalf("LargestFree %d after freeing everything, want capacity %d", a.LargestFree(), a.Capacity())
	}
}

func TestModelRandom(t *testing.T) {
	cases := []struct {
		name       string
		base, size uint64
		ops, every int
	}{
		{"small", 0, 4096 * Align, 8000, 1},
		{"unaligned-base", 0x1003, 1000*Align + 17, 8000, 1},
		{"tiny", 5, 3 * Align, 2000, 1},
		{"1TiB", 0x7f0000000000, 1 << 40, 20000, 16},
		{"16TiB", 0x7f0000000000, 16 << 40, 20000, 16},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for seed := uint64(1); seed <= 4; seed++ {
				a, err := New(c.base, c.size)
				if err != nil {
					t.Fatal(err)
				}
				runModel(t, a, newModel(c.base, a.Capacity()), seed*0x9E3779B97F4A7C15, c.ops, c.every)
			}
		})
	}
}

// TestModelManySmall keeps thousands of allocations live so the index grows
// through several incremental rehashes while being checked.
func TestModelManySmall(t *testing.T) {
	a, err := New(0x7f0000000000, 1<<40)
	if err != nil {
		t.Fatal(err)
	}
	m := newModel(a.base, a.Capacity())
	var addrs []uint64
	for i := 0; i < 20000; i++ {
		n := uint64(1 + i%3000)
		addr, err := a.Alloc(n)
		if err != nil {
			t.Fatal(err)
		}
		m.live[addr] = roundUp(n)
		addrs = append(addrs, addr)
		if i%97 == 0 {
			if _, err := check(a); err != nil {
				t.Fatalf("alloc %d: %v", i, err)
			}
		}
	}
	if err := compare(a, m); err != nil {
		t.Fatal(err)
	}
	// Growth keeps pace with inserts, so chains stay short.
	if x := a.idx; x.count > 2*len(x.cur) {
		t.Fatalf("index: %d entries in %d buckets", x.count, len(x.cur))
	}
	for i := 0; i < len(addrs); i += 2 {
		if err := a.Free(addrs[i], m.live[addrs[i]]); err != nil {
			t.Fatal(err)
		}
		delete(m.live, addrs[i])
	}
	if err := compare(a, m); err != nil {
		t.Fatal(err)
	}
}
