package cororpc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"sync"
	"time"
)

// Options configure a Client. The zero value is usable.
type Options struct {
	// MaxMessageLen bounds body plus attachment of a response; 0 means
	// DefaultMaxMessageLen. A larger response breaks the connection.
	MaxMessageLen uint32
	// CallTimeout bounds a call whose context has no deadline: 0 means
	// coro_rpc's default request timeout (30 s), negative means none.
	CallTimeout time.Duration
	// DialTimeout bounds each connection attempt: 0 means coro_rpc's
	// default connect timeout (30 s).
	DialTimeout time.Duration
	// ReconnectBackoff is how long the client waits before dialing again
	// after its connection broke; consecutive failed dials double it, up
	// to 2 s or ReconnectBackoff if larger. 0 means 100 ms.
	ReconnectBackoff time.Duration
	// Dial opens the connection; nil means TCP through net.Dialer.
	Dial func(ctx context.Context, addr string) (net.Conn, error)
	// Logger receives protocol errors; nil means slog.Default(), which mc
	// points at pkg/diag/glog's handler.
	Logger *slog.Logger
}

const (
	defaultTimeout          = 30 * time.Second
	defaultReconnectBackoff = 100 * time.Millisecond
	maxReconnectBackoff     = 2 * time.Second
	// maxAbandoned bounds the calls a connection remembers after their
	// callers gave up, waiting for late responses to discard. A peer that
	// leaves this many unanswered is not going to answer; dropping the
	// connection frees them.
	maxAbandoned = 1024
)

// Client calls one coro_rpc server. Calls from any number of goroutines are
// multiplexed on one connection, each under its own sequence number. The
// connection is opened on first use and opened again, after a short
// backoff, by the first call after it broke.
type Client struct {
	addr   string
	opts   Options
	log    *slog.Logger
	ctx    context.Context // ends with Close: aborts dials and backoff waits
	cancel context.CancelFunc
	wg     sync.WaitGroup // read loops

	mu       sync.Mutex
	closed   bool
	conn     *clientConn
	dialing  chan struct{} // closed when the dial in progress ends
	retryAt  time.Time
	failures int // consecutive failed dials
	lastErr  error
}

// NewClient returns a Client for addr that connects on its first call.
func NewClient(addr string, opts *Options) *Client {
	c := &Client{addr: addr}
	if opts != nil {
		c.opts = *opts
	}
	if c.opts.CallTimeout == 0 {
		c.opts.CallTimeout = defaultTimeout
	}
	if c.opts.DialTimeout <= 0 {
		c.opts.DialTimeout = defaultTimeout
	}
	if c.opts.ReconnectBackoff <= 0 {
		c.opts.ReconnectBackoff = defaultReconnectBackoff
	}
	if c.opts.Dial == nil {
		var d net.Dialer
		c.opts.Dial = func(ctx context.Context, addr string) (net.Conn, error) {
			return d.DialContext(ctx, "tcp", addr)
		}
	}
	c.log = c.opts.Logger
	if c.log == nil {
		c.log = slog.Default()
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	return c
}

// Dial returns a Client for addr with its connection already open.
func Dial(ctx context.Context, addr string, opts *Options) (*Client, error) {
	c := NewClient(addr, opts)
	if _, err := c.connect(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Addr is the server address the client calls.
func (c *Client) Addr() string { return c.addr }

// Connected reports whether the client has a connection open that has
// not broken: a call made now goes out on it without a dial. A client
// whose peer closed the connection learns it as soon as its reader
// does, without a call.
func (c *Client) Connected() bool {
	c.mu.Lock()
	cn := c.conn
	c.mu.Unlock()
	return cn != nil && !cn.broken()
}

// Call sends body to function fnID and returns the response body. An error
// response from the server is an *RPCError; a broken connection fails the
// call with an error wrapping ErrConnectionLost (never retried); a call whose
// context ends returns the context's error at once.
func (c *Client) Call(ctx context.Context, fnID uint32, body []byte) ([]byte, error) {
	resp, _, err := c.CallWithAttachment(ctx, fnID, body, nil)
	return resp, err
}

// CallWithAttachment is Call with coro_rpc's attachment: raw bytes sent
// after the body, outside struct_pack. It returns the response's body and
// attachment.
func (c *Client) CallWithAttachment(ctx context.Context, fnID uint32, body, attach []byte) (respBody, respAttach []byte, err error) {
	if uint64(len(body)) > math.MaxUint32 || uint64(len(attach)) > math.MaxUint32 {
		return nil, nil, fmt.Errorf("call %#08x to %s: body %d, attachment %d bytes: %w", fnID, c.addr, len(body), len(attach), ErrMessageTooLarge)
	}
	if _, ok := ctx.Deadline(); !ok && c.opts.CallTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.opts.CallTimeout)
		defer cancel()
	}
	for {
		cn, err := c.connect(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("call %#08x: %w", fnID, err)
		}
		p, seq, ok := cn.register(fnID)
		if !ok {
			// It broke before anything of this call was sent, so trying
			// the next connection cannot run the call twice.
			continue
		}
		if err := cn.send(ctx, RequestHeader{
			Magic: Magic, Version: Version, SerializeType: SerializeStructPack,
			Seq: seq, FunctionID: fnID,
			Length: uint32(len(body)), AttachLength: uint32(len(attach)),
		}, body, attach); err != nil {
			if cerr := ctx.Err(); cerr != nil {
				err = cerr
			} else if errors.Is(err, os.ErrDeadlineExceeded) {
				// The write deadline is ctx's; its timer may not have
				// fired yet.
				err = context.DeadlineExceeded
			}
			return nil, nil, fmt.Errorf("call %#08x seq %d to %s: send: %w", fnID, seq, c.addr, err)
		}
		var r response
		select {
		case r = <-p.done:
		case <-ctx.Done():
			select {
			case r = <-p.done: // answered just in time
			default:
				cn.abandon(seq)
				return nil, nil, fmt.Errorf("call %#08x seq %d to %s: %w", fnID, seq, c.addr, ctx.Err())
			}
		}
		if r.err != nil {
			return nil, nil, fmt.Errorf("call %#08x seq %d to %s: %w: %w", fnID, seq, c.addr, ErrConnectionLost, r.err)
		}
		if r.errCode != 0 {
			code, msg, derr := decodeErrorBody(r.errCode, r.body)
			if derr != nil {
				msg = derr.Error()
			}
			return nil, nil, &RPCError{Code: code, Message: msg, Function: fnID}
		}
		return r.body, r.attach, nil
	}
}

// Close fails the calls in flight with ErrClosed, closes the connection and
// waits for its reader to exit. Later calls fail with ErrClosed.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	cn := c.conn
	c.conn = nil
	c.mu.Unlock()
	c.cancel()
	if cn != nil {
		cn.fail(fmt.Errorf("client for %s: %w", c.addr, ErrClosed))
	}
	c.wg.Wait()
	return nil
}

// connect returns the open connection, or opens one: only one dial runs at a
// time, and it first waits out the backoff left by the last failure.
func (c *Client) connect(ctx context.Context) (*clientConn, error) {
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return nil, fmt.Errorf("client for %s: %w", c.addr, ErrClosed)
		}
		if cn := c.conn; cn != nil {
			if !cn.broken() {
				c.mu.Unlock()
				return cn, nil
			}
			// Its reader is still failing the calls on it; do not wait
			// for it to say so.
			c.dropLocked(cn)
		}
		if ch := c.dialing; ch != nil {
			c.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return nil, fmt.Errorf("connect to %s: %w", c.addr, ctx.Err())
			}
		}
		wait, lastErr := time.Until(c.retryAt), c.lastErr
		ch := make(chan struct{})
		c.dialing = ch
		c.mu.Unlock()

		nc, err := c.dial(ctx, wait, lastErr)

		c.mu.Lock()
		c.dialing = nil
		close(ch)
		var cn *clientConn
		switch {
		case err == nil && c.closed:
			nc.Close()
			err = fmt.Errorf("client for %s: %w", c.addr, ErrClosed)
		case err == nil:
			cn = c.newConn(nc)
			c.conn, c.failures, c.lastErr = cn, 0, nil
			c.wg.Add(1)
			go cn.readLoop()
		case ctx.Err() != nil || c.closed:
			// The caller gave up; that says nothing about the server.
		default:
			c.failures++
			c.lastErr = err
			c.retryAt = time.Now().Add(c.backoff())
		}
		c.mu.Unlock()
		return cn, err
	}
}

func (c *Client) dial(ctx context.Context, wait time.Duration, lastErr error) (net.Conn, error) {
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil, fmt.Errorf("reconnect to %s: waiting %v after %v: %w", c.addr, wait.Round(time.Millisecond), lastErr, ctx.Err())
		case <-c.ctx.Done():
			return nil, fmt.Errorf("client for %s: %w", c.addr, ErrClosed)
		}
	}
	dctx, cancel := context.WithTimeout(ctx, c.opts.DialTimeout)
	defer cancel()
	stop := context.AfterFunc(c.ctx, cancel)
	defer stop()
	nc, err := c.opts.Dial(dctx, c.addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", c.addr, err)
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		// coro_rpc enables TCP_NODELAY too; small requests must not wait.
		_ = tc.SetNoDelay(true)
	}
	return nc, nil
}

func (c *Client) backoff() time.Duration {
	limit := max(maxReconnectBackoff, c.opts.ReconnectBackoff)
	d := c.opts.ReconnectBackoff
	for i := 1; i < c.failures && d < limit; i++ {
		d *= 2
	}
	return min(d, limit)
}

// connBroke forgets cn so that the next call dials again, after the backoff.
func (c *Client) connBroke(cn *clientConn) {
	c.mu.Lock()
	c.dropLocked(cn)
	c.mu.Unlock()
}

func (c *Client) dropLocked(cn *clientConn) {
	if c.conn == cn {
		c.conn = nil
		c.lastErr = cn.cause()
		c.retryAt = time.Now().Add(c.opts.ReconnectBackoff)
	}
}

// clientConn is one connection and the calls in flight on it.
type clientConn struct {
	c   *Client
	nc  net.Conn
	raw *rawIO // nc's socket without syscall entries, or nil
	br  *bufio.Reader

	wmu sync.Mutex // whole frames go out one at a time
	hdr []byte     // header scratch, under wmu

	mu        sync.Mutex
	calls     map[uint32]*pending
	seq       uint32
	abandoned int
	err       error // why the connection broke; set once
}

type pending struct {
	done      chan response // capacity 1: the reader never blocks on it
	abandoned bool
}

type response struct {
	errCode      uint8
	body, attach []byte
	err          error // the connection broke
}

func (c *Client) newConn(nc net.Conn) *clientConn {
	raw := newRawIO(nc)
	var r io.Reader = nc
	if raw != nil {
		r = raw // no syscall entry per read or write: see rawio_linux.go
	}
	return &clientConn{
		c:     c,
		nc:    nc,
		raw:   raw,
		br:    bufio.NewReaderSize(r, 32<<10),
		hdr:   make([]byte, 0, RequestHeaderLen),
		calls: make(map[uint32]*pending),
	}
}

// register reserves a sequence number; ok is false if the connection broke.
func (cn *clientConn) register(fnID uint32) (p *pending, seq uint32, ok bool) {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	if cn.err != nil {
		return nil, 0, false
	}
	for {
		seq = cn.seq
		cn.seq++
		// Only after 2^32 calls can a number still be in use.
		if _, busy := cn.calls[seq]; !busy {
			break
		}
	}
	p = &pending{done: make(chan response, 1)}
	cn.calls[seq] = p
	return p, seq, true
}

// abandon marks a call whose caller gave up; its response, if it comes, is
// read and discarded rather than taken for a protocol error.
func (cn *clientConn) abandon(seq uint32) {
	cn.mu.Lock()
	p, ok := cn.calls[seq]
	if ok && !p.abandoned {
		p.abandoned = true
		cn.abandoned++
	}
	n := cn.abandoned
	cn.mu.Unlock()
	if n > maxAbandoned {
		cn.fail(fmt.Errorf("%s left %d calls unanswered after their callers gave up", cn.c.addr, n))
	}
}

var longAgo = time.Unix(1, 0)

// send writes one request frame. A write interrupted after some bytes went
// out leaves the stream unframed, so it breaks the connection.
func (cn *clientConn) send(ctx context.Context, h RequestHeader, body, attach []byte) error {
	cn.wmu.Lock()
	defer cn.wmu.Unlock()
	if err := ctx.Err(); err != nil {
		cn.forget(h.Seq)
		return err
	}
	deadline, _ := ctx.Deadline()
	if err := cn.nc.SetWriteDeadline(deadline); err != nil {
		cn.fail(fmt.Errorf("set write deadline: %w", err))
		return fmt.Errorf("%w: %w", ErrConnectionLost, err)
	}
	// Cancellation without a deadline must interrupt a write blocked on a
	// peer that stopped reading; the next writer sets its own deadline
	// only after this one has fired or been stopped.
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		_ = cn.nc.SetWriteDeadline(longAgo)
		close(fired)
	})
	cn.hdr = h.AppendTo(cn.hdr[:0])
	var n int64
	var err error
	if cn.raw != nil {
		var k int
		k, err = cn.raw.writev(cn.hdr, body, attach)
		n = int64(k)
	} else {
		bufs := net.Buffers{cn.hdr, body, attach}
		n, err = bufs.WriteTo(cn.nc)
	}
	if !stop() {
		<-fired
	}
	if err != nil && n == 0 {
		// Nothing went out (typically a deadline already past): the
		// stream is intact and only this call fails.
		cn.forget(h.Seq)
		return fmt.Errorf("write to %s: %w", cn.c.addr, err)
	}
	if err != nil {
		err = fmt.Errorf("write to %s: %w", cn.c.addr, err)
		cn.fail(err)
		return fmt.Errorf("%w: %w", ErrConnectionLost, err)
	}
	return nil
}

func (cn *clientConn) cause() error {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	return cn.err
}

func (cn *clientConn) broken() bool { return cn.cause() != nil }

func (cn *clientConn) forget(seq uint32) {
	cn.mu.Lock()
	delete(cn.calls, seq)
	cn.mu.Unlock()
}

// readLoop delivers responses to their calls until the connection breaks.
func (cn *clientConn) readLoop() {
	defer cn.c.wg.Done()
	maxLen := cn.c.opts.MaxMessageLen
	for {
		h, err := readResponseHeader(cn.br, maxLen)
		if err != nil {
			cn.fail(fmt.Errorf("read from %s: %w", cn.c.addr, err))
			return
		}
		cn.mu.Lock()
		_, known := cn.calls[h.Seq]
		cn.mu.Unlock()
		if !known {
			err := fmt.Errorf("response seq %d (%d body bytes, err_code %d) from %s: %w", h.Seq, h.Length, h.ErrCode, cn.c.addr, ErrUnknownSeq)
			cn.c.log.Error("coro_rpc: dropping connection", "peer", cn.c.addr, "err", err)
			cn.fail(err)
			return
		}
		body, attach, err := readPayload(cn.br, h.Length, h.AttachLength)
		if err != nil {
			cn.fail(fmt.Errorf("read response seq %d from %s: %w", h.Seq, cn.c.addr, err))
			return
		}
		cn.mu.Lock()
		p, ok := cn.calls[h.Seq]
		if ok {
			delete(cn.calls, h.Seq)
			if p.abandoned {
				cn.abandoned--
			}
		}
		cn.mu.Unlock()
		if ok && !p.abandoned {
			p.done <- response{errCode: h.ErrCode, body: body, attach: attach}
		}
	}
}

// fail breaks the connection once: it closes the socket, fails every call in
// flight with cause and tells the client to dial again.
func (cn *clientConn) fail(cause error) {
	cn.mu.Lock()
	if cn.err != nil {
		cn.mu.Unlock()
		return
	}
	cn.err = cause
	calls := cn.calls
	cn.calls = nil
	cn.mu.Unlock()
	_ = cn.nc.Close()
	for _, p := range calls {
		if !p.abandoned {
			p.done <- response{err: cause}
		}
	}
	cn.c.connBroke(cn)
}
