package rdmatransport

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine"
	"github.com/kvcache-ops/mc/pkg/engine/meta"
	"github.com/kvcache-ops/mc/pkg/rdma"
	"github.com/kvcache-ops/mc/pkg/topo"
)

// route carries tasks to one remote segment.
type route struct {
	t      *Transport
	desc   *meta.SegmentDesc
	bufs   []meta.BufferDesc // by address
	devIdx map[string]int    // peer device -> index in desc.Devices
}

// taskState gathers a task's slices.
type taskState struct {
	task      *engine.Task
	remaining atomic.Int32
	mu        sync.Mutex
	err       error
}

func (s *taskState) sliceDone(n uint32, err error) {
	if err == nil {
		s.task.AddTransferred(uint64(n))
	} else {
		s.mu.Lock()
		if s.err == nil {
			s.err = err
		}
		s.mu.Unlock()
	}
	if s.remaining.Add(-1) == 0 {
		s.mu.Lock()
		err := s.err
		s.mu.Unlock()
		s.task.Complete(err)
	}
}

type slice struct {
	ts        *taskState
	op        rdma.Opcode
	local     uint64
	remote    uint64
	length    uint32
	reg       *region
	rbuf      *meta.BufferDesc
	retry     int
	lastLocal string
	lastPeer  string
	lastErr   error
}

// Submit slices every task and posts the slices. From the first slice
// that cannot be posted without waiting (its connection is not set up,
// or the send queue is full), the rest are posted in order by one
// goroutine: see post.
func (r *route) Submit(tasks []*engine.Task) {
	t := r.t
	var later []*slice
	defer func() {
		if later != nil {
			go func() {
				for _, s := range later {
					r.post(s, false)
				}
			}()
		}
	}()
	sl := uint64(t.cfg.SliceSize)
	frag := sl + sl/uint64(t.cfg.FragmentRatio)
	for _, task := range tasks {
		req := task.Request()
		if t.closed.Load() {
			task.Complete(engine.ErrEngineClosed)
			continue
		}
		reg := t.lookup(req.Source, req.Length)
		if reg == nil {
			task.Complete(fmt.Errorf("local range [0x%x, +%d) not registered with the rdma transport: %w", req.Source, req.Length, engine.ErrOutOfRange))
			continue
		}
		rbuf := r.remoteBuffer(req.Target, req.Length)
		if rbuf == nil {
			task.Complete(fmt.Errorf("target range [0x%x, +%d) of segment %q: %w", req.Target, req.Length, r.desc.Name, engine.ErrOutOfRange))
			continue
		}
		op := rdma.OpRead
		if req.Op == engine.Write {
			op = rdma.OpWrite
		}
		lens := sliceLengths(req.Length, sl, frag)
		ts := &taskState{task: task}
		ts.remaining.Store(int32(len(lens)))
		var off uint64
		for _, n := range lens {
			s := &slice{ts: ts, op: op, local: req.Source + off, remote: req.Target + off, length: uint32(n), reg: reg, rbuf: rbuf}
			off += n
			t.slicesOut.Add(1)
			if later != nil || !r.post(s, true) {
				later = append(later, s)
			}
		}
	}
}

func (r *route) Close() error { return nil }

// sliceLengths cuts n bytes into slices of sl bytes; a tail of at most
// frag (slice + slice/MC_FRAGMENT_RATIO) is kept whole rather than
// leaving a small fragment.
func sliceLengths(n, sl, frag uint64) []uint64 {
	out := make([]uint64, 0, n/sl+1)
	for off := uint64(0); off < n; {
		l := sl
		if n-off <= frag {
			l = n - off
		}
		out = append(out, l)
		off += l
	}
	return out
}

func (r *route) remoteBuffer(addr, n uint64) *meta.BufferDesc {
	i, _ := slices.BinarySearchFunc(r.bufs, addr, func(b meta.BufferDesc, a uint64) int {
		if b.Addr <= a {
			return -1
		}
		return 1
	})
	if i == 0 {
		return nil
	}
	b := &r.bufs[i-1]
	off := addr - b.Addr
	if off >= b.Length || n > b.Length-off {
		return nil
	}
	return b
}

// peerEntry is the peer matrix row for a remote buffer's location; a
// peer without one is reached through all its NICs.
func (r *route) peerEntry(loc string) (e topo.Entry) {
	if pe, ok := r.desc.PriorityMatrix[loc]; ok {
		return pe
	}
	for _, d := range r.desc.Devices {
		e.Preferred = append(e.Preferred, d.Name)
	}
	return e
}

func (r *route) finish(s *slice, err error) {
	s.ts.sliceDone(s.length, err)
	r.t.slicesOut.Done()
}

// post sends s on a path chosen for its retry count, retrying on another
// path while posting fails. It never blocks on the network except for a
// connection setup, and inline (called from Submit) not even for that:
// it returns false, having done nothing, when s would wait for a
// connection to be set up or for room in a full send queue (Submit hands
// it to a goroutine). Submit takes no deadline, and a peer that does not
// answer (a stopped process: its kernel still accepts) held it up to
// ConnectTimeout per attempt, so a caller's deadline passed before it
// could even wait (the store's gets answered 2-10 s late).
func (r *route) post(s *slice, inline bool) bool {
	t := r.t
	for {
		if t.closed.Load() {
			r.finish(s, engine.ErrEngineClosed)
			return true
		}
		if s.retry > t.cfg.RetryCount {
			r.finish(s, fmt.Errorf("rdma slice [0x%x, +%d): gave up after %d retries: %w", s.remote, s.length, t.cfg.RetryCount, s.lastErr))
			return true
		}
		rr := t.rr.Add(1)
		activeLocal := func(n string) bool {
			_, c := t.ctxByName(n)
			return c != nil && c.Active()
		}
		localName := pick(t.localEntry(s.reg.m.Location()), s.retry, rr, t.cfg.RoundRobin, s.lastLocal, activeLocal)
		if localName == "" && t.cfg.Matrix != nil {
			// The matrix names no open, active NIC for this location.
			localName = pick(t.defaultEntry(s.reg.m.Location()), s.retry, rr, t.cfg.RoundRobin, s.lastLocal, activeLocal)
		}
		if localName == "" {
			r.finish(s, fmt.Errorf("rdma slice [0x%x, +%d): no active local NIC for %s: %w", s.remote, s.length, s.reg.m.Location(), ErrNoPath))
			return true
		}
		peerName := pick(r.peerEntry(s.rbuf.Name), s.retry, rr, t.cfg.RoundRobin, s.lastPeer, func(n string) bool {
			_, ok := r.devIdx[n]
			return ok && !t.railPaused(r.desc.Name+"@"+n)
		})
		if peerName == "" {
			// Every rail paused: use one anyway rather than fail a transfer
			// a paused rail may still carry.
			peerName = pick(r.peerEntry(s.rbuf.Name), s.retry, rr, t.cfg.RoundRobin, "", func(n string) bool { _, ok := r.devIdx[n]; return ok })
		}
		if peerName == "" {
			r.finish(s, fmt.Errorf("rdma slice [0x%x, +%d): segment %q has no NIC for %s: %w", s.remote, s.length, r.desc.Name, s.rbuf.Name, ErrNoPath))
			return true
		}
		li, c := t.ctxByName(localName)
		pj := r.devIdx[peerName]
		peerPath := r.desc.Name + "@" + peerName
		var ep *rdma.Endpoint
		var err error
		if inline {
			// Only an endpoint that needs no connection exchange.
			if ep = c.Connected(peerPath); ep == nil {
				return false
			}
		} else {
			cctx, cancel := context.WithTimeout(t.connCtx, t.cfg.ConnectTimeout)
			ep, err = c.Endpoint(cctx, peerPath)
			cancel()
		}
		if err != nil {
			s.lastErr, s.lastLocal, s.lastPeer = err, localName, peerName
			if !errors.Is(err, rdma.ErrContextInactive) && !errors.Is(err, syscall.ENOMEM) {
				// The peer refused or did not answer: count it against the
				// rail so a dead peer NIC stops costing a handshake per slice.
				t.railError(peerPath)
			}
			s.retry++
			continue
		}
		rs := rdma.Slice{Op: s.op, LocalAddr: s.local, LKey: s.reg.mrs[li].LKey(), Length: s.length,
			RemoteAddr: s.remote, RKey: s.rbuf.Rkey[pj], RetryCount: s.retry}
		err = ep.Post(rs, func(wc rdma.WC) { r.completed(s, c, ep, localName, peerName, wc) })
		if errors.Is(err, rdma.ErrQueueFull) {
			// Not a path failure: wait for completions (off Submit's
			// goroutine: they may be WRs to a peer that stopped).
			if inline {
				return false
			}
			time.Sleep(20 * time.Microsecond)
			continue
		}
		if err != nil {
			s.lastErr, s.lastLocal, s.lastPeer = err, localName, peerName
			s.retry++
			continue
		}
		return true
	}
}

// completed runs on a completion worker: it must not block, so retries
// are posted from a new goroutine.
func (r *route) completed(s *slice, c *rdma.Context, ep *rdma.Endpoint, localName, peerName string, wc rdma.WC) {
	if wc.Status == rdma.WCSuccess {
		r.finish(s, nil)
		return
	}
	s.lastErr = fmt.Errorf("local NIC %s, peer NIC %s@%s: %s", localName, r.desc.Name, peerName, wc.Status)
	s.lastLocal = localName
	s.lastPeer = ""
	if wc.Status.Remote() {
		peerPath := r.desc.Name + "@" + peerName
		r.t.railError(peerPath)
		c.DeleteEndpoint(ep)
		s.lastPeer, s.lastLocal = peerName, ""
	}
	s.retry++
	go r.post(s, false)
}
