package tcp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// guarded is a Memory of one registered region [base, base+n) that sits
// inside a larger array with canary bytes on both sides: a server that
// strays outside what Acquire returned changes a canary.
type guarded struct {
	base  uint64
	arena []byte
	pad   int
	mu    sync.Mutex
	held  int
}

const canary = 0xA5

func newGuarded(base uint64, n, pad int) *guarded {
	g := &guarded{base: base, arena: make([]byte, n+2*pad), pad: pad}
	for i := range g.arena {
		g.arena[i] = canary
	}
	return g
}

func (g *guarded) region() []byte { return g.arena[g.pad : len(g.arena)-g.pad] }

func (g *guarded) Acquire(addr, size uint64) ([]byte, Ref, error) {
	r := g.region()
	if addr < g.base || addr-g.base > uint64(len(r)) || size > uint64(len(r))-(addr-g.base) {
		return nil, nil, errors.New("out of range")
	}
	g.mu.Lock()
	g.held++
	g.mu.Unlock()
	off := addr - g.base
	return r[off : off+size : off+size], g, nil
}

func (g *guarded) Release() {
	g.mu.Lock()
	g.held--
	g.mu.Unlock()
}

func (g *guarded) check(t testing.TB) {
	t.Helper()
	for i := 0; i < g.pad; i++ {
		if g.arena[i] != canary || g.arena[len(g.arena)-1-i] != canary {
			t.Fatalf("canary overwritten at pad offset %d", i)
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.held != 0 {
		t.Fatalf("%d refs not released", g.held)
	}
}

func startServer(t *testing.T, mem Memory) *Server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(ln, mem, ServerOptions{})
	t.Cleanup(func() { s.Close() })
	return s
}

func dial(t *testing.T, s *Server) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	t.Cleanup(func() { c.Close() })
	return c
}

func readStatus(t *testing.T, c net.Conn) uint64 {
	t.Helper()
	var b [8]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		t.Fatalf("read status: %v", err)
	}
	return binary.LittleEndian.Uint64(b[:])
}

func TestServerRawV2AndV1(t *testing.T) {
	g := newGuarded(0x10000, 4096, 64)
	s := startServer(t, g)
	c := dial(t, s)

	// v2 WRITE then READ of the same bytes, pipelined on one connection.
	payload := []byte("mooncake")
	req := AppendHeader(nil, Header{Size: 8, Addr: 0x10000 + 100, Write: true, V2: true})
	req = append(req, payload...)
	req = AppendHeader(req, Header{Size: 8, Addr: 0x10000 + 100, V2: true})
	if _, err := c.Write(req); err != nil {
		t.Fatal(err)
	}
	if st := readStatus(t, c); st != StatusOK {
		t.Fatalf("write status %#x", st)
	}
	if st := readStatus(t, c); st != StatusOK {
		t.Fatalf("read status %#x", st)
	}
	got := make([]byte, 8)
	io.ReadFull(c, got)
	if !bytes.Equal(got, payload) || !bytes.Equal(g.region()[100:108], payload) {
		t.Fatalf("got %q, memory %q", got, g.region()[100:108])
	}

	// v1: no status frames, on the same connection.
	req = AppendHeader(nil, Header{Size: 3, Addr: 0x10000, Write: true})
	req = append(req, "abc"...)
	req = AppendHeader(req, Header{Size: 3, Addr: 0x10000})
	c.Write(req)
	got = make([]byte, 3)
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "abc" {
		t.Fatalf("v1 read %q %v", got, err)
	}
	c.Close()
	s.Close()
	g.check(t)
}

func TestServerRejects(t *testing.T) {
	cases := []struct {
		name string
		h    Header
	}{
		{"past end", Header{Size: 2, Addr: 0x10000 + 4095, Write: true, V2: true}},
		{"before start", Header{Size: 2, Addr: 0x10000 - 1, Write: true, V2: true}},
		{"wraps", Header{Size: 1 << 63, Addr: 1<<64 - 4, Write: true, V2: true}},
		{"huge", Header{Size: 1<<64 - 1, Addr: 0x10000, V2: true}},
		{"zero size", Header{Size: 0, Addr: 0x10000, V2: true}},
		{"read past end", Header{Size: 4097, Addr: 0x10000, V2: true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := newGuarded(0x10000, 4096, 64)
			before := append([]byte(nil), g.arena...)
			s := startServer(t, g)
			c := dial(t, s)
			req := AppendHeader(nil, tc.h)
			req = append(req, bytes.Repeat([]byte{0xee}, 16)...)
			c.Write(req)
			if st := readStatus(t, c); st != StatusRejected {
				t.Fatalf("status %#x, want rejected", st)
			}
			// Then the server closes the connection.
			if n, err := c.Read(make([]byte, 1)); err == nil {
				t.Fatalf("connection still open (%d bytes)", n)
			}
			s.Close()
			if !bytes.Equal(before, g.arena) {
				t.Fatal("memory changed by a rejected request")
			}
			g.check(t)
		})
	}
	t.Run("bad opcode", func(t *testing.T) {
		g := newGuarded(0x10000, 4096, 64)
		s := startServer(t, g)
		c := dial(t, s)
		b := AppendHeader(nil, Header{Size: 8, Addr: 0x10000, V2: true})
		b[16] = 0x85
		c.Write(b)
		if st := readStatus(t, c); st != StatusRejected {
			t.Fatalf("status %#x", st)
		}
	})
}

// Every byte fed to a connection handler: it may fail, but never touches
// memory outside the registered region nor leaks a reference.
func FuzzServeConn(f *testing.F) {
	f.Add(append(AppendHeader(nil, Header{Size: 4, Addr: 0x10000, Write: true, V2: true}), "abcd"...))
	f.Add(AppendHeader(nil, Header{Size: 4096, Addr: 0x10000, V2: true}))
	f.Add(AppendHeader(nil, Header{Size: 1, Addr: 0x10000 + 4096, V2: true}))
	f.Add(append(AppendHeader(nil, Header{Size: 2, Addr: 0x10000 + 4094, Write: true}), "zz"...))
	f.Fuzz(func(t *testing.T, in []byte) {
		g := newGuarded(0x10000, 4096, 256)
		s := &Server{mem: g, opts: ServerOptions{IdleTimeout: time.Second}}
		var out bytes.Buffer
		s.ServeConn(struct {
			io.Reader
			io.Writer
		}{bytes.NewReader(in), &out})
		g.check(t)
		// Whatever went out came from the region or is a status word:
		// never more than the input could have asked for.
		if out.Len() > len(in)/HeaderSize*(StatusSize+4096) {
			t.Fatalf("%d bytes out for %d bytes in", out.Len(), len(in))
		}
	})
}

// client side helpers

type result struct {
	mu   sync.Mutex
	errs []error
	wg   sync.WaitGroup
}

type doneOp struct {
	r *result
}

func (d doneOp) OpDone(err error) {
	d.r.mu.Lock()
	d.r.errs = append(d.r.errs, err)
	d.r.mu.Unlock()
	d.r.wg.Done()
}

func ops(r *result, n int, write bool, addr uint64, size int, local []byte) []*Op {
	out := make([]*Op, n)
	r.wg.Add(n)
	for i := range out {
		out[i] = &Op{Write: write, Addr: addr + uint64(i*size), Buf: local[i*size : (i+1)*size], Done: doneOp{r}}
	}
	return out
}

func TestClientPipelinedV2AndV1(t *testing.T) {
	g := newGuarded(0x10000, 1<<20, 64)
	s := startServer(t, g)
	var local []byte
	for _, v2 := range []bool{true, false} {
		lanes := 3
		if !v2 {
			// v1 has no status: only one connection orders the reads
			// after the writes.
			lanes = 1
		}
		cl := NewClient(ClientOptions{Lanes: lanes})
		local = writeReadBack(t, cl, s.Addr().String(), v2, 256, 4096, 13)
		cl.Close()
	}
	s.Close() // waits for the handlers: memory is settled
	if !bytes.Equal(g.region(), local) {
		t.Fatal("registered memory differs")
	}
	g.check(t)
}

func TestClientDeadPeerFailsWithinTimeout(t *testing.T) {
	// A peer that reads requests and never answers.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			io.Copy(io.Discard, c)
		}
	}()
	cl := NewClient(ClientOptions{Lanes: 1, StatusTimeout: 200 * time.Millisecond})
	defer cl.Close()
	var r result
	start := time.Now()
	cl.Submit(t.Context(), ln.Addr().String(), true, ops(&r, 4, false, 0x10000, 8, make([]byte, 32)))
	r.wg.Wait()
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("took %v", d)
	}
	for _, err := range r.errs {
		if err == nil {
			t.Fatal("op succeeded against a silent peer")
		}
	}

	// A peer that dies: connection refused is reported per op.
	addr := ln.Addr().String()
	ln.Close()
	var r2 result
	cl.Submit(t.Context(), addr, true, ops(&r2, 2, true, 0x10000, 8, make([]byte, 16)))
	r2.wg.Wait()
	for _, err := range r2.errs {
		if err == nil {
			t.Fatal("op succeeded against a closed port")
		}
	}
}

func TestClientRejectedFailsOpAndLaneRecovers(t *testing.T) {
	g := newGuarded(0x10000, 4096, 64)
	s := startServer(t, g)
	cl := NewClient(ClientOptions{Lanes: 1})
	defer cl.Close()
	var r result
	bad := ops(&r, 1, true, 0x10000+4090, 8, make([]byte, 8))
	cl.Submit(t.Context(), s.Addr().String(), true, bad)
	r.wg.Wait()
	if !errors.Is(r.errs[0], ErrRejected) {
		t.Fatalf("err %v", r.errs[0])
	}
	// The lane died with the rejection; the next submit redials.
	var r2 result
	cl.Submit(t.Context(), s.Addr().String(), true, ops(&r2, 1, true, 0x10000, 8, []byte("12345678")))
	r2.wg.Wait()
	s.Close()
	if r2.errs[0] != nil || string(g.region()[:8]) != "12345678" {
		t.Fatalf("after redial: %v %q", r2.errs[0], g.region()[:8])
	}
}

// An initiator that disappears with requests half done gets one warning
// at the target, however many of its connections break.
func TestServerWarnsOnceWhenInitiatorVanishes(t *testing.T) {
	var logs syncLog
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})))
	t.Cleanup(func() { slog.SetDefault(old) })
	g := newGuarded(0x10000, 1<<20, 64)
	s := startServer(t, g)
	// Clean sessions first: no warning.
	c := dial(t, s)
	c.Write(append(AppendHeader(nil, Header{Size: 3, Addr: 0x10000, Write: true, V2: true}), "abc"...))
	readStatus(t, c)
	c.Close()
	// Then four connections die mid-request, each a write whose payload
	// stops short.
	for i := 0; i < 4; i++ {
		c := dial(t, s)
		// Each its own range: the handlers run at once, and two writers of
		// one range race (in registered memory as in any shared memory).
		req := AppendHeader(nil, Header{Size: 64 << 10, Addr: 0x10000 + uint64(i)<<16, Write: true, V2: true})
		c.Write(append(req, make([]byte, 1000)...))
		c.Close()
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(logs.String(), "went away") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // let the other three connections end
	if n := strings.Count(logs.String(), "initiator went away in the middle of a request"); n != 1 {
		t.Fatalf("%d warnings, want 1:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "read 65536 bytes of write payload") || !strings.Contains(logs.String(), "peer=127.0.0.1:") {
		t.Fatalf("warning: %s", logs.String())
	}
}

type syncLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Mooncake's default client: a connection per request, v2 and v1, read
// and write; a rejected range fails only its own request.
func TestClientPerRequest(t *testing.T) {
	g := newGuarded(0x10000, 1<<20, 64)
	ln, err := Listen(t.Context(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(ln, g, ServerOptions{})
	defer s.Close()
	for _, v2 := range []bool{true, false} {
		cl := NewClient(ClientOptions{PerRequest: true})
		mul := byte(7)
		if !v2 {
			mul = 11 // different bytes from the v2 round
		}
		writeReadBack(t, cl, s.Addr().String(), v2, 64, 16384, mul)
		cl.Close()
	}
	cl := NewClient(ClientOptions{PerRequest: true})
	defer cl.Close()
	var r result
	cl.Submit(t.Context(), s.Addr().String(), true, ops(&r, 1, false, 0x10000+(1<<20), 4096, make([]byte, 4096)))
	r.wg.Wait()
	if len(r.errs) != 1 || !errors.Is(r.errs[0], ErrRejected) {
		t.Fatalf("out-of-range request: %v", r.errs)
	}
	s.Close()
	g.check(t)
}

// Replies are written from registered memory after the pipeline drains:
// a READ pipelined before a WRITE to the same bytes still returns what
// the bytes held when it was read.
func TestServerReadBeforeWriteKeepsOrder(t *testing.T) {
	g := newGuarded(0x10000, 4096, 64)
	copy(g.region(), "old!")
	s := startServer(t, g)
	c := dial(t, s)
	req := AppendHeader(nil, Header{Size: 4, Addr: 0x10000, V2: true})
	req = AppendHeader(req, Header{Size: 4, Addr: 0x10000, Write: true, V2: true})
	req = append(req, "new!"...)
	req = AppendHeader(req, Header{Size: 4, Addr: 0x10000, V2: true})
	if _, err := c.Write(req); err != nil {
		t.Fatal(err)
	}
	var got []string
	for i := 0; i < 3; i++ {
		if st := readStatus(t, c); st != StatusOK {
			t.Fatalf("reply %d: status %#x", i, st)
		}
		if i != 1 {
			b := make([]byte, 4)
			io.ReadFull(c, b)
			got = append(got, string(b))
		}
	}
	if got[0] != "old!" || got[1] != "new!" {
		t.Fatalf("reads returned %q, want old! then new!", got)
	}
	c.Close()
	s.Close()
	g.check(t)
}

// writeReadBack writes 1 MiB of a pattern (mul) to 0x10000 in n requests
// of size bytes, reads it back in 64 KiB requests and compares.
func writeReadBack(t *testing.T, cl *Client, addr string, v2 bool, n, size int, mul byte) []byte {
	t.Helper()
	local := make([]byte, 1<<20)
	for i := range local {
		local[i] = byte(i)*mul + 1
	}
	var r result
	cl.Submit(t.Context(), addr, v2, ops(&r, n, true, 0x10000, size, local))
	r.wg.Wait()
	back := make([]byte, 1<<20)
	cl.Submit(t.Context(), addr, v2, ops(&r, 16, false, 0x10000, 65536, back))
	r.wg.Wait()
	for _, err := range r.errs {
		if err != nil {
			t.Fatalf("v2=%v: %v", v2, err)
		}
	}
	if !bytes.Equal(back, local) {
		t.Fatalf("v2=%v: bytes differ", v2)
	}
	return local
}

// A Submit gives each lane at least minLaneBytes: a small batch goes over
// one connection (spreading it cost more than it won: 4 KiB reads, batch
// 128, one thread, 555-617k IOPS over 4 lanes against 644-743k over 2),
// a large one over every lane.
func TestSubmitSpreadsByBytes(t *testing.T) {
	g := newGuarded(0x10000, 4<<20, 64)
	s := startServer(t, g)
	addr := s.Addr().String()
	cl := NewClient(ClientOptions{Lanes: 4})
	defer cl.Close()
	dialled := func() int {
		cl.mu.Lock()
		p := cl.peers[addr]
		cl.mu.Unlock()
		p.mu.Lock()
		defer p.mu.Unlock()
		n := 0
		for _, l := range p.lanes {
			if l != nil {
				n++
			}
		}
		return n
	}
	submit := func(n, size int) {
		t.Helper()
		var r result
		cl.Submit(t.Context(), addr, true, ops(&r, n, false, 0x10000, size, make([]byte, n*size)))
		r.wg.Wait()
		for _, err := range r.errs {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	submit(8, 4096)
	if n := dialled(); n != 1 {
		t.Fatalf("8 reads of 4 KiB went over %d lanes, want 1", n)
	}
	submit(64, 16<<10)
	if n := dialled(); n != 4 {
		t.Fatalf("64 reads of 16 KiB went over %d lanes in all, want 4", n)
	}
}

// TestWarnGoneWithoutPeerAddress: a connection handed from the event loop
// to a handler after its initiator reset it has no remote address
// (RemoteAddr is nil); the warning for it panicked the process (seen in
// make test, a node under a test's SIGKILLed initiator).
func TestWarnGoneWithoutPeerAddress(t *testing.T) {
	s := &Server{}
	s.warnGone(nil, peerGone("read header: %w", io.ErrUnexpectedEOF))
	s.warnGone(nil, peerGone("read header: %w", io.ErrUnexpectedEOF))
	if _, ok := s.goneAt["unknown peer"]; !ok {
		t.Fatalf("no warning recorded for a peer without an address: %v", s.goneAt)
	}
}
