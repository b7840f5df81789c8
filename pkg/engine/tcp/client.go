package tcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Op is one request from the client's side: Buf is the local memory (the
// source of a WRITE, the destination of a READ), Addr the target's virtual
// address. Done is told exactly once how it ended.
type Op struct {
	Write bool
	Addr  uint64
	Buf   []byte
	Done  Completer
}

// Completer receives an Op's outcome; nil err means len(Buf) bytes moved.
type Completer interface{ OpDone(err error) }

// ErrClosed fails operations still queued when the client is closed.
var ErrClosed = errors.New("tcp client closed")

// Defaults for ClientOptions.
const (
	DefaultLanes         = 4
	DefaultStatusTimeout = 30 * time.Second
	DefaultDialTimeout   = 5 * time.Second
)

// minLaneBytes is the least a Submit gives one lane (see Submit).
const minLaneBytes = 256 << 10

// ClientOptions configures a Client.
type ClientOptions struct {
	// Lanes is the number of persistent connections per peer; requests of
	// one Submit are spread over them. 0 means DefaultLanes.
	Lanes int
	// StatusTimeout bounds the wait for each status word or reply
	// (MC_TCP_STATUS_TIMEOUT_SEC); 0 means DefaultStatusTimeout. A lane
	// that times out fails its outstanding operations and is dropped.
	StatusTimeout time.Duration
	// DialTimeout bounds connecting a lane; 0 means DefaultDialTimeout.
	DialTimeout time.Duration
	// IdleRedial: a lane unused for this long is replaced before use, so it
	// never meets the server's idle timeout mid-request. 0 means half of
	// DefaultIdleTimeout.
	IdleRedial time.Duration
	// PerRequest opens a connection per request, as Mooncake's client
	// does without MC_TCP_ENABLE_CONNECTION_POOL; Lanes is then unused.
	PerRequest bool
}

// Client sends requests to TCP data servers over persistent, pipelined
// lanes: a writer goroutine per lane sends headers and payloads back to
// back, a reader goroutine takes replies in FIFO order and completes the
// operations. A lane that fails is dropped and redialled on next use.
type Client struct {
	opts ClientOptions

	mu     sync.Mutex
	peers  map[string]*peer
	closed bool

	// Per-request mode: Close cancels stop (which closes the connections
	// in flight) and waits for their goroutines.
	stop     context.Context
	stopNow  context.CancelFunc
	requests sync.WaitGroup
}

// NewClient returns a client with no connections yet.
func NewClient(opts ClientOptions) *Client {
	if opts.Lanes <= 0 {
		opts.Lanes = DefaultLanes
	}
	if opts.StatusTimeout <= 0 {
		opts.StatusTimeout = DefaultStatusTimeout
	}
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = DefaultDialTimeout
	}
	if opts.IdleRedial <= 0 {
		opts.IdleRedial = DefaultIdleTimeout / 2
	}
	c := &Client{opts: opts, peers: make(map[string]*peer)}
	c.stop, c.stopNow = context.WithCancel(context.Background())
	return c
}

type peer struct {
	addr string
	v2   bool
	mu   sync.Mutex
	next int
	// lanes are dialled lazily; a nil or dead slot is redialled on use.
	lanes []*lane
}

// Submit sends ops to the data server at addr (host:port). v2 selects
// protocol version 2 (status frames); false speaks v1 to old peers. Submit
// returns once the ops are queued; each completes through its Done. A
// connection that cannot be made fails the ops given to it.
func (c *Client) Submit(ctx context.Context, addr string, v2 bool, ops []*Op) {
	if len(ops) == 0 {
		return
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		failAll(ops, ErrClosed)
		return
	}
	if c.opts.PerRequest {
		c.requests.Add(len(ops))
		c.mu.Unlock()
		c.submitPerRequest(ctx, addr, v2, ops)
		return
	}
	key := addr
	if !v2 {
		key += "/v1"
	}
	p := c.peers[key]
	if p == nil {
		p = &peer{addr: addr, v2: v2, lanes: make([]*lane, c.opts.Lanes)}
		c.peers[key] = p
	}
	c.mu.Unlock()

	// Contiguous chunks, one per lane, starting at a rotating lane so that
	// single-request submits spread too. A lane is given at least
	// minLaneBytes: splitting a small batch costs more in goroutine
	// hand-offs and syscalls than the parallel lanes win back.
	bytes := 0
	for _, op := range ops {
		bytes += len(op.Buf)
	}
	n := max(1, min(len(ops), len(p.lanes), (bytes+minLaneBytes-1)/minLaneBytes))
	per := (len(ops) + n - 1) / n
	for i := 0; i < len(ops); i += per {
		chunk := ops[i:min(i+per, len(ops))]
		l, err := c.lane(ctx, p)
		if err != nil {
			failAll(chunk, err)
			continue
		}
		l.enqueue(chunk)
	}
}

// lane returns the next usable lane of p, dialling if needed.
func (c *Client) lane(ctx context.Context, p *peer) (*lane, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	i := p.next
	p.next = (p.next + 1) % len(p.lanes)
	l := p.lanes[i]
	if l != nil && (l.dead() || time.Since(time.Unix(0, l.lastUse.Load())) > c.opts.IdleRedial) {
		l.close(fmt.Errorf("lane to %s replaced", p.addr))
		p.lanes[i], l = nil, nil
	}
	if l == nil {
		d := net.Dialer{Timeout: c.opts.DialTimeout}
		conn, err := d.DialContext(ctx, "tcp", p.addr)
		if err != nil {
			return nil, fmt.Errorf("connect to tcp data port %s: %w", p.addr, err)
		}
		c.mu.Lock()
		closed := c.closed
		c.mu.Unlock()
		if closed {
			conn.Close()
			return nil, ErrClosed
		}
		l = newLane(conn, p.v2, c.opts.StatusTimeout)
		p.lanes[i] = l
		slog.Debug("tcp lane connected", "peer", p.addr, "lane", i, "lanes", len(p.lanes), "local", conn.LocalAddr(), "v2", p.v2)
	}
	return l, nil
}

// Abort fails every operation queued or in flight to the data server at
// addr with err and closes its lanes (the next Submit dials anew). An op
// being received completes only once its connection is closed, so no byte
// of it lands in local memory after its completion. It is for a peer
// known to be gone (its node dropped by the store's master) that would
// otherwise hold its ops until StatusTimeout. Per-request connections are
// left to their own deadlines.
func (c *Client) Abort(addr string, err error) {
	c.mu.Lock()
	var ps []*peer
	for _, key := range []string{addr, addr + "/v1"} {
		if p := c.peers[key]; p != nil {
			ps = append(ps, p)
			delete(c.peers, key)
		}
	}
	c.mu.Unlock()
	for _, p := range ps {
		p.closeLanes(err)
	}
}

// closeLanes kills every lane of p with err and waits for their
// goroutines.
func (p *peer) closeLanes(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, l := range p.lanes {
		if l != nil {
			l.close(err)
			p.lanes[i] = nil
		}
	}
}

// Close fails queued operations with ErrClosed, closes every lane and
// waits for the lane goroutines to exit.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	peers := c.peers
	c.peers = nil
	c.mu.Unlock()
	c.stopNow()
	c.requests.Wait()
	for _, p := range peers {
		p.closeLanes(ErrClosed)
	}
	return nil
}

func failAll(ops []*Op, err error) {
	for _, op := range ops {
		op.Done.OpDone(err)
	}
}

// lane is one persistent connection. Every queued op is in exactly one of
// sendq, recvq, the reader's working set, or (v1 writes) the writer's
// unflushed set, so it completes exactly once.
type lane struct {
	conn    net.Conn
	v2      bool
	timeout time.Duration
	lastUse atomic.Int64

	mu    sync.Mutex
	err   error // set once when the lane dies
	sendq []*Op
	recvq []*Op

	sendSig chan struct{}
	recvSig chan struct{}
	done    chan struct{}
	wg      sync.WaitGroup
}

func newLane(conn net.Conn, v2 bool, timeout time.Duration) *lane {
	l := &lane{
		conn:    conn,
		v2:      v2,
		timeout: timeout,
		sendSig: make(chan struct{}, 1),
		recvSig: make(chan struct{}, 1),
		done:    make(chan struct{}),
	}
	l.lastUse.Store(time.Now().UnixNano())
	l.wg.Add(2)
	go l.writer()
	go l.reader()
	return l
}

func (l *lane) dead() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err != nil
}

func (l *lane) enqueue(ops []*Op) {
	l.lastUse.Store(time.Now().UnixNano())
	l.mu.Lock()
	if l.err != nil {
		err := l.err
		l.mu.Unlock()
		failAll(ops, err)
		return
	}
	l.sendq = append(l.sendq, ops...)
	l.mu.Unlock()
	signal(l.sendSig)
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// fail kills the lane: queued and unanswered ops fail with err.
func (l *lane) fail(err error) {
	l.mu.Lock()
	if l.err != nil {
		l.mu.Unlock()
		return
	}
	l.err = err
	pending := append(l.sendq, l.recvq...)
	l.sendq, l.recvq = nil, nil
	l.mu.Unlock()
	close(l.done)
	l.conn.Close()
	failAll(pending, err)
}

// close kills the lane and waits for its goroutines.
func (l *lane) close(err error) {
	l.fail(err)
	l.wg.Wait()
}

func (l *lane) writer() {
	defer l.wg.Done()
	// Headers are packed into one buffer and WRITE payloads go out from
	// the caller's memory, all with one writev: no payload is copied.
	var work, v1writes []*Op
	var hdrs []byte
	var vec, sent net.Buffers
	for {
		l.mu.Lock()
		for len(l.sendq) == 0 && l.err == nil {
			l.mu.Unlock()
			select {
			case <-l.sendSig:
			case <-l.done:
			}
			l.mu.Lock()
		}
		if l.err != nil {
			l.mu.Unlock()
			failAll(v1writes, l.err)
			return
		}
		work, l.sendq = l.sendq, work[:0]
		// Ops awaiting a reply move to recvq before their bytes leave, so
		// the reader knows what the next reply belongs to.
		for _, op := range work {
			if l.v2 || !op.Write {
				l.recvq = append(l.recvq, op)
			}
		}
		l.mu.Unlock()
		signal(l.recvSig)

		hdrs = hdrs[:0]
		for _, op := range work {
			hdrs = AppendHeader(hdrs, Header{Size: uint64(len(op.Buf)), Addr: op.Addr, Write: op.Write, V2: l.v2})
		}
		from := 0
		for i, op := range work {
			if op.Write {
				to := (i + 1) * HeaderSize
				vec = append(vec, hdrs[from:to], op.Buf)
				from = to
				if !l.v2 {
					v1writes = append(v1writes, op)
				}
			}
		}
		if from < len(hdrs) {
			vec = append(vec, hdrs[from:])
		}
		sent = vec // WriteTo consumes its receiver; vec keeps the array
		_, err := sent.WriteTo(l.conn)
		clear(vec)
		vec = vec[:0]
		if err == nil {
			// v1 has no status: a write is done once its bytes are handed
			// to the kernel.
			for _, op := range v1writes {
				op.Done.OpDone(nil)
			}
			v1writes = v1writes[:0]
		}
		clear(work)
		if err != nil {
			err = fmt.Errorf("send to %s: %w", l.conn.RemoteAddr(), err)
			failAll(v1writes, err)
			v1writes = nil
			l.fail(err)
			return
		}
	}
}

func (l *lane) reader() {
	defer l.wg.Done()
	rr := newReplyReader(l.conn, 64<<10)
	var work []*Op
	var st [StatusSize]byte
	for {
		l.mu.Lock()
		for len(l.recvq) == 0 && l.err == nil {
			l.mu.Unlock()
			select {
			case <-l.recvSig:
			case <-l.done:
			}
			l.mu.Lock()
		}
		if l.err != nil {
			l.mu.Unlock()
			return
		}
		work, l.recvq = l.recvq, work[:0]
		l.mu.Unlock()

		// The deadline is set when work arrives and refreshed at most every
		// 1/8 of the timeout: each reply gets between 7/8 and all of it.
		set := time.Now()
		l.conn.SetReadDeadline(set.Add(l.timeout))
		for i, op := range work {
			if now := time.Now(); now.Sub(set) > l.timeout/8 {
				set = now
				l.conn.SetReadDeadline(now.Add(l.timeout))
			}
			stb, data := st[:], op.Buf
			if !l.v2 {
				stb = nil
			}
			if op.Write {
				data = nil
			}
			err := rr.readFrame(stb, data)
			if err != nil {
				if !errors.Is(err, ErrRejected) {
					err = l.describe(err)
					failAll(work[i:], err)
					clear(work)
					l.fail(err)
					return
				}
				// The server closes after a rejection: the lane is dead
				// before the rejected op completes, so that whatever its
				// owner submits next goes to a new lane.
				later := fmt.Errorf("connection to %s closed by the peer after it rejected an earlier request", l.conn.RemoteAddr())
				failAll(work[i+1:], later)
				l.fail(later)
				op.Done.OpDone(err)
				clear(work)
				return
			}
			op.Done.OpDone(nil)
		}
		clear(work)
	}
}

func (l *lane) readReply(br io.Reader, op *Op, st []byte) error {
	if l.v2 {
		if _, err := io.ReadFull(br, st); err != nil {
			return err
		}
		if err := CheckStatus(st); err != nil {
			return err
		}
	}
	if !op.Write {
		if _, err := io.ReadFull(br, op.Buf); err != nil {
			return err
		}
	}
	return nil
}

// describe turns a read error into a reason an operator can act on.
func (l *lane) describe(err error) error {
	// The lane was killed (Abort, Close): its reason, not the closed
	// connection it left, is what the op's owner needs.
	l.mu.Lock()
	why := l.err
	l.mu.Unlock()
	if why != nil {
		return why
	}
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return fmt.Errorf("no reply from %s within %s (MC_TCP_STATUS_TIMEOUT_SEC): %w", l.conn.RemoteAddr(), l.timeout, err)
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("connection to %s closed by the peer: %w", l.conn.RemoteAddr(), err)
	}
	return fmt.Errorf("receive from %s: %w", l.conn.RemoteAddr(), err)
}
