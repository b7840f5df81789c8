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
	"sync/atomic"
	"time"

	"github.com/kvcache-ops/mc/pkg/budget"
)

// Request is one call as a Handler sees it. Body and Attachment belong to
// the handler.
type Request struct {
	Header     RequestHeader
	Body       []byte
	Attachment []byte
	RemoteAddr net.Addr
}

// Handler runs one call and returns the response body (the struct_pack
// encoding of the result). A non-nil error becomes a coro_rpc error
// response: an *RPCError's code and message as given, any other error
// rpc_throw_exception (10) with the error's text, which is what coro_rpc
// answers when a handler throws. ctx ends when the client goes away or the
// server is closed.
type Handler func(ctx context.Context, req *Request) ([]byte, error)

// ServerOptions configure a Server. The zero value is usable.
type ServerOptions struct {
	// MaxMessageLen bounds body plus attachment of a request; 0 means
	// DefaultMaxMessageLen. A larger request is read off the wire without
	// being kept and answered with message_too_large.
	MaxMessageLen uint32
	// MaxInFlight bounds the calls one connection runs at once; reading
	// from it pauses while that many are running. 0 means 256.
	MaxInFlight int
	// WriteTimeout bounds writing one response to a client that stopped
	// reading; 0 means 30 s.
	WriteTimeout time.Duration
	// ReadTimeout bounds reading one request frame, from its first byte
	// to its last; a client that stalls inside a frame loses the
	// connection, and what was read of the frame is dropped. An idle
	// connection (between frames) has no deadline. 0 means 30 s.
	ReadTimeout time.Duration
	// Budget, when set, bounds the request bytes the server holds: a
	// frame's body is charged to it before a byte of it is kept, and
	// handed back when its handler's answer has been written (or the
	// call dropped). A frame that cannot be charged within AdmissionWait
	// is read off the wire without being kept and answered with
	// message_too_large and a message naming the budget. Shared with
	// other servers (the gRPC side of a master) by passing the same one.
	Budget *budget.Budget
	// AdmissionWait bounds how long a frame waits for Budget (reading
	// from its connection pauses meanwhile); 0 means 1 s.
	AdmissionWait time.Duration
	// Logger receives connection errors; nil means slog.Default().
	Logger *slog.Logger
	// Inline, when set, says whether a call of a function may run in the
	// connection's read loop instead of a goroutine of its own; it is
	// asked per call (keep it cheap), only when nothing else is running
	// or waiting on the connection (a caller making one call
	// at a time, as one of Mooncake's clients does). That saves the hand
	// over to another goroutine and its stack's growth: on a loaded
	// 2-core host about a fifth of a call's round trip. Only functions
	// that never block for long (no waits on a quorum, a lease, another
	// client) may be inline: the connection reads nothing while one
	// runs.
	Inline func(functionID uint32) bool
	// CancelOnHangup, when set and true for a call's function, ends the
	// call's context also when its client hangs up (the connection's
	// read loop sees it close) while the call runs, as a gRPC stream's
	// context ends with its caller: a handler that waits (a put start
	// waiting for read leases) can then give back what its caller will
	// never learn it got. Other calls' contexts end only with the server
	// (coro_rpc runs them to the end; their answers go nowhere). Only
	// calls not run inline see it at once; an inline call's connection
	// reads nothing while it runs, so its context finds out when asked:
	// Err looks at the socket (one non-blocking peek), and Done starts
	// watching it (a read on a goroutine, stopped when the call ends) for
	// a handler about to wait.
	CancelOnHangup func(functionID uint32) bool
	// Recycle, when set, is handed each body a handler returned once the
	// server is done with it (written, or dropped with the connection),
	// so that handlers can encode answers into reused buffers. Set it
	// only when no handler returns a body it still uses afterwards.
	Recycle func(body []byte)
}

// Server dispatches coro_rpc requests to Handlers by function id. It serves
// any number of listeners and handed-over connections.
type Server struct {
	opts ServerOptions
	log  *slog.Logger
	// ctx is the parent of every handler's context; cancelled by Close
	// and by a Shutdown whose grace runs out.
	ctx    context.Context
	cancel context.CancelFunc

	hmu      sync.RWMutex
	handlers map[uint32]registered

	mu        sync.Mutex
	closing   bool
	listeners map[net.Listener]struct{}
	conns     map[*serverConn]struct{}
	connWG    sync.WaitGroup
}

type registered struct {
	name string
	h    Handler
}

// NewServer returns a Server with no handlers.
func NewServer(opts *ServerOptions) *Server {
	s := &Server{
		handlers:  make(map[uint32]registered),
		listeners: make(map[net.Listener]struct{}),
		conns:     make(map[*serverConn]struct{}),
	}
	if opts != nil {
		s.opts = *opts
	}
	if s.opts.MaxInFlight <= 0 {
		s.opts.MaxInFlight = 256
	}
	if s.opts.WriteTimeout <= 0 {
		s.opts.WriteTimeout = defaultTimeout
	}
	if s.opts.ReadTimeout <= 0 {
		s.opts.ReadTimeout = defaultTimeout
	}
	if s.opts.AdmissionWait <= 0 {
		s.opts.AdmissionWait = time.Second
	}
	s.log = s.opts.Logger
	if s.log == nil {
		s.log = slog.Default()
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s
}

// Register routes the function id of qualifiedName (see FunctionID) to h and
// returns that id. Registering a name twice, or two names whose ids
// collide, is an error.
func (s *Server) Register(qualifiedName string, h Handler) (uint32, error) {
	id := FunctionID(qualifiedName)
	s.hmu.Lock()
	defer s.hmu.Unlock()
	if prev, ok := s.handlers[id]; ok {
		return id, fmt.Errorf("register %q: function id %#08x already taken by %q", qualifiedName, id, prev.name)
	}
	s.handlers[id] = registered{name: qualifiedName, h: h}
	return id, nil
}

// Serve accepts connections on ln and serves each until Close or Shutdown,
// after which it returns an error wrapping ErrClosed. It closes ln on return.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		ln.Close()
		return fmt.Errorf("serve %s: %w", ln.Addr(), ErrClosed)
	}
	s.listeners[ln] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, ln)
		s.mu.Unlock()
		ln.Close()
	}()
	var delay time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if s.isClosing() {
				return fmt.Errorf("serve %s: %w", ln.Addr(), ErrClosed)
			}
			var te interface{ Temporary() bool }
			if errors.Is(err, net.ErrClosed) || !errors.As(err, &te) || !te.Temporary() {
				return fmt.Errorf("serve %s: accept: %w", ln.Addr(), err)
			}
			// Out of descriptors and the like: let connections drain.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			s.log.Warn("coro_rpc: accept failed; retrying", "addr", ln.Addr(), "err", err, "in", delay)
			time.Sleep(delay)
			continue
		}
		delay = 0
		sc, err := s.track(nc)
		if err != nil {
			return fmt.Errorf("serve %s: %w", ln.Addr(), err)
		}
		go sc.serve()
	}
}

// ServeConn serves one connection that someone else accepted and returns
// when it ends (nil when the client hung up or the server was closed).
//
// The caller may already have read the connection's first bytes, e.g. to
// tell coro_rpc (first byte Magic, 0x15) from an HTTP/2 preface on a shared
// port: it hands over the connection wrapped so that reads return the peeked
// bytes first, as WithReader does with the bufio.Reader that peeked.
// Deadlines and Close must reach the underlying connection.
func (s *Server) ServeConn(nc net.Conn) error {
	sc, err := s.track(nc)
	if err != nil {
		return fmt.Errorf("serve %s: %w", nc.RemoteAddr(), err)
	}
	return sc.serve()
}

// track registers a connection, or closes it if the server is closing.
func (s *Server) track(nc net.Conn) (*serverConn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		nc.Close()
		return nil, ErrClosed
	}
	ctx, cancel := context.WithCancel(s.ctx)
	hup, hupEnd := context.WithCancel(ctx)
	raw := newRawIO(nc)
	var r io.Reader = nc
	if raw != nil {
		r = raw
	}
	sc := &serverConn{
		s:        s,
		nc:       nc,
		raw:      raw,
		br:       bufio.NewReaderSize(r, 32<<10),
		ctx:      ctx,
		cancel:   cancel,
		hup:      hup,
		hupEnd:   hupEnd,
		inflight: make(chan struct{}, s.opts.MaxInFlight),
	}
	sc.inline = &inlineCtx{Context: hup, sc: sc}
	s.conns[sc] = struct{}{}
	s.connWG.Add(1)
	return sc, nil
}

func (s *Server) isClosing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closing
}

// Shutdown stops the server gracefully: listeners close, connections stop
// reading new requests, calls in flight run to completion and their
// responses are written, then connections close. If ctx ends first, handler
// contexts are cancelled, connections are closed and ctx's error returned.
func (s *Server) Shutdown(ctx context.Context) error {
	s.beginClose()
	done := make(chan struct{})
	go func() {
		s.connWG.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		s.cancel()
		s.mu.Lock()
		for sc := range s.conns {
			sc.nc.Close()
		}
		s.mu.Unlock()
		return fmt.Errorf("coro_rpc server shutdown: %w", ctx.Err())
	}
}

// Close stops the server: listeners close, connections stop reading, the
// contexts of calls in flight are cancelled and Close waits for their
// handlers to return and their responses to be written, so clients learn
// why their calls failed. A handler that ignores its context delays Close.
func (s *Server) Close() error {
	s.cancel()
	s.beginClose()
	s.connWG.Wait()
	return nil
}

func (s *Server) beginClose() {
	s.mu.Lock()
	s.closing = true
	for ln := range s.listeners {
		ln.Close()
	}
	for sc := range s.conns {
		sc.stopReading()
	}
	s.mu.Unlock()
}

// serverConn is one client connection.
type serverConn struct {
	s      *Server
	nc     net.Conn
	raw    *rawIO // nc's socket read and written without entering syscalls (rawio_linux.go), or nil
	br     *bufio.Reader
	ctx    context.Context // parent of its handlers' contexts
	cancel context.CancelFunc
	hup    context.Context // ctx, also ended when the read loop ends (CancelOnHangup's calls)
	hupEnd context.CancelFunc
	inline *inlineCtx // the context of CancelOnHangup's inline calls

	watchMu   sync.Mutex
	inlineRun bool          // an inline call of inline's is running
	watchDone chan struct{} // closed when the watching read returned; nil: not watching
	inflight  chan struct{} // semaphore of running handlers
	running   sync.WaitGroup
	stopping  atomic.Bool // reads are being interrupted on purpose

	wmu    sync.Mutex
	hdr    []byte
	broken bool // a write failed; no more responses go out
}

func (sc *serverConn) stopReading() {
	sc.stopping.Store(true)
	_ = sc.nc.SetReadDeadline(longAgo)
}

// setReadDeadline sets the connection's read deadline unless the server
// is stopping it (stopReading's deadline in the past wins).
func (sc *serverConn) setReadDeadline(t time.Time) {
	_ = sc.nc.SetReadDeadline(t)
	if sc.stopping.Load() {
		_ = sc.nc.SetReadDeadline(longAgo)
	}
}

func (sc *serverConn) serve() error {
	s := sc.s
	err := sc.readLoop()
	if !sc.stopping.Load() {
		// The client left (or broke the stream); a graceful shutdown
		// lets the calls under way finish.
		sc.hupEnd()
	}
	if err != nil {
		// A client that sends garbage is broken; stop working for it,
		// though the answers of calls already running still go out.
		sc.cancel()
	}
	sc.running.Wait()
	sc.cancel()
	sc.nc.Close()
	s.mu.Lock()
	delete(s.conns, sc)
	s.mu.Unlock()
	s.connWG.Done()
	return err
}

// readLoop reads requests and starts their handlers until the client hangs
// up (nil), the server stops it (nil) or the stream goes bad (the error).
func (sc *serverConn) readLoop() error {
	s := sc.s
	peer := sc.nc.RemoteAddr()
	var hb [RequestHeaderLen]byte
	for {
		// Idle between frames for as long as the client likes; once a
		// frame starts, all of it must come within ReadTimeout.
		_, err := sc.br.Peek(1)
		if err == nil {
			sc.setReadDeadline(time.Now().Add(s.opts.ReadTimeout))
			_, err = io.ReadFull(sc.br, hb[:])
		}
		if err == nil {
			err = sc.handleFrame(hb[:])
		}
		if err == nil {
			sc.setReadDeadline(time.Time{})
			continue
		}
		if errors.Is(err, os.ErrDeadlineExceeded) && !sc.stopping.Load() {
			err = fmt.Errorf("frame not read within %s: %w", s.opts.ReadTimeout, err)
		}
		if sc.stopping.Load() || errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
			return nil
		}
		err = fmt.Errorf("coro_rpc connection from %s: %w", peer, err)
		s.log.Warn("coro_rpc: closing connection", "peer", peer, "err", err)
		return err
	}
}

// handleFrame reads the rest of the request whose header is hb and answers
// or dispatches it. Only errors that end the connection are returned.
func (sc *serverConn) handleFrame(hb []byte) error {
	s := sc.s
	h, err := ParseRequestHeader(hb)
	if err != nil {
		return err
	}
	if err := h.Check(s.opts.MaxMessageLen); err != nil {
		if !errors.Is(err, ErrMessageTooLarge) {
			return err
		}
		// The framing is intact, so the client can be told why instead
		// of losing every call on the connection.
		n := int64(h.Length) + int64(h.AttachLength)
		if _, derr := io.CopyN(io.Discard, sc.br, n); derr != nil {
			return fmt.Errorf("skip %d-byte request seq %d: %w", n, h.Seq, derr)
		}
		sc.writeError(h, ErrcMessageTooLarge, err.Error())
		return nil
	}
	n := int64(h.Length) + int64(h.AttachLength)
	charged, err := sc.admit(n)
	if err != nil {
		// Refused before a byte of it was kept: skip it (under the
		// frame's deadline) and say why.
		if _, derr := io.CopyN(io.Discard, sc.br, n); derr != nil {
			return fmt.Errorf("skip %d-byte request seq %d refused by the budget: %w", n, h.Seq, derr)
		}
		sc.writeError(h, ErrcMessageTooLarge, err.Error())
		return nil
	}
	release := func() { s.opts.Budget.Release(charged) }
	body, attach, err := readPayloadGrowing(sc.br, h.Length, h.AttachLength)
	if err != nil {
		release()
		if n >= freeOSMemoryAbove {
			// A peer that left (or stalled past the deadline) inside a
			// big frame: hand what it made us hold back to the system
			// now rather than at the next collection, which an idle
			// server may not run for minutes.
			budget.ReturnMemory()
		}
		return fmt.Errorf("request seq %d function %#08x: %w", h.Seq, h.FunctionID, err)
	}
	s.hmu.RLock()
	reg, ok := s.handlers[h.FunctionID]
	s.hmu.RUnlock()
	if !ok {
		release()
		sc.writeError(h, ErrcFunctionNotRegistered, NotRegisteredMessage)
		return nil
	}
	select {
	case sc.inflight <- struct{}{}:
	case <-sc.ctx.Done():
		release()
		sc.writeError(h, ErrcOperationCanceled, "server closing")
		return nil
	}
	sc.running.Add(1)
	req := &Request{Header: h, Body: body, Attachment: attach, RemoteAddr: sc.nc.RemoteAddr()}
	hangup := s.opts.CancelOnHangup != nil && s.opts.CancelOnHangup(h.FunctionID)
	if len(sc.inflight) == 1 && sc.br.Buffered() == 0 && s.opts.Inline != nil && s.opts.Inline(h.FunctionID) {
		if !hangup {
			sc.run(sc.ctx, reg, req, release)
			return nil
		}
		sc.watchMu.Lock()
		sc.inlineRun = true
		sc.watchMu.Unlock()
		sc.run(sc.inline, reg, req, release)
		sc.watchMu.Lock()
		sc.inlineRun = false
		done := sc.watchDone
		sc.watchDone = nil
		sc.watchMu.Unlock()
		if done != nil {
			// Take the reader back (the read loop resets the
			// deadline).
			_ = sc.nc.SetReadDeadline(longAgo)
			<-done
		}
		return nil
	}
	ctx := sc.ctx
	if hangup {
		ctx = sc.hup
	}
	go sc.run(ctx, reg, req, release)
	return nil
}

// inlineCtx is the context of an inline call of a CancelOnHangup
// function: sc.hup, which also ends when a look at the socket (Err) or a
// read started for a handler about to wait (Done) finds the client gone.
type inlineCtx struct {
	context.Context
	sc *serverConn
}

func (c *inlineCtx) Done() <-chan struct{} {
	c.sc.watch()
	return c.Context.Done()
}

func (c *inlineCtx) Err() error {
	if err := c.Context.Err(); err != nil {
		return err
	}
	if c.sc.hungUp() {
		c.sc.hupEnd()
	}
	return c.Context.Err()
}

// hungUp looks whether the client of the inline call under way left (a
// watching read, if one runs, tells by ending hup instead).
func (sc *serverConn) hungUp() bool {
	sc.watchMu.Lock()
	defer sc.watchMu.Unlock()
	if !sc.inlineRun || sc.watchDone != nil || sc.raw == nil {
		return false
	}
	return sc.raw.hungUp()
}

// watch starts a read that ends hup when the client of the inline call
// under way hangs up; the call's end stops it (handleFrame).
func (sc *serverConn) watch() {
	sc.watchMu.Lock()
	defer sc.watchMu.Unlock()
	if !sc.inlineRun || sc.watchDone != nil {
		return
	}
	sc.setReadDeadline(time.Time{})
	done := make(chan struct{})
	sc.watchDone = done
	go func() {
		defer close(done)
		// Bytes (a next request) stay buffered for the read loop; an
		// error other than the deadline that stops this read is the
		// client gone.
		if _, err := sc.br.Peek(1); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			sc.hupEnd()
		}
	}()
}

// FreeFrame is the payload size below which a frame is not charged to
// the budget: the small calls that keep a pool going pass while big ones
// wait their turn.
const FreeFrame = 64 << 10

// admit charges a frame's n payload bytes to the budget, waiting at most
// AdmissionWait (reading from this connection pauses meanwhile).
func (sc *serverConn) admit(n int64) (int64, error) {
	b := sc.s.opts.Budget
	if n < FreeFrame {
		return 0, nil
	}
	if charged, err := b.TryAcquire(n); err == nil {
		return charged, nil
	}
	ctx, cancel := context.WithTimeout(sc.ctx, sc.s.opts.AdmissionWait)
	defer cancel()
	// The frame's read deadline must not cut the wait short.
	_ = sc.nc.SetReadDeadline(time.Time{})
	charged, err := b.Acquire(ctx, n)
	sc.setReadDeadline(time.Now().Add(sc.s.opts.ReadTimeout))
	return charged, err
}

// freeOSMemoryAbove is the size of a dropped frame worth returning memory
// to the system for.
const freeOSMemoryAbove = 8 << 20

func (sc *serverConn) run(ctx context.Context, reg registered, req *Request, release func()) {
	defer func() {
		release()
		<-sc.inflight
		sc.running.Done()
	}()
	body, err := sc.call(ctx, reg, req)
	switch {
	case err != nil:
		code, msg := ErrcRPCThrowException, err.Error()
		var re *RPCError
		if errors.As(err, &re) {
			msg = re.Message
			if re.Code != ErrcOK {
				code = re.Code
			}
		}
		sc.writeError(req.Header, code, msg)
	case uint64(len(body)) > math.MaxUint32:
		sc.writeError(req.Header, ErrcMessageTooLarge, fmt.Sprintf("body larger than 4G: %dB", len(body)))
	default:
		sc.write(ResponseHeader{Seq: req.Header.Seq, Length: uint32(len(body))}, body)
	}
	if body != nil && sc.s.opts.Recycle != nil {
		sc.s.opts.Recycle(body)
	}
}

// call runs the handler, turning a panic into an error response as
// coro_rpc turns an exception into one.
func (sc *serverConn) call(ctx context.Context, reg registered, req *Request) (body []byte, err error) {
	defer func() {
		if r := recover(); r != nil {
			sc.s.log.Error("coro_rpc: handler panicked", "function", reg.name, "peer", req.RemoteAddr, "panic", r)
			body, err = nil, fmt.Errorf("%s panicked: %v", reg.name, r)
		}
	}()
	return reg.h(ctx, req)
}

func (sc *serverConn) writeError(req RequestHeader, code Errc, msg string) {
	body, errCode := appendErrorBody(nil, code, msg)
	sc.write(ResponseHeader{Seq: req.Seq, ErrCode: errCode, Length: uint32(len(body))}, body)
}

// write sends one response frame. A failed write closes the connection,
// which ends its read loop and cancels its handlers.
func (sc *serverConn) write(h ResponseHeader, body []byte) {
	h.Magic, h.Version = Magic, Version
	sc.wmu.Lock()
	defer sc.wmu.Unlock()
	if sc.broken {
		return
	}
	_ = sc.nc.SetWriteDeadline(time.Now().Add(sc.s.opts.WriteTimeout))
	sc.hdr = h.AppendTo(sc.hdr[:0])
	var err error
	if sc.raw != nil {
		_, err = sc.raw.writev(sc.hdr, body)
	} else {
		err = sc.writeBuffers(body)
	}
	if err != nil {
		sc.broken = true
		sc.s.log.Warn("coro_rpc: response write failed; closing connection", "peer", sc.nc.RemoteAddr(), "seq", h.Seq, "err", err)
		sc.cancel()
		sc.nc.Close()
	}
}

// writeBuffers writes sc.hdr and body with net.Conn's writev.
func (sc *serverConn) writeBuffers(body []byte) error {
	bufs := net.Buffers{sc.hdr, body}
	// Header and body in one writev: net.Buffers does that only on the
	// *net.TCPConn itself, and a connection sniffed on a shared port
	// comes wrapped (WithReader), which made it two writes, two segments
	// and two wake-ups of the client per answer.
	w := sc.nc
	if rc, ok := w.(*readerConn); ok {
		w = rc.Conn
	}
	_, err := bufs.WriteTo(w)
	return err
}

// WithReader returns nc with its reads taken from r: typically the
// bufio.Reader that peeked at nc's first bytes, so that a connection sniffed
// on a shared port can be handed to Server.ServeConn with nothing lost.
// Writes, deadlines and Close go to nc.
func WithReader(nc net.Conn, r io.Reader) net.Conn {
	return &readerConn{Conn: nc, r: r}
}

type readerConn struct {
	net.Conn
	r io.Reader
}

func (c *readerConn) Read(p []byte) (int, error) { return c.r.Read(p) }
