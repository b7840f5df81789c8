package kvevents

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// pubSocket is the PUB side: it accepts subscribers and hands each
// message to every subscriber whose subscriptions match its topic (the
// first frame), through that subscriber's own bounded queue.
type pubSocket struct {
	ln  net.Listener
	hwm int
	// eventHWM bounds the events queued for one subscriber, as hwm its
	// messages: with messages of up to MaxBatch events, hwm messages
	// alone could keep several times the events (and bytes) that
	// mooncake_master's 64-event messages would.
	eventHWM int64
	log      *slog.Logger
	mu       sync.Mutex
	subs     map[*subscriberConn]struct{}
	drops    atomic.Uint64
	wg       sync.WaitGroup
	done     chan struct{}
	// free holds messages every subscriber has written, for the next
	// ones, by buffer size (powers of two, minClass to maxClass): a
	// message's buffer is reused rather than allocated, copied into and
	// collected (tens of kilobytes each, a thousand a second at full put
	// speed), and at most twice the size of the message it holds, so
	// what a stalled subscriber's queue keeps is about its messages'
	// bytes.
	free [maxClass - minClass + 1]chan *message
	// made counts the messages made rather than taken from free.
	made atomic.Uint64
	// handed counts the messages queued for subscribers' writers, and
	// split the direct writes that wrote part of a message (tests).
	handed, split atomic.Uint64
	// out holds the messages of one drain of the publisher's queue
	// (queue) until flush hands them to the subscribers together, in
	// one writev to each (the publisher's own when the subscriber's
	// writer is idle, else its writer's), and the subscriber wakes once
	// to read them. Publisher goroutine only.
	out []*message
	// targets and wires are flush's (publisher goroutine only).
	targets []*subscriberConn
	wires   [][]byte
}

// message is one framed message, shared by the subscribers it is queued
// for; the last to write it (or the publisher, when none took it)
// returns it to the free list.
type message struct {
	buf    []byte // framing room, then the payload (newMessage, frameMessage)
	wire   []byte // the framed message, in buf
	events int64  // it carries (eventHWM)
	refs   atomic.Int32
}

// Message buffers: their sizes (1 KiB to 1 MiB, room for a message of
// DefaultMaxBatch events with keys of a few hundred bytes; a message
// larger than that gets a buffer of its own size, not reused) and how
// many of each size are kept for reuse: 64, and 2 MiB of the largest
// sizes (a subscriber's writer behind by a few messages still finds its
// next buffers here).
const (
	minClass     = 10
	maxClass     = 20
	freeMessages = 64
	freeBytes    = 2 << 20
	// maxWritev bounds the messages one write to a subscriber carries
	// when several are queued for it.
	maxWritev = 64
)

type subscriberConn struct {
	c net.Conn
	q chan *message
	// unwritten counts the messages queued for it and not yet written
	// (in q or being written): what linger waits for.
	unwritten atomic.Int64
	// events counts the events of those messages.
	events atomic.Int64
	// all counts its subscriptions to the empty topic, less their
	// cancels (guarded by pubSocket.mu): every message's topic is empty,
	// so those are the only subscriptions that match. Others are not
	// kept: a subscriber sending topics by the thousand (64 KiB each)
	// held that memory in the master for as long as it stayed.
	all  int
	gone chan struct{}
	once sync.Once
	// raw is the connection's descriptor for flush's direct writes
	// (nil: every message goes through the writer).
	raw syscall.RawConn
	// skip is how much of the first message queued after a direct
	// write that wrote part of it the writer leaves out: set by flush
	// before it queues that message, read by the writer after.
	skip int
}

func newPubSocket(ln net.Listener, hwm, eventHWM int, log *slog.Logger) *pubSocket {
	s := &pubSocket{ln: ln, hwm: hwm, eventHWM: int64(eventHWM), log: log, subs: make(map[*subscriberConn]struct{}), done: make(chan struct{})}
	s.initFree()
	s.wg.Add(1)
	go s.accept()
	return s
}

func (s *pubSocket) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			select {
			case <-s.done:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			s.log.Warn(fmt.Sprintf("kv events: accept: %v", err))
			time.Sleep(50 * time.Millisecond)
			continue
		}
		s.wg.Add(1)
		go s.serve(c)
	}
}

// serve runs one subscriber: the handshake, then its subscriptions (read
// here) and its messages (written by a goroutine of its own).
func (s *pubSocket) serve(c net.Conn) {
	defer s.wg.Done()
	r := bufio.NewReader(c)
	if err := handshake(c, r, true, "PUB", "SUB", "XSUB"); err != nil {
		s.log.Warn(fmt.Sprintf("kv events: subscriber %s: %v", c.RemoteAddr(), err))
		_ = c.Close()
		return
	}
	sc := &subscriberConn{c: c, q: make(chan *message, s.hwm), gone: make(chan struct{})}
	if r, ok := c.(syscall.Conn); ok {
		if raw, err := r.SyscallConn(); err == nil {
			sc.raw = raw
		}
	}
	s.mu.Lock()
	select {
	case <-s.done:
		s.mu.Unlock()
		_ = c.Close()
		return
	default:
	}
	s.subs[sc] = struct{}{}
	s.mu.Unlock()
	s.wg.Add(1)
	go s.write(sc)
	err := s.readSubscriptions(sc, r)
	s.drop(sc)
	select {
	case <-s.done:
	default:
		s.log.Info(fmt.Sprintf("kv events: subscriber %s left: %v", c.RemoteAddr(), err))
	}
}

func (s *pubSocket) readSubscriptions(sc *subscriberConn, r *bufio.Reader) error {
	for {
		flags, body, err := readFrame(r, maxSubscriberFrame)
		if err != nil {
			return err
		}
		var sub bool
		var topic []byte
		switch {
		case flags&flagCommand != 0:
			name, data, err := parseCommand(body)
			if err != nil {
				return err
			}
			switch name {
			case "SUBSCRIBE":
				sub, topic = true, data
			case "CANCEL":
				topic = data
			default:
				continue
			}
		case len(body) == 0:
			continue
		case body[0] == 1 || body[0] == 0:
			sub, topic = body[0] == 1, body[1:]
		default:
			continue
		}
		if len(topic) > 0 {
			continue // matches no message: every topic is empty
		}
		s.mu.Lock()
		if sub {
			sc.all++
		} else if sc.all > 0 {
			sc.all--
		}
		s.mu.Unlock()
	}
}

// write sends sc's queued messages, as many as are queued (up to
// maxWritev) in one write.
func (s *pubSocket) write(sc *subscriberConn) {
	defer s.wg.Done()
	var ms []*message
	var bufs, v net.Buffers
	for {
		select {
		case m := <-sc.q:
			ms = append(ms[:0], m)
		case <-sc.gone:
			return
		}
		skip := sc.skip // flush wrote this much of m itself
		sc.skip = 0
	more:
		for len(ms) < maxWritev {
			select {
			case m := <-sc.q:
				ms = append(ms, m)
			default:
				break more
			}
		}
		var err error
		if len(ms) == 1 {
			_, err = sc.c.Write(ms[0].wire[skip:])
		} else {
			bufs = bufs[:0]
			for i, m := range ms {
				if i == 0 {
					bufs = append(bufs, m.wire[skip:])
				} else {
					bufs = append(bufs, m.wire)
				}
			}
			v = bufs // WriteTo consumes v
			_, err = v.WriteTo(sc.c)
		}
		var events int64
		for i, m := range ms {
			events += m.events
			s.release(m)
			ms[i] = nil
		}
		sc.events.Add(-events)
		sc.unwritten.Add(-int64(len(ms)))
		if err != nil {
			s.drop(sc)
			return
		}
	}
}

func (s *pubSocket) initFree() {
	for i := range s.free {
		s.free[i] = make(chan *message, min(freeMessages, freeBytes>>(minClass+i)))
	}
}

// newMessage is a message to encode a payload of at most size bytes
// into, from the free list when it has one: its buf holds the room
// frameMessage needs. (A payload that turns out larger still fits: the
// buffer grows, and is not reused.)
func (s *pubSocket) newMessage(size int) *message {
	size += messageRoom
	c := max(bits.Len(uint(size-1)), minClass)
	var m *message
	if c <= maxClass {
		select {
		case m = <-s.free[c-minClass]:
		default:
		}
	}
	if m == nil {
		n := size // a large message's own
		if c <= maxClass {
			n = 1 << c
		}
		m = &message{buf: make([]byte, 0, n)}
		s.made.Add(1)
	}
	m.buf, m.wire = m.buf[:messageRoom], nil
	return m
}

// release drops a reference to m; the last returns it to the free list
// of its size.
func (s *pubSocket) release(m *message) {
	if m.refs.Add(-1) != 0 {
		return
	}
	c := bits.Len(uint(cap(m.buf))) - 1
	if c < minClass || c > maxClass || cap(m.buf) != 1<<c {
		return // grown past its size, or a large message's own
	}
	m.wire = nil
	select {
	case s.free[c-minClass] <- m:
	default:
	}
}

func (s *pubSocket) drop(sc *subscriberConn) {
	sc.once.Do(func() {
		s.mu.Lock()
		delete(s.subs, sc)
		s.mu.Unlock()
		close(sc.gone)
		_ = sc.c.Close()
	})
}

// queue frames m, whose payload follows its framing room in m.buf, as
// one message (empty topic, sequence number, payload) for flush to send;
// m is the socket's from then on. Publisher goroutine only.
func (s *pubSocket) queue(m *message, seq uint64) {
	m.wire = frameMessage(m.buf, seq)
	s.out = append(s.out, m)
	if len(s.out) >= maxWritev {
		s.flush()
	}
}

// flush hands the messages queue framed to every matching subscriber,
// in order. To a subscriber whose writer has nothing left to write it
// writes them itself, in one writev that does not wait (the socket's
// buffer takes a pace interval's messages): handing them to the writer
// would wake it, a goroutine and often a thread, once per send. What
// that write leaves, and everything for a subscriber still writing,
// goes to the subscriber's queue; a full queue drops a message for that
// subscriber alone. Publisher goroutine only.
func (s *pubSocket) flush() {
	if len(s.out) == 0 {
		return
	}
	for _, m := range s.out {
		m.refs.Store(1) // ours, until every subscriber has it
	}
	s.mu.Lock()
	for sc := range s.subs {
		if sc.all > 0 {
			s.targets = append(s.targets, sc)
		}
	}
	s.mu.Unlock()
	for i, sc := range s.targets {
		s.targets[i] = nil
		rest, skip := s.out, 0
		if sc.raw != nil && sc.unwritten.Load() == 0 {
			var err error
			if rest, skip, err = s.writeNow(sc); err != nil {
				s.drop(sc)
				continue
			}
			if len(rest) == 0 {
				continue
			}
		}
		for j, m := range rest {
			if q := sc.events.Load(); q > 0 && q+m.events > s.eventHWM {
				s.drops.Add(1) // its queue holds as many events as it may
				continue
			}
			m.refs.Add(1)
			sc.unwritten.Add(1)
			sc.events.Add(m.events)
			if j == 0 && skip > 0 {
				sc.skip = skip // the writer is idle: set before it can take m
			}
			select {
			case sc.q <- m:
				s.handed.Add(1)
			default:
				sc.unwritten.Add(-1)
				sc.events.Add(-m.events)
				m.refs.Add(-1)
				s.drops.Add(1)
			}
		}
	}
	s.targets = s.targets[:0]
	for i, m := range s.out {
		s.release(m)
		s.out[i] = nil
	}
	s.out = s.out[:0]
}

// writeNow writes s.out to sc, whose writer is idle, in one writev that
// does not wait for room: the messages it did not write whole, and how
// much of the first of those it wrote.
func (s *pubSocket) writeNow(sc *subscriberConn) (rest []*message, skip int, err error) {
	s.wires = s.wires[:0]
	for _, m := range s.out {
		s.wires = append(s.wires, m.wire)
	}
	var n int
	var werr error
	if err := sc.raw.Write(func(fd uintptr) bool {
		n, werr = unix.Writev(int(fd), s.wires)
		return true // one try: what is left goes to the writer
	}); err != nil {
		return nil, 0, err
	}
	for i := range s.wires {
		s.wires[i] = nil
	}
	if werr != nil {
		if werr == unix.EAGAIN || werr == unix.EINTR {
			return s.out, 0, nil
		}
		return nil, 0, werr
	}
	rest = s.out
	for len(rest) > 0 && n >= len(rest[0].wire) {
		n -= len(rest[0].wire)
		rest = rest[1:]
	}
	if n > 0 {
		s.split.Add(1)
	}
	return rest, n, nil
}

// stats counts subscribers that receive messages, and messages dropped
// for subscribers that fell behind.
func (s *pubSocket) stats() (subscribed int, drops uint64) {
	s.mu.Lock()
	for sc := range s.subs {
		if sc.all > 0 {
			subscribed++
		}
	}
	s.mu.Unlock()
	return subscribed, s.drops.Load()
}

func (s *pubSocket) close() error {
	close(s.done)
	err := s.ln.Close()
	s.mu.Lock()
	subs := make([]*subscriberConn, 0, len(s.subs))
	for sc := range s.subs {
		subs = append(subs, sc)
	}
	s.mu.Unlock()
	for _, sc := range subs {
		s.linger(sc)
		s.drop(sc)
	}
	s.wg.Wait()
	return err
}

// linger gives a subscriber a moment to take what is queued for it
// (and what its writer took but has not written yet) before its
// connection closes (ZMQ_LINGER; Mooncake's is 0).
func (s *pubSocket) linger(sc *subscriberConn) {
	deadline := time.Now().Add(200 * time.Millisecond)
	for sc.unwritten.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
}
