package tcp

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kvcache-ops/mc/pkg/connlimit"
)

// The inline path serves Mooncake's default client (a connection per
// request: connect, one header, one reply, close) as an event loop does:
// a goroutine waits on an epoll set of its own holding the listener and
// the connections it serves (a few such loops share the listener), and accepts, reads the request, writes the
// reply and closes the socket itself, with no goroutine, Go net.Conn or
// netpoll registration per connection. Connections whose peer has not
// closed yet after its reply wait in the set (as a persistent Mooncake
// lane does between its one-at-a-time requests). A WRITE whose payload
// has not all come yet waits in the set too, its payload read straight
// into registered memory as it arrives: Mooncake's client writes the
// header and the payload separately, and the loop often reads the header
// alone. A reply that the socket cannot take at once (a large READ to a
// peer with a small receive window) stays in the set too, the loop
// writing the rest each time the socket has room, rather than costing a
// descriptor duplicated into a net.Conn, a poller registration and a
// goroutine per request. Anything else (a header not wholly in one read,
// pipelining, a rejected range) is handed, with the bytes already read,
// to the ordinary per-connection handler.
//
// The loop's syscalls go through RawSyscall. On loopback accept4, writev
// and close run the peer's TCP processing too (tens of µs), and as
// ordinary syscalls the runtime's monitor took the goroutine's processor
// away mid-call and woke another thread for it, which cost more than the
// call. None of them blocks (every socket here is non-blocking), so
// holding the processor is safe. Under the race detector, reads and the
// status writes stay read(2)/write(2), through which it orders memory.
//
// BenchmarkAcceptPath and the README's bench-tcp section have the figures.

// maxEvents bounds one epoll_wait.
const maxEvents = 128

// maxAccepts bounds the connections accepted per round, so that waiting
// ones are served in between.
const maxAccepts = 64

type inlineLoop struct {
	s   *Server
	ep  int      // the loop's epoll set
	epf *os.File // ep, registered with Go's poller
	lfd int      // a descriptor of the listening socket, in ep

	buf    []byte
	st     []byte
	events [maxEvents]unix.EpollEvent
	// waiting: connections in ep, with the time of their last request.
	waiting map[int]time.Time
	// partial: waiting connections in the middle of a WRITE's payload.
	partial map[int]partialWrite
	// replies: waiting connections in the middle of a READ's reply,
	// waited on for room (EPOLLOUT) instead of requests.
	replies map[int]partialReply
	// slots: every connection the loop holds (waiting or being served),
	// with its place under the server's connection caps.
	slots   map[int]connlimit.Slot
	sa      unix.RawSockaddrAny
	backoff time.Duration

	mu      sync.Mutex // ep against a late re-arm of the listener
	stopped bool
}

// startInline runs the inline loops when the listener allows it.
func (s *Server) startInline() bool {
	tl, ok := s.ln.(*net.TCPListener)
	if !ok {
		return false
	}
	rc, err := tl.SyscallConn()
	if err != nil {
		return false
	}
	var loops inlineLoops
	// An arriving connection wakes one of them (EPOLLEXCLUSIVE).
	for range s.opts.EventLoops {
		l, err := newInlineLoop(s, rc)
		if err != nil {
			break
		}
		loops = append(loops, l)
	}
	if len(loops) == 0 {
		return false
	}
	s.extra = loops
	for _, l := range loops {
		s.wg.Add(1)
		go l.run()
	}
	return true
}

// inlineLoops closes every loop (Server.Close).
type inlineLoops []*inlineLoop

func (ls inlineLoops) len() int { return len(ls) }

func (ls inlineLoops) Close() error {
	for _, l := range ls {
		l.Close()
	}
	return nil
}

// listenEvents: the listener wakes one loop per event, not all of them.
const listenEvents = unix.EPOLLIN | unix.EPOLLEXCLUSIVE

func newInlineLoop(s *Server, rc syscall.RawConn) (*inlineLoop, error) {
	lfd := -1
	var derr error
	rc.Control(func(fd uintptr) {
		lfd, derr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0)
		// Accepted sockets inherit it: no setsockopt per connection.
		_ = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	})
	if derr != nil {
		return nil, derr
	}
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		unix.Close(lfd)
		return nil, err
	}
	l := &inlineLoop{s: s, ep: ep, lfd: lfd, buf: make([]byte, 64<<10), st: make([]byte, 0, StatusSize),
		waiting: make(map[int]time.Time), partial: make(map[int]partialWrite), replies: make(map[int]partialReply),
		slots: make(map[int]connlimit.Slot)}
	err = l.ctl(unix.EPOLL_CTL_ADD, lfd, listenEvents)
	if err == nil {
		// Non-blocking, so that os.NewFile registers it with the poller:
		// the loop parks until the set has something ready.
		err = unix.SetNonblock(ep, true)
	}
	if err != nil {
		unix.Close(ep)
		unix.Close(lfd)
		return nil, err
	}
	l.epf = os.NewFile(uintptr(ep), "tcp data epoll")
	return l, nil
}

// Close ends the loop (Server.Close); the loop closes what it holds.
func (l *inlineLoop) Close() error {
	l.mu.Lock()
	l.stopped = true
	l.mu.Unlock()
	return l.epf.Close()
}

func (l *inlineLoop) ctl(op, fd int, events uint32) error {
	ev := unix.EpollEvent{Events: events, Fd: int32(fd)}
	return unix.EpollCtl(l.ep, op, fd, &ev)
}

func (l *inlineLoop) run() {
	defer l.s.wg.Done()
	defer func() {
		for fd := range l.waiting {
			l.forget(fd)
			rawClose(fd)
		}
		l.mu.Lock()
		unix.Close(l.lfd)
		l.mu.Unlock()
	}()
	rc, err := l.epf.SyscallConn()
	if err != nil {
		return
	}
	// The loop wakes at least this often to drop idle connections.
	sweep := l.s.opts.IdleTimeout / 8
	for {
		l.epf.SetReadDeadline(time.Now().Add(sweep))
		err := rc.Read(func(uintptr) bool {
			l.poll()
			return false
		})
		if errors.Is(err, os.ErrDeadlineExceeded) {
			l.dropIdle()
			continue
		}
		return // closed
	}
}

// poll handles everything ready in the set, until nothing is.
func (l *inlineLoop) poll() {
	for {
		n, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(l.ep), uintptr(unsafe.Pointer(&l.events[0])),
			maxEvents, 0, 0, 0)
		if e == unix.EINTR {
			continue
		}
		if e != 0 || n == 0 {
			return
		}
		for _, ev := range l.events[:n] {
			fd := int(ev.Fd)
			if fd == l.lfd {
				l.acceptSome()
				continue
			}
			if _, ok := l.waiting[fd]; !ok {
				continue // handed over or closed earlier in this round
			}
			if l.serve(fd) {
				l.waiting[fd] = time.Now()
			}
		}
		// Round again until the set has nothing ready: a listener left
		// with connections after maxAccepts is still ready, and Go's
		// poller (edge-triggered on ep) wakes the loop only on news.
	}
}

func (l *inlineLoop) acceptSome() {
	for range maxAccepts {
		salen := uint32(unix.SizeofSockaddrAny)
		r, _, e := unix.RawSyscall6(unix.SYS_ACCEPT4, uintptr(l.lfd), uintptr(unsafe.Pointer(&l.sa)), uintptr(unsafe.Pointer(&salen)),
			unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0, 0)
		switch e {
		case 0:
		case unix.EAGAIN:
			l.backoff = 0
			return
		case unix.EINTR, unix.ECONNABORTED:
			continue
		default:
			l.pauseAccept(e)
			return
		}
		fd := int(r)
		slot, ok := l.s.opts.Limiter.Admit(limiterName, rawHost(&l.sa))
		if !ok {
			connlimit.RefuseFD(fd)
			continue
		}
		l.slots[fd] = slot
		if slog.Default().Enabled(context.Background(), slog.LevelDebug) {
			slog.Debug("tcp data connection accepted", "peer", peerAddr(fd))
		}
		if l.serve(fd) {
			if err := l.ctl(unix.EPOLL_CTL_ADD, fd, l.interest(fd)); err != nil {
				if l.midRequest(fd) {
					// Part of a payload is already in memory, or part of
					// a reply sent: no handler can go on from there.
					l.forget(fd)
					rawClose(fd)
					slog.Warn("tcp data connection dropped", "err", os.NewSyscallError("epoll_ctl", err))
					continue
				}
				l.handOver(fd, handover{})
				continue
			}
			l.waiting[fd] = time.Now()
		}
	}
}

// pauseAccept takes the listener out of the set for a while after a
// failed accept (EMFILE and friends: out of descriptors or memory), which
// would otherwise wake the loop again at once; net/http backs off alike.
func (l *inlineLoop) pauseAccept(e syscall.Errno) {
	l.backoff = min(max(2*l.backoff, 5*time.Millisecond), time.Second)
	slog.Warn("tcp data listener: accept failed", "err", os.NewSyscallError("accept4", e), "retry_in", l.backoff)
	l.ctl(unix.EPOLL_CTL_DEL, l.lfd, 0)
	time.AfterFunc(l.backoff, func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if !l.stopped {
			l.ctl(unix.EPOLL_CTL_ADD, l.lfd, listenEvents)
		}
	})
}

// dropIdle closes waiting connections idle for the server's idle timeout,
// as the per-connection handler's deadline does.
func (l *inlineLoop) dropIdle() {
	cut := time.Now().Add(-l.s.opts.IdleTimeout)
	for fd, at := range l.waiting {
		if at.Before(cut) {
			l.forget(fd)
			rawClose(fd)
		}
	}
}

// serve reads from fd and serves what came while it is one whole request
// at a time. It returns true when fd should wait in the set for more; on
// false fd is closed or handed over.
func (l *inlineLoop) serve(fd int) bool {
	for {
		if r, ok := l.replies[fd]; ok {
			if !l.rest(fd, r) {
				return false
			}
			if _, ok := l.replies[fd]; ok {
				return true // the socket has no room yet
			}
			continue
		}
		if p, ok := l.partial[fd]; ok {
			if !l.more(fd, p) {
				return false
			}
			if _, ok := l.partial[fd]; ok {
				return true // the rest has not come yet
			}
			continue
		}
		n, err := rawRead(fd, l.buf)
		switch {
		case err == unix.EAGAIN:
			return true
		case n == 0 && err == nil, err != nil:
			// The peer closed (or reset) between requests: done.
			l.forget(fd)
			rawClose(fd)
			return false
		}
		if !l.one(fd, l.buf[:n]) {
			return false
		}
	}
}

// one serves data when it is exactly one request (and its payload);
// otherwise it hands fd over with data as its first bytes.
func (l *inlineLoop) one(fd int, data []byte) bool {
	s := l.s
	if len(data) < HeaderSize {
		l.handOver(fd, handover{prefix: data})
		return false
	}
	h, herr := DecodeHeader(data[:HeaderSize])
	if herr != nil || h.Size == 0 {
		l.handOver(fd, handover{prefix: data}) // the handler answers and logs these
		return false
	}
	if h.Write && uint64(len(data)-HeaderSize) > h.Size || !h.Write && len(data) != HeaderSize {
		l.handOver(fd, handover{prefix: data}) // pipelining
		return false
	}
	mem, ref, err := s.mem.Acquire(h.Addr, h.Size)
	if err != nil {
		l.handOver(fd, handover{prefix: data}) // rejected by the handler, as for any peer
		return false
	}
	if h.Write {
		got := copy(mem, data[HeaderSize:])
		if got < len(mem) {
			l.partial[fd] = partialWrite{mem: mem, ref: ref, got: got, v2: h.V2}
			return true
		}
		ref.Release()
		return l.ack(fd, h.V2)
	}
	st := l.st[:0]
	if h.V2 {
		st = append(st, statusOKBytes...)
	}
	sent, err := rawWritev(fd, st, mem)
	if err != nil && err != unix.EAGAIN {
		ref.Release()
		l.gone(fd, err)
		return false
	}
	if sent < len(st)+len(mem) {
		// The socket took part of it: the rest goes as it makes room.
		r := partialReply{mem: mem, ref: ref}
		sent = max(sent, 0)
		if sent < len(st) {
			r.st = append(r.st, st[sent:]...)
		} else {
			r.mem = mem[sent-len(st):]
		}
		return l.await(fd, r)
	}
	ref.Release()
	return true
}

// partialReply is the unsent rest of a reply: st (the rest of the status
// word) then a READ's mem, pinned by ref (nil for a WRITE's status).
type partialReply struct {
	st  []byte
	mem []byte
	ref Ref
}

// interest is what the loop waits for on fd: room for the rest of a
// reply, or else the next request (or the peer's close).
func (l *inlineLoop) interest(fd int) uint32 {
	if _, ok := l.replies[fd]; ok {
		return unix.EPOLLOUT
	}
	return unix.EPOLLIN | unix.EPOLLRDHUP
}

// midRequest: fd is in the middle of a WRITE's payload or a READ's reply.
func (l *inlineLoop) midRequest(fd int) bool {
	_, w := l.partial[fd]
	_, r := l.replies[fd]
	return w || r
}

// await makes fd wait for room for r (fd is in the set when the loop
// served it from there; acceptSome adds a new one with its interest). It
// returns false when fd is closed.
func (l *inlineLoop) await(fd int, r partialReply) bool {
	l.replies[fd] = r
	if _, ok := l.waiting[fd]; ok {
		if err := l.ctl(unix.EPOLL_CTL_MOD, fd, unix.EPOLLOUT); err != nil {
			l.gone(fd, os.NewSyscallError("epoll_ctl", err))
			return false
		}
	}
	return true
}

// rest writes what fd's socket takes of its pending reply. Once the reply
// is whole it waits for requests again. It returns false when fd is
// closed.
func (l *inlineLoop) rest(fd int, r partialReply) bool {
	var sent int
	var err error
	if len(r.mem) == 0 {
		sent, err = rawWrite(fd, r.st) // a WRITE's status: see rawRead
	} else {
		sent, err = rawWritev(fd, r.st, r.mem)
	}
	if err == unix.EAGAIN {
		return true
	}
	if err != nil {
		l.gone(fd, err)
		return false
	}
	k := min(sent, len(r.st))
	r.st, sent = r.st[k:], sent-k
	r.mem = r.mem[sent:]
	if len(r.st) > 0 || len(r.mem) > 0 {
		l.replies[fd] = r
		return true
	}
	delete(l.replies, fd)
	if r.ref != nil {
		r.ref.Release()
	}
	// A connection accepted in this round is not in the set yet:
	// acceptSome adds it with its interest once serve returns.
	if _, ok := l.waiting[fd]; !ok {
		return true
	}
	if err := l.ctl(unix.EPOLL_CTL_MOD, fd, unix.EPOLLIN|unix.EPOLLRDHUP); err != nil {
		l.gone(fd, os.NewSyscallError("epoll_ctl", err))
		return false
	}
	return true
}

// partialWrite is a WRITE whose payload is still coming: got bytes of
// mem have.
type partialWrite struct {
	mem []byte
	ref Ref
	got int
	v2  bool
}

// more reads what has come of fd's partial WRITE straight into its
// memory, and acknowledges it once whole. It returns false when fd is
// closed or handed over.
func (l *inlineLoop) more(fd int, p partialWrite) bool {
	n, err := rawRead(fd, p.mem[p.got:])
	switch {
	case err == unix.EAGAIN:
		return true
	case n == 0 && err == nil:
		err = io.ErrUnexpectedEOF
		fallthrough
	case err != nil:
		addr := peerAddr(fd)
		l.forget(fd)
		rawClose(fd)
		if !l.s.isClosed() {
			l.s.warnGone(addr, peerGone("read %d bytes of write payload: %w", len(p.mem), err))
		}
		return false
	}
	p.got += n
	if p.got < len(p.mem) {
		l.partial[fd] = p
		return true
	}
	delete(l.partial, fd)
	p.ref.Release()
	return l.ack(fd, p.v2)
}

// ack sends a whole WRITE's status (v2 only). It returns false when fd is
// closed or handed over.
func (l *inlineLoop) ack(fd int, v2 bool) bool {
	if !v2 {
		return true
	}
	st := append(l.st[:0], statusOKBytes...)
	k, err := rawWrite(fd, st)
	if err != nil && err != unix.EAGAIN {
		l.gone(fd, err)
		return false
	}
	if k < len(st) {
		return l.await(fd, partialReply{st: append([]byte(nil), st[max(k, 0):]...)})
	}
	return true
}

// forget takes fd out of the waiting set's books (unpinning the memory of
// a partial WRITE); closing fd takes it out of the set itself.
func (l *inlineLoop) forget(fd int) {
	delete(l.waiting, fd)
	if slot, ok := l.slots[fd]; ok {
		delete(l.slots, fd)
		slot.Release()
	}
	if p, ok := l.partial[fd]; ok {
		delete(l.partial, fd)
		p.ref.Release()
	}
	if r, ok := l.replies[fd]; ok {
		delete(l.replies, fd)
		if r.ref != nil {
			r.ref.Release()
		}
	}
}

// release takes fd out of the set before it is handed over: the handler
// keeps a duplicate open, which would keep it in the set.
func (l *inlineLoop) release(fd int) {
	if _, ok := l.waiting[fd]; ok {
		delete(l.waiting, fd)
		l.ctl(unix.EPOLL_CTL_DEL, fd, 0)
	}
}

// handOver gives fd to a per-connection handler: h0's prefix (copied)
// are its first bytes.
func (l *inlineLoop) handOver(fd int, h0 handover) {
	l.release(fd)
	slot := l.slots[fd]
	delete(l.slots, fd)
	c, err := fdConn(fd)
	if err == nil && !l.s.track(c, slot) {
		err = net.ErrClosed
	} else if err != nil {
		slot.Release()
	}
	if err != nil {
		if !errors.Is(err, net.ErrClosed) {
			slog.Warn("tcp data connection: hand-over failed", "err", err)
		}
		return
	}
	h0.prefix = append([]byte(nil), h0.prefix...)
	go l.s.handle(c, h0)
}

// gone closes fd after its initiator left in the middle of a request.
func (l *inlineLoop) gone(fd int, err error) {
	addr := peerAddr(fd)
	l.forget(fd)
	rawClose(fd)
	if !l.s.isClosed() {
		l.s.warnGone(addr, peerGone("write reply: %w", err))
	}
}

// fdConn turns an accepted socket into a net.Conn registered with Go's
// poller, closing fd.
func fdConn(fd int) (net.Conn, error) {
	// Blocking for os.NewFile, so that it does not register fd with the
	// poller only for FileConn to register its duplicate again.
	if err := unix.SetNonblock(fd, false); err != nil {
		rawClose(fd)
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "tcp data connection")
	c, err := net.FileConn(f) // a non-blocking duplicate
	f.Close()
	return c, err
}

// rawHost is the host of an address accept4 filled in.
func rawHost(sa *unix.RawSockaddrAny) netip.Addr {
	switch sa.Addr.Family {
	case unix.AF_INET:
		return netip.AddrFrom4((*unix.RawSockaddrInet4)(unsafe.Pointer(sa)).Addr)
	case unix.AF_INET6:
		return netip.AddrFrom16((*unix.RawSockaddrInet6)(unsafe.Pointer(sa)).Addr).Unmap()
	}
	return netip.Addr{}
}

// peerAddr is the remote address of fd, for log lines.
func peerAddr(fd int) net.Addr {
	sa, err := unix.Getpeername(fd)
	if err != nil {
		return &net.TCPAddr{}
	}
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return &net.TCPAddr{IP: sa.Addr[:], Port: sa.Port}
	case *unix.SockaddrInet6:
		return &net.TCPAddr{IP: sa.Addr[:], Port: sa.Port}
	}
	return &net.TCPAddr{}
}

// rawWritev writes a then b with one writev(2).
func rawWritev(fd int, a, b []byte) (int, error) {
	var iov [2]unix.Iovec
	n := 0
	for _, p := range [2][]byte{a, b} {
		if len(p) > 0 {
			iov[n].Base = &p[0]
			iov[n].SetLen(len(p))
			n++
		}
	}
	r, _, e := unix.RawSyscall(unix.SYS_WRITEV, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(n))
	runtime.KeepAlive(a)
	runtime.KeepAlive(b)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

func rawClose(fd int) { unix.RawSyscall(unix.SYS_CLOSE, uintptr(fd), 0, 0) }

// rawRead is read(2); under the race detector an ordinary syscall, from
// package syscall: its Read and Write order memory for the race detector
// as Go's net reads and writes do (x/sys/unix's order it among themselves
// only), so a peer in this process that read a status sees the memory a
// payload was read into.
func rawRead(fd int, p []byte) (int, error) {
	if raceEnabled {
		return syscall.Read(fd, p)
	}
	return rawIO(unix.SYS_READ, fd, p)
}

// rawWrite is write(2) as rawRead is read(2).
func rawWrite(fd int, p []byte) (int, error) {
	if raceEnabled {
		return syscall.Write(fd, p)
	}
	return rawIO(unix.SYS_WRITE, fd, p)
}

// rawIO is read(2) or write(2) (trap) on p with RawSyscall.
func rawIO(trap uintptr, fd int, p []byte) (int, error) {
	r, _, e := unix.RawSyscall(trap, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	runtime.KeepAlive(p)
	if e != 0 {
		return -1, e
	}
	return int(r), nil
}
