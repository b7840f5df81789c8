package alloc

import (
	"errors"
	"fmt"
	"math/bits"
	"slices"
)

// Align is the allocation granule: sizes are rounded up to a multiple of it
// and addresses are multiples of it from base.
const Align = 64

const alignShift = 6

var (
	// ErrNoSpace means no free block can hold the request.
	ErrNoSpace = errors.New("no free block large enough")
	// ErrBadFree means Free was given an address that is not the start of a
	// live allocation (never allocated, already freed, out of range) or a
	// size that is not the one the allocation was made with.
	ErrBadFree = errors.New("not a live allocation")
	// ErrZeroSize means Alloc was asked for 0 bytes: a zero-length object
	// needs no space and must not take an address another object could get.
	ErrZeroSize = errors.New("zero-size allocation")
)

// Range is a span of addresses [Addr, Addr+Len).
type Range struct{ Addr, Len uint64 }

const (
	slBits  = 5
	slCount = 1 << slBits // linear sub-bins per power of two

	// scanLimit bounds how many blocks of one bin Alloc's fallback and
	// LargestFree read, which keeps both O(1) when a bin holds many blocks
	// that are too small for a request landing inside that bin's range.
	scanLimit = 16

	nilIdx  = ^uint32(0)
	freeBit = uint64(1) << 63 // in node.off; offsets are granules, below 2^58

	chunkBits = 12
	chunkSize = 1 << chunkBits
)

// node is one block, free or allocated. Its size is implicit (the next
// block's offset minus its own), which keeps a node at 24 bytes.
type node struct {
	off                uint64 // granules from base; freeBit while free
	prevPhys, nextPhys uint32
	// While free: the bin's list. While allocated: nextFree chains the
	// index bucket, and prevFree is unused.
	prevFree, nextFree uint32
}

// Allocator hands out Align-aligned ranges of [base, base+capacity). It is
// not safe for concurrent use.
type Allocator struct {
	base     uint64
	granules uint64 // capacity in granules, also the end offset
	used     uint64 // granules
	allocs   int

	// Nodes live in chunks of chunkSize so that growing never copies more
	// than one chunk; only the last chunk is partly filled.
	chunks [][]node
	nNodes uint32
	spare  uint32 // released nodes, chained through nextFree

	flCount  uint32
	flBitmap uint64
	slBitmap []uint32
	heads    []uint32 // flCount*slCount bin list heads

	idx index
}

// New manages [base, base+size). Capacity is size rounded down to a
// multiple of Align. It fails when base+size overflows 64 bits or size is
// smaller than Align.
func New(base, size uint64) (*Allocator, error) {
	a, err := newEmpty(base, size, 0)
	if err != nil {
		return nil, err
	}
	i, _ := a.newNode()
	*a.n(i) = node{off: 0, prevPhys: nilIdx, nextPhys: nilIdx}
	a.insertFree(i, a.granules)
	return a, nil
}

func newEmpty(base, size uint64, expect int) (*Allocator, error) {
	if base+size < base {
		return nil, fmt.Errorf("new allocator [%#x, +%d): end overflows 64 bits", base, size)
	}
	if size < Align {
		return nil, fmt.Errorf("new allocator [%#x, +%d): size below the %d-byte granule", base, size, Align)
	}
	a := &Allocator{base: base, granules: size >> alignShift, spare: nilIdx}
	fl, _ := binOf(a.granules)
	a.flCount = fl + 1
	a.slBitmap = make([]uint32, a.flCount)
	a.heads = make([]uint32, a.flCount*slCount)
	for i := range a.heads {
		a.heads[i] = nilIdx
	}
	a.idx.init(expect)
	return a, nil
}

// NewWithUsed rebuilds an allocator over [base, base+size) whose used
// ranges are given in any order, such as the replicas a re-mounted segment
// still holds. Each range must start Align-aligned from base; its length is
// rounded up as Alloc would, so Free(r.Addr, r.Len) releases it later.
// Overlapping, empty, unaligned or out-of-range ranges are an error naming
// the range.
func NewWithUsed(base, size uint64, used []Range) (*Allocator, error) {
	a, err := newEmpty(base, size, len(used))
	if err != nil {
		return nil, err
	}
	end := base + a.granules<<alignShift
	sorted := slices.Clone(used)
	slices.SortFunc(sorted, func(x, y Range) int {
		switch {
		case x.Addr < y.Addr:
			return -1
		case x.Addr > y.Addr:
			return 1
		}
		return 0
	})
	last := nilIdx
	var at uint64 // granule offset where the next block starts
	add := func(off uint64, free bool, g uint64) {
		i, _ := a.newNode()
		*a.n(i) = node{off: off, prevPhys: last, nextPhys: nilIdx}
		if last != nilIdx {
			a.n(last).nextPhys = i
		}
		last = i
		if free {
			a.insertFree(i, g)
			return
		}
		a.idxInsert(off, i)
		a.used += g
		a.allocs++
	}
	bad := func(r Range, why string, args ...any) error {
		return fmt.Errorf("new allocator: used range [%#x, %#x): "+why, append([]any{r.Addr, r.Addr + r.Len}, args...)...)
	}
	for k, r := range sorted {
		switch {
		case r.Len == 0:
			return nil, fmt.Errorf("new allocator: used range at %#x: empty", r.Addr)
		case r.Addr+r.Len < r.Addr:
			return nil, fmt.Errorf("new allocator: used range at %#x, +%d: end overflows 64 bits", r.Addr, r.Len)
		case r.Addr < base || r.Addr+r.Len > end:
			return nil, bad(r, "outside [%#x, %#x)", base, end)
		case (r.Addr-base)&(Align-1) != 0:
			return nil, bad(r, "start not %d-byte aligned from base %#x", Align, base)
		}
		off := (r.Addr - base) >> alignShift
		if off < at {
			p := sorted[k-1]
			return nil, bad(r, "overlaps used range [%#x, %#x)", p.Addr, p.Addr+p.Len)
		}
		g := (r.Len + Align - 1) >> alignShift // no overflow: r.Len < end-base
		if off > at {
			add(at, true, off-at)
		}
		add(off, false, g)
		at = off + g
	}
	if at < a.granules {
		add(at, true, a.granules-at)
	}
	return a, nil
}

// Alloc returns the address of n free bytes (rounded up to Align). It fails
// with ErrZeroSize for n == 0 and ErrNoSpace when no free block fits. O(1).
func (a *Allocator) Alloc(n uint64) (uint64, error) {
	if n == 0 {
		return 0, fmt.Errorf("alloc 0 bytes: %w", ErrZeroSize)
	}
	if n > a.Available() {
		return 0, a.noSpace(n)
	}
	g := (n + Align - 1) >> alignShift
	i, s := a.findFree(g)
	if i == nilIdx {
		return 0, a.noSpace(n)
	}
	// Take the remainder's node before holding node pointers: growing the
	// last chunk moves it.
	r := nilIdx
	if s > g {
		var ok bool
		if r, ok = a.newNode(); !ok {
			return 0, fmt.Errorf("alloc %d bytes: %d blocks, the most one allocator tracks: %w", n, a.nNodes, ErrNoSpace)
		}
	}
	a.removeFree(i, s)
	nd := a.n(i)
	if r != nilIdx {
		next := nd.nextPhys
		*a.n(r) = node{off: nd.off + g, prevPhys: i, nextPhys: next}
		if next != nilIdx {
			a.n(next).prevPhys = r
		}
		nd.nextPhys = r
		a.insertFree(r, s-g)
	}
	a.idxInsert(nd.off, i)
	a.used += g
	a.allocs++
	return a.base + nd.off<<alignShift, nil
}

// AllocAligned is Alloc with an address that is a multiple of align, a
// power of two (at most 1 GiB; at most Align is Alloc). A range a disk
// read lands in with O_DIRECT must start on a block boundary, which
// Align alone does not give. It takes a free block large enough for the
// request wherever the boundary falls in it and gives the bytes before the
// boundary back as a free block of their own. It fails with ErrNoSpace
// when no such block is found, and with an error saying so when the
// allocator's base is not Align-aligned (no granule boundary can then be
// an align boundary). O(1).
func (a *Allocator) AllocAligned(n, align uint64) (uint64, error) {
	if align&(align-1) != 0 || align > 1<<30 {
		return 0, fmt.Errorf("alloc %d bytes aligned to %d: the alignment is not a power of two up to 1 GiB", n, align)
	}
	if align <= Align {
		return a.Alloc(n)
	}
	if n == 0 {
		return 0, fmt.Errorf("alloc 0 bytes: %w", ErrZeroSize)
	}
	if a.base&(Align-1) != 0 {
		return 0, fmt.Errorf("alloc %d bytes aligned to %d: base %#x is not %d-byte aligned", n, align, a.base, Align)
	}
	if n > a.Available() {
		return 0, a.noSpace(n)
	}
	g := (n + Align - 1) >> alignShift
	leadOf := func(i uint32) uint64 {
		abs := a.base + (a.n(i).off&^freeBit)<<alignShift
		return (((abs + align - 1) &^ (align - 1)) - abs) >> alignShift
	}
	// The block a plain allocation would take, if the boundary leaves
	// room in it (a gap exactly as large as an aligned range, as freeing
	// one leaves, does); otherwise one large enough for the worst case,
	// the boundary one granule past its start.
	i, s := a.findFree(g)
	if i != nilIdx && leadOf(i)+g > s {
		i = nilIdx
	}
	if i == nilIdx {
		if i, s = a.findFree(g + align>>alignShift - 1); i == nilIdx {
			return 0, a.noSpace(n)
		}
	}
	start := a.n(i).off &^ freeBit
	lead := leadOf(i)
	// Nodes first: growing the last chunk moves node pointers.
	l, r := nilIdx, nilIdx
	var ok bool
	if lead > 0 {
		if l, ok = a.newNode(); !ok {
			return 0, fmt.Errorf("alloc %d bytes: %d blocks, the most one allocator tracks: %w", n, a.nNodes, ErrNoSpace)
		}
	}
	if s > lead+g {
		if r, ok = a.newNode(); !ok {
			if l != nilIdx {
				a.releaseNode(l)
			}
			return 0, fmt.Errorf("alloc %d bytes: %d blocks, the most one allocator tracks: %w", n, a.nNodes, ErrNoSpace)
		}
	}
	a.removeFree(i, s)
	if l != nilIdx {
		// i keeps the bytes before the boundary, free; l is the allocation.
		nd := a.n(i)
		next := nd.nextPhys
		*a.n(l) = node{off: start + lead, prevPhys: i, nextPhys: next}
		if next != nilIdx {
			a.n(next).prevPhys = l
		}
		a.n(i).nextPhys = l
		a.insertFree(i, lead)
		i = l
	}
	if r != nilIdx {
		nd := a.n(i)
		next := nd.nextPhys
		*a.n(r) = node{off: nd.off + g, prevPhys: i, nextPhys: next}
		if next != nilIdx {
			a.n(next).prevPhys = r
		}
		nd.nextPhys = r
		a.insertFree(r, s-lead-g)
	}
	off := a.n(i).off
	a.idxInsert(off, i)
	a.used += g
	a.allocs++
	return a.base + off<<alignShift, nil
}

// releaseNode gives back a node newNode returned that was never linked.
func (a *Allocator) releaseNode(i uint32) {
	a.n(i).nextFree = a.spare
	a.spare = i
}

func (a *Allocator) noSpace(n uint64) error {
	return fmt.Errorf("alloc %d bytes: largest free block %d, %d of %d bytes free: %w",
		n, a.LargestFree(), a.Available(), a.Capacity(), ErrNoSpace)
}

// Free releases the allocation at addr; n is the size given to Alloc (or
// the Len given to NewWithUsed; any n that rounds up to the same multiple
// of Align is the same). The block merges with free neighbours.
// Anything but a live allocation's start and size is ErrBadFree, and
// changes nothing. O(1).
func (a *Allocator) Free(addr, n uint64) error {
	rel := addr - a.base
	if addr < a.base || rel >= a.granules<<alignShift || rel&(Align-1) != 0 {
		return fmt.Errorf("free %#x: not an allocation start in [%#x, %#x): %w",
			addr, a.base, a.base+a.Capacity(), ErrBadFree)
	}
	off := rel >> alignShift
	i := a.idxFind(off)
	if i == nilIdx {
		return fmt.Errorf("free %#x: no live allocation starts there (never allocated or already freed): %w", addr, ErrBadFree)
	}
	s := a.size(i)
	if n == 0 || n > a.Capacity() || (n+Align-1)>>alignShift != s {
		return fmt.Errorf("free %#x: size %d does not match the allocation's %d bytes: %w", addr, n, s<<alignShift, ErrBadFree)
	}
	a.idxRemove(off)
	a.used -= s
	a.allocs--

	if p := a.n(i).prevPhys; p != nilIdx && a.n(p).off&freeBit != 0 {
		ps := a.size(p)
		a.removeFree(p, ps)
		a.unlink(i)
		i, s = p, s+ps
	}
	if x := a.n(i).nextPhys; x != nilIdx && a.n(x).off&freeBit != 0 {
		xs := a.size(x)
		a.removeFree(x, xs)
		a.unlink(x)
		s += xs
	}
	a.insertFree(i, s)
	return nil
}

// unlink drops block i from the physical list, its predecessor absorbing
// its space, and releases the node.
func (a *Allocator) unlink(i uint32) {
	nd := a.n(i)
	p, x := nd.prevPhys, nd.nextPhys
	a.n(p).nextPhys = x
	if x != nilIdx {
		a.n(x).prevPhys = p
	}
	nd.nextFree = a.spare
	a.spare = i
}

// Used returns the bytes allocated, after rounding.
func (a *Allocator) Used() uint64 { return a.used << alignShift }

// Capacity returns the bytes managed: size rounded down to Align.
func (a *Allocator) Capacity() uint64 { return a.granules << alignShift }

// Available returns Capacity minus Used, however fragmented.
func (a *Allocator) Available() uint64 { return (a.granules - a.used) << alignShift }

// Allocations returns the number of live allocations.
func (a *Allocator) Allocations() int { return a.allocs }

// LargestFree returns the size of the largest request Alloc is sure to
// satisfy now, so placement can skip a segment that cannot fit an object
// without trying it. That is the largest free block, unless the top bin
// holds more than scanLimit blocks; then it is the largest among those
// Alloc would look at (still at least the bin's lower bound). O(1).
func (a *Allocator) LargestFree() uint64 {
	if a.flBitmap == 0 {
		return 0
	}
	fl := uint32(63 - bits.LeadingZeros64(a.flBitmap))
	sl := uint32(31 - bits.LeadingZeros32(a.slBitmap[fl]))
	var best uint64
	i := a.heads[fl*slCount+sl]
	for k := 0; k < scanLimit && i != nilIdx; k++ {
		best = max(best, a.size(i))
		i = a.n(i).nextFree
	}
	return best << alignShift
}

func (a *Allocator) n(i uint32) *node {
	return &a.chunks[i>>chunkBits][i&(chunkSize-1)]
}

// newNode returns a node index, reusing released ones first. It may move
// the last chunk, so callers fetch node pointers after it.
func (a *Allocator) newNode() (uint32, bool) {
	if i := a.spare; i != nilIdx {
		a.spare = a.n(i).nextFree
		return i, true
	}
	if a.nNodes == nilIdx {
		return nilIdx, false
	}
	c := len(a.chunks) - 1
	if c < 0 || len(a.chunks[c]) == chunkSize {
		a.chunks = append(a.chunks, make([]node, 0, 4))
		c++
	}
	if ch := a.chunks[c]; len(ch) == cap(ch) {
		grown := make([]node, len(ch), min(2*cap(ch), chunkSize))
		copy(grown, ch)
		a.chunks[c] = grown
	}
	a.chunks[c] = append(a.chunks[c], node{})
	i := a.nNodes
	a.nNodes++
	return i, true
}

// size returns block i's size in granules.
func (a *Allocator) size(i uint32) uint64 {
	nd := a.n(i)
	end := a.granules
	if nd.nextPhys != nilIdx {
		end = a.n(nd.nextPhys).off &^ freeBit
	}
	return end - nd.off&^freeBit
}

// binOf maps a size in granules to its bin: sizes below slCount have a bin
// each (fl 0); above, fl is the power of two and sl the linear slice of it.
func binOf(g uint64) (fl, sl uint32) {
	if g < slCount {
		return 0, uint32(g)
	}
	t := uint32(bits.Len64(g)) - 1
	return t - slBits + 1, uint32(g>>(t-slBits)) - slCount
}

func (a *Allocator) insertFree(i uint32, g uint64) {
	fl, sl := binOf(g)
	b := fl*slCount + sl
	h := a.heads[b]
	nd := a.n(i)
	nd.off |= freeBit
	nd.prevFree, nd.nextFree = nilIdx, h
	if h != nilIdx {
		a.n(h).prevFree = i
	}
	a.heads[b] = i
	a.slBitmap[fl] |= 1 << sl
	a.flBitmap |= 1 << fl
}

func (a *Allocator) removeFree(i uint32, g uint64) {
	fl, sl := binOf(g)
	b := fl*slCount + sl
	nd := a.n(i)
	nd.off &^= freeBit
	p, x := nd.prevFree, nd.nextFree
	if p != nilIdx {
		a.n(p).nextFree = x
	} else {
		a.heads[b] = x
	}
	if x != nilIdx {
		a.n(x).prevFree = p
	}
	if a.heads[b] == nilIdx {
		a.slBitmap[fl] &^= 1 << sl
		if a.slBitmap[fl] == 0 {
			a.flBitmap &^= 1 << fl
		}
	}
}

// findFree returns a free block of at least g granules and its size, or
// nilIdx. It rounds g up to the next bin boundary so that any block of the
// bin it finds fits (good fit, two bit scans). Only when that finds nothing
// does it look at a few blocks of g's own bin, whose smaller blocks may not
// fit.
func (a *Allocator) findFree(g uint64) (uint32, uint64) {
	rg := g
	if g >= slCount {
		rg += 1<<(bits.Len64(g)-1-slBits) - 1
	}
	fl, sl := binOf(rg)
	if fl < a.flCount {
		m := a.slBitmap[fl] & (^uint32(0) << sl)
		if m == 0 {
			if f := a.flBitmap & (^uint64(0) << (fl + 1)); f != 0 {
				fl = uint32(bits.TrailingZeros64(f))
				m = a.slBitmap[fl]
			}
		}
		if m != 0 {
			i := a.heads[fl*slCount+uint32(bits.TrailingZeros32(m))]
			return i, a.size(i)
		}
	}
	gfl, gsl := binOf(g)
	if rfl, rsl := binOf(rg); rfl == gfl && rsl == gsl || gfl >= a.flCount {
		// g's bin was searched above, or is past the largest this
		// allocator has: no block is that large (an aligned request
		// asks for its size plus the alignment, which can be).
		return nilIdx, 0
	}
	i := a.heads[gfl*slCount+gsl]
	for k := 0; k < scanLimit && i != nilIdx; k++ {
		if s := a.size(i); s >= g {
			return i, s
		}
		i = a.n(i).nextFree
	}
	return nilIdx, 0
}
