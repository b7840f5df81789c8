package alloc

import (
	"errors"
	"slices"
	"testing"
)

// FuzzAllocator reads a space and a sequence of operations from the input
// and checks every step against the interval model: allocs, frees, frees of
// arbitrary (mostly bad) addresses and sizes, rebuilding with NewWithUsed
// from the live set, and NewWithUsed over arbitrary ranges.
//
// Input: 2 header bytes (space size, base), then 5 bytes per operation, at
// most maxFuzzOps of them: each step is checked against the model in
// O(live), so longer inputs only slow the fuzzer down.
func FuzzAllocator(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 1, 0, 0})
	f.Add([]byte{15, 3, 0, 0, 64, 0, 0, 1, 0, 200, 0, 0, 2, 0, 0, 0, 0, 2, 1, 0, 0, 0})
	f.Add([]byte{255, 0x5f, 0, 0x40, 0, 0, 0, 1, 0x10, 0, 0, 0, 4, 0, 0, 0, 0, 3, 1, 2, 3, 4, 5, 9, 9, 9, 9, 0})
	// Aligned allocations (op 6) between plain ones and frees.
	f.Add([]byte{15, 3, 0, 0, 1, 0, 0, 6, 0, 100, 6, 0, 6, 0, 200, 3, 0, 2, 0, 0, 0, 0, 6, 0x80, 9, 7, 0})
	f.Fuzz(fuzzOps)
}

const maxFuzzOps = 256

func fuzzOps(t *testing.T, in []byte) {
	if len(in) < 2 {
		return
	}
	in = in[:min(len(in), 2+5*maxFuzzOps)]
	granules := (uint64(in[0]) + 1) << (in[1] % 32)
	var base uint64
	if in[1]&32 != 0 {
		base = 0x7f0000000000
	}
	if in[1]&64 != 0 {
		base += 3
	}
	a, err := New(base, granules*Align)
	if err != nil {
		t.Fatal(err)
	}
	capacity := a.Capacity()
	m := newModel(base, capacity)
	var live []Range // as requested, in allocation order
	size := func(hi, lo byte) uint64 {
		u := uint64(hi)<<8 | uint64(lo)
		if hi&0x80 != 0 { // scaled to the space, up to ~2x capacity
			return (u & 0x7fff) * (capacity >> 14)
		}
		return u
	}
	for op := in[2:]; len(op) >= 5; op = op[5:] {
		switch op[0] % 7 {
		case 0, 1:
			n := size(op[1], op[2])
			lf := a.LargestFree()
			addr, err := a.Alloc(n)
			switch {
			case n == 0:
				if !errors.Is(err, ErrZeroSize) {
					t.Fatalf("alloc(0) = %v", err)
				}
			case err != nil:
				if !errors.Is(err, ErrNoSpace) || n <= lf {
					t.Fatalf("alloc(%d) with LargestFree %d = %v", n, lf, err)
				}
			default:
				if err := m.add(addr, n); err != nil {
					t.Fatal(err)
				}
				live = append(live, Range{addr, n})
			}
		case 2:
			if len(live) == 0 {
				continue
			}
			k := int(op[1]) % len(live)
			r := live[k]
			if err := a.Free(r.Addr, r.Len); err != nil {
				t.Fatalf("free(%#x, %d): %v", r.Addr, r.Len, err)
			}
			live = slices.Delete(live, k, k+1)
			delete(m.live, r.Addr)
		case 3:
			addr := base + size(op[1], op[2])
			n := size(op[3], op[4])
			err := a.Free(addr, n)
			if l, ok := m.live[addr]; ok && n != 0 && roundUp(n) == l {
				if err != nil {
					t.Fatalf("free(%#x, %d) of a live allocation: %v", addr, n, err)
				}
				delete(m.live, addr)
				live = slices.DeleteFunc(live, func(r Range) bool { return r.Addr == addr })
			} else if !errors.Is(err, ErrBadFree) {
				t.Fatalf("free(%#x, %d), not a live allocation = %v", addr, n, err)
			}
		case 4:
			shuffled := slices.Clone(live)
			if len(shuffled) > 1 {
				k := int(op[1]) % len(shuffled)
				shuffled[0], shuffled[k] = shuffled[k], shuffled[0]
			}
			b, err := NewWithUsed(base, granules*Align, shuffled)
			if err != nil {
				t.Fatalf("NewWithUsed from the live set: %v", err)
			}
			a = b
		case 5:
			var rs []Range
			for i := 1; i+1 < 5; i += 2 {
				rs = append(rs, Range{base + uint64(op[i])*Align, uint64(op[i+1]) * 17})
			}
			_, err := NewWithUsed(base, granules*Align, rs)
			valid := true
			for i, r := range rs {
				if r.Len == 0 || r.Addr+roundUp(r.Len) > base+capacity {
					valid = false
				}
				for _, q := range rs[:i] {
					if r.Addr < q.Addr+roundUp(q.Len) && q.Addr < r.Addr+roundUp(r.Len) {
						valid = false
					}
				}
			}
			if valid != (err == nil) {
				t.Fatalf("NewWithUsed(%v) in [%#x, +%d) = %v, model says valid=%v", rs, base, capacity, err, valid)
			}
		case 6:
			n := size(op[1], op[2])
			align := uint64(Align) << (op[3] % 8)
			lf := a.LargestFree()
			addr, err := a.AllocAligned(n, align)
			switch {
			case n == 0:
				if !errors.Is(err, ErrZeroSize) {
					t.Fatalf("alloc(0) = %v", err)
				}
			case base%Align != 0 && align > Align:
				if err == nil || errors.Is(err, ErrNoSpace) {
					t.Fatalf("AllocAligned(%d, %d) over base %#x = %v, want the base refused", n, align, base, err)
				}
			case err != nil:
				// Only a request that LargestFree does not promise room
				// for, its boundary included, may fail.
				if !errors.Is(err, ErrNoSpace) || roundUp(n)+align-Align <= lf {
					t.Fatalf("AllocAligned(%d, %d) with LargestFree %d = %v", n, align, lf, err)
				}
			default:
				if align > Align && addr%align != 0 {
					t.Fatalf("AllocAligned(%d, %d) = %#x, not aligned", n, align, addr)
				}
				if err := m.add(addr, n); err != nil {
					t.Fatal(err)
				}
				live = append(live, Range{addr, n})
			}
		}
		if err := compare(a, m); err != nil {
			t.Fatal(err)
		}
	}
}
