// Package policy is the eviction order of a KV-cache: which cached entry
// to drop first when room is needed. The store's master orders its objects
// with it, `mc store replay` replays request traces through it, and the
// conductor simulator's instance caches use it, so a policy measured on a
// trace is the policy the store runs.
//
// A Policy orders Entries that its user embeds in its own records (no
// allocation per entry, O(1) per operation):
//
//   - lru: least recently added or touched first.
//   - fifo: first added first; touching does not refresh.
//   - lfu: fewest touches first (an add counts as one), ties least
//     recently used first; O(1) with frequency buckets.
//   - length-aware: the Mooncake paper's observation that the later blocks
//     of a long prefix are reused less than its early ones. An entry's
//     depth is its block's position in the request that last added or
//     touched it (0 for the first block of a prompt); the deepest entries
//     go first, ties least recently used first. Depths at or beyond
//     MaxDepth share the deepest bucket.
//
// A new policy is one type implementing Policy, registered in New.
package policy

import (
	"fmt"
	"strings"
)

// Entry is the policy's handle on one cached item, embedded in the user's
// record. V points back at the record.
type Entry[T any] struct {
	prev, next *Entry[T]
	bucket     *bucket[T] // lfu: its frequency bucket
	hits       uint32
	depth      uint16 // < MaxDepth; with in, fits beside hits in one word
	in         bool
	V          T
}

// Hits is how often the entry was added or touched.
func (e *Entry[T]) Hits() uint32 { return e.hits }

// In reports whether the entry is in a policy.
func (e *Entry[T]) In() bool { return e.in }

// Depth is the entry's depth as length-aware keeps it (0 in the others).
func (e *Entry[T]) Depth() int { return int(e.depth) }

// Policy orders entries for eviction. Implementations are not safe for
// concurrent use; callers hold their own lock.
type Policy[T any] interface {
	// Add inserts e (not in any policy) at depth (its block position in
	// its request; only length-aware uses it).
	Add(e *Entry[T], depth int)
	// Touch records a use of e (a read, or a request reusing its block
	// at depth).
	Touch(e *Entry[T], depth int)
	// Remove takes e out.
	Remove(e *Entry[T])
	// Victim is the entry to evict first, nil when empty.
	Victim() *Entry[T]
	// Victims calls fn with entries in eviction order until it returns
	// false. fn may Remove the entry it is given, and nothing else.
	Victims(fn func(e *Entry[T]) bool)
	Len() int
	Name() string
}

// Names lists the policies New knows.
var Names = []string{"lru", "lfu", "fifo", "length-aware"}

// MaxDepth bounds length-aware's depth buckets.
const MaxDepth = 4096

// New returns the policy called name.
func New[T any](name string) (Policy[T], error) {
	switch strings.ToLower(name) {
	case "lru":
		return &lru[T]{name: "lru", refresh: true}, nil
	case "fifo":
		return &lru[T]{name: "fifo"}, nil
	case "lfu":
		return &lfu[T]{}, nil
	case "length-aware", "length_aware", "lengthaware":
		return &lengthAware[T]{}, nil
	}
	return nil, fmt.Errorf("eviction policy %q: want one of %s", name, strings.Join(Names, ", "))
}

// list is an intrusive doubly linked list; front is the eviction end.
type list[T any] struct {
	head, tail *Entry[T]
	n          int
}

func (l *list[T]) pushBack(e *Entry[T]) {
	e.prev, e.next = l.tail, nil
	if l.tail != nil {
		l.tail.next = e
	} else {
		l.head = e
	}
	l.tail = e
	l.n++
}

func (l *list[T]) unlink(e *Entry[T]) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		l.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		l.tail = e.prev
	}
	e.prev, e.next = nil, nil
	l.n--
}

// each walks front to back; fn may unlink the entry it is given.
func (l *list[T]) each(fn func(e *Entry[T]) bool) bool {
	for e := l.head; e != nil; {
		next := e.next
		if !fn(e) {
			return false
		}
		e = next
	}
	return true
}

func mustOut[T any](e *Entry[T]) {
	if e.in {
		panic("policy: Add of an entry already in a policy")
	}
}

// lru is LRU, or FIFO when touches do not refresh.
type lru[T any] struct {
	l       list[T]
	name    string
	refresh bool
}

func (p *lru[T]) Add(e *Entry[T], depth int) {
	mustOut(e)
	e.in, e.hits = true, 1
	p.l.pushBack(e)
}

func (p *lru[T]) Touch(e *Entry[T], _ int) {
	e.hits++
	if p.refresh {
		p.l.unlink(e)
		p.l.pushBack(e)
	}
}

func (p *lru[T]) Remove(e *Entry[T]) {
	p.l.unlink(e)
	e.in = false
}

func (p *lru[T]) Victim() *Entry[T]                 { return p.l.head }
func (p *lru[T]) Victims(fn func(e *Entry[T]) bool) { p.l.each(fn) }
func (p *lru[T]) Len() int                          { return p.l.n }
func (p *lru[T]) Name() string                      { return p.name }

// bucket is one frequency's entries (lfu), least recently used first.
type bucket[T any] struct {
	freq       uint32
	l          list[T]
	prev, next *bucket[T]
}

// lfu keeps buckets in increasing frequency; moving an entry up is O(1)
// because its next frequency's bucket is its bucket's neighbour or new.
type lfu[T any] struct {
	head *bucket[T] // lowest frequency
	n    int
}

func (p *lfu[T]) Add(e *Entry[T], _ int) {
	mustOut(e)
	e.in, e.hits = true, 1
	b := p.head
	if b == nil || b.freq != 1 {
		b = &bucket[T]{freq: 1, next: p.head}
		if p.head != nil {
			p.head.prev = b
		}
		p.head = b
	}
	e.bucket = b
	b.l.pushBack(e)
	p.n++
}

func (p *lfu[T]) Touch(e *Entry[T], _ int) {
	e.hits++
	b := e.bucket
	nb := b.next
	if nb == nil || nb.freq != b.freq+1 {
		nb = &bucket[T]{freq: b.freq + 1, prev: b, next: b.next}
		if b.next != nil {
			b.next.prev = nb
		}
		b.next = nb
	}
	b.l.unlink(e)
	e.bucket = nb
	nb.l.pushBack(e)
	if b.l.n == 0 {
		p.drop(b)
	}
}

func (p *lfu[T]) drop(b *bucket[T]) {
	if b.prev != nil {
		b.prev.next = b.next
	} else {
		p.head = b.next
	}
	if b.next != nil {
		b.next.prev = b.prev
	}
}

func (p *lfu[T]) Remove(e *Entry[T]) {
	b := e.bucket
	b.l.unlink(e)
	e.bucket, e.in = nil, false
	if b.l.n == 0 {
		p.drop(b)
	}
	p.n--
}

func (p *lfu[T]) Victim() *Entry[T] {
	if p.head == nil {
		return nil
	}
	return p.head.l.head
}

func (p *lfu[T]) Victims(fn func(e *Entry[T]) bool) {
	for b := p.head; b != nil; {
		next := b.next
		if !b.l.each(fn) {
			return
		}
		b = next
	}
}

func (p *lfu[T]) Len() int     { return p.n }
func (p *lfu[T]) Name() string { return "lfu" }

// lengthAware keeps one LRU list per depth and the deepest non-empty one.
type lengthAware[T any] struct {
	lists [MaxDepth]list[T]
	deep  int // deepest depth that may be non-empty
	n     int
}

func clampDepth(d int) uint16 {
	return uint16(min(max(d, 0), MaxDepth-1))
}

func (p *lengthAware[T]) Add(e *Entry[T], depth int) {
	mustOut(e)
	e.in, e.hits = true, 1
	e.depth = clampDepth(depth)
	p.lists[e.depth].pushBack(e)
	p.deep = max(p.deep, int(e.depth))
	p.n++
}

// Touch moves e to the depth of its new use: a block reused early in a
// request is worth more than where it was first seen.
func (p *lengthAware[T]) Touch(e *Entry[T], depth int) {
	e.hits++
	p.lists[e.depth].unlink(e)
	e.depth = clampDepth(depth)
	p.lists[e.depth].pushBack(e)
	p.deep = max(p.deep, int(e.depth))
}

func (p *lengthAware[T]) Remove(e *Entry[T]) {
	p.lists[e.depth].unlink(e)
	e.in = false
	p.n--
}

// settle lowers deep past empty lists: amortised O(1), since deep only
// rises by an Add or Touch.
func (p *lengthAware[T]) settle() {
	for p.deep > 0 && p.lists[p.deep].n == 0 {
		p.deep--
	}
}

func (p *lengthAware[T]) Victim() *Entry[T] {
	p.settle()
	return p.lists[p.deep].head
}

func (p *lengthAware[T]) Victims(fn func(e *Entry[T]) bool) {
	p.settle()
	for d := p.deep; d >= 0; d-- {
		if !p.lists[d].each(fn) {
			return
		}
	}
}

func (p *lengthAware[T]) Len() int     { return p.n }
func (p *lengthAware[T]) Name() string { return "length-aware" }
