package cororpc

import (
	"bytes"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/diag/glog"
)

// rawServer is a loopback listener whose connections the test drives byte
// by byte, to play a misbehaving or scripted coro_rpc server.
type rawServer struct {
	ln    net.Listener
	conns chan net.Conn
}

func newRawServer(t *testing.T) *rawServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rs := &rawServer{ln: ln, conns: make(chan net.Conn, 16)}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			rs.conns <- c
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		for {
			select {
			case c := <-rs.conns:
				c.Close()
			default:
				return
			}
		}
	})
	return rs
}

func (rs *rawServer) addr() string { return rs.ln.Addr().String() }

// accept returns the next connection the client opened.
func (rs *rawServer) accept(t *testing.T) net.Conn {
	t.Helper()
	select {
	case c := <-rs.conns:
		t.Cleanup(func() { c.Close() })
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("client never connected")
		return nil
	}
}

// noConnWithin fails if the client opens a connection within d.
func (rs *rawServer) noConnWithin(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case c := <-rs.conns:
		c.Close()
		t.Fatalf("client opened an unexpected connection")
	case <-time.After(d):
	}
}

func readReq(t *testing.T, c net.Conn) (RequestHeader, []byte) {
	t.Helper()
	h, body, _, err := ReadRequest(c, 0)
	if err != nil {
		t.Errorf("raw server: read request: %v", err)
	}
	return h, body
}

func writeResp(t *testing.T, c net.Conn, h ResponseHeader, body []byte) {
	t.Helper()
	h.Magic = Magic
	h.Length = uint32(len(body))
	if _, err := c.Write(append(h.AppendTo(nil), body...)); err != nil {
		t.Errorf("raw server: write response: %v", err)
	}
}

// logBuffer collects glog lines from a Client or Server.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) logger() *slog.Logger {
	return slog.New(glog.NewHandler(l, &glog.Options{Level: slog.LevelDebug}))
}

// lines returns the parsed glog lines whose body contains substr.
func (l *logBuffer) lines(t *testing.T, substr string) []glog.Line {
	t.Helper()
	l.mu.Lock()
	text := l.buf.String()
	l.mu.Unlock()
	var out []glog.Line
	for _, s := range strings.Split(text, "\n") {
		if s == "" {
			continue
		}
		line, ok := glog.ParseLine([]byte(s))
		if !ok {
			t.Errorf("not a glog line: %q", s)
			continue
		}
		if strings.Contains(string(line.Body), substr) {
			out = append(out, line)
		}
	}
	return out
}

// checkGoroutines returns a function that fails the test if goroutines
// started since it was called are still running a second later.
func checkGoroutines(t *testing.T) func() {
	t.Helper()
	base := runtime.NumGoroutine()
	return func() {
		t.Helper()
		deadline := time.Now().Add(2 * time.Second)
		for runtime.NumGoroutine() > base {
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				n := runtime.Stack(buf, true)
				t.Errorf("%d goroutines left, started with %d:\n%s", runtime.NumGoroutine(), base, buf[:n])
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// within fails the test if f does not return within d, so that a hang
// shows as a failure, not a test binary timeout.
func within(t *testing.T, d time.Duration, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s did not return within %v", what, d)
	}
}
