package cororpc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// startServer serves s on a loopback port and closes it with the test.
func startServer(t *testing.T, s *Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	t.Cleanup(func() {
		s.Close()
		if err := <-served; !errors.Is(err, ErrClosed) {
			t.Errorf("Serve returned %v, want ErrClosed", err)
		}
	})
	return ln.Addr().String()
}

func mustRegister(t *testing.T, s *Server, name string, h Handler) uint32 {
	t.Helper()
	id, err := s.Register(name, h)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// rawDial opens a connection the test writes frames on by hand.
func rawDial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	return c
}

func sendReq(t *testing.T, c net.Conn, seq, fn uint32, body []byte) {
	t.Helper()
	h := RequestHeader{Magic: Magic, Seq: seq, FunctionID: fn, Length: uint32(len(body))}
	if _, err := c.Write(append(h.AppendTo(nil), body...)); err != nil {
		t.Fatal(err)
	}
}

func recvResp(t *testing.T, c net.Conn) (ResponseHeader, []byte) {
	t.Helper()
	h, body, _, err := ReadResponse(c, 0)
	if err != nil {
		t.Fatalf("read response: %v", err)
	}
	return h, body
}

// expectClosed fails unless the server closes c.
func expectClosed(t *testing.T, c net.Conn) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := io.Copy(io.Discard, c)
	if err != nil || n != 0 {
		t.Fatalf("want the server to close the connection; read %d bytes, err %v", n, err)
	}
}

// The server answers captured requests with exactly the bytes the real
// master sent, given the same result bodies.
func TestServerAnswersLikeCapturedMaster(t *testing.T) {
	s := NewServer(nil)
	next := make(chan []byte, 1)
	registered := map[string]bool{}
	caps := loadCaptures(t)
	for _, c := range caps {
		if registered[c.Call] {
			continue
		}
		registered[c.Call] = true
		mustRegister(t, s, "mooncake::WrappedMasterService::"+c.Call, func(ctx context.Context, req *Request) ([]byte, error) {
			return <-next, nil
		})
	}
	addr := startServer(t, s)
	conn := rawDial(t, addr)
	for _, c := range caps {
		reqHdr, reqBody, respHdr, respBody := c.bytes(t)
		next <- respBody
		if _, err := conn.Write(append(reqHdr, reqBody...)); err != nil {
			t.Fatal(err)
		}
		want := append(respHdr, respBody...)
		got := make([]byte, len(want))
		if _, err := io.ReadFull(conn, got); err != nil {
			t.Fatalf("%s: %v", c.Call, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s: server sent\n%x\nthe master sent\n%x", c.Call, got, want)
		}
	}
}

func TestServerUnknownFunction(t *testing.T) {
	s := NewServer(nil)
	known := mustRegister(t, s, "test::Known", func(ctx context.Context, req *Request) ([]byte, error) {
		return []byte("known"), nil
	})
	addr := startServer(t, s)
	conn := rawDial(t, addr)
	sendReq(t, conn, 5, 0xdeadbeef, []byte("args"))
	h, body := recvResp(t, conn)
	// err_code 11 and struct_pack("the rpc function not registered"),
	// with the type literal as the captured master's build writes it.
	wantBody := "77facf9d" + "04" + "800c00" + "1f" + hex.EncodeToString([]byte(NotRegisteredMessage))
	if h.Seq != 5 || h.ErrCode != 11 || hex.EncodeToString(body) != wantBody {
		t.Fatalf("got %+v %x, want seq 5 err_code 11 body %s", h, body, wantBody)
	}
	// The connection goes on.
	sendReq(t, conn, 6, known, nil)
	if h, body := recvResp(t, conn); h.Seq != 6 || h.ErrCode != 0 || string(body) != "known" {
		t.Fatalf("after unknown id: %+v %q", h, body)
	}
	// And through the Client, as an RPCError.
	c := NewClient(addr, nil)
	defer c.Close()
	_, err := c.Call(context.Background(), 0xdeadbeef, nil)
	var re *RPCError
	if !errors.As(err, &re) || re.Code != ErrcFunctionNotRegistered || re.Message != NotRegisteredMessage || re.Function != 0xdeadbeef {
		t.Fatalf("client got %v", err)
	}
}

func TestServerHandlerErrors(t *testing.T) {
	var logs logBuffer
	s := NewServer(&ServerOptions{Logger: logs.logger()})
	fn := mustRegister(t, s, "test::Fail", func(ctx context.Context, req *Request) ([]byte, error) {
		switch string(req.Body) {
		case "plain":
			return nil, errors.New("disk on fire")
		case "args":
			return nil, &RPCError{Code: ErrcInvalidRPCArguments, Message: "invalid rpc arg"}
		case "wide":
			return nil, &RPCError{Code: 300, Message: "user code"}
		case "255":
			return nil, &RPCError{Code: 255, Message: "edge"}
		case "panic":
			panic("handler bug")
		}
		return []byte("ok"), nil
	})
	c := NewClient(startServer(t, s), nil)
	defer c.Close()
	for _, tc := range []struct {
		body string
		code Errc
		msg  string
	}{
		{"plain", ErrcRPCThrowException, "disk on fire"},
		{"args", ErrcInvalidRPCArguments, "invalid rpc arg"},
		{"wide", 300, "user code"},
		{"255", 255, "edge"},
		{"panic", ErrcRPCThrowException, "test::Fail panicked: handler bug"},
	} {
		_, err := c.Call(context.Background(), fn, []byte(tc.body))
		var re *RPCError
		if !errors.As(err, &re) || re.Code != tc.code || re.Message != tc.msg {
			t.Errorf("%s: got %v, want code %d %q", tc.body, err, tc.code, tc.msg)
		}
	}
	if got, err := c.Call(context.Background(), fn, nil); err != nil || string(got) != "ok" {
		t.Fatalf("after errors: %q %v", got, err)
	}
	if l := logs.lines(t, "panicked"); len(l) != 1 || l[0].Severity != 'E' {
		t.Errorf("want one E line for the panic, got %q", logs.buf.String())
	}
}

// Calls on one connection run at once, and each response goes out when its
// handler finishes, not in request order.
func TestServerConcurrentPerConnection(t *testing.T) {
	const n = 8
	s := NewServer(nil)
	var arrived sync.WaitGroup
	arrived.Add(n)
	allIn := make(chan struct{})
	go func() { arrived.Wait(); close(allIn) }()
	releaseSlow := make(chan struct{})
	barrier := mustRegister(t, s, "test::Barrier", func(ctx context.Context, req *Request) ([]byte, error) {
		arrived.Done()
		select {
		case <-allIn:
			return req.Body, nil
		case <-time.After(5 * time.Second):
			return nil, errors.New("handlers ran one at a time")
		}
	})
	slow := mustRegister(t, s, "test::Slow", func(ctx context.Context, req *Request) ([]byte, error) {
		<-releaseSlow
		return []byte("slow"), nil
	})
	fast := mustRegister(t, s, "test::Fast", func(ctx context.Context, req *Request) ([]byte, error) {
		return []byte("fast"), nil
	})
	addr := startServer(t, s)
	c := NewClient(addr, nil)
	defer c.Close()
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			body := []byte{byte(i)}
			if got, err := c.Call(context.Background(), barrier, body); err != nil || !bytes.Equal(got, body) {
				t.Errorf("barrier call %d: %q %v", i, got, err)
			}
		})
	}
	wg.Wait()

	conn := rawDial(t, addr)
	sendReq(t, conn, 1, slow, nil)
	sendReq(t, conn, 2, fast, nil)
	if h, body := recvResp(t, conn); h.Seq != 2 || string(body) != "fast" {
		t.Fatalf("first response %+v %q, want the fast call's", h, body)
	}
	close(releaseSlow)
	if h, body := recvResp(t, conn); h.Seq != 1 || string(body) != "slow" {
		t.Fatalf("second response %+v %q, want the slow call's", h, body)
	}
}

// MaxInFlight bounds the handlers one connection runs; reading resumes as
// they finish.
func TestServerMaxInFlight(t *testing.T) {
	var running, peak atomic.Int32
	s := NewServer(&ServerOptions{MaxInFlight: 2})
	fn := mustRegister(t, s, "test::Busy", func(ctx context.Context, req *Request) ([]byte, error) {
		n := running.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		time.Sleep(5 * time.Millisecond)
		running.Add(-1)
		return nil, nil
	})
	c := NewClient(startServer(t, s), nil)
	defer c.Close()
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			if _, err := c.Call(context.Background(), fn, nil); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if p := peak.Load(); p != 2 {
		t.Fatalf("peak %d handlers at once, want 2", p)
	}
}

func TestServerBadInput(t *testing.T) {
	var logs logBuffer
	var calls atomic.Int32
	s := NewServer(&ServerOptions{MaxMessageLen: 1024, Logger: logs.logger()})
	fn := mustRegister(t, s, "test::Echo", func(ctx context.Context, req *Request) ([]byte, error) {
		calls.Add(1)
		return req.Body, nil
	})
	addr := startServer(t, s)

	t.Run("too large", func(t *testing.T) {
		conn := rawDial(t, addr)
		sendReq(t, conn, 1, fn, bytes.Repeat([]byte("x"), 2000))
		h, body := recvResp(t, conn)
		code, msg, err := decodeErrorBody(h.ErrCode, body)
		if h.Seq != 1 || code != ErrcMessageTooLarge || err != nil || !strings.Contains(msg, "limit of 1024") {
			t.Fatalf("got %+v %v %q %v", h, code, msg, err)
		}
		// The oversized body was skipped, so framing holds.
		sendReq(t, conn, 2, fn, []byte("small"))
		if h, body := recvResp(t, conn); h.Seq != 2 || string(body) != "small" {
			t.Fatalf("after the oversized request: %+v %q", h, body)
		}
	})
	t.Run("garbage magic", func(t *testing.T) {
		conn := rawDial(t, addr)
		conn.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
		expectClosed(t, conn)
	})
	t.Run("newer version", func(t *testing.T) {
		conn := rawDial(t, addr)
		conn.Write(RequestHeader{Magic: Magic, Version: 1, FunctionID: fn}.AppendTo(nil))
		expectClosed(t, conn)
	})
	t.Run("serialize type", func(t *testing.T) {
		conn := rawDial(t, addr)
		conn.Write(RequestHeader{Magic: Magic, SerializeType: 1, FunctionID: fn}.AppendTo(nil))
		expectClosed(t, conn)
	})
	t.Run("truncated frame", func(t *testing.T) {
		conn := rawDial(t, addr)
		h := RequestHeader{Magic: Magic, FunctionID: fn, Length: 100}
		conn.Write(append(h.AppendTo(nil), "half"...))
		conn.(*net.TCPConn).CloseWrite()
		expectClosed(t, conn)
	})
	if n := calls.Load(); n != 1 {
		t.Errorf("handler ran %d times; only the one good request should reach it", n)
	}
	for _, what := range []string{"bad coro_rpc magic", "unsupported coro_rpc version", "serialize_type 1", "unexpected EOF"} {
		if l := logs.lines(t, what); len(l) != 1 || l[0].Severity != 'W' {
			t.Errorf("want one W line about %q; log:\n%s", what, logs.buf.String())
		}
	}
}

// A store sharing one port between coro_rpc and HTTP/2 peeks at the first
// byte and hands coro_rpc connections over with WithReader.
func TestServeConnAfterPeek(t *testing.T) {
	s := NewServer(nil)
	fn := mustRegister(t, s, "test::Echo", func(ctx context.Context, req *Request) ([]byte, error) {
		return req.Body, nil
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	sniffed := make(chan string, 2)
	var served sync.WaitGroup
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			br := bufio.NewReader(nc)
			first, err := br.Peek(1)
			if err != nil {
				nc.Close()
				continue
			}
			if first[0] != Magic {
				sniffed <- "other"
				nc.Close()
				continue
			}
			sniffed <- "coro_rpc"
			served.Go(func() {
				if err := s.ServeConn(WithReader(nc, br)); err != nil {
					t.Errorf("ServeConn: %v", err)
				}
			})
		}
	}()
	c := NewClient(ln.Addr().String(), nil)
	defer c.Close()
	if got, err := c.Call(context.Background(), fn, []byte("peeked")); err != nil || string(got) != "peeked" {
		t.Fatalf("got %q %v", got, err)
	}
	h2 := rawDial(t, ln.Addr().String())
	h2.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))
	if a, b := <-sniffed, <-sniffed; a != "coro_rpc" || b != "other" {
		t.Fatalf("sniffed %s, %s", a, b)
	}
	within(t, 5*time.Second, "Close", func() { s.Close() })
	within(t, 5*time.Second, "ServeConn", served.Wait)
}

func TestServerShutdownGraceful(t *testing.T) {
	leaks := checkGoroutines(t)
	s := NewServer(nil)
	started := make(chan struct{})
	release := make(chan struct{})
	fn := mustRegister(t, s, "test::Slow", func(ctx context.Context, req *Request) ([]byte, error) {
		close(started)
		<-release
		return []byte("finished"), ctx.Err()
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	c := NewClient(addr, nil)
	res := make(chan error, 1)
	go func() {
		got, err := c.Call(context.Background(), fn, nil)
		if err == nil && string(got) != "finished" {
			err = errors.New("wrong body " + string(got))
		}
		res <- err
	}()
	<-started
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		shut <- s.Shutdown(ctx)
	}()
	if err := <-served; !errors.Is(err, ErrClosed) {
		t.Fatalf("Serve: %v", err)
	}
	if nc, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		nc.Close()
		t.Fatal("listener still accepting during shutdown")
	}
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned %v with a call in flight", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	if err := <-res; err != nil {
		t.Fatalf("in-flight call: %v", err)
	}
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	a, b := net.Pipe()
	defer b.Close()
	if err := s.ServeConn(a); !errors.Is(err, ErrClosed) {
		t.Fatalf("ServeConn after Shutdown: %v", err)
	}
	c.Close()
	leaks()
}

// Close cancels the calls in flight; their handlers' answers still reach
// the clients, so a call fails with the reason.
func TestServerCloseCancelsHandlers(t *testing.T) {
	leaks := checkGoroutines(t)
	s := NewServer(nil)
	started := make(chan struct{})
	fn := mustRegister(t, s, "test::Wait", func(ctx context.Context, req *Request) ([]byte, error) {
		close(started)
		<-ctx.Done()
		return nil, ctx.Err()
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	c := NewClient(ln.Addr().String(), nil)
	res := make(chan error, 1)
	go func() {
		_, err := c.Call(context.Background(), fn, nil)
		res <- err
	}()
	<-started
	within(t, 5*time.Second, "Close", func() { s.Close() })
	var re *RPCError
	if err := <-res; !errors.As(err, &re) || re.Code != ErrcRPCThrowException || re.Message != "context canceled" {
		t.Fatalf("in-flight call: %v", err)
	}
	c.Close()
	leaks()
}

// When Shutdown's grace runs out, connections are closed under calls that
// are still running, and their clients learn the connection was lost.
func TestServerShutdownTimeout(t *testing.T) {
	s := NewServer(nil)
	started := make(chan struct{})
	release := make(chan struct{})
	defer close(release)
	fn := mustRegister(t, s, "test::Stuck", func(ctx context.Context, req *Request) ([]byte, error) {
		close(started)
		<-release // ignores ctx
		return nil, nil
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	c := NewClient(ln.Addr().String(), nil)
	defer c.Close()
	res := make(chan error, 1)
	go func() {
		_, err := c.Call(context.Background(), fn, nil)
		res <- err
	}()
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	var err2 error
	within(t, 5*time.Second, "Shutdown", func() { err2 = s.Shutdown(ctx) })
	if !errors.Is(err2, context.DeadlineExceeded) {
		t.Fatalf("Shutdown: %v", err2)
	}
	if err := <-res; !errors.Is(err, ErrConnectionLost) {
		t.Fatalf("in-flight call: %v", err)
	}
}

func TestRegisterTwice(t *testing.T) {
	s := NewServer(nil)
	h := func(ctx context.Context, req *Request) ([]byte, error) { return nil, nil }
	if _, err := s.Register("a::B", h); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Register("a::B", h); err == nil || !strings.Contains(err.Error(), `"a::B"`) {
		t.Fatalf("second Register: %v", err)
	}
}

// Recycle gets back each body a handler returned, after it was written:
// the client has its bytes by then, and a body the handler reuses for the
// next answer does not change an answer already sent.
func TestServerRecyclesBodies(t *testing.T) {
	var mu sync.Mutex
	var free [][]byte
	recycled := 0
	s := NewServer(&ServerOptions{Recycle: func(b []byte) {
		mu.Lock()
		free = append(free, b)
		recycled++
		mu.Unlock()
	}})
	n := 0
	id := mustRegister(t, s, "test::Count", func(ctx context.Context, req *Request) ([]byte, error) {
		mu.Lock()
		defer mu.Unlock()
		var b []byte
		if len(free) > 0 {
			b, free = free[len(free)-1][:0], free[:len(free)-1]
		}
		n++
		return fmt.Appendf(b, "answer %d", n), nil
	})
	failing := mustRegister(t, s, "test::Fail", func(ctx context.Context, req *Request) ([]byte, error) {
		return nil, errors.New("no")
	})
	addr := startServer(t, s)
	conn := rawDial(t, addr)
	for i := 1; i <= 5; i++ {
		sendReq(t, conn, uint32(i), id, nil)
		if h, body := recvResp(t, conn); h.Seq != uint32(i) || string(body) != fmt.Sprintf("answer %d", i) {
			t.Fatalf("call %d: %+v %q", i, h, body)
		}
	}
	sendReq(t, conn, 9, failing, nil)
	if h, _ := recvResp(t, conn); h.ErrCode == 0 {
		t.Fatalf("failing handler answered %+v", h)
	}
	// Every answer's body comes back (the last one just after its write).
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		got := recycled
		mu.Unlock()
		if got == 5 {
			break
		}
		if got > 5 || time.Now().After(deadline) {
			t.Fatalf("%d bodies recycled, want the 5 answers' (an error answer has none)", got)
		}
		time.Sleep(time.Millisecond)
	}
}

// An inline function runs in the read loop only when nothing else runs or
// waits on the connection: behind a blocked call it still gets its own
// goroutine and answers first, and calls sent back to back are all
// answered.
func TestServerInlineOnlyWhenAlone(t *testing.T) {
	var fastID uint32
	var asked atomic.Int32
	s := NewServer(&ServerOptions{Inline: func(id uint32) bool { asked.Add(1); return id == fastID }})
	fastID = FunctionID("test::Fast")
	releaseSlow := make(chan struct{})
	slow := mustRegister(t, s, "test::Slow", func(ctx context.Context, req *Request) ([]byte, error) {
		<-releaseSlow
		return []byte("slow"), nil
	})
	fast := mustRegister(t, s, "test::Fast", func(ctx context.Context, req *Request) ([]byte, error) {
		return append([]byte("fast"), req.Body...), nil
	})
	addr := startServer(t, s)
	conn := rawDial(t, addr)
	sendReq(t, conn, 1, slow, nil)
	sendReq(t, conn, 2, fast, nil)
	if h, body := recvResp(t, conn); h.Seq != 2 || string(body) != "fast" {
		t.Fatalf("first response %+v %q, want the fast call's", h, body)
	}
	close(releaseSlow)
	if h, body := recvResp(t, conn); h.Seq != 1 || string(body) != "slow" {
		t.Fatalf("second response %+v %q, want the slow call's", h, body)
	}
	for i := range 16 {
		sendReq(t, conn, uint32(10+i), fast, []byte{byte(i)})
	}
	// Answers may come in any order (coro_rpc matches them by seq).
	seen := make(map[uint32]bool)
	for range 16 {
		h, body := recvResp(t, conn)
		i := h.Seq - 10
		if i >= 16 || seen[h.Seq] || string(body) != "fast"+string([]byte{byte(i)}) {
			t.Fatalf("back-to-back calls: answer %+v %q", h, body)
		}
		seen[h.Seq] = true
	}
	c := NewClient(addr, nil)
	defer c.Close()
	for i := range 100 {
		if got, err := c.Call(context.Background(), fast, []byte{byte(i)}); err != nil || string(got) != "fast"+string([]byte{byte(i)}) {
			t.Fatalf("serial call %d: %q %v", i, got, err)
		}
	}
	if asked.Load() < 100 {
		t.Fatalf("Inline asked %d times for 100 serial calls: it must be asked per call", asked.Load())
	}
}

// A sniffed connection whose sniffer read ahead more than the first byte
// (two whole requests and half of a third, sent in one write) is served
// from those bytes first and then from the socket; an answer larger than
// the socket takes at once goes out whole; a read deadline still ends an
// idle connection's read (Close).
func TestServeConnReadAheadAndLargeAnswer(t *testing.T) {
	s := NewServer(nil)
	fn := mustRegister(t, s, "test::Echo", func(ctx context.Context, req *Request) ([]byte, error) {
		if string(req.Body) == "big" {
			return bytes.Repeat([]byte("0123456789abcdef"), 1<<18), nil // 4 MiB
		}
		return req.Body, nil
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c := rawDial(t, ln.Addr().String())
	var wire []byte
	for i, body := range []string{"one", "two", "three"} {
		h := RequestHeader{Magic: Magic, Version: Version, Seq: uint32(i + 1), FunctionID: fn, Length: uint32(len(body))}
		wire = append(h.AppendTo(wire), body...)
	}
	cut := len(wire) - 3
	if _, err := c.Write(wire[:cut]); err != nil {
		t.Fatal(err)
	}
	nc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(nc)
	for br.Buffered() < cut {
		if _, err := br.Peek(br.Buffered() + 1); err != nil {
			t.Fatal(err)
		}
	}
	served := make(chan error, 1)
	go func() { served <- s.ServeConn(WithReader(nc, br)) }()
	time.Sleep(20 * time.Millisecond)
	if _, err := c.Write(wire[cut:]); err != nil {
		t.Fatal(err)
	}
	h := RequestHeader{Magic: Magic, Version: Version, Seq: 4, FunctionID: fn, Length: 3}
	if _, err := c.Write(append(h.AppendTo(nil), "big"...)); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	time.Sleep(50 * time.Millisecond) // the big answer fills the socket
	got := map[uint32]string{}
	for range 4 {
		rh, body, _, err := ReadResponse(c, 1<<30)
		if err != nil {
			t.Fatalf("answers so far %d: %v", len(got), err)
		}
		if rh.Seq == 4 && (len(body) != 4<<20 || !bytes.Equal(body[len(body)-16:], []byte("0123456789abcdef"))) {
			t.Fatalf("big answer: %d bytes", len(body))
		}
		got[rh.Seq] = string(body[:min(len(body), 5)])
	}
	if got[1] != "one" || got[2] != "two" || got[3] != "three" || got[4] != "01234" {
		t.Fatalf("answers by seq: %v", got)
	}
	within(t, 5*time.Second, "Close", func() { s.Close() })
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("ServeConn: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("ServeConn did not return after Close")
	}
}

// A call of a CancelOnHangup function sees its context end when its
// client hangs up, run inline or not (inline: when its handler waits on
// Done, or asks Err); another function's call runs on (coro_rpc's way).
func TestServerCancelOnHangup(t *testing.T) {
	hangup := map[uint32]bool{FunctionID("t::hup"): true, FunctionID("t::inline-done"): true, FunctionID("t::inline-err"): true}
	inline := map[uint32]bool{FunctionID("t::inline-done"): true, FunctionID("t::inline-err"): true, FunctionID("t::inline-plain"): true}
	s := NewServer(&ServerOptions{
		CancelOnHangup: func(id uint32) bool { return hangup[id] },
		Inline:         func(id uint32) bool { return inline[id] },
	})
	ended := make(chan string, 2)
	wait := func(name string) Handler {
		return func(ctx context.Context, _ *Request) ([]byte, error) {
			select {
			case <-ctx.Done():
				ended <- name
			case <-time.After(time.Second):
				ended <- name + " ran on"
			}
			return nil, nil
		}
	}
	poll := func(name string) Handler {
		return func(ctx context.Context, _ *Request) ([]byte, error) {
			for t0 := time.Now(); time.Since(t0) < time.Second; time.Sleep(time.Millisecond) {
				if ctx.Err() != nil {
					ended <- name
					return nil, nil
				}
			}
			ended <- name + " ran on"
			return nil, nil
		}
	}
	hup := mustRegister(t, s, "t::hup", wait("hup"))
	plain := mustRegister(t, s, "t::plain", wait("plain"))
	inDone := mustRegister(t, s, "t::inline-done", wait("inline-done"))
	inErr := mustRegister(t, s, "t::inline-err", poll("inline-err"))
	inPlain := mustRegister(t, s, "t::inline-plain", poll("inline-plain"))
	addr := startServer(t, s)
	for _, tc := range []struct {
		fn   uint32
		want string
	}{{hup, "hup"}, {plain, "plain ran on"}, {inDone, "inline-done"}, {inErr, "inline-err"}, {inPlain, "inline-plain ran on"}} {
		c := rawDial(t, addr)
		sendReq(t, c, 1, tc.fn, []byte("x"))
		time.Sleep(50 * time.Millisecond)
		c.Close()
		select {
		case got := <-ended:
			if got != tc.want {
				t.Fatalf("client hung up under a call: %q, want %q", got, tc.want)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("handler never returned")
		}
	}
	// An inline call that watched its connection gives the reader back:
	// the connection serves the next call.
	c := rawDial(t, addr)
	sendReq(t, c, 1, inDone, []byte("x"))
	if got := <-ended; got != "inline-done ran on" {
		t.Fatalf("inline call of a client that stayed: %q", got)
	}
	if h, _ := recvResp(t, c); h.Seq != 1 || h.ErrCode != 0 {
		t.Fatalf("answer %+v", h)
	}
	sendReq(t, c, 2, inErr, []byte("x"))
	time.Sleep(50 * time.Millisecond)
	c.Close()
	if got := <-ended; got != "inline-err" {
		t.Fatalf("second call on the connection, client gone: %q", got)
	}
}

// Connected follows the connection: false before the first call, true
// after it, false once the server closed it, with no call in between.
func TestClientConnected(t *testing.T) {
	s := NewServer(nil)
	fn := mustRegister(t, s, "t::echo", func(_ context.Context, r *Request) ([]byte, error) { return r.Body, nil })
	addr := startServer(t, s)
	c := NewClient(addr, nil)
	defer c.Close()
	if c.Connected() {
		t.Fatal("Connected before any call")
	}
	if _, err := c.Call(context.Background(), fn, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if !c.Connected() {
		t.Fatal("not Connected after a call")
	}
	s.Close()
	deadline := time.Now().Add(5 * time.Second)
	for c.Connected() {
		if time.Now().After(deadline) {
			t.Fatal("still Connected 5 s after the server closed")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
