package tcp

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"sync"
	"time"

	"github.com/kvcache-ops/mc/pkg/connlimit"
)

// Memory resolves a remote address range to registered local bytes. The
// server never touches a byte outside what Acquire returns.
type Memory interface {
	// Acquire returns exactly the bytes [addr, addr+size) when that range
	// lies inside ONE registered, remotely accessible buffer, pinned until
	// the Ref is released (so it cannot be unregistered under a transfer).
	Acquire(addr, size uint64) ([]byte, Ref, error)
}

// Ref pins registered memory while a transfer uses it.
type Ref interface{ Release() }

// DefaultIdleTimeout bounds how long a server connection may sit between
// (or inside) requests before the server drops it. Clients redial lanes
// idle for half of it, so persistent lanes never hit it.
const DefaultIdleTimeout = 10 * time.Minute

// ServerOptions configures a Server.
type ServerOptions struct {
	// IdleTimeout bounds every read and write on a connection (refreshed
	// as requests arrive); 0 means DefaultIdleTimeout.
	IdleTimeout time.Duration
	// EventLoops is how many event loops serve the listener on Linux
	// (inline_linux.go); 0 means DefaultEventLoops.
	EventLoops int
	// Limiter bounds the connections held (nil: the process's
	// connlimit.Default).
	Limiter *connlimit.Limiter
}

// limiterName labels the data listener in logs and metrics.
const limiterName = "tcp data"

// MaxEventLoops bounds ServerOptions.EventLoops.
const MaxEventLoops = 64

// DefaultEventLoops is one event loop per two processors, at most four:
// a loop keeps about one core busy with kernel work at full load, and the
// rest is left to the goroutines of pipelining connections.
func DefaultEventLoops() int { return max(1, min(runtime.GOMAXPROCS(0)/2, 4)) }

// Server is one data listener. On Linux an event loop serves clients that
// send one request at a time (Mooncake's connection-per-request client,
// its pooled lanes) without a goroutine per connection (inline_linux.go);
// a connection that pipelines, and every connection elsewhere, is served
// by its own goroutine, request after request, until the peer closes it, a
// request is rejected, or the server is closed.
type Server struct {
	ln    net.Listener
	extra io.Closer // the inline accept loop's descriptor of ln, if any
	mem   Memory
	opts  ServerOptions

	mu     sync.Mutex
	conns  map[net.Conn]connlimit.Slot
	goneAt map[string]time.Time // last warning per peer host (warnGone)
	closed bool
	wg     sync.WaitGroup
}

// NewServer serves ln in the background until Close.
func NewServer(ln net.Listener, mem Memory, opts ServerOptions) *Server {
	if opts.IdleTimeout <= 0 {
		opts.IdleTimeout = DefaultIdleTimeout
	}
	if opts.EventLoops <= 0 {
		opts.EventLoops = DefaultEventLoops()
	}
	opts.EventLoops = min(opts.EventLoops, MaxEventLoops)
	if opts.Limiter == nil {
		opts.Limiter = connlimit.Default()
	}
	s := &Server{ln: ln, mem: mem, opts: opts, conns: make(map[net.Conn]connlimit.Slot)}
	if !s.startInline() {
		s.wg.Add(1)
		go s.acceptLoop()
	}
	return s
}

// EventLoops is how many event loops serve the listener; 0 when every
// connection gets its own goroutine (not Linux, or not a TCP listener).
func (s *Server) EventLoops() int {
	if ls, ok := s.extra.(interface{ len() int }); ok {
		return ls.len()
	}
	return 0
}

// Addr is the listener's address.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Close stops accepting, closes every connection (a request in flight fails
// on the peer with a connection error) and waits for the handlers to exit.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	err := s.ln.Close()
	extra := s.extra
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	// The event loops are closed without s.mu: a loop handing a
	// connection over holds its own lock and then takes s.mu (track), so
	// closing them under s.mu deadlocked (seen in pkg/coll under load).
	// track refuses what comes after closed was set.
	if extra != nil {
		extra.Close()
	}
	s.wg.Wait()
	return err
}

func (s *Server) acceptLoop() {
	defer s.wg.Done()
	var backoff time.Duration
	for {
		c, err := s.ln.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed || errors.Is(err, net.ErrClosed) {
				return
			}
			// Transient (EMFILE and friends): back off as net/http does.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			slog.Warn("tcp data listener: accept failed", "err", err, "retry_in", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		slot, ok := s.opts.Limiter.Admit(limiterName, connlimit.AddrOf(c.RemoteAddr()))
		if !ok {
			connlimit.Refuse(c)
			continue
		}
		slog.Debug("tcp data connection accepted", "peer", c.RemoteAddr())
		if !s.track(c, slot) {
			return
		}
		go s.handle(c, handover{})
	}
}

// track registers c, holding slot, so that Close can close it; false (and
// c closed, slot released) once the server is closed. A tracked
// connection must be handled.
func (s *Server) track(c net.Conn, slot connlimit.Slot) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		c.Close()
		slot.Release()
		return false
	}
	s.conns[c] = slot
	s.wg.Add(1)
	return true
}

// handle serves a tracked connection, perhaps begun elsewhere, until it
// ends.
func (s *Server) handle(c net.Conn, h0 handover) {
	defer s.wg.Done()
	err := s.serve(c, h0)
	c.Close()
	s.mu.Lock()
	slot := s.conns[c]
	delete(s.conns, c)
	s.mu.Unlock()
	slot.Release()
	var gone *peerGoneError
	switch {
	case errors.As(err, &gone) && !s.isClosed():
		s.warnGone(c.RemoteAddr(), err)
	case err != nil && !errors.Is(err, net.ErrClosed):
		slog.Debug("tcp data connection closed", "peer", c.RemoteAddr(), "err", err)
	}
}

func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// goneWarnEvery limits the warning for an initiator that vanished to one
// line per peer host in this period: its lanes (or its many per-request
// connections) all break at once.
const goneWarnEvery = 10 * time.Second

func (s *Server) warnGone(addr net.Addr, err error) {
	// A socket handed over after its peer reset has no remote address:
	// net.FileConn's getpeername failed, and RemoteAddr is nil.
	host := "unknown peer"
	if addr != nil {
		host = addr.String()
	} else {
		addr = &net.TCPAddr{}
	}
	if h, _, herr := net.SplitHostPort(host); herr == nil {
		host = h
	}
	now := time.Now()
	s.mu.Lock()
	if s.goneAt == nil || len(s.goneAt) > 4096 {
		s.goneAt = make(map[string]time.Time)
	}
	last, seen := s.goneAt[host]
	warn := !seen || now.Sub(last) >= goneWarnEvery
	if warn {
		s.goneAt[host] = now
	}
	s.mu.Unlock()
	if warn {
		slog.Warn("tcp data connection: initiator went away in the middle of a request", "peer", addr, "err", err)
	}
}

// peerGoneError is a connection that broke with a request half done: the
// initiator died, was killed or lost its network.
type peerGoneError struct{ err error }

func (e *peerGoneError) Error() string { return e.err.Error() }
func (e *peerGoneError) Unwrap() error { return e.err }

func peerGone(format string, args ...any) error {
	return &peerGoneError{err: fmt.Errorf(format, args...)}
}

// deadliner is the part of net.Conn the handler uses when it has it.
type deadliner interface{ SetDeadline(time.Time) error }

// connState is a connection's reusable state, pooled: with Mooncake's
// default client every request is a new connection, and allocating (and
// zeroing) a 64 KiB reader per connection made the garbage collector a
// large share of the target's CPU per task (BenchmarkAcceptPath).
type connState struct {
	br *bufio.Reader
	// Replies not yet written: status words and READ data as slices of
	// registered memory (pinned by refs), sent with one writev.
	out  net.Buffers
	refs []Ref
	size int
	// wrote: a WRITE payload landed in registered memory since the last
	// flush (see flush).
	wrote   bool
	scratch []byte
}

var connStatePool = sync.Pool{New: func() any { return &connState{br: bufio.NewReaderSize(nil, 64<<10)} }}

// Status words are constants: replies point at these instead of copying.
var (
	statusOKBytes       = statusBytes(StatusOK)
	statusRejectedBytes = statusBytes(StatusRejected)
)

func statusBytes(st uint64) []byte {
	b := make([]byte, StatusSize)
	PutStatus(b, st)
	return b
}

// Replies are written when no further request is buffered, or earlier
// once this many bytes (or iovecs) are pending, which bounds how long
// memory stays pinned behind a long pipeline.
const (
	maxPendingBytes = 4 << 20
	maxPendingVecs  = 1024
)

func (cs *connState) add(b []byte, ref Ref) {
	cs.out = append(cs.out, b)
	if ref != nil {
		cs.refs = append(cs.refs, ref)
	}
	cs.size += len(b)
}

// flush writes the pending replies with one writev (net.Buffers loops
// over short writes) straight from registered memory, then unpins it.
func (cs *connState) flush(w io.Writer) error {
	if len(cs.out) == 0 {
		return nil
	}
	defer cs.release()
	if len(cs.refs) == 0 {
		// Status words only: one plain write.
		buf := cs.scratch[:0]
		for _, b := range cs.out {
			buf = append(buf, b...)
		}
		cs.scratch = buf
		_, err := w.Write(buf)
		return err
	}
	vec := cs.out // WriteTo consumes its receiver; cs.out keeps the array
	if cs.wrote {
		// The race detector sees a socket order memory only through
		// write(2)/read(2), not writev(2): a peer that reads our reply and
		// then looks at memory we filled from a WRITE (a test, an
		// in-process bench) would be reported as racing. The first
		// reply word goes out with write(2), before any byte of the rest.
		if _, err := w.Write(vec[0]); err != nil {
			return err
		}
		vec = vec[1:]
	}
	_, err := vec.WriteTo(w)
	return err
}

func (cs *connState) release() {
	for _, r := range cs.refs {
		r.Release()
	}
	clear(cs.out[:cap(cs.out)])
	clear(cs.refs)
	cs.out, cs.refs, cs.size, cs.wrote = cs.out[:0], cs.refs[:0], 0, false
}

// ServeConn handles requests on rw until EOF or an error, which it returns
// (nil for a clean EOF between requests). It does not close rw. A request
// whose range is not inside one registered buffer gets the rejected status
// (v2) and ends the connection, as Mooncake's server does.
func (s *Server) ServeConn(rw io.ReadWriter) error { return s.serve(rw, handover{}) }

// handover is what a connection brings when it was begun elsewhere (the
// event loop): bytes already read from it.
type handover struct {
	prefix []byte
}

// serve is ServeConn on a connection begun elsewhere.
func (s *Server) serve(rw io.ReadWriter, h0 handover) error {
	prefix := h0.prefix
	dl, _ := rw.(deadliner)
	var r io.Reader = rw
	if len(prefix) > 0 {
		r = &prefixReader{p: prefix, r: rw}
	}
	cs := connStatePool.Get().(*connState)
	cs.br.Reset(r)
	br := cs.br
	defer func() {
		cs.release()
		cs.br.Reset(nil)
		connStatePool.Put(cs)
	}()
	var hdr [HeaderSize]byte
	var lastDeadline time.Time
	for {
		// Coalesce the replies of pipelined requests: write only when no
		// further request is already buffered.
		if br.Buffered() == 0 || cs.size >= maxPendingBytes || len(cs.out) >= maxPendingVecs {
			if err := cs.flush(rw); err != nil {
				return peerGone("write reply: %w", err)
			}
		}
		if dl != nil {
			// Refreshing the deadline costs a timer update; doing it at
			// most every 1/8 of the timeout keeps the bound within 7/8-1x.
			if now := time.Now(); now.Sub(lastDeadline) > s.opts.IdleTimeout/8 {
				lastDeadline = now
				// Reads and writes: a peer that stops reading its
				// READ data must not pin the handler either.
				dl.SetDeadline(now.Add(s.opts.IdleTimeout))
			}
		}
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			ferr := cs.flush(rw)
			if err == io.EOF {
				return ferr
			}
			if err == io.ErrUnexpectedEOF {
				return peerGone("read header: %w", err)
			}
			return fmt.Errorf("read header: %w", err)
		}
		h, err := DecodeHeader(hdr[:])
		if err != nil {
			if hdr[16]&VersionBit != 0 {
				cs.add(statusRejectedBytes, nil)
			}
			cs.flush(rw)
			return err
		}
		if h.Size == 0 {
			err = fmt.Errorf("request of 0 bytes at 0x%x", h.Addr)
		}
		var mem []byte
		var ref Ref
		if err == nil {
			mem, ref, err = s.mem.Acquire(h.Addr, h.Size)
		}
		if err != nil {
			if h.V2 {
				cs.add(statusRejectedBytes, nil)
			}
			cs.flush(rw)
			return fmt.Errorf("reject %s of %d bytes at 0x%x: %w", opName(h.Write), h.Size, h.Addr, err)
		}
		if h.Write {
			// READ replies still pending point into registered memory:
			// send them before this payload may overwrite what they read.
			if len(cs.refs) > 0 {
				if err := cs.flush(rw); err != nil {
					ref.Release()
					return peerGone("write reply: %w", err)
				}
			}
			err = readPayload(br, r, mem)
			ref.Release()
			if err != nil {
				return peerGone("read %d bytes of write payload: %w", h.Size, err)
			}
			cs.wrote = true
			if h.V2 {
				cs.add(statusOKBytes, nil)
			}
			continue
		}
		if h.V2 {
			cs.add(statusOKBytes, nil)
		}
		cs.add(mem, ref)
	}
}

// readPayload fills p from br's buffer and then r. A large rest is read
// from r straight into p (registered memory) once the buffer is empty:
// through the buffer, every byte of a 64 KiB WRITE was copied twice.
func readPayload(br *bufio.Reader, r io.Reader, p []byte) error {
	n := 0
	if k := br.Buffered(); k > 0 {
		n, _ = br.Read(p[:min(k, len(p))]) // from the buffer: no syscall
	}
	if len(p)-n >= directReadMin {
		_, err := io.ReadFull(r, p[n:])
		return err
	}
	_, err := io.ReadFull(br, p[n:])
	return err
}

// prefixReader reads p, then r: a connection handed over with bytes
// already read from it.
type prefixReader struct {
	p []byte
	r io.Reader
}

func (pr *prefixReader) Read(b []byte) (int, error) {
	if len(pr.p) > 0 {
		n := copy(b, pr.p)
		pr.p = pr.p[n:]
		return n, nil
	}
	return pr.r.Read(b)
}

func opName(write bool) string {
	if write {
		return "write"
	}
	return "read"
}
