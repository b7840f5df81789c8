package alloc

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func mustNew(t *testing.T, base, size uint64) *Allocator {
	t.Helper()
	a, err := New(base, size)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func mustAlloc(t *testing.T, a *Allocator, n uint64) uint64 {
	t.Helper()
	addr, err := a.Alloc(n)
	if err != nil {
		t.Fatalf("alloc(%d): %v", n, err)
	}
	return addr
}

func mustCheck(t *testing.T, a *Allocator) []Range {
	t.Helper()
	free, err := check(a)
	if err != nil {
		t.Fatal(err)
	}
	return free
}

func TestNewBounds(t *testing.T) {
	for _, c := range []struct {
		base, size uint64
		want       string
	}{
		{math.MaxUint64 - 100, 1000, "overflows"},
		{1 << 63, 1 << 63, "overflows"},
		{0, 0, "below the 64-byte granule"},
		{0x1000, Align - 1, "below the 64-byte granule"},
	} {
		if _, err := New(c.base, c.size); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%#x, %d) = %v, want an error containing %q", c.base, c.size, err, c.want)
		}
	}
	// The top of the 64-bit space is usable up to its last byte.
	a := mustNew(t, math.MaxUint64-Align*10, Align*10)
	if addr := mustAlloc(t, a, Align*10); addr != math.MaxUint64-Align*10 {
		t.Fatalf("alloc of the whole space at the top = %#x", addr)
	}
	a = mustNew(t, 0x1000, 1000)
	if a.Capacity() != 960 || a.Available() != 960 || a.LargestFree() != 960 {
		t.Fatalf("size 1000: capacity %d available %d largest %d, want 960 (whole granules)", a.Capacity(), a.Available(), a.LargestFree())
	}
}

func TestAllocRoundsAndAligns(t *testing.T) {
	const base = 0x1003 // not aligned itself: addresses are aligned from it
	a := mustNew(t, base, 1<<20)
	x := mustAlloc(t, a, 1)
	y := mustAlloc(t, a, 65)
	z := mustAlloc(t, a, 64)
	for _, addr := range []uint64{x, y, z} {
		if (addr-base)%Align != 0 {
			t.Errorf("address %#x not %d-aligned from base %#x", addr, Align, base)
		}
	}
	if a.Used() != 64+128+64 || a.Allocations() != 3 || a.Available() != a.Capacity()-256 {
		t.Fatalf("used %d allocations %d available %d", a.Used(), a.Allocations(), a.Available())
	}
	if err := a.Free(y, 65); err != nil {
		t.Fatal(err)
	}
	if a.Used() != 128 || a.Allocations() != 2 {
		t.Fatalf("after free: used %d allocations %d", a.Used(), a.Allocations())
	}
	mustCheck(t, a)
}

func TestZeroSize(t *testing.T) {
	a := mustNew(t, 0, 1<<20)
	_, err := a.Alloc(0)
	if !errors.Is(err, ErrZeroSize) || errors.Is(err, ErrNoSpace) {
		t.Fatalf("alloc(0) = %v, want ErrZeroSize (not ErrNoSpace)", err)
	}
	if a.Allocations() != 0 || a.Used() != 0 {
		t.Fatal("alloc(0) changed the allocator")
	}
}

func TestExhaustion(t *testing.T) {
	const n = 1000
	a := mustNew(t, 0x10000, n*Align)
	seen := map[uint64]bool{}
	for i := 0; i < n; i++ {
		addr := mustAlloc(t, a, Align)
		if seen[addr] {
			t.Fatalf("address %#x handed out twice", addr)
		}
		seen[addr] = true
	}
	_, err := a.Alloc(1)
	if !errors.Is(err, ErrNoSpace) {
		t.Fatalf("alloc on a full allocator = %v, want ErrNoSpace", err)
	}
	if a.Available() != 0 || a.LargestFree() != 0 {
		t.Fatalf("full: available %d largest %d", a.Available(), a.LargestFree())
	}
	mustCheck(t, a)

	b := mustNew(t, 0, 1<<30)
	for _, big := range []uint64{1<<30 + 1, 1 << 40, math.MaxUint64} {
		if _, err := b.Alloc(big); !errors.Is(err, ErrNoSpace) {
			t.Errorf("alloc(%d) in 1 GiB = %v, want ErrNoSpace", big, err)
		}
	}
	mustAlloc(t, b, 1<<30) // exactly the capacity
}

func TestBadFree(t *testing.T) {
	const base = 0x7f0000000000
	a := mustNew(t, base, 1<<20)
	x := mustAlloc(t, a, 1000) // 1024 after rounding
	y := mustAlloc(t, a, 4096)
	before := mustCheck(t, a)
	used := a.Used()
	for _, c := range []struct {
		name       string
		addr, size uint64
	}{
		{"inside a block", x + Align, 1000},
		{"unaligned", x + 1, 1000},
		{"below base", base - Align, 64},
		{"past the end", base + 1<<20, 64},
		{"far past the end", math.MaxUint64, 64},
		{"free space", y + 8192, 64},
		{"larger size", x, 2000},
		{"smaller size", x, 900},
		{"zero size", x, 0},
		{"huge size", x, math.MaxUint64},
	} {
		if err := a.Free(c.addr, c.size); !errors.Is(err, ErrBadFree) {
			t.Errorf("%s: free(%#x, %d) = %v, want ErrBadFree", c.name, c.addr, c.size, err)
		}
	}
	// A size that rounds to the allocation's is the same allocation.
	if err := a.Free(x, 1024); err != nil {
		t.Fatalf("free with the rounded size: %v", err)
	}
	if err := a.Free(x, 1000); !errors.Is(err, ErrBadFree) {
		t.Fatalf("double free = %v, want ErrBadFree", err)
	}
	if a.Used() != used-1024 || a.Allocations() != 1 {
		t.Fatalf("after bad frees: used %d allocations %d", a.Used(), a.Allocations())
	}
	if err := a.Free(y, 4096); err != nil {
		t.Fatal(err)
	}
	if free := mustCheck(t, a); len(before) != 1 || len(free) != 1 || free[0] != (Range{base, 1 << 20}) {
		t.Fatalf("free blocks %v after freeing all", free)
	}
}

// TestFragmentation: with every other block free, a 2-block request fails
// although half the space is free; freeing one block between two free ones
// makes a run of three, and the request lands inside it.
func TestFragmentation(t *testing.T) {
	const blocks, bs = 64, 4096
	a := mustNew(t, 0, blocks*bs)
	addrs := make([]uint64, blocks)
	for i := range addrs {
		addrs[i] = mustAlloc(t, a, bs)
	}
	for i := 0; i < blocks; i += 2 {
		if err := a.Free(addrs[i], bs); err != nil {
			t.Fatal(err)
		}
	}
	if a.Available() != blocks/2*bs || a.LargestFree() != bs {
		t.Fatalf("available %d largest %d", a.Available(), a.LargestFree())
	}
	if _, err := a.Alloc(2 * bs); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("2-block alloc with no adjacent free pair = %v, want ErrNoSpace", err)
	}
	// Single blocks still fit in every hole.
	one := mustAlloc(t, a, bs)
	if err := a.Free(one, bs); err != nil {
		t.Fatal(err)
	}
	const k = 21 // blocks k-1 and k+1 are free
	if err := a.Free(addrs[k], bs); err != nil {
		t.Fatal(err)
	}
	if a.LargestFree() != 3*bs {
		t.Fatalf("largest free %d after merging three blocks, want %d", a.LargestFree(), 3*bs)
	}
	got := mustAlloc(t, a, 2*bs)
	if got < addrs[k-1] || got+2*bs > addrs[k+1]+bs {
		t.Fatalf("2-block alloc at %#x, outside the only free run [%#x, %#x)", got, addrs[k-1], addrs[k+1]+bs)
	}
	if _, err := a.Alloc(2 * bs); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("second 2-block alloc = %v, want ErrNoSpace", err)
	}
	mustCheck(t, a)
}

// TestTopBinScanLimit builds a top bin with more small blocks than Alloc
// reads, ahead of one that fits: LargestFree then promises only what Alloc
// will find, and Alloc keeps that promise.
func TestTopBinScanLimit(t *testing.T) {
	// Bin of 1024..1055 granules: holes of 1024 granules and one of 1040.
	const small, big, gran = 1024, 1040, Align
	a := mustNew(t, 0, 1<<30)
	var holes []uint64
	bigHole := mustAlloc(t, a, big*gran)
	mustAlloc(t, a, gran)
	for i := 0; i < scanLimit+4; i++ {
		holes = append(holes, mustAlloc(t, a, small*gran))
		mustAlloc(t, a, gran)
	}
	rest := mustAlloc(t, a, a.LargestFree()) // fill the tail
	_ = rest
	if err := a.Free(bigHole, big*gran); err != nil { // deepest in the bin list
		t.Fatal(err)
	}
	for _, h := range holes {
		if err := a.Free(h, small*gran); err != nil {
			t.Fatal(err)
		}
	}
	lf := a.LargestFree()
	if lf != small*gran {
		t.Fatalf("LargestFree %d, want %d (the big hole is beyond the scan)", lf, small*gran)
	}
	if _, err := a.Alloc(lf); err != nil {
		t.Fatalf("alloc(LargestFree) = %v", err)
	}
	mustCheck(t, a)
}

func TestNewWithUsed(t *testing.T) {
	const base, size = 0x7f0000000000, 1 << 40
	rng := rand.New(rand.NewPCG(1, 2))
	// The live data of a segment, as a previous master placed it.
	prev := mustNew(t, base, size)
	var used []Range
	for i := 0; i < 3000; i++ {
		n := 1 + rng.Uint64N(64<<20)
		addr := mustAlloc(t, prev, n)
		used = append(used, Range{addr, n})
	}
	for i := 0; i < len(used); i++ { // free a third, leaving holes
		if rng.IntN(3) == 0 {
			if err := prev.Free(used[i].Addr, used[i].Len); err != nil {
				t.Fatal(err)
			}
			used[i] = used[len(used)-1]
			used = used[:len(used)-1]
		}
	}
	rng.Shuffle(len(used), func(i, j int) { used[i], used[j] = used[j], used[i] })

	a, err := NewWithUsed(base, size, used)
	if err != nil {
		t.Fatal(err)
	}
	want := mustCheck(t, prev)
	if got := mustCheck(t, a); !slices.Equal(got, want) {
		t.Fatalf("rebuilt free blocks differ from the original's:\n%v\n%v", got, want)
	}
	if a.Used() != prev.Used() || a.Allocations() != len(used) {
		t.Fatalf("rebuilt used %d allocations %d, want %d %d", a.Used(), a.Allocations(), prev.Used(), len(used))
	}
	// Mooncake #3826/#1336: a new master must never place over live data.
	m := newModel(base, a.Capacity())
	for _, r := range used {
		m.live[r.Addr] = roundUp(r.Len)
	}
	for {
		n := 1 + rng.Uint64N(256<<20)
		addr, err := a.Alloc(n)
		if errors.Is(err, ErrNoSpace) {
			if n <= a.LargestFree() {
				t.Fatalf("alloc(%d) failed with LargestFree %d", n, a.LargestFree())
			}
			if a.LargestFree() < Align {
				break
			}
			n = a.LargestFree()
			if addr, err = a.Alloc(n); err != nil {
				t.Fatal(err)
			}
		} else if err != nil {
			t.Fatal(err)
		}
		if err := m.add(addr, n); err != nil {
			t.Fatal(err)
		}
	}
	if a.Available() != 0 {
		t.Fatalf("filled: %d bytes still available", a.Available())
	}
	// The rebuilt ranges free with the lengths the objects have.
	for _, r := range used {
		if err := a.Free(r.Addr, r.Len); err != nil {
			t.Fatal(err)
		}
		delete(m.live, r.Addr)
	}
	if err := compare(a, m); err != nil {
		t.Fatal(err)
	}

	empty, err := NewWithUsed(base, size, nil)
	if err != nil {
		t.Fatal(err)
	}
	if free := mustCheck(t, empty); len(free) != 1 || free[0] != (Range{base, size}) {
		t.Fatalf("NewWithUsed with nothing used: free %v", free)
	}
	full, err := NewWithUsed(base, 4*Align, []Range{{base + 2*Align, 2 * Align}, {base, 2*Align - 5}})
	if err != nil {
		t.Fatal(err)
	}
	if full.Available() != 0 || len(mustCheck(t, full)) != 0 {
		t.Fatalf("NewWithUsed covering everything: available %d", full.Available())
	}
}

func TestNewWithUsedErrors(t *testing.T) {
	const base, size = 0x7f0000000000, 1 << 20
	for _, c := range []struct {
		name string
		used []Range
		want string
	}{
		{"overlap", []Range{{base + 4096, 4096}, {base, 8192}}, "used range [0x7f0000001000, 0x7f0000002000): overlaps used range [0x7f0000000000, 0x7f0000002000)"},
		{"duplicate", []Range{{base, 64}, {base, 64}}, "overlaps"},
		{"below base", []Range{{base - 64, 64}}, "used range [0x7effffffffc0, 0x7f0000000000): outside [0x7f0000000000, 0x7f0000100000)"},
		{"past the end", []Range{{base + size - 64, 128}}, "outside"},
		{"overflow", []Range{{math.MaxUint64 - 10, 100}}, "overflows"},
		{"empty", []Range{{base, 0}}, "empty"},
		{"unaligned", []Range{{base + 8, 64}}, "not 64-byte aligned"},
	} {
		_, err := NewWithUsed(base, size, c.used)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: NewWithUsed(%v) = %v, want an error containing %q", c.name, c.used, err, c.want)
		}
	}
	if _, err := NewWithUsed(math.MaxUint64, 2, nil); err == nil {
		t.Error("NewWithUsed with an overflowing end succeeded")
	}
}

// TestLargeSpaces places objects beyond 4 GiB and 64 GiB offsets, and
// single objects larger than 4 GiB, in 1 TiB and 16 TiB spaces.
func TestLargeSpaces(t *testing.T) {
	const base = 0x7f0000000000
	for _, size := range []uint64{1 << 40, 16 << 40} {
		a := mustNew(t, base, size)
		third := size / 3
		x := mustAlloc(t, a, third)
		y := mustAlloc(t, a, third)
		z := mustAlloc(t, a, a.LargestFree())
		if x != base || y != base+roundUp(third) || z != base+2*roundUp(third) {
			t.Fatalf("%d: placed at %#x %#x %#x", size, x, y, z)
		}
		if a.Available() != 0 {
			t.Fatalf("%d: %d bytes left", size, a.Available())
		}
		if err := a.Free(y, third); err != nil {
			t.Fatal(err)
		}
		// 5 GiB objects into the middle third, well past 64 GiB from base.
		var got []uint64
		for {
			addr, err := a.Alloc(5 << 30)
			if errors.Is(err, ErrNoSpace) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, addr)
		}
		if want := roundUp(third) / (5 << 30); uint64(len(got)) != want {
			t.Fatalf("%d: %d objects of 5 GiB in the middle third, want %d", size, len(got), want)
		}
		if last := got[len(got)-1]; last+5<<30 > z || last < y {
			t.Fatalf("%d: last object at %#x outside [%#x, %#x)", size, last, y, z)
		}
		for _, addr := range got {
			if err := a.Free(addr, 5<<30); err != nil {
				t.Fatal(err)
			}
		}
		for _, r := range []Range{{x, third}, {z, size - 2*roundUp(third)}} {
			if err := a.Free(r.Addr, r.Len); err != nil {
				t.Fatal(err)
			}
		}
		if free := mustCheck(t, a); len(free) != 1 || free[0] != (Range{base, size}) {
			t.Fatalf("%d: free blocks %v after freeing all", size, free)
		}
	}
}

// TestAllocAligned: aligned ranges land on the boundary wherever the free
// block starts, the bytes before it stay free and usable, and freeing
// everything leaves one free block again.
func TestAllocAligned(t *testing.T) {
	const base = 0x7f0000001000
	a, err := New(base, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	m := newModel(base, a.Capacity())
	small, err := a.Alloc(100) // the next block starts 128 bytes past a page
	if err != nil {
		t.Fatal(err)
	}
	m.live[small] = roundUp(100)
	var got []Range
	for _, n := range []uint64{4096, 10000, 1, 65536 + 64} {
		addr, err := a.AllocAligned(n, 4096)
		if err != nil {
			t.Fatalf("AllocAligned(%d, 4096): %v", n, err)
		}
		if addr%4096 != 0 {
			t.Fatalf("AllocAligned(%d, 4096) = %#x, not on a 4096-byte boundary", n, addr)
		}
		if err := m.add(addr, n); err != nil {
			t.Fatal(err)
		}
		got = append(got, Range{addr, n})
		if err := compare(a, m); err != nil {
			t.Fatalf("after AllocAligned(%d): %v", n, err)
		}
	}
	// The bytes skipped before an aligned range are free for a small
	// object: it lands in such a gap, not past the last range.
	if addr, err := a.Alloc(64); err != nil || addr > got[len(got)-1].Addr {
		t.Fatalf("Alloc(64) = %#x, %v; want a gap left before an aligned range (below %#x)", addr, err, got[len(got)-1].Addr)
	} else {
		m.live[addr] = 64
		got = append(got, Range{addr, 64})
	}
	got = append(got, Range{small, 100})
	for _, r := range got {
		if err := a.Free(r.Addr, r.Len); err != nil {
			t.Fatalf("free %v: %v", r, err)
		}
		delete(m.live, r.Addr)
		if err := compare(a, m); err != nil {
			t.Fatalf("after free %v: %v", r, err)
		}
	}
	if a.LargestFree() != a.Capacity() {
		t.Fatalf("LargestFree %d after freeing everything, want %d", a.LargestFree(), a.Capacity())
	}
	for _, bad := range []uint64{3000, 1 << 31} {
		if _, err := a.AllocAligned(64, bad); err == nil || errors.Is(err, ErrNoSpace) {
			t.Fatalf("AllocAligned(64, %d) = %v, want the alignment refused", bad, err)
		}
	}
	// A block exactly as large as the request serves it when its start is
	// on the boundary: here the whole space.
	if addr, err := a.AllocAligned(a.Capacity(), 4096); err != nil || addr != base {
		t.Fatalf("AllocAligned(capacity, 4096) from a page-aligned base = %#x, %v; want the whole space", addr, err)
	}
	if _, err := a.AllocAligned(64, 4096); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("AllocAligned of a full space = %v, want ErrNoSpace", err)
	}
	if err := a.Free(base, a.Capacity()); err != nil {
		t.Fatal(err)
	}
	// The same space one granule past a page: no block has the room with
	// the boundary.
	b, _ := New(base+64, 1<<20)
	if _, err := b.AllocAligned(b.Capacity(), 4096); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("AllocAligned(capacity, 4096) from a base past a page = %v, want ErrNoSpace", err)
	}
	odd, _ := New(base+3, 1<<20)
	if _, err := odd.AllocAligned(4096, 4096); err == nil || errors.Is(err, ErrNoSpace) {
		t.Fatalf("AllocAligned over base %#x = %v, want the base refused", base+3, err)
	}
}

// An aligned request for about the whole allocator fails with no space
// (or succeeds) instead of panicking: its worst case, the size plus the
// alignment, lies past the allocator's largest size class, and the bin
// lookup indexed past its tables (found by FuzzAllocator).
func TestAllocAlignedNearCapacity(t *testing.T) {
	for _, capacity := range []uint64{64 << 10, 1 << 20, 64 << 20} {
		for _, align := range []uint64{128, 4096, 2 << 20, 1 << 30} {
			a, err := New(1<<30, capacity)
			if err != nil {
				t.Fatal(err)
			}
			// A small block first, so that the aligned ones cannot start
			// at the (aligned) base.
			if _, err := a.Alloc(48); err != nil {
				t.Fatal(err)
			}
			for _, n := range []uint64{capacity - Align, capacity - align + 1, capacity / 2, 65} {
				if n == 0 || n > capacity-Align {
					continue
				}
				addr, err := a.AllocAligned(n, align)
				if err == nil {
					if addr%align != 0 {
						t.Fatalf("capacity %d: alloc %d aligned %d at %#x", capacity, n, align, addr)
					}
					if err := a.Free(addr, n); err != nil {
						t.Fatal(err)
					}
				} else if !errors.Is(err, ErrNoSpace) {
					t.Fatalf("capacity %d: alloc %d aligned %d: %v", capacity, n, align, err)
				}
			}
		}
	}
}
