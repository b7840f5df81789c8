package alloc

import "math/bits"

// index finds an allocated block's node from its offset, for Free. It is a
// chained hash table whose chains run through the nextFree field, which an
// allocated node does not otherwise use, so an entry costs one bucket (4 to
// 8 bytes) instead of a map entry's 20 to 40. It grows by doubling, moving
// two old buckets per insert or remove (as Redis's dict does) rather than
// all at once, so no Free or Alloc pays for rehashing millions of entries.
type index struct {
	cur   []uint32
	old   []uint32 // non-nil while growing: buckets [moved, len) not yet moved
	moved int
	count int
	bits  uint8 // len(cur) == 1<<bits
}

func (x *index) init(expect int) {
	x.bits = uint8(max(3, bits.Len(uint(expect))))
	x.cur = make([]uint32, 1<<x.bits)
	for i := range x.cur {
		x.cur[i] = nilIdx
	}
}

// bucket spreads offsets with Fibonacci hashing: allocations of one size
// sit at an arithmetic progression of offsets, which this scatters well.
func bucket(off uint64, b uint8) uint64 {
	return (off * 0x9E3779B97F4A7C15) >> (64 - b)
}

func (a *Allocator) idxStep() {
	x := &a.idx
	if x.old == nil {
		return
	}
	for k := 0; k < 2 && x.moved < len(x.old); k++ {
		for j := x.old[x.moved]; j != nilIdx; {
			nd := a.n(j)
			next := nd.nextFree
			b := bucket(nd.off, x.bits)
			nd.nextFree = x.cur[b]
			x.cur[b] = j
			j = next
		}
		x.moved++
	}
	if x.moved == len(x.old) {
		x.old = nil
	}
}

func (a *Allocator) idxInsert(off uint64, i uint32) {
	a.idxStep()
	x := &a.idx
	if x.old == nil && x.count >= len(x.cur) {
		x.old, x.moved = x.cur, 0
		x.bits++
		x.cur = make([]uint32, 1<<x.bits)
		for k := range x.cur {
			x.cur[k] = nilIdx
		}
	}
	b := bucket(off, x.bits)
	a.n(i).nextFree = x.cur[b]
	x.cur[b] = i
	x.count++
}

// idxHead returns the chain that holds off if it is indexed.
func (a *Allocator) idxHead(off uint64) *uint32 {
	x := &a.idx
	if x.old != nil {
		if b := bucket(off, x.bits-1); b >= uint64(x.moved) {
			for j := x.old[b]; j != nilIdx; j = a.n(j).nextFree {
				if a.n(j).off == off {
					return &x.old[b]
				}
			}
		}
	}
	return &x.cur[bucket(off, x.bits)]
}

func (a *Allocator) idxFind(off uint64) uint32 {
	for j := *a.idxHead(off); j != nilIdx; j = a.n(j).nextFree {
		if a.n(j).off == off {
			return j
		}
	}
	return nilIdx
}

func (a *Allocator) idxRemove(off uint64) {
	link := a.idxHead(off)
	for j := *link; j != nilIdx; j = *link {
		nd := a.n(j)
		if nd.off == off {
			*link = nd.nextFree
			a.idx.count--
			break
		}
		link = &nd.nextFree
	}
	a.idxStep()
}
