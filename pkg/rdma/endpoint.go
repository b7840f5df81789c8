package rdma

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Sentinel errors callers branch on.
var (
	// ErrEndpointInactive: the endpoint was retired (evicted, deleted, or
	// its context went inactive); get a fresh one from the context.
	ErrEndpointInactive = errors.New("endpoint inactive")
	// ErrQueueFull: every QP of the endpoint has MaxWR work requests
	// outstanding; retry after completions.
	ErrQueueFull = errors.New("endpoint send queues full")
	// ErrContextInactive: the context's port or device failed; use
	// another NIC.
	ErrContextInactive = errors.New("rdma context inactive")
)

// ConnectionDesc is the connection exchange Mooncake carries in the
// handshake socket's Connection frames (compat.md §3); field names and
// JSON keys are Mooncake's. A request names the sender's NIC in
// LocalNICPath and the target NIC in PeerNICPath; the reply is the same
// shape from the other side, with ReplyMsg non-empty on failure.
type ConnectionDesc struct {
	LocalNICPath string   `json:"local_nic_path"`
	LocalLID     uint16   `json:"local_lid"`
	LocalGID     string   `json:"local_gid"`
	PeerNICPath  string   `json:"peer_nic_path"`
	QPNums       []uint32 `json:"qp_num"`
	ReplyMsg     string   `json:"reply_msg"`
}

// ExchangeFunc sends a connection request to the peer that owns
// req.PeerNICPath and returns its reply (on the peer, Context.Accept
// produces it).
type ExchangeFunc func(ctx context.Context, req ConnectionDesc) (ConnectionDesc, error)

// Slice is one RDMA operation an engine posts through an endpoint. The
// local range must lie in memory registered on the endpoint's context
// (LKey), the remote range in the peer's region named by RKey.
type Slice struct {
	Op         Opcode
	LocalAddr  uint64
	LKey       uint32
	Length     uint32
	RemoteAddr uint64
	RKey       uint32
	// RetryCount is only logged (Mooncake's slice-failure line shows it).
	RetryCount int
}

// Endpoint connects the context's NIC to one peer NIC path over
// QPsPerEndpoint RC queue pairs.
type Endpoint struct {
	ctx   *Context
	peer  string
	qps   []QP
	depth []atomic.Int32 // outstanding WRs per QP
	rr    atomic.Uint32

	mu        sync.Mutex // serialises Connect callers
	stateMu   sync.Mutex // QP state changes, Connect's and Accept's
	inited    bool       // QPs in INIT or later (under stateMu)
	remoteQPN []uint32   // the peer QPs ours are paired with, once RTS (under stateMu)
	connected atomic.Bool
	active    atomic.Bool

	visited   atomic.Bool // SIEVE
	retiredAt time.Time   // set under the store's lock
	newer     *Endpoint   // store list, under the store's lock
	older     *Endpoint
}

// PeerNICPath is "<peer_server>@<peer_dev>".
func (e *Endpoint) PeerNICPath() string { return e.peer }

// Connected reports whether the QPs reached RTS.
func (e *Endpoint) Connected() bool { return e.connected.Load() }

// Paired reports whether e's QPs are connected to a peer's QPs. A
// passive endpoint (set up by the peer's request) is paired but becomes
// Connected, ready to post, only once its own Connect had the peer's
// reply.
func (e *Endpoint) Paired() bool {
	e.stateMu.Lock()
	defer e.stateMu.Unlock()
	return e.remoteQPN != nil
}

// Active reports whether the endpoint is still usable (not retired).
func (e *Endpoint) Active() bool { return e.active.Load() }

// QPNums lists the endpoint's QP numbers.
func (e *Endpoint) QPNums() []uint32 {
	out := make([]uint32, len(e.qps))
	for i, q := range e.qps {
		out[i] = q.Num()
	}
	return out
}

// Outstanding is the number of work requests posted and not completed.
func (e *Endpoint) Outstanding() int {
	n := 0
	for i := range e.depth {
		n += int(e.depth[i].Load())
	}
	return n
}

func (e *Endpoint) quiescent() bool {
	return !e.active.Load() && e.Outstanding() == 0
}

// retire marks e inactive and moves its QPs to ERR, which flushes their
// outstanding work requests so the depth counters drain.
func (e *Endpoint) retire(now time.Time) {
	e.active.Store(false)
	e.retiredAt = now
	for _, q := range e.qps {
		q.Modify(QPAttr{State: QPStateErr})
	}
}

// Connect performs the active side of connection setup: QPs to INIT,
// exchange (lid, gid, qp_num) with the peer through the context's
// ExchangeFunc, then RTR and RTS.
func (e *Endpoint) Connect(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.connected.Load() {
		return nil
	}
	if !e.active.Load() {
		return ErrEndpointInactive
	}
	c := e.ctx
	if c.cfg.Exchange == nil {
		return fmt.Errorf("connect %s: no exchange function configured", e.peer)
	}
	e.stateMu.Lock()
	err := e.init()
	e.stateMu.Unlock()
	if err != nil {
		return fmt.Errorf("connect %s: %w", e.peer, err)
	}
	port := c.Port()
	req := ConnectionDesc{
		LocalNICPath: c.NICPath(),
		LocalLID:     port.LID,
		LocalGID:     port.GID.String(),
		PeerNICPath:  e.peer,
		QPNums:       e.QPNums(),
	}
	reply, err := c.cfg.Exchange(ctx, req)
	if err != nil {
		return fmt.Errorf("connect %s: exchange: %w", e.peer, err)
	}
	if reply.ReplyMsg != "" {
		return fmt.Errorf("connect %s: peer refused: %s", e.peer, reply.ReplyMsg)
	}
	e.stateMu.Lock()
	defer e.stateMu.Unlock()
	if e.remoteQPN != nil {
		// Both sides connected at once: the peer's request, served by
		// Accept while ours was in flight, already paired these QPs with
		// the peer QPs its reply names. Its reply means they are ready.
		if !slices.Equal(e.remoteQPN, reply.QPNums) {
			return fmt.Errorf("connect %s: peer replied with QPs %v, ours are paired with %v", e.peer, reply.QPNums, e.remoteQPN)
		}
	} else if err := e.toRTS(reply); err != nil {
		return fmt.Errorf("connect %s: %w", e.peer, err)
	}
	e.connected.Store(true)
	return nil
}

// init moves the QPs to INIT once (under stateMu).
func (e *Endpoint) init() error {
	if e.inited {
		return nil
	}
	for _, q := range e.qps {
		if err := q.Modify(QPAttr{State: QPStateInit, Port: e.ctx.cfg.Port, Access: AccessAll}); err != nil {
			return err
		}
	}
	e.inited = true
	return nil
}

// toRTS pairs each QP with the peer's QP of the same index (under
// stateMu); the caller marks the endpoint connected when the peer's QPs
// are ready too.
func (e *Endpoint) toRTS(peer ConnectionDesc) error {
	if len(peer.QPNums) != len(e.qps) {
		return fmt.Errorf("peer has %d QPs, want %d", len(peer.QPNums), len(e.qps))
	}
	gid, err := ParseGID(peer.LocalGID)
	if err != nil {
		return err
	}
	for i, q := range e.qps {
		remote := RemoteQP{LID: peer.LocalLID, GID: gid, QPN: peer.QPNums[i]}
		if err := q.Modify(QPAttr{State: QPStateRTR, Remote: remote, MTU: e.ctx.cfg.MTU}); err != nil {
			return err
		}
		if err := q.Modify(QPAttr{State: QPStateRTS}); err != nil {
			return err
		}
	}
	e.remoteQPN = slices.Clone(peer.QPNums)
	return nil
}

// Post posts s on the least loaded QP; done runs on a completion worker
// with the work completion, after the endpoint's depth counter dropped.
// done must not block. Errors: ErrEndpointInactive, ErrQueueFull, or the
// provider's post error; on error done is never called.
func (e *Endpoint) Post(s Slice, done func(WC)) error {
	if !e.connected.Load() {
		return fmt.Errorf("post to %s: not connected", e.peer)
	}
	// Take the depth slot before checking liveness: Reclaim destroys only
	// after seeing inactive and zero depth, so a post that passes the
	// check below is always seen by it.
	start := int(e.rr.Add(1))
	qi := -1
	for k := range e.qps {
		i := (start + k) % len(e.qps)
		if d := e.depth[i].Add(1); int(d) <= e.ctx.cfg.MaxWR {
			qi = i
			break
		}
		e.depth[i].Add(-1)
	}
	if qi < 0 {
		return fmt.Errorf("post to %s: %w", e.peer, ErrQueueFull)
	}
	if !e.active.Load() {
		e.depth[qi].Add(-1)
		return fmt.Errorf("post to %s: %w", e.peer, ErrEndpointInactive)
	}
	if e.ctx.cqOutstanding.Add(1) > int64(e.ctx.cfg.CQDepth) {
		e.ctx.cqOutstanding.Add(-1)
		e.depth[qi].Add(-1)
		return fmt.Errorf("post to %s: completion queue of %s full: %w", e.peer, e.ctx.name, ErrQueueFull)
	}
	id := e.ctx.track(e, qi, s, done)
	err := e.qps[qi].PostSend(WR{
		ID:         id,
		Op:         s.Op,
		Local:      SGE{Addr: s.LocalAddr, Length: s.Length, LKey: s.LKey},
		RemoteAddr: s.RemoteAddr,
		RKey:       s.RKey,
	})
	if err != nil {
		e.ctx.untrack(id)
		e.ctx.cqOutstanding.Add(-1)
		e.depth[qi].Add(-1)
		return fmt.Errorf("post to %s: %w", e.peer, err)
	}
	return nil
}

// logSliceFailure writes Mooncake's worker line for a failed slice.
func (e *Endpoint) logSliceFailure(s Slice, st WCStatus) {
	slog.Error(fmt.Sprintf("Worker: Process failed for slice (opcode: %d, source_addr: %#x, length: %d, dest_addr: %d, local_nic: %s, peer_nic: %s, dest_rkey: %d, retry_cnt: %d): %s",
		s.Op, s.LocalAddr, s.Length, s.RemoteAddr, e.ctx.name, e.peer, s.RKey, s.RetryCount, st))
}
