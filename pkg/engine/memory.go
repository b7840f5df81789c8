package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kvcache-ops/mc/pkg/engine/shm"
	"github.com/kvcache-ops/mc/pkg/engine/tcp"
	"github.com/kvcache-ops/mc/pkg/engine/vmem"
)

// Memory is a registered buffer. Its bytes come from an anonymous mmap (or,
// for a remote buffer of an engine with the same-host transport, a memfd
// region), so its address is stable for its whole life and can travel on
// the wire as a Mooncake target address.
type Memory struct {
	addr     uint64
	b        []byte
	location string
	remote   bool
	region   *shm.Region // memfd backing, when same-host peers may map it
	// placed: mapped by vmem (remote memory): its range is reserved,
	// never reused, once released.
	placed bool

	// refs counts transfers using the buffer; -1 means unregistered.
	// Acquire fails once it is -1, so the unmap can never race a copy.
	refs atomic.Int64
}

// Addr is the virtual address of the first byte (what peers put in a
// request's target offset, and what local requests use as source).
func (m *Memory) Addr() uint64 { return m.addr }

// Len is the buffer's length in bytes.
func (m *Memory) Len() int { return len(m.b) }

// Bytes is the buffer itself. Do not use it after UnregisterMemory.
func (m *Memory) Bytes() []byte { return m.b }

// Location is where the memory lives ("cpu:0", "cuda:0").
func (m *Memory) Location() string { return m.location }

// Remote reports whether peers may read and write it.
func (m *Memory) Remote() bool { return m.remote }

func (m *Memory) acquire() bool {
	for {
		r := m.refs.Load()
		if r < 0 {
			return false
		}
		if m.refs.CompareAndSwap(r, r+1) {
			return true
		}
	}
}

// Pin holds m registered (UnregisterMemory waits for Unpin) while the
// caller works on its bytes outside a transfer; false once m is
// unregistered.
func (m *Memory) Pin() bool { return m.acquire() }

// Unpin ends a Pin.
func (m *Memory) Unpin() { m.refs.Add(-1) }

// Release implements tcp.Ref.
func (m *Memory) Release() { m.refs.Add(-1) }

// contains reports whether [addr, addr+size) lies inside m.
func (m *Memory) contains(addr, size uint64) bool {
	if addr < m.addr {
		return false
	}
	off := addr - m.addr
	return off <= uint64(len(m.b)) && size <= uint64(len(m.b))-off
}

// slice returns m's bytes for [addr, addr+size); contains must hold.
func (m *Memory) slice(addr, size uint64) []byte {
	off := addr - m.addr
	return m.b[off : off+size : off+size]
}

// ErrOutOfRange fails a request whose range is not inside one registered
// buffer.
var ErrOutOfRange = errors.New("address range not inside one registered buffer")

// ErrBusy is returned by UnregisterMemory when transfers still use the
// buffer after its grace period.
var ErrBusy = errors.New("memory in use by transfers")

// registry maps addresses to registered buffers. Lookups (every request,
// both directions) read a sorted copy-on-write snapshot without locking;
// register/unregister replace it under mu.
type registry struct {
	mu   sync.Mutex
	snap atomic.Pointer[[]*Memory]
}

func (r *registry) list() []*Memory {
	if p := r.snap.Load(); p != nil {
		return *p
	}
	return nil
}

// find returns the buffer holding [addr, addr+size), or nil.
func (r *registry) find(addr, size uint64) *Memory {
	l := r.list()
	// First buffer starting after addr; the candidate is the one before.
	i, _ := slices.BinarySearchFunc(l, addr, func(m *Memory, a uint64) int {
		if m.addr <= a {
			return -1
		}
		return 1
	})
	if i == 0 {
		return nil
	}
	if m := l[i-1]; m.contains(addr, size) {
		return m
	}
	return nil
}

// Acquire implements tcp.Memory: only remotely accessible buffers are
// served to peers.
func (r *registry) Acquire(addr, size uint64) ([]byte, tcp.Ref, error) {
	m := r.find(addr, size)
	if m == nil || !m.remote {
		return nil, nil, ErrOutOfRange
	}
	if !m.acquire() {
		return nil, nil, ErrOutOfRange
	}
	return m.slice(addr, size), m, nil
}

func (r *registry) add(m *Memory) {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := slices.Clone(r.list())
	i, _ := slices.BinarySearchFunc(l, m.addr, func(x *Memory, a uint64) int { return cmpU64(x.addr, a) })
	l = slices.Insert(l, i, m)
	r.snap.Store(&l)
}

func (r *registry) remove(m *Memory) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.list()
	i := slices.Index(l, m)
	if i < 0 {
		return false
	}
	l = slices.Delete(slices.Clone(l), i, i+1)
	r.snap.Store(&l)
	return true
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// allocate maps size bytes of anonymous memory.
func allocate(size int, location string, remote bool) (*Memory, error) {
	if size <= 0 {
		return nil, fmt.Errorf("register memory: size %d must be positive", size)
	}
	var b []byte
	var err error
	if remote {
		// Peers address it: an address given up must never name memory
		// again (a stalled writer's grant would land in it).
		b, err = vmem.Map(-1, 0, size)
	} else {
		b, err = unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	}
	if err != nil {
		return nil, fmt.Errorf("register memory: mmap %d bytes: %w", size, err)
	}
	return &Memory{
		addr:     uint64(uintptr(unsafe.Pointer(&b[0]))),
		b:        b,
		location: location,
		remote:   remote,
		placed:   remote,
	}, nil
}

// retire waits until no transfer holds m (up to grace) and marks it dead:
// from then on nothing can acquire it and it may be unmapped.
func (m *Memory) retire(grace time.Duration) error {
	deadline := time.Now().Add(grace)
	for !m.refs.CompareAndSwap(0, -1) {
		if time.Now().After(deadline) {
			return ErrBusy
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

// allocateShared backs a remote buffer with a memfd region of t.
func allocateShared(t *shmTransport, size int, location string) (*Memory, error) {
	if size <= 0 {
		return nil, fmt.Errorf("register memory: size %d must be positive", size)
	}
	r, err := t.newRegion(size)
	if err != nil {
		return nil, fmt.Errorf("register memory: %w", err)
	}
	b := r.Bytes()
	return &Memory{
		addr:     uint64(uintptr(unsafe.Pointer(&b[0]))),
		b:        b,
		location: location,
		remote:   true,
		region:   r,
	}, nil
}

func (m *Memory) unmap() error {
	if m.region != nil {
		return m.region.Close()
	}
	if m.placed {
		return vmem.Release(m.b)
	}
	return unix.Munmap(m.b)
}

// retireShared makes same-host peers' copies into m fail from now on.
func (m *Memory) retireShared() {
	if m.region != nil {
		m.region.Retire()
	}
}

// reviveShared undoes retireShared for memory that stays registered.
func (m *Memory) reviveShared() {
	if m.region != nil {
		m.region.Revive()
	}
}

// Populate faults every page of m in (MADV_POPULATE_WRITE), asking for
// transparent huge pages first. It never changes m's contents, so it may
// run while transfers use m. A store segment is populated so that puts do
// not pay page faults. It fails on kernels before 5.14 (EINVAL), where the
// pages simply fault in on first use.
//
// It works in chunks and stops early, returning ctx's error, when ctx ends.
func (m *Memory) Populate(ctx context.Context) error {
	_ = unix.Madvise(m.b, unix.MADV_HUGEPAGE)
	const chunk = 64 << 20
	for off := 0; off < len(m.b); off += chunk {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := unix.Madvise(m.b[off:min(off+chunk, len(m.b))], unix.MADV_POPULATE_WRITE); err != nil {
			return fmt.Errorf("populate %d bytes at 0x%x: %w", len(m.b), m.addr, err)
		}
	}
	return nil
}
