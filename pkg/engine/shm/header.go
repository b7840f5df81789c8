package shm

import (
	"sync/atomic"
	"unsafe"
)

// header is a region's first page, shared between the owner and every
// peer that maps it.
type header []byte

func (h header) word(off int) *uint64 { return (*uint64)(unsafe.Pointer(&h[off])) }

func (h header) get(off int) uint64 { return atomic.LoadUint64(h.word(off)) }

func (h header) set(off int, v uint64) { atomic.StoreUint64(h.word(off), v) }

func (h header) token() (t Token) {
	copy(t[:], h[offToken:offToken+len(t)])
	return t
}

func (h header) state() uint64 { return h.get(offState) }
