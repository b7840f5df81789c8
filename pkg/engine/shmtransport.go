package engine

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/kvcache-ops/mc/pkg/engine/meta"
	"github.com/kvcache-ops/mc/pkg/engine/shm"
)

// Protocols of Config.Protocol beyond the descriptor protocols.
const (
	// ProtocolAuto serves this engine's memory to same-host peers through
	// shared memory and reaches a segment through shm when it is on this
	// host (and mappable), else through its descriptor's protocol.
	ProtocolAuto = "auto"
	// ProtocolSHM is ProtocolAuto that refuses to open a segment shm
	// cannot reach.
	ProtocolSHM = "shm"
	// ProtocolLocal is what Segment.Transport reports for the engine's
	// own segment (a memcpy).
	ProtocolLocal = "local"
)

// ErrNoSHM is matched when a segment cannot be reached through shm under
// --protocol shm; the wrapped error says why (another host, another
// user, no shm in the descriptor, memory that cannot be mapped).
var ErrNoSHM = errors.New("segment not reachable through shared memory")

// shmMinPerCore is the least a batch gives each extra goroutine: below
// it, starting and waking one costs more than the copy it takes over.
const shmMinPerCore = 256 << 10

// shmTransport is the same-host transport: this engine's remote buffers
// are memfd regions (package shm) advertised in the descriptor's mc_shm,
// and a segment of a same-host peer is mapped and served by memcpy in the
// submitting goroutine and helpers, one per core the batch can use. A
// peer's regions are mapped once per engine and shared by every Segment
// open on them: a fresh mapping costs a page-table entry per page on
// first touch, which a store client reopening a segment after a failure,
// or a collective after a membership change, should not pay again.
type shmTransport struct {
	e      *Engine
	self   shm.Identity
	local  shm.Local
	nextID atomic.Uint64

	mu     sync.Mutex
	peers  map[shm.Token]*shmPeer
	routes map[*shmRoute]struct{}
	closed bool
}

// shmPeer is one attached peer engine and its regions mapped here, shared
// by the routes open on it (under shmTransport.mu) and released with the
// last.
type shmPeer struct {
	p    *shm.Peer
	refs int
	maps map[uint64]*shmMapping // by region id
}

type shmMapping struct {
	m    *shm.Mapping
	refs int
}

func newSHMTransport(e *Engine) (*shmTransport, error) {
	tok, err := shm.NewToken()
	if err != nil {
		return nil, err
	}
	self, err := shm.Self(e.cfg.ProcFS, tok)
	if err != nil {
		return nil, err
	}
	return &shmTransport{
		e:      e,
		self:   self,
		local:  shm.Local{ProcFS: e.cfg.ProcFS, BootID: self.BootID, UID: self.UID},
		peers:  make(map[shm.Token]*shmPeer),
		routes: make(map[*shmRoute]struct{}),
	}, nil
}

func (t *shmTransport) Protocol() string { return ProtocolSHM }

// newRegion backs a remote buffer; ids count from 1 and are never reused.
func (t *shmTransport) newRegion(size int) (*shm.Region, error) {
	return shm.NewRegion(size, t.self.Token, t.nextID.Add(1))
}

// Describe adds mc_shm for d's buffers, which must all be regions of
// this engine (else peers could not map the whole segment, and nothing
// is advertised).
func (t *shmTransport) Describe(d *meta.SegmentDesc) {
	s := &meta.SHMDesc{BootID: t.self.BootID, Token: t.self.Token.String(), PID: t.self.PID, UID: t.self.UID,
		Buffers: make([]meta.SHMBufferDesc, 0, len(d.Buffers))}
	for _, b := range d.Buffers {
		m := t.e.reg.find(b.Addr, b.Length)
		if m == nil || m.region == nil {
			return
		}
		s.Buffers = append(s.Buffers, meta.SHMBufferDesc{Addr: b.Addr, FD: m.region.FD(), ID: m.region.ID()})
	}
	d.SHM = s
}

func (t *shmTransport) DescribeBuffer(m *Memory) meta.BufferDesc {
	return meta.BufferDesc{Name: t.e.cfg.LocalServerName, Addr: m.addr, Length: uint64(len(m.b))}
}

// Dial maps the peer's buffers. Its errors wrap shm's sentinels
// (ErrOtherHost, ErrOtherUser, ErrUnmappable, ErrRetired) or say that
// the descriptor has no mc_shm.
func (t *shmTransport) Dial(_ context.Context, s SegmentInfo) (Route, error) {
	d := s.Desc
	if d.SHM == nil {
		return nil, fmt.Errorf("its descriptor advertises no shared memory (the engine runs without --protocol auto or shm, or is not mc)")
	}
	tok, err := shm.ParseToken(d.SHM.Token)
	if err != nil {
		return nil, err
	}
	id := shm.Identity{BootID: d.SHM.BootID, Token: tok, PID: d.SHM.PID, UID: d.SHM.UID}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, ErrEngineClosed
	}
	sp := t.peers[tok]
	if sp != nil && (sp.p.Identity() != id || sp.p.Exited()) {
		// Gone, or not the process the descriptor names now: routes
		// still holding it keep it until they close.
		delete(t.peers, tok)
		sp = nil
	}
	if sp == nil {
		p, err := shm.Attach(t.local, id)
		if err != nil {
			return nil, err
		}
		sp = &shmPeer{p: p, maps: make(map[uint64]*shmMapping)}
		t.peers[tok] = sp
	}
	sp.refs++
	r := &shmRoute{t: t, name: s.Name, peer: sp}
	for i, b := range d.Buffers {
		ref := shm.BufferRef{Addr: b.Addr, Length: b.Length, FD: d.SHM.Buffers[i].FD, ID: d.SHM.Buffers[i].ID}
		sm := sp.maps[ref.ID]
		if sm != nil && (sm.m.Ref() != ref || !sm.m.Live()) {
			delete(sp.maps, ref.ID) // retired (or described otherwise): map afresh, which says why
			sm = nil
		}
		if sm == nil {
			m, err := sp.p.Map(ref)
			if err != nil {
				t.releaseLocked(r)
				return nil, err
			}
			sm = &shmMapping{m: m}
			sp.maps[ref.ID] = sm
		}
		sm.refs++
		r.maps = append(r.maps, sm)
	}
	slices.SortFunc(r.maps, func(a, b *shmMapping) int { return cmpU64(a.m.Ref().Addr, b.m.Ref().Addr) })
	t.routes[r] = struct{}{}
	return r, nil
}

// releaseLocked drops r's references: a mapping no route uses is
// unmapped, a peer no route uses is let go. r's copies must have ended.
func (t *shmTransport) releaseLocked(r *shmRoute) {
	sp := r.peer
	for _, sm := range r.maps {
		if sm.refs--; sm.refs == 0 {
			sm.m.Close()
			if id := sm.m.Ref().ID; sp.maps[id] == sm {
				delete(sp.maps, id)
			}
		}
	}
	r.maps = nil
	if sp.refs--; sp.refs == 0 {
		sp.p.Close()
		if tok := sp.p.Identity().Token; t.peers[tok] == sp {
			delete(t.peers, tok)
		}
	}
	delete(t.routes, r)
}

// Close unmaps every open segment's memory (after copies in flight end).
func (t *shmTransport) Close() error {
	t.mu.Lock()
	t.closed = true
	routes := make([]*shmRoute, 0, len(t.routes))
	for r := range t.routes {
		routes = append(routes, r)
	}
	t.mu.Unlock()
	var errs []error
	for _, r := range routes {
		errs = append(errs, r.Close())
	}
	return errors.Join(errs...)
}

// shmRoute is one Segment's view of a peer's mapped regions.
type shmRoute struct {
	t    *shmTransport
	name string
	peer *shmPeer
	maps []*shmMapping // by address; fixed once dialled

	// mu is held shared by every Submit for the whole copy, and
	// exclusively by Close before it lets the mappings go: no copy ever
	// touches unmapped memory.
	mu     sync.RWMutex
	closed bool
}

// shmCopy is one task's bytes on both sides.
type shmCopy struct {
	t      *Task
	m      *shm.Mapping
	remote []byte
}

func (r *shmRoute) find(addr, n uint64) *shm.Mapping {
	i, _ := slices.BinarySearchFunc(r.maps, addr, func(m *shmMapping, a uint64) int {
		if m.m.Ref().Addr <= a {
			return -1
		}
		return 1
	})
	if i == 0 {
		return nil
	}
	m := r.maps[i-1].m
	off := addr - m.Ref().Addr
	if off > m.Ref().Length || n > m.Ref().Length-off {
		return nil
	}
	return m
}

// Submit copies every task and completes it: done only when the peer
// process was alive and the buffer still registered both before and
// after the copy, so a COMPLETED write landed in memory its owner still
// had registered.
func (r *shmRoute) Submit(tasks []*Task) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.closed {
		for _, t := range tasks {
			t.Complete(fmt.Errorf("segment %q: %w", r.name, ErrSegmentClosed))
		}
		return
	}
	if r.peer.p.Exited() {
		r.failExited(tasks)
		return
	}
	jobs := make([]shmCopy, 0, len(tasks))
	total := 0
	for _, t := range tasks {
		n := uint64(len(t.op.Buf))
		m := r.find(t.op.Addr, n)
		if m == nil {
			t.Complete(fmt.Errorf("target range [0x%x, +%d) of segment %q: %w", t.op.Addr, n, r.name, ErrOutOfRange))
			continue
		}
		if !m.Live() {
			t.Complete(r.retiredError(m))
			continue
		}
		off := t.op.Addr - m.Ref().Addr
		jobs = append(jobs, shmCopy{t: t, m: m, remote: m.Bytes()[off : off+n : off+n]})
		total += int(n)
	}
	copyAll(jobs, total)
	exited := r.peer.p.Exited()
	for _, j := range jobs {
		switch {
		case exited:
			j.t.Complete(r.exitedError())
		case !j.m.Live():
			j.t.Complete(r.retiredError(j.m))
		default:
			j.t.Complete(nil)
		}
	}
}

func (r *shmRoute) exitedError() error {
	return fmt.Errorf("segment %q (pid %d): %w", r.name, r.peer.p.Identity().PID, shm.ErrPeerExited)
}

func (r *shmRoute) retiredError(m *shm.Mapping) error {
	return fmt.Errorf("buffer 0x%x of segment %q: %w (open the segment again)", m.Ref().Addr, r.name, shm.ErrRetired)
}

func (r *shmRoute) failExited(tasks []*Task) {
	err := r.exitedError()
	for _, t := range tasks {
		t.Complete(err)
	}
}

// copyAll moves every job's bytes, cut into as many contiguous byte
// ranges as the batch has cores for (each at least shmMinPerCore), the
// first in this goroutine.
func copyAll(jobs []shmCopy, total int) {
	w := min(runtime.GOMAXPROCS(0), total/shmMinPerCore)
	if w <= 1 {
		copyRange(jobs, 0, total)
		return
	}
	per := (total + w - 1) / w
	var wg sync.WaitGroup
	for i := 1; i < w; i++ {
		wg.Add(1)
		go func(lo, hi int) {
			defer wg.Done()
			copyRange(jobs, lo, hi)
		}(i*per, min((i+1)*per, total))
	}
	copyRange(jobs, 0, per)
	wg.Wait()
}

// copyRange copies bytes [lo, hi) of the jobs laid end to end.
func copyRange(jobs []shmCopy, lo, hi int) {
	pos := 0
	for _, j := range jobs {
		n := len(j.remote)
		if pos >= hi {
			return
		}
		if pos+n > lo {
			a, b := max(lo-pos, 0), min(hi-pos, n)
			if j.t.op.Write {
				copy(j.remote[a:b], j.t.op.Buf[a:b])
			} else {
				copy(j.t.op.Buf[a:b], j.remote[a:b])
			}
		}
		pos += n
	}
}

// Close lets the peer's memory go once no copy of this route uses it.
func (r *shmRoute) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	r.mu.Unlock()
	r.t.mu.Lock()
	r.t.releaseLocked(r)
	r.t.mu.Unlock()
	return nil
}
