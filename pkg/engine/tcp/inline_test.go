//go:build linux

package tcp

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"golang.org/x/sys/unix"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// More connections queued at once than the accept loop takes per round
// are all served. A loop that parked with connections left in the accept
// queue never heard of them again (its epoll set does not tell Go's
// poller twice about a listener that stays ready) and initiators waited
// for their status timeout: mc bench initiator --tcp-lanes 0 --threads 2.
func TestQueuedConnectionsAllServed(t *testing.T) {
	// One loop, and several sharing the listener.
	for _, loops := range []int{1, 3} {
		t.Run(fmt.Sprintf("loops=%d", loops), func(t *testing.T) { queuedAllServed(t, loops) })
	}
}

func queuedAllServed(t *testing.T, loops int) {
	const n = 3*64 + 5
	g := newGuarded(0x10000, n, 64)
	for i := range g.region() {
		g.region()[i] = byte(i*13 + 1)
	}
	ln, err := Listen(t.Context(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// Queued before the server runs: connected, request sent.
	conns := make([]net.Conn, n)
	for i := range conns {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Write(AppendHeader(nil, Header{Addr: 0x10000 + uint64(i), Size: 1, V2: true})); err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}
	s := NewServer(ln, g, ServerOptions{EventLoops: loops})
	defer s.Close()
	if n := len(s.extra.(inlineLoops)); n != loops {
		t.Fatalf("%d event loops, want %d", n, loops)
	}
	for i, c := range conns {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		var reply [StatusSize + 1]byte
		if _, err := io.ReadFull(c, reply[:]); err != nil {
			t.Fatalf("connection %d of %d: %v", i, n, err)
		}
		if st := binary.LittleEndian.Uint64(reply[:]); st != StatusOK || reply[StatusSize] != g.region()[i] {
			t.Fatalf("connection %d: status %x, byte %d", i, st, reply[StatusSize])
		}
	}
}

// request sends one v2 request on c and returns its status (and the data
// of a READ).
func request(t *testing.T, c net.Conn, h Header, payload []byte) (uint64, []byte) {
	t.Helper()
	h.V2 = true
	if _, err := c.Write(append(AppendHeader(nil, h), payload...)); err != nil {
		t.Fatalf("send: %v", err)
	}
	st := readStatus(t, c)
	if h.Write || st != StatusOK {
		return st, nil
	}
	data := make([]byte, h.Size)
	if _, err := io.ReadFull(c, data); err != nil {
		t.Fatalf("read data: %v", err)
	}
	return st, data
}

// A connection that stays open after its reply waits for its next
// request (a pooled Mooncake lane sends one at a time), may switch to
// pipelining, and is closed once idle for the server's idle timeout.
func TestInlineConnectionLifecycle(t *testing.T) {
	g := newGuarded(0x10000, 1<<20, 64)
	ln, err := Listen(t.Context(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(ln, g, ServerOptions{IdleTimeout: 400 * time.Millisecond})
	defer s.Close()
	c := dial(t, s)
	payload := bytes.Repeat([]byte{0x5a}, 1000)
	if st, _ := request(t, c, Header{Write: true, Addr: 0x10000, Size: 1000}, payload); st != StatusOK {
		t.Fatalf("write: status %x", st)
	}
	time.Sleep(50 * time.Millisecond) // waiting in the set
	if st, data := request(t, c, Header{Addr: 0x10000, Size: 1000}, nil); st != StatusOK || !bytes.Equal(data, payload) {
		t.Fatalf("read after a pause: status %x, data equal %v", st, bytes.Equal(data, payload))
	}
	// Three requests in one write: handed to the per-connection handler.
	var wire []byte
	for i := range 3 {
		wire = AppendHeader(wire, Header{Addr: 0x10000 + uint64(i), Size: 10, V2: true})
	}
	if _, err := c.Write(wire); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if st := readStatus(t, c); st != StatusOK {
			t.Fatalf("pipelined %d: status %x", i, st)
		}
		got := make([]byte, 10)
		if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, payload[:10]) {
			t.Fatalf("pipelined %d: %v", i, err)
		}
	}
	// A second connection left idle after one request is dropped after
	// the idle timeout (within its 1/8 sweep).
	c2 := dial(t, s)
	request(t, c2, Header{Addr: 0x10000, Size: 8}, nil)
	start := time.Now()
	c2.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := c2.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("idle connection: read got %v, want EOF", err)
	}
	if d := time.Since(start); d < 300*time.Millisecond || d > 1500*time.Millisecond {
		t.Fatalf("idle connection closed after %v, want about 400ms", d)
	}
	s.Close()
	g.check(t)
}

// A reply larger than the socket takes at once is finished by the loop
// as the socket makes room, byte for byte, with no goroutine of its own;
// a peer that leaves in the middle of one leaves no pin behind.
func TestInlineLargeReply(t *testing.T) {
	const size = 8 << 20
	g := newGuarded(0x10000, size, 64)
	for i := range g.region() {
		g.region()[i] = byte(i*7 + i>>13)
	}
	ln, err := Listen(t.Context(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(ln, g, ServerOptions{})
	defer s.Close()
	c := dial(t, s)
	c.(*net.TCPConn).SetReadBuffer(64 << 10)
	var hdr [HeaderSize]byte
	PutHeader(hdr[:], Header{Addr: 0x10000, Size: size, V2: true})
	if _, err := c.Write(hdr[:]); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // let the socket fill up
	if st := readStatus(t, c); st != StatusOK {
		t.Fatalf("status %x", st)
	}
	got := make([]byte, size)
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, g.region()) {
		t.Fatal("large reply differs")
	}
	// And the connection goes on.
	if st, data := request(t, c, Header{Addr: 0x10000 + 5, Size: 3}, nil); st != StatusOK || !bytes.Equal(data, g.region()[5:8]) {
		t.Fatalf("request after a large reply: %x", st)
	}
	if k := s.handedOver(); k != 0 {
		t.Fatalf("%d connections handed to a goroutine for a large reply, want 0", k)
	}
	c.Close()
	// A peer that reads part of a large reply and leaves.
	for range 3 {
		c := dial(t, s)
		c.(*net.TCPConn).SetReadBuffer(64 << 10)
		if _, err := c.Write(hdr[:]); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, make([]byte, 100<<10)); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	waitUnpinned(t, g)
	s.Close()
	g.check(t)
}

// waitUnpinned waits until no range of g is pinned.
func waitUnpinned(t *testing.T, g *guarded) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		g.mu.Lock()
		held := g.held
		g.mu.Unlock()
		if held == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d pins held after the peer left", held)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Close ends connections waiting in the loop's set and returns.
func TestCloseWithWaitingConnections(t *testing.T) {
	g := newGuarded(0x10000, 4096, 64)
	ln, err := Listen(t.Context(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(ln, g, ServerOptions{})
	var conns []net.Conn
	for range 5 {
		c := dial(t, s)
		request(t, c, Header{Addr: 0x10000, Size: 16}, nil)
		conns = append(conns, c)
	}
	done := make(chan struct{})
	go func() { s.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return")
	}
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.Read(make([]byte, 1)); err == nil {
				t.Error("a waiting connection stayed open after Close")
			}
		}()
	}
	wg.Wait()
	if _, err := net.DialTimeout("tcp", s.Addr().String(), time.Second); err == nil {
		// The listener's own descriptor and the loop's are both gone.
		t.Error("listener still accepts after Close")
	}
	g.check(t)
}

// FuzzInlineServer sends arbitrary bytes over a real connection to a
// server on its inline path and checks that nothing outside registered
// memory is touched and no pin is leaked, whatever the bytes.
func FuzzInlineServer(f *testing.F) {
	le := binary.LittleEndian
	hdr := func(size, addr uint64, op byte) []byte {
		b := make([]byte, HeaderSize)
		le.PutUint64(b, size)
		le.PutUint64(b[8:], addr)
		b[16] = op
		return b
	}
	f.Add(hdr(16, 0x10000, OpRead|VersionBit))
	f.Add(append(hdr(4, 0x10010, OpWrite|VersionBit), 1, 2, 3, 4))
	f.Add(append(hdr(4, 0x10010, OpWrite), 1, 2, 3, 4))
	f.Add(hdr(16, 0x10000+4090, OpRead|VersionBit))
	f.Add(append(hdr(8, 0x10000, OpRead|VersionBit), hdr(8, 0x10008, OpRead|VersionBit)...))
	f.Add(hdr(1<<62, 0x10000, OpWrite|VersionBit))
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	g := newGuarded(0x10000, 4096, 256)
	ln, err := Listen(f.Context(), "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	s := NewServer(ln, g, ServerOptions{IdleTimeout: time.Second})
	f.Cleanup(func() { s.Close() })
	f.Fuzz(func(t *testing.T, in []byte) {
		c, err := net.Dial("tcp", s.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(2 * time.Second))
		c.Write(in)
		c.(*net.TCPConn).CloseWrite()
		io.Copy(io.Discard, c) // until the server closes
		c.Close()
		for i := 0; i < g.pad; i++ {
			if g.arena[i] != canary || g.arena[len(g.arena)-1-i] != canary {
				t.Fatalf("canary overwritten at pad offset %d", i)
			}
		}
		g.mu.Lock()
		held := g.held
		g.mu.Unlock()
		if held != 0 {
			t.Fatalf("%d pins held after the server closed the connection", held)
		}
	})
}

// Out of descriptors, accept fails: the loop warns once per failure and
// backs off instead of spinning on a listener that stays ready, and
// serves the connection once descriptors are free again.
func TestAcceptFailureBacksOff(t *testing.T) {
	var logs syncLog
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})))
	t.Cleanup(func() { slog.SetDefault(old) })
	g := newGuarded(0x10000, 4096, 64)
	copy(g.region(), "backoff")
	ln, err := Listen(t.Context(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(ln, g, ServerOptions{})
	defer s.Close()
	// The client socket exists before the limit drops; connecting needs no
	// new descriptor, accepting does.
	cfd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(cfd)
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	// A new descriptor takes the lowest free number: with the limit at
	// that number, none can be made.
	probe, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	free := probe.Fd()
	probe.Close()
	low := lim
	low.Cur = uint64(free)
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	restored := false
	restore := func() {
		if !restored {
			restored = true
			if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
				t.Fatal(err)
			}
		}
	}
	defer restore()
	port := s.Addr().(*net.TCPAddr).Port
	if err := unix.Connect(cfd, &unix.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		restore()
		t.Fatal(err)
	}
	if _, err := unix.Write(cfd, AppendHeader(nil, Header{Addr: 0x10000, Size: 7, V2: true})); err != nil {
		restore()
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(logs.String(), "accept failed") && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // a spinning loop would log hundreds
	restore()
	if n := strings.Count(logs.String(), "accept failed"); n < 1 || n > 10 {
		t.Fatalf("%d accept warnings in ~50ms, want a few:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "too many open files") {
		t.Fatalf("warning does not name the cause:\n%s", logs.String())
	}
	reply := make([]byte, StatusSize+7)
	got := 0
	unix.SetsockoptTimeval(cfd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 5})
	for got < len(reply) {
		n, err := unix.Read(cfd, reply[got:])
		if n <= 0 || err != nil {
			t.Fatalf("reply after the limit was restored: %d bytes, %v", got, err)
		}
		got += n
	}
	if binary.LittleEndian.Uint64(reply) != StatusOK || string(reply[StatusSize:]) != "backoff" {
		t.Fatalf("reply %q", reply)
	}
}

// handedOver is how many connections per-connection handlers hold.
func (s *Server) handedOver() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// Mooncake's client writes a WRITE's header and its payload with two
// writes (the payload once the header's write completed), so the loop
// often reads the header alone. The loop serves such a request itself,
// reading the rest of the payload into registered memory as it comes,
// whatever the payload's size, instead of handing the connection to a
// goroutine of its own (a net.Conn, a poller registration and a wake-up
// per put: 6 of 10 of the Python client's 4 KiB puts went that way).
func TestInlineSplitWrite(t *testing.T) {
	const size = 256 << 10
	g := newGuarded(0x10000, size, 64)
	ln, err := Listen(t.Context(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(ln, g, ServerOptions{EventLoops: 1})
	defer s.Close()
	for _, n := range []int{4096, size} {
		c := dial(t, s)
		payload := make([]byte, n)
		for i := range payload {
			payload[i] = byte(i*31 + n)
		}
		if _, err := c.Write(AppendHeader(nil, Header{Write: true, Addr: 0x10000, Size: uint64(n), V2: true})); err != nil {
			t.Fatal(err)
		}
		// The payload in pieces, the first after a pause.
		for off := 0; off < n; {
			time.Sleep(10 * time.Millisecond)
			k := min(n-off, max(1, n/3))
			if _, err := c.Write(payload[off : off+k]); err != nil {
				t.Fatal(err)
			}
			off += k
		}
		if st := readStatus(t, c); st != StatusOK {
			t.Fatalf("%d-byte split write: status %x", n, st)
		}
		if !bytes.Equal(g.region()[:n], payload) {
			t.Fatalf("%d-byte split write: memory differs", n)
		}
		// The connection goes on in the loop.
		if st, data := request(t, c, Header{Addr: 0x10000 + 7, Size: 9}, nil); st != StatusOK || !bytes.Equal(data, payload[7:16]) {
			t.Fatalf("read after a %d-byte split write: status %x", n, st)
		}
		if k := s.handedOver(); k != 0 {
			t.Fatalf("%d-byte split write: %d connections handed to a goroutine, want 0", n, k)
		}
		c.Close()
	}
	// A peer that leaves in the middle of a payload: no pin is kept.
	c := dial(t, s)
	if _, err := c.Write(append(AppendHeader(nil, Header{Write: true, Addr: 0x10000, Size: 4096, V2: true}), 1, 2, 3)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	c.Close()
	waitUnpinned(t, g)
	s.Close()
	g.check(t)
}

// A large reply that the loop finishes while still serving the connection
// it has just accepted (the peer drains the socket between two writes)
// leaves the connection in the loop's set, serving the next request:
// the loop used to re-arm a connection it had not added yet, and closed it.
func TestInlineLargeReplyOnNewConnection(t *testing.T) {
	const size = 4 << 20
	g := newGuarded(0x10000, size, 64)
	for i := range g.region() {
		g.region()[i] = byte(i*13 + i>>11)
	}
	ln, err := Listen(t.Context(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(ln, g, ServerOptions{EventLoops: 1})
	defer s.Close()
	got := make([]byte, size)
	for i := range 100 {
		c := dial(t, s)
		if _, err := c.Write(AppendHeader(nil, Header{Addr: 0x10000, Size: size, V2: true})); err != nil {
			t.Fatal(err)
		}
		if st := readStatus(t, c); st != StatusOK {
			t.Fatalf("round %d: status %x", i, st)
		}
		if _, err := io.ReadFull(c, got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, g.region()) {
			t.Fatalf("round %d: large reply differs", i)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if st, data := request(t, c, Header{Addr: 0x10000 + 9, Size: 4}, nil); st != StatusOK || !bytes.Equal(data, g.region()[9:13]) {
			t.Fatalf("round %d: request after a large reply on a new connection: status %x", i, st)
		}
		c.Close()
	}
	waitUnpinned(t, g)
	s.Close()
	g.check(t)
}
