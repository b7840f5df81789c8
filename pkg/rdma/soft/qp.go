package soft

import (
	"fmt"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"github.com/kvcache-ops/mc/pkg/rdma"
)

// DefaultMaxWR is the outstanding-WR limit of a QP created with
// MaxSendWR 0 (Mooncake's MC_MAX_WR default).
const DefaultMaxWR = 256

func (p *pd) CreateQP(init rdma.QPInit) (rdma.QP, error) {
	n := p.d.n
	c, ok := init.SendCQ.(*cq)
	if !ok || c == nil {
		return nil, fmt.Errorf("soft device %q: create qp: send CQ is not a soft CQ: %w", n.cfg.Name, syscall.EINVAL)
	}
	maxWR := init.MaxSendWR
	if maxWR <= 0 {
		maxWR = DefaultMaxWR
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, open := n.handles[p.d]; !open {
		return nil, fmt.Errorf("soft device %q: create qp: %w", n.cfg.Name, syscall.ENODEV)
	}
	if len(n.qps) >= n.cfg.MaxQP {
		return nil, fmt.Errorf("soft device %q: create qp (%d of %d in use): %w", n.cfg.Name, len(n.qps), n.cfg.MaxQP, syscall.ENOMEM)
	}
	q := &qp{n: n, dev: p.d, pd: p, num: n.nextQPN, sendCQ: c, maxWR: maxWR}
	n.nextQPN++
	if n.nextQPN >= 1<<24 { // QPNs are 24 bits
		n.nextQPN = 0x100
	}
	for n.qps[n.nextQPN] != nil {
		n.nextQPN++
	}
	n.qps[q.num] = q
	return q, nil
}

// AllocatedQPs reports how many QPs exist on dev (what a NIC's firmware
// counts against max_qp).
func (p *Provider) AllocatedQPs(dev string) (int, error) {
	n, err := p.nic(dev)
	if err != nil {
		return 0, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.qps), nil
}

type pendingWR struct {
	wr    rdma.WR
	seq   uint64
	local *mr
	off   int
}

type qp struct {
	n      *nic
	dev    *device
	pd     *pd
	num    uint32
	sendCQ *cq
	maxWR  int

	mu        sync.Mutex
	state     rdma.QPState
	access    rdma.Access
	remote    rdma.RemoteQP
	link      *link
	pending   []*pendingWR
	nextSeq   uint64
	progress  time.Time // last post into an empty queue or last completion
	destroyed bool
}

func (q *qp) Num() uint32 { return q.num }

func (q *qp) State() rdma.QPState {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.state
}

func (q *qp) Modify(a rdma.QPAttr) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.destroyed {
		return fmt.Errorf("modify qp %d: destroyed: %w", q.num, syscall.EINVAL)
	}
	bad := func() error {
		return fmt.Errorf("modify qp %d from %v to %v: %w", q.num, q.state, a.State, syscall.EINVAL)
	}
	switch a.State {
	case rdma.QPStateReset:
		q.pending = nil // RESET discards WRs without completions
		q.state = rdma.QPStateReset
		q.link = nil
	case rdma.QPStateInit:
		if q.state != rdma.QPStateReset && q.state != rdma.QPStateInit {
			return bad()
		}
		if a.Port != 0 && a.Port != 1 {
			return fmt.Errorf("modify qp %d to INIT: port %d: %w", q.num, a.Port, syscall.EINVAL)
		}
		q.access = a.Access
		q.state = rdma.QPStateInit
	case rdma.QPStateRTR:
		if q.state != rdma.QPStateInit {
			return bad()
		}
		if a.Remote.LID == 0 {
			return fmt.Errorf("modify qp %d to RTR: remote LID 0: %w", q.num, syscall.EINVAL)
		}
		ap := netip.AddrPortFrom(a.Remote.GID.Addr(), a.Remote.LID)
		if !ap.Addr().IsValid() || ap.Addr().IsUnspecified() {
			return fmt.Errorf("modify qp %d to RTR: remote GID %v is not an address: %w", q.num, a.Remote.GID, syscall.EINVAL)
		}
		l, err := q.n.link(ap, a.Remote.LID)
		if err != nil {
			return fmt.Errorf("modify qp %d to RTR: %w", q.num, err)
		}
		q.remote = a.Remote
		q.link = l
		q.state = rdma.QPStateRTR
	case rdma.QPStateRTS:
		if q.state != rdma.QPStateRTR && q.state != rdma.QPStateRTS {
			return bad()
		}
		q.state = rdma.QPStateRTS
	case rdma.QPStateErr:
		q.toErrorLocked(rdma.WCWRFlushErr)
	default:
		return bad()
	}
	return nil
}

// toErrorLocked moves q to ERR: the oldest outstanding WR completes with
// first, the rest with WRFlushErr.
func (q *qp) toErrorLocked(first rdma.WCStatus) {
	q.state = rdma.QPStateErr
	if len(q.pending) == 0 {
		return
	}
	wcs := make([]rdma.WC, len(q.pending))
	for i, p := range q.pending {
		st := rdma.WCWRFlushErr
		if i == 0 {
			st = first
		}
		wcs[i] = rdma.WC{WRID: p.wr.ID, Status: st, Op: p.wr.Op, QPNum: q.num}
	}
	q.pending = nil
	q.sendCQ.push(wcs...)
}

func (q *qp) PostSend(wrs ...rdma.WR) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.destroyed {
		return fmt.Errorf("post send on qp %d: destroyed: %w", q.num, syscall.EINVAL)
	}
	switch q.state {
	case rdma.QPStateRTS:
	case rdma.QPStateErr:
		wcs := make([]rdma.WC, len(wrs))
		for i, wr := range wrs {
			wcs[i] = rdma.WC{WRID: wr.ID, Status: rdma.WCWRFlushErr, Op: wr.Op, QPNum: q.num}
		}
		q.sendCQ.push(wcs...)
		return nil
	default:
		return fmt.Errorf("post send on qp %d in %v: %w", q.num, q.state, syscall.EINVAL)
	}
	if len(q.pending)+len(wrs) > q.maxWR {
		return fmt.Errorf("post send on qp %d: %d outstanding of %d: %w", q.num, len(q.pending), q.maxWR, syscall.ENOMEM)
	}
	for i, wr := range wrs {
		if wr.Op != rdma.OpRead && wr.Op != rdma.OpWrite {
			return fmt.Errorf("post send on qp %d: opcode %d: %w", q.num, wr.Op, syscall.EINVAL)
		}
		m := q.n.mr(wr.Local.LKey)
		off, inside := 0, false
		if m != nil && m.pd == q.pd {
			off, inside = m.span(wr.Local.Addr, wr.Local.Length)
		}
		if !inside || (wr.Op == rdma.OpRead && m.access&rdma.AccessLocalWrite == 0) {
			// Earlier WRs flush, this one reports the protection error,
			// later ones flush: completions stay in post order.
			q.toErrorLocked(rdma.WCWRFlushErr)
			wcs := []rdma.WC{{WRID: wr.ID, Status: rdma.WCLocProtErr, Op: wr.Op, QPNum: q.num}}
			for _, rest := range wrs[i+1:] {
				wcs = append(wcs, rdma.WC{WRID: rest.ID, Status: rdma.WCWRFlushErr, Op: rest.Op, QPNum: q.num})
			}
			q.sendCQ.push(wcs...)
			return nil
		}
		seq := q.nextSeq
		q.nextSeq++
		if len(q.pending) == 0 {
			q.progress = time.Now()
		}
		q.pending = append(q.pending, &pendingWR{wr: wr, seq: seq, local: m, off: off})
		q.link.enqueue(outFrame{
			req:   request{op: wr.Op, dstQPN: q.remote.QPN, srcQPN: q.num, rkey: wr.RKey, seq: seq, raddr: wr.RemoteAddr, length: wr.Local.Length},
			local: m,
			off:   off,
		})
	}
	return nil
}

func (q *qp) Destroy() error {
	q.mu.Lock()
	if q.destroyed {
		q.mu.Unlock()
		return fmt.Errorf("destroy qp %d: already destroyed: %w", q.num, syscall.EINVAL)
	}
	q.destroyed = true
	q.pending = nil
	q.state = rdma.QPStateReset
	q.mu.Unlock()
	q.n.mu.Lock()
	delete(q.n.qps, q.num)
	q.n.mu.Unlock()
	return nil
}

// head finds the outstanding WR a response with seq answers (nil when it
// was flushed meanwhile).
func (q *qp) head(seq uint64) *pendingWR {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, p := range q.pending {
		if p.seq == seq {
			return p
		}
	}
	return nil
}

// finish completes p with st if it is still outstanding. Any error moves
// the QP to ERR, flushing the WRs behind p.
func (q *qp) finish(p *pendingWR, st rdma.WCStatus) {
	q.mu.Lock()
	defer q.mu.Unlock()
	idx := -1
	for i, x := range q.pending {
		if x == p {
			idx = i
			break
		}
	}
	if idx < 0 {
		return // flushed or reset meanwhile
	}
	q.progress = time.Now()
	if st != rdma.WCSuccess {
		rest := append([]*pendingWR{p}, q.pending[:idx]...)
		q.pending = append(rest, q.pending[idx+1:]...)
		q.toErrorLocked(st)
		return
	}
	q.pending = append(q.pending[:idx], q.pending[idx+1:]...)
	q.sendCQ.push(rdma.WC{WRID: p.wr.ID, Status: st, Op: p.wr.Op, ByteLen: p.wr.Local.Length, QPNum: q.num})
}
