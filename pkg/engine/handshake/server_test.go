package handshake

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func listen(t *testing.T, opts Options) *Server {
	t.Helper()
	s, err := Listen("127.0.0.1:0", opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestRequestReply(t *testing.T) {
	s := listen(t, Options{})
	s.Handle(Connection, func(ctx context.Context, p []byte) ([]byte, error) {
		var in ConnectionInfo
		if err := json.Unmarshal(p, &in); err != nil {
			return nil, err
		}
		out := ConnectionInfo{LocalNICPath: in.PeerNICPath, PeerNICPath: in.LocalNICPath, QPNum: []uint32{in.QPNum[0] + 1}}
		return json.Marshal(out)
	})
	req, _ := json.Marshal(ConnectionInfo{LocalNICPath: "a@mlx5_0", LocalLID: 3, LocalGID: "fe:80", PeerNICPath: "b@mlx5_1", QPNum: []uint32{41}})
	if !strings.Contains(string(req), `"local_nic_path":"a@mlx5_0","local_lid":3,"local_gid":"fe:80","peer_nic_path":"b@mlx5_1","qp_num":[41],"reply_msg":""`) {
		t.Fatalf("ConnectionInfo JSON field names: %s", req)
	}
	reply, err := Request(context.Background(), s.Addr(), Connection, req, 0)
	if err != nil {
		t.Fatal(err)
	}
	var got ConnectionInfo
	if err := json.Unmarshal(reply, &got); err != nil {
		t.Fatal(err)
	}
	if got.LocalNICPath != "b@mlx5_1" || got.PeerNICPath != "a@mlx5_0" || len(got.QPNum) != 1 || got.QPNum[0] != 42 {
		t.Fatalf("reply = %+v", got)
	}
}

// The server's side of the wire, byte for byte: one frame in, a frame of
// the same type out, then EOF (half-close).
func TestServerWire(t *testing.T) {
	s := listen(t, Options{})
	s.Handle(Probe, func(ctx context.Context, p []byte) ([]byte, error) { return []byte(`{"status":"success"}`), nil })
	c, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte{3, 0, 0, 0, 0, 0, 0, 0, 3, '{', '}'}); err != nil {
		t.Fatal(err)
	}
	all, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	want := append([]byte{21, 0, 0, 0, 0, 0, 0, 0, 3}, `{"status":"success"}`...)
	if !bytes.Equal(all, want) {
		t.Fatalf("server wrote %x, want %x", all, want)
	}
}

func TestDefaultProbe(t *testing.T) {
	s := listen(t, Options{})
	reply, err := Request(context.Background(), s.Addr(), Probe, []byte(`{}`), 0)
	if err != nil || string(reply) != `{"status":"success"}` {
		t.Fatalf("probe: %q %v", reply, err)
	}
	s.Handle(Probe, nil)
	if _, err := Request(context.Background(), s.Addr(), Probe, []byte(`{}`), 0); !errors.Is(err, ErrNoReply) {
		t.Fatalf("probe without handler: %v", err)
	}
}

func TestNoHandlerClosesWithoutReply(t *testing.T) {
	s := listen(t, Options{})
	_, err := Request(context.Background(), s.Addr(), Notify, []byte(`{}`), 0)
	if !errors.Is(err, ErrNoReply) || !strings.Contains(err.Error(), s.Addr()) {
		t.Fatalf("err = %v, want ErrNoReply naming %s", err, s.Addr())
	}
	s.Handle(Notify, func(ctx context.Context, p []byte) ([]byte, error) { return nil, errors.New("boom") })
	if _, err := Request(context.Background(), s.Addr(), Notify, []byte(`{}`), 0); !errors.Is(err, ErrNoReply) {
		t.Fatalf("failing handler: %v", err)
	}
	s.Handle(Notify, nil)
	if _, err := Request(context.Background(), s.Addr(), Notify, []byte(`{}`), 0); !errors.Is(err, ErrNoReply) {
		t.Fatalf("removed handler: %v", err)
	}
}

func TestServerRejectsOversizedRequest(t *testing.T) {
	s := listen(t, Options{MaxLength: 16})
	called := false
	s.Handle(Metadata, func(ctx context.Context, p []byte) ([]byte, error) { called = true; return p, nil })
	_, err := Request(context.Background(), s.Addr(), Metadata, bytes.Repeat([]byte("x"), 64), 0)
	if err == nil || called {
		t.Fatalf("oversized request served: err=%v called=%v", err, called)
	}
	// At the limit it is served.
	if _, err := Request(context.Background(), s.Addr(), Metadata, bytes.Repeat([]byte("x"), 15), 0); err != nil {
		t.Fatal(err)
	}
}

func TestClientRejectsOversizedAndMismatchedReply(t *testing.T) {
	for _, tc := range []struct {
		name  string
		reply []byte
		want  string
	}{
		{"too large", AppendFrame(nil, Metadata, bytes.Repeat([]byte("y"), 100)), "exceeds limit 50"},
		{"wrong type", AppendFrame(nil, Notify, []byte("{}")), "reply has type Notify, want Metadata"},
		{"truncated", AppendFrame(nil, Metadata, []byte("{}"))[:10], "unexpected EOF"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			go func() {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				ReadFrame(c, 0)
				c.Write(tc.reply)
			}()
			_, err = Request(context.Background(), ln.Addr().String(), Metadata, []byte("{}"), 50)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), ln.Addr().String()) {
				t.Fatalf("err = %v, want %q naming the peer", err, tc.want)
			}
		})
	}
}

func TestRequestUnreachable(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	start := time.Now()
	_, err := Request(context.Background(), addr, Metadata, []byte("{}"), 0)
	if err == nil || !strings.Contains(err.Error(), "handshake with "+addr+" unreachable") {
		t.Fatalf("err = %v", err)
	}
	if time.Since(start) > 2*time.Second {
		t.Fatalf("refused connection took %v", time.Since(start))
	}
}

func TestRequestHonoursContext(t *testing.T) {
	// A peer that accepts and never answers.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var conns []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	defer func() {
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = Request(ctx, ln.Addr().String(), Metadata, []byte("{}"), 0)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want deadline exceeded", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("took %v", d)
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel2)
	if _, err = Request(ctx2, ln.Addr().String(), Metadata, []byte("{}"), 0); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancel: err = %v", err)
	}
}

func TestServerDropsSilentPeerAfterTimeout(t *testing.T) {
	s := listen(t, Options{Timeout: 100 * time.Millisecond})
	c, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte{9, 0, 0}) // part of a header, then nothing
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	start := time.Now()
	n, err := c.Read(make([]byte, 1))
	if n != 0 || isTimeout(err) {
		t.Fatalf("read = %d, %v; want EOF/reset from the server", n, err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("server held a silent connection %v", d)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// goroutines waits for the count to settle back to at most want.
func waitGoroutines(t *testing.T, want int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		n := runtime.NumGoroutine()
		if n <= want {
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("goroutines: %d, want <= %d\n%s", n, want, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestCloseWaitsForInFlightHandler(t *testing.T) {
	base := runtime.NumGoroutine()
	s, err := Listen("127.0.0.1:0", Options{})
	if err != nil {
		t.Fatal(err)
	}
	entered := make(chan struct{})
	release := make(chan struct{})
	s.Handle(Metadata, func(ctx context.Context, p []byte) ([]byte, error) {
		close(entered)
		<-release
		return []byte(`{"done":true}`), nil
	})
	// An idle connection that never sends: Close must not wait for it.
	idle, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()

	type result struct {
		reply []byte
		err   error
	}
	res := make(chan result, 1)
	go func() {
		r, err := Request(context.Background(), s.Addr(), Metadata, []byte(`{}`), 0)
		res <- result{r, err}
	}()
	<-entered
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while a handler was running", err)
	case <-time.After(100 * time.Millisecond):
	}
	// New connections are refused once Close has begun.
	if c, err := net.DialTimeout("tcp", s.Addr(), time.Second); err == nil {
		c.Close()
		t.Fatalf("listener still accepting after Close")
	}
	close(release)
	r := <-res
	if r.err != nil || string(r.reply) != `{"done":true}` {
		t.Fatalf("in-flight request: %q %v", r.reply, r.err)
	}
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return after the handler finished")
	}
	// The idle connection was dropped by the server.
	idle.SetReadDeadline(time.Now().Add(2 * time.Second))
	if n, err := idle.Read(make([]byte, 1)); n != 0 || isTimeout(err) {
		t.Fatalf("idle connection not closed by Close: %d %v", n, err)
	}
	idle.Close()
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	waitGoroutines(t, base)
}

func TestListenRange(t *testing.T) {
	// Find a few consecutive free ports, then occupy all but one.
	var lns []net.Listener
	defer func() {
		for _, l := range lns {
			l.Close()
		}
	}()
	first, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lo := first.Addr().(*net.TCPAddr).Port
	first.Close()
	hi := lo + 3
	if hi > 65535 {
		t.Skip("no room above ephemeral port")
	}
	free := lo + 2
	for p := lo; p <= hi; p++ {
		if p == free {
			continue
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			t.Skipf("port %d taken by someone else: %v", p, err)
		}
		lns = append(lns, l)
	}
	s, err := ListenRange("127.0.0.1", lo, hi, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if s.Addr() != "127.0.0.1:"+strconv.Itoa(free) {
		t.Fatalf("Addr = %s, want the only free port %d", s.Addr(), free)
	}
	s.Close()
	// Whole range busy.
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(free))
	if err != nil {
		t.Fatal(err)
	}
	lns = append(lns, l)
	if _, err := ListenRange("127.0.0.1", lo, hi, Options{}); err == nil || !strings.Contains(err.Error(), "no free port") {
		t.Fatalf("busy range: %v", err)
	}
	for _, r := range [][2]int{{0, 10}, {20, 10}, {1, 70000}} {
		if _, err := ListenRange("127.0.0.1", r[0], r[1], Options{}); err == nil || !strings.Contains(err.Error(), "invalid") {
			t.Fatalf("range %v: %v", r, err)
		}
	}
}
