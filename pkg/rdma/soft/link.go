package soft

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"github.com/kvcache-ops/mc/pkg/rdma"
)

const (
	wireBuf      = 256 << 10
	dialTimeout  = 2 * time.Second
	helloTimeout = 5 * time.Second
	// payloadTimeout bounds reading a payload once its header arrived.
	// Headers themselves are awaited without a deadline: the connection is
	// persistent and may idle.
	payloadTimeout = 30 * time.Second
)

// outFrame is a request waiting for the link's writer.
type outFrame struct {
	req   request
	local *mr // WRITE payload source
	off   int
}

// link is the requester side of the wire from one nic to one peer device:
// a queue of requests, a writer goroutine that (re)dials and sends them,
// and a reader goroutine per connection that completes them.
type link struct {
	n       *nic
	addr    netip.AddrPort
	peerLID uint16

	mu     sync.Mutex
	cond   *sync.Cond
	q      []outFrame
	conn   net.Conn
	closed bool
}

// link returns the link to addr, starting its writer on first use.
func (n *nic) link(addr netip.AddrPort, peerLID uint16) (*link, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.down {
		return nil, syscall.ENODEV
	}
	if l := n.links[addr]; l != nil {
		return l, nil
	}
	l := &link{n: n, addr: addr, peerLID: peerLID}
	l.cond = sync.NewCond(&l.mu)
	n.links[addr] = l
	n.wg.Add(1)
	go l.writer()
	return l, nil
}

func (l *link) enqueue(f outFrame) {
	l.mu.Lock()
	l.q = append(l.q, f)
	l.mu.Unlock()
	l.cond.Signal()
}

func (l *link) close() {
	l.mu.Lock()
	l.closed = true
	c := l.conn
	l.mu.Unlock()
	l.cond.Broadcast()
	if c != nil {
		c.Close()
	}
}

// silent reports whether frames to the peer are lost: port down, wire
// killed, or DropPeer.
func (n *nic) silent(peerLID uint16) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.port != rdma.PortActive || n.wireDead || n.dropped[peerLID]
}

func (n *nic) track(c net.Conn) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.wireDead || n.down {
		return false
	}
	n.conns[c] = struct{}{}
	return true
}

func (n *nic) untrack(c net.Conn) {
	n.mu.Lock()
	delete(n.conns, c)
	n.mu.Unlock()
}

func (l *link) writer() {
	defer l.n.wg.Done()
	var bw *bufio.Writer
	var conn net.Conn
	var hdr [requestLen]byte
	for {
		l.mu.Lock()
		for len(l.q) == 0 && !l.closed {
			l.cond.Wait()
		}
		if l.closed {
			l.mu.Unlock()
			return
		}
		batch := l.q
		l.q = nil
		if l.conn != conn { // the reader saw the connection die
			conn, bw = l.conn, nil
		}
		l.mu.Unlock()

		if l.n.silent(l.peerLID) {
			continue // lost on the wire; the watchdog completes them
		}
		if conn == nil {
			c, err := l.dial()
			if err != nil {
				continue // peer unreachable: the requests time out
			}
			l.mu.Lock()
			if l.closed {
				l.mu.Unlock()
				c.Close()
				return
			}
			l.conn, conn = c, c
			l.mu.Unlock()
			bw = bufio.NewWriterSize(c, wireBuf)
		}
		if bw == nil {
			bw = bufio.NewWriterSize(conn, wireBuf)
		}
		var err error
		for _, f := range batch {
			encodeRequest(hdr[:], f.req)
			if _, err = bw.Write(hdr[:]); err != nil {
				break
			}
			if f.req.op == rdma.OpWrite {
				if err = writePayload(bw, f.local, f.off, int(f.req.length)); err != nil {
					break
				}
			}
		}
		if err == nil {
			err = bw.Flush()
		}
		if err != nil {
			conn.Close()
			l.mu.Lock()
			if l.conn == conn {
				l.conn = nil
			}
			l.mu.Unlock()
			conn, bw = nil, nil
		}
	}
}

// writePayload copies n bytes of m from off; a region deregistered in
// flight sends zeros so the stream stays framed.
func writePayload(w io.Writer, m *mr, off, n int) error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.dead {
		_, err := w.Write(make([]byte, n))
		return err
	}
	_, err := w.Write(m.buf[off : off+n])
	return err
}

func (l *link) dial() (net.Conn, error) {
	c, err := net.DialTimeout("tcp", l.addr.String(), dialTimeout)
	if err != nil {
		return nil, err
	}
	if !l.n.track(c) {
		c.Close()
		return nil, syscall.ENETDOWN
	}
	var h [helloLen]byte
	encodeHello(h[:], l.n.lid)
	if _, err := c.Write(h[:]); err != nil {
		c.Close()
		l.n.untrack(c)
		return nil, err
	}
	l.n.wg.Add(1)
	go l.reader(c)
	return c, nil
}

// reader completes requests from the responses on c.
func (l *link) reader(c net.Conn) {
	defer l.n.wg.Done()
	defer func() {
		c.Close()
		l.n.untrack(c)
		l.mu.Lock()
		if l.conn == c {
			l.conn = nil
		}
		l.mu.Unlock()
	}()
	br := bufio.NewReaderSize(c, wireBuf)
	var hdr [responseLen]byte
	for {
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return
		}
		r, err := decodeResponse(hdr[:])
		if err != nil {
			return
		}
		var q *qp
		var p *pendingWR
		if q = l.n.qp(r.dstQPN); q != nil {
			p = q.head(r.seq)
		}
		st := r.status
		if r.length > 0 {
			c.SetReadDeadline(time.Now().Add(payloadTimeout))
			switch {
			case p == nil:
				err = discard(br, r.length)
			case p.wr.Op != rdma.OpRead || r.length != p.wr.Local.Length:
				err = discard(br, r.length)
				st = rdma.WCBadRespErr
			default:
				var ok bool
				ok, err = readPayload(br, p.local, p.off, int(r.length))
				if !ok {
					st = rdma.WCLocProtErr
				}
			}
			c.SetReadDeadline(time.Time{})
			if err != nil {
				return
			}
		}
		if p != nil {
			q.finish(p, st)
		}
	}
}

// readPayload fills m[off:off+n] from r; false when m was deregistered
// (the bytes are consumed and dropped).
func readPayload(r io.Reader, m *mr, off, n int) (bool, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.dead {
		return false, discard(r, uint32(n))
	}
	_, err := io.ReadFull(r, m.buf[off:off+n])
	return true, err
}

func discard(r io.Reader, n uint32) error {
	_, err := io.CopyN(io.Discard, r, int64(n))
	return err
}

func (n *nic) acceptLoop() {
	defer n.wg.Done()
	for {
		c, err := n.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			select {
			case <-n.stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		if !n.track(c) {
			c.Close()
			continue
		}
		n.wg.Add(1)
		go n.serve(c)
	}
}

// serve is the responder side of one connection: it checks and executes
// requests in order and answers each.
func (n *nic) serve(c net.Conn) {
	defer n.wg.Done()
	defer func() {
		c.Close()
		n.untrack(c)
	}()
	var h [helloLen]byte
	c.SetReadDeadline(time.Now().Add(helloTimeout))
	if _, err := io.ReadFull(c, h[:]); err != nil {
		return
	}
	peerLID, err := decodeHello(h[:])
	if err != nil {
		return
	}
	c.SetReadDeadline(time.Time{})
	br := bufio.NewReaderSize(c, wireBuf)
	bw := bufio.NewWriterSize(c, wireBuf)
	var hdr [requestLen]byte
	var rh [responseLen]byte
	for {
		if br.Buffered() == 0 {
			if err := bw.Flush(); err != nil {
				return
			}
		}
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return
		}
		r, err := decodeRequest(hdr[:])
		if err != nil {
			return
		}
		c.SetReadDeadline(time.Now().Add(payloadTimeout))
		m, off, st := n.check(r, peerLID)
		if r.op == rdma.OpWrite {
			if st == rdma.WCSuccess {
				var ok bool
				ok, err = readPayload(br, m, off, int(r.length))
				if !ok {
					st = rdma.WCRemAccessErr
				}
			} else {
				err = discard(br, r.length)
			}
			if err != nil {
				return
			}
		}
		c.SetReadDeadline(time.Time{})
		if n.silent(peerLID) {
			continue // port down or peer dropped: no answer
		}
		resp := response{status: st, dstQPN: r.srcQPN, seq: r.seq}
		if r.op == rdma.OpRead && st == rdma.WCSuccess {
			resp.length = r.length
		}
		encodeResponse(rh[:], resp)
		if _, err := bw.Write(rh[:]); err != nil {
			return
		}
		if resp.length > 0 {
			if err := writePayload(bw, m, off, int(r.length)); err != nil {
				return
			}
		}
	}
}

// check validates a request as an RC responder does: the target QP must
// be connected to the sender, and the rkey must name a region of the QP's
// PD, with the needed remote access, containing [raddr, raddr+length). An
// access violation also moves the responder's QP to ERR with an async
// event.
func (n *nic) check(r request, peerLID uint16) (*mr, int, rdma.WCStatus) {
	q := n.qp(r.dstQPN)
	if q == nil {
		return nil, 0, rdma.WCRemInvReqErr
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if (q.state != rdma.QPStateRTR && q.state != rdma.QPStateRTS) || q.remote.LID != peerLID || q.remote.QPN != r.srcQPN {
		return nil, 0, rdma.WCRemInvReqErr
	}
	need := rdma.AccessRemoteRead
	if r.op == rdma.OpWrite {
		need = rdma.AccessRemoteWrite
	}
	m := n.mr(r.rkey)
	off, inside := 0, false
	if m != nil && m.pd == q.pd && m.access&need != 0 && q.access&need != 0 {
		off, inside = m.span(r.raddr, r.length)
	}
	if !inside {
		q.toErrorLocked(rdma.WCWRFlushErr)
		n.mu.Lock()
		n.emitLocked(q.dev, rdma.AsyncEvent{Type: rdma.EventQPAccessErr, QPNum: q.num})
		n.mu.Unlock()
		return nil, 0, rdma.WCRemAccessErr
	}
	return m, off, rdma.WCSuccess
}
