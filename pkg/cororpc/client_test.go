package cororpc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// The client must put on the wire exactly what Mooncake's client sent, call
// after call on one connection (sequence numbers from 0), and hand back the
// master's bodies untouched.
func TestClientReplaysCapturedSessions(t *testing.T) {
	caps := loadCaptures(t)
	// Lines 1-4 and 11-18 are each one connection with seqs 0, 1, 2, ...
	for _, session := range [][]capture{caps[0:4], caps[10:18]} {
		rs := newRawServer(t)
		c := NewClient(rs.addr(), nil)
		defer c.Close()
		serverErr := make(chan error, 1)
		go func() {
			conn := <-rs.conns
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
			for _, cp := range session {
				reqHdr, reqBody, respHdr, respBody := cp.bytes(t)
				want := append(reqHdr, reqBody...)
				got := make([]byte, len(want))
				if _, err := io.ReadFull(conn, got); err != nil {
					serverErr <- fmt.Errorf("%s: read: %w", cp.Call, err)
					return
				}
				if !bytes.Equal(got, want) {
					serverErr <- fmt.Errorf("%s: client sent\n%x\nMooncake's client sent\n%x", cp.Call, got, want)
					return
				}
				if _, err := conn.Write(append(respHdr, respBody...)); err != nil {
					serverErr <- err
					return
				}
			}
			serverErr <- nil
		}()
		for _, cp := range session {
			_, reqBody, _, respBody := cp.bytes(t)
			got, err := c.Call(context.Background(), cp.fnID(t), reqBody)
			if err != nil {
				t.Fatalf("%s: %v", cp.Call, err)
			}
			if !bytes.Equal(got, respBody) {
				t.Fatalf("%s: body %x, want %x", cp.Call, got, respBody)
			}
		}
		if err := <-serverErr; err != nil {
			t.Fatal(err)
		}
	}
}

func TestClientConcurrentCallsOutOfOrder(t *testing.T) {
	const n = 64
	rs := newRawServer(t)
	c := NewClient(rs.addr(), nil)
	defer c.Close()
	go func() {
		conn := <-rs.conns
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		type req struct {
			seq  uint32
			body []byte
		}
		// Answer only once every call is in flight, last first.
		var reqs []req
		seen := map[uint32]bool{}
		for range n {
			h, body, _, err := ReadRequest(conn, 0)
			if err != nil {
				t.Errorf("raw server: %v", err)
				return
			}
			if seen[h.Seq] {
				t.Errorf("seq %d used twice", h.Seq)
			}
			seen[h.Seq] = true
			reqs = append(reqs, req{h.Seq, body})
		}
		for i := len(reqs) - 1; i >= 0; i-- {
			r := reqs[i]
			writeResp(t, conn, ResponseHeader{Seq: r.seq}, append([]byte("re:"), r.body...))
		}
		// Hold the connection until the client is done.
		_, _ = conn.Read(make([]byte, 1))
	}()
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			body := fmt.Appendf(nil, "call-%d", i)
			got, err := c.Call(context.Background(), 0x1234, body)
			if err != nil {
				t.Errorf("call %d: %v", i, err)
				return
			}
			if want := "re:" + string(body); string(got) != want {
				t.Errorf("call %d got %q, want %q", i, got, want)
			}
		})
	}
	wg.Wait()
	rs.noConnWithin(t, 50*time.Millisecond)
}

func TestClientRPCError(t *testing.T) {
	rs := newRawServer(t)
	c := NewClient(rs.addr(), nil)
	defer c.Close()
	go func() {
		conn := rs.accept(t)
		for _, code := range []Errc{ErrcFunctionNotRegistered, 300} {
			h, _ := readReq(t, conn)
			body, errCode := appendErrorBody(nil, code, "nope")
			writeResp(t, conn, ResponseHeader{Seq: h.Seq, ErrCode: errCode}, body)
		}
		h, _ := readReq(t, conn)
		writeResp(t, conn, ResponseHeader{Seq: h.Seq}, []byte("fine"))
	}()
	for _, code := range []Errc{ErrcFunctionNotRegistered, 300} {
		_, err := c.Call(context.Background(), 0xabcd, nil)
		var re *RPCError
		if !errors.As(err, &re) || re.Code != code || re.Message != "nope" || re.Function != 0xabcd {
			t.Fatalf("got %#v (%v), want RPCError code %d", err, err, code)
		}
	}
	// An error response leaves the connection usable.
	if got, err := c.Call(context.Background(), 1, nil); err != nil || string(got) != "fine" {
		t.Fatalf("after error responses: %q %v", got, err)
	}
	rs.noConnWithin(t, 50*time.Millisecond)
}

// A broken response fails the call with a connection-lost error naming the
// cause, and the call in flight is not retried behind the caller's back.
func TestClientBrokenResponses(t *testing.T) {
	for _, tc := range []struct {
		name  string
		reply func(conn net.Conn, h RequestHeader)
		want  error
	}{
		{"truncated header", func(conn net.Conn, h RequestHeader) {
			conn.Write(ResponseHeader{Magic: Magic, Seq: h.Seq, Length: 4}.AppendTo(nil)[:10])
			conn.Close()
		}, io.ErrUnexpectedEOF},
		{"truncated body", func(conn net.Conn, h RequestHeader) {
			conn.Write(append(ResponseHeader{Magic: Magic, Seq: h.Seq, Length: 100}.AppendTo(nil), "short"...))
			conn.Close()
		}, io.ErrUnexpectedEOF},
		{"garbage magic", func(conn net.Conn, h RequestHeader) {
			conn.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n"))
		}, ErrBadMagic},
		{"newer version", func(conn net.Conn, h RequestHeader) {
			conn.Write(ResponseHeader{Magic: Magic, Version: 1, Seq: h.Seq}.AppendTo(nil))
		}, ErrBadVersion},
		{"beyond the limit", func(conn net.Conn, h RequestHeader) {
			// 1 GiB announced, nothing sent: the client must refuse
			// at once rather than wait for (or allocate) the body.
			conn.Write(ResponseHeader{Magic: Magic, Seq: h.Seq, Length: 1 << 30}.AppendTo(nil))
		}, ErrMessageTooLarge},
		{"peer closes", func(conn net.Conn, h RequestHeader) {
			conn.Close()
		}, io.EOF},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := newRawServer(t)
			c := NewClient(rs.addr(), &Options{MaxMessageLen: 1 << 20, ReconnectBackoff: time.Millisecond})
			defer c.Close()
			go func() {
				conn := rs.accept(t)
				h, _ := readReq(t, conn)
				tc.reply(conn, h)
			}()
			var err error
			within(t, 5*time.Second, "call", func() {
				_, err = c.Call(context.Background(), 7, []byte("x"))
			})
			if !errors.Is(err, ErrConnectionLost) || !errors.Is(err, tc.want) {
				t.Fatalf("err %v, want ErrConnectionLost and %v", err, tc.want)
			}
			// Not retried: no second connection until the next call.
			rs.noConnWithin(t, 100*time.Millisecond)
			go func() {
				conn := rs.accept(t)
				h, _ := readReq(t, conn)
				writeResp(t, conn, ResponseHeader{Seq: h.Seq}, []byte("ok"))
			}()
			if got, err := c.Call(context.Background(), 7, nil); err != nil || string(got) != "ok" {
				t.Fatalf("next call: %q %v", got, err)
			}
		})
	}
}

func TestClientUnknownSeqDropsConnection(t *testing.T) {
	var logs logBuffer
	rs := newRawServer(t)
	c := NewClient(rs.addr(), &Options{Logger: logs.logger(), ReconnectBackoff: time.Millisecond})
	defer c.Close()
	go func() {
		conn := rs.accept(t)
		readReq(t, conn)
		readReq(t, conn)
		writeResp(t, conn, ResponseHeader{Seq: 999}, []byte("stray"))
		_, _ = conn.Read(make([]byte, 1))
	}()
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() {
			_, err := c.Call(context.Background(), 7, []byte{byte(i)})
			if !errors.Is(err, ErrConnectionLost) || !errors.Is(err, ErrUnknownSeq) {
				t.Errorf("call %d: err %v, want ErrConnectionLost and ErrUnknownSeq", i, err)
			}
		})
	}
	within(t, 5*time.Second, "calls", wg.Wait)
	lines := logs.lines(t, "dropping connection")
	if len(lines) != 1 || lines[0].Severity != 'E' || !strings.Contains(string(lines[0].Body), "seq 999") {
		t.Fatalf("want one E line naming seq 999, got %d: %q", len(lines), logs.buf.String())
	}
	go func() {
		conn := rs.accept(t)
		h, _ := readReq(t, conn)
		writeResp(t, conn, ResponseHeader{Seq: h.Seq}, []byte("again"))
	}()
	if got, err := c.Call(context.Background(), 7, nil); err != nil || string(got) != "again" {
		t.Fatalf("after the drop: %q %v", got, err)
	}
}

func TestClientServerStopsAnswering(t *testing.T) {
	rs := newRawServer(t)
	c := NewClient(rs.addr(), &Options{CallTimeout: 150 * time.Millisecond})
	defer c.Close()
	go func() {
		conn := rs.accept(t)
		for {
			if _, _, _, err := ReadRequest(conn, 0); err != nil {
				return // never answers
			}
		}
	}()
	// Deadline from ctx.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	var err error
	within(t, 5*time.Second, "call with a deadline", func() { _, err = c.Call(ctx, 7, nil) })
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v, want DeadlineExceeded", err)
	}
	if took := time.Since(start); took < 90*time.Millisecond {
		t.Fatalf("returned after %v, before its deadline", took)
	}
	// No deadline in ctx: CallTimeout applies.
	within(t, 5*time.Second, "call without a deadline", func() { _, err = c.Call(context.Background(), 7, nil) })
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v, want DeadlineExceeded from CallTimeout", err)
	}
}

// A cancelled call returns at once; its late response is discarded without
// upsetting the connection, which keeps serving other calls.
func TestClientCancelDiscardsLateResponse(t *testing.T) {
	var logs logBuffer
	rs := newRawServer(t)
	c := NewClient(rs.addr(), &Options{Logger: logs.logger()})
	defer c.Close()
	gotFirst := make(chan RequestHeader, 1)
	answerLate := make(chan struct{})
	go func() {
		conn := rs.accept(t)
		h1, _ := readReq(t, conn)
		gotFirst <- h1
		<-answerLate
		writeResp(t, conn, ResponseHeader{Seq: h1.Seq}, []byte("too late"))
		h2, _ := readReq(t, conn)
		writeResp(t, conn, ResponseHeader{Seq: h2.Seq}, []byte("second"))
	}()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := c.Call(ctx, 7, []byte("first"))
		errc <- err
	}()
	<-gotFirst
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err %v, want Canceled", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("cancelled call did not return")
	}
	close(answerLate)
	if got, err := c.Call(context.Background(), 7, []byte("2")); err != nil || string(got) != "second" {
		t.Fatalf("second call: %q %v", got, err)
	}
	rs.noConnWithin(t, 50*time.Millisecond)
	if l := logs.lines(t, ""); len(l) != 0 {
		t.Fatalf("late response logged: %q", logs.buf.String())
	}
}

// A peer that leaves too many abandoned calls unanswered loses the
// connection, so a silent server cannot grow the client's memory.
func TestClientBoundsAbandonedCalls(t *testing.T) {
	const n = maxAbandoned + 1
	rs := newRawServer(t)
	c := NewClient(rs.addr(), nil)
	defer c.Close()
	allSent := make(chan struct{})
	go func() {
		conn := rs.accept(t)
		for range n {
			if _, _, _, err := ReadRequest(conn, 0); err != nil {
				t.Errorf("raw server: %v", err)
				return
			}
		}
		close(allSent)
		_, _ = io.Copy(io.Discard, conn)
	}()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			if _, err := c.Call(ctx, 7, nil); !errors.Is(err, context.Canceled) {
				t.Errorf("err %v, want Canceled", err)
			}
		})
	}
	select {
	case <-allSent:
	case <-time.After(10 * time.Second):
		t.Fatal("calls never all reached the server")
	}
	cancel()
	wg.Wait()
	c.mu.Lock()
	cn := c.conn
	c.mu.Unlock()
	if cn != nil {
		t.Fatalf("connection kept after %d abandoned calls", n)
	}
}

func TestClientAttachment(t *testing.T) {
	rs := newRawServer(t)
	c := NewClient(rs.addr(), nil)
	defer c.Close()
	go func() {
		conn := rs.accept(t)
		h, body, attach, err := ReadRequest(conn, 0)
		if err != nil || string(body) != "b" || string(attach) != "ATTACH" || h.AttachLength != 6 {
			t.Errorf("raw server got %+v %q %q %v", h, body, attach, err)
		}
		rh := ResponseHeader{Magic: Magic, Seq: h.Seq, Length: 2, AttachLength: 3}
		conn.Write(append(rh.AppendTo(nil), "rbRAT"...))
	}()
	body, attach, err := c.CallWithAttachment(context.Background(), 7, []byte("b"), []byte("ATTACH"))
	if err != nil || string(body) != "rb" || string(attach) != "RAT" {
		t.Fatalf("got %q %q %v", body, attach, err)
	}
}

func TestClientReconnectsAfterServerRestart(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	start := func(ln net.Listener, reply string) *Server {
		s := NewServer(nil)
		if _, err := s.Register("test::Echo", func(ctx context.Context, req *Request) ([]byte, error) {
			return []byte(reply), nil
		}); err != nil {
			t.Fatal(err)
		}
		go s.Serve(ln)
		return s
	}
	echo := FunctionID("test::Echo")
	s1 := start(ln, "one")
	c := NewClient(addr, &Options{ReconnectBackoff: 20 * time.Millisecond})
	defer c.Close()
	if got, err := c.Call(context.Background(), echo, nil); err != nil || string(got) != "one" {
		t.Fatalf("before restart: %q %v", got, err)
	}
	s1.Close()
	// The server is gone: calls fail (lost connection or refused dial),
	// each returning rather than hanging.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := c.Call(ctx, echo, nil); err == nil {
		t.Fatal("call succeeded with the server closed")
	}
	ln2, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen again on %s: %v", addr, err)
	}
	s2 := start(ln2, "two")
	defer s2.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, err := c.Call(context.Background(), echo, nil)
		if err == nil {
			if string(got) != "two" {
				t.Fatalf("after restart: %q", got)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no reconnect within 5s: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestClientClose(t *testing.T) {
	leaks := checkGoroutines(t)
	rs := newRawServer(t)
	c := NewClient(rs.addr(), nil)
	go func() {
		conn := rs.accept(t)
		_, _ = io.Copy(io.Discard, conn)
	}()
	errc := make(chan error, 1)
	go func() {
		_, err := c.Call(context.Background(), 7, nil)
		errc <- err
	}()
	// Let the call get in flight before closing.
	deadline := time.Now().Add(5 * time.Second)
	for {
		c.mu.Lock()
		cn := c.conn
		c.mu.Unlock()
		if cn != nil {
			cn.mu.Lock()
			n := len(cn.calls)
			cn.mu.Unlock()
			if n == 1 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("call never got in flight")
		}
		time.Sleep(time.Millisecond)
	}
	within(t, 5*time.Second, "Close", func() { c.Close() })
	if err := <-errc; !errors.Is(err, ErrClosed) || !errors.Is(err, ErrConnectionLost) {
		t.Fatalf("in-flight call: %v, want ErrConnectionLost and ErrClosed", err)
	}
	if _, err := c.Call(context.Background(), 7, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("call after Close: %v", err)
	}
	c.Close() // twice is fine
	rs.ln.Close()
	leaks()
}

func TestDialRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	c, err := Dial(context.Background(), addr, &Options{DialTimeout: time.Second})
	if err == nil {
		c.Close()
		t.Fatal("Dial to a closed port succeeded")
	}
	if !strings.Contains(err.Error(), addr) {
		t.Fatalf("error %q does not name %s", err, addr)
	}
	// A lazy client waits out its backoff between failed dials and gives
	// up with the caller's deadline, naming the last failure.
	lc := NewClient(addr, &Options{ReconnectBackoff: time.Hour})
	defer lc.Close()
	if _, err := lc.Call(context.Background(), 7, nil); err == nil {
		t.Fatal("call to a closed port succeeded")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = lc.Call(ctx, 7, nil)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("second call: %v, want the deadline and the last dial error", err)
	}
}
