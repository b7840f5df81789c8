package store

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	pb "github.com/kvcache-ops/mc/pkg/store/storepb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// The staged read's own wire. A one-key disk get is two round trips, the
// master's lookup and the node's BatchGetStaged; through gRPC the second
// cost 290 us more than the node's own work on this workplace's loaded
// 2-core VM (send to handler 117 us, handler to the reader's return
// 169 us, of a 1 MiB get of 1180 us: each way goes through gRPC's writer
// and reader goroutines, asleep after the pause the disk read makes). A
// plain request and answer on a TCP connection, written and read by the
// caller's goroutine and served by one goroutine per connection, took
// 30-50 us against gRPC's 235-295 in the same process after such a
// pause (a loop timed during the change, not kept).
//
// The connection is the TierRead service's own (same address): a client
// opens with tierWireHello (24 bytes, as long as HTTP/2's preface, so a
// node of a build before this wire, whose gRPC server reads that many,
// refuses it at once); the node answers the same 24 bytes, and the
// connection then carries requests and answers in turn:
//
//	request: type (1 byte, tierFrameGet), timeout in ms (uint32 LE),
//	         payload length (uint32 LE), payload (BatchGetStagedRequest)
//	answer:  gRPC status code (1 byte, 0 = OK), payload length (uint32
//	         LE), payload (BatchGetStagedResponse, or the error message)
//
// Other connections (gRPC's preface) go to the gRPC server. Only the
// unary staged read uses this wire; the streamed one, ReleaseStaged and
// any reader of another build keep gRPC.
const tierWireHello = "MC-TIER-READ/1\r\n\r\n\x00\x00\x00\x00\x00\x00"

const (
	tierFrameGet       = 1
	tierRequestHeader  = 9
	tierResponseHeader = 5
)

func encodeTierRequest(dst []byte, typ byte, timeout time.Duration, payload []byte) []byte {
	ms := min(max(timeout.Milliseconds(), 1), int64(^uint32(0)))
	dst = append(dst, typ)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(ms))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(payload)))
	return append(dst, payload...)
}

// decodeTierRequestHeader reads a request's header; the payload length
// is bounded by MaxMsgSize.
func decodeTierRequestHeader(b []byte) (typ byte, timeout time.Duration, n int, err error) {
	if len(b) < tierRequestHeader {
		return 0, 0, 0, fmt.Errorf("staged read request header of %d bytes, want %d", len(b), tierRequestHeader)
	}
	typ = b[0]
	timeout = time.Duration(binary.LittleEndian.Uint32(b[1:5])) * time.Millisecond
	l := binary.LittleEndian.Uint32(b[5:9])
	switch {
	case typ != tierFrameGet:
		return typ, 0, 0, fmt.Errorf("staged read request of type %d (only %d is known)", typ, tierFrameGet)
	case l > MaxMsgSize:
		return typ, 0, 0, fmt.Errorf("staged read request of %d bytes (at most %d)", l, MaxMsgSize)
	case timeout == 0:
		return typ, 0, 0, errors.New("staged read request without a timeout")
	}
	return typ, timeout, int(l), nil
}

func encodeTierResponse(dst []byte, code codes.Code, payload []byte) []byte {
	dst = append(dst, byte(code))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(payload)))
	return append(dst, payload...)
}

// decodeTierResponseHeader reads an answer's header; the payload length
// is bounded by MaxMsgSize.
func decodeTierResponseHeader(b []byte) (code codes.Code, n int, err error) {
	if len(b) < tierResponseHeader {
		return 0, 0, fmt.Errorf("staged read answer header of %d bytes, want %d", len(b), tierResponseHeader)
	}
	l := binary.LittleEndian.Uint32(b[1:5])
	if l > MaxMsgSize {
		return 0, 0, fmt.Errorf("staged read answer of %d bytes (at most %d)", l, MaxMsgSize)
	}
	return codes.Code(b[0]), int(l), nil
}

// tierMux is the TierRead service's listener: it hands the gRPC server
// (Accept) the connections that are not the staged read's own wire and
// serves those that are. Close (the gRPC server's Stop) closes the
// listener and the wire's connections.
type tierMux struct {
	ln    net.Listener
	serve func(ctx context.Context, c net.Conn)
	conns chan net.Conn
	ctx   context.Context
	stop  context.CancelFunc
	once  sync.Once

	mu   sync.Mutex
	open map[net.Conn]struct{}
}

func newTierMux(ln net.Listener, serve func(ctx context.Context, c net.Conn)) *tierMux {
	m := &tierMux{ln: ln, serve: serve, conns: make(chan net.Conn), open: make(map[net.Conn]struct{})}
	m.ctx, m.stop = context.WithCancel(context.Background())
	go m.run()
	return m
}

func (m *tierMux) run() {
	var backoff time.Duration
	for {
		c, err := m.ln.Accept()
		if err != nil {
			if m.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				m.Close()
				return
			}
			// Out of descriptors and the like: accept again after a
			// pause, as net/http and gRPC's own Serve do.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			select {
			case <-time.After(backoff):
			case <-m.ctx.Done():
			}
			continue
		}
		backoff = 0
		if !m.track(c) {
			c.Close()
			return
		}
		go m.sniff(c)
	}
}

// track counts c as open; false once closed.
func (m *tierMux) track(c net.Conn) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ctx.Err() != nil {
		return false
	}
	m.open[c] = struct{}{}
	return true
}

func (m *tierMux) untrack(c net.Conn) {
	m.mu.Lock()
	delete(m.open, c)
	m.mu.Unlock()
}

// sniff reads a connection's first bytes: the wire's hello, or the
// start of gRPC's preface, which the gRPC server reads again.
func (m *tierMux) sniff(c net.Conn) {
	var b [len(tierWireHello)]byte
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := io.ReadFull(c, b[:])
	_ = c.SetReadDeadline(time.Time{})
	if err == nil && string(b[:]) == tierWireHello {
		defer m.untrack(c)
		defer c.Close()
		m.serve(m.ctx, c)
		return
	}
	m.untrack(c)
	if n == 0 {
		c.Close()
		return
	}
	select {
	case m.conns <- &replayConn{Conn: c, pre: b[:n]}:
	case <-m.ctx.Done():
		c.Close()
	}
}

func (m *tierMux) Accept() (net.Conn, error) {
	select {
	case c := <-m.conns:
		return c, nil
	case <-m.ctx.Done():
		return nil, net.ErrClosed
	}
}

func (m *tierMux) Close() error {
	m.once.Do(func() {
		m.mu.Lock()
		m.stop()
		for c := range m.open {
			c.Close()
		}
		m.mu.Unlock()
		_ = m.ln.Close()
	})
	return nil
}

func (m *tierMux) Addr() net.Addr { return m.ln.Addr() }

// replayConn is a connection whose first bytes were read already.
type replayConn struct {
	net.Conn
	pre []byte
}

func (c *replayConn) Read(p []byte) (int, error) {
	if len(c.pre) > 0 {
		n := copy(p, c.pre)
		c.pre = c.pre[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// serveConn answers one reader's staged reads on c in turn, until it
// closes or the node stops. A read runs under the timeout its request
// carries (as gRPC's deadline would); a reader gone meanwhile leaves its
// batch to the TTL, as on gRPC.
func (s *tierReadServer) serveConn(ctx context.Context, c net.Conn) {
	if _, err := c.Write([]byte(tierWireHello)); err != nil {
		return
	}
	var hdr [tierRequestHeader]byte
	var in, out []byte
	for {
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		_, timeout, n, err := decodeTierRequestHeader(hdr[:])
		if err != nil {
			// The stream cannot be trusted past a bad header.
			_, _ = c.Write(encodeTierResponse(nil, codes.InvalidArgument, []byte(err.Error())))
			return
		}
		if cap(in) < n {
			in = make([]byte, n)
		}
		if _, err := io.ReadFull(c, in[:n]); err != nil {
			return
		}
		out = s.answer(ctx, timeout, in[:n], out[:0])
		if _, err := c.Write(out); err != nil {
			return
		}
	}
}

// answer serves one request's payload and returns the encoded answer.
func (s *tierReadServer) answer(ctx context.Context, timeout time.Duration, payload, out []byte) []byte {
	var req pb.BatchGetStagedRequest
	if err := proto.Unmarshal(payload, &req); err != nil {
		return encodeTierResponse(out, codes.InvalidArgument, []byte(fmt.Sprintf("staged read request: %v", err)))
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	resp, err := s.getStaged(rctx, &req, nil)
	cancel()
	if err != nil {
		st, _ := status.FromError(err)
		return encodeTierResponse(out, st.Code(), []byte(st.Message()))
	}
	b, err := proto.Marshal(resp)
	if err != nil {
		return encodeTierResponse(out, codes.Internal, []byte(fmt.Sprintf("staged read answer: %v", err)))
	}
	return encodeTierResponse(out, codes.OK, b)
}

// errNoTierWire: the node does not speak the staged read's own wire.
var errNoTierWire = errors.New("node does not serve the staged read wire")

// tierWireConns are a client's idle connections of the staged read's
// own wire per node, and the nodes that do not speak it.
type tierWireConns struct {
	mu     sync.Mutex
	idle   map[string][]net.Conn
	legacy map[string]bool
	closed bool
	// exchanges counts the staged reads answered on the wire.
	exchanges atomic.Uint64
}

// maxIdleTierConns bounds the idle connections kept per node: one per
// reader that had a read under way at once, up to this.
const maxIdleTierConns = 16

func (w *tierWireConns) isLegacy(svc string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.legacy[svc]
}

// take returns an idle connection to svc, or nil.
func (w *tierWireConns) take(svc string) net.Conn {
	w.mu.Lock()
	defer w.mu.Unlock()
	cs := w.idle[svc]
	if len(cs) == 0 {
		return nil
	}
	c := cs[len(cs)-1]
	w.idle[svc] = cs[:len(cs)-1]
	return c
}

func (w *tierWireConns) put(svc string, c net.Conn) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed || len(w.idle[svc]) >= maxIdleTierConns {
		c.Close()
		return
	}
	if w.idle == nil {
		w.idle = make(map[string][]net.Conn)
	}
	w.idle[svc] = append(w.idle[svc], c)
}

func (w *tierWireConns) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	for svc, cs := range w.idle {
		for _, c := range cs {
			c.Close()
		}
		delete(w.idle, svc)
	}
}

// dial opens a connection to svc and says hello; errNoTierWire when the
// node answers otherwise (a build before the wire, which then is asked
// through gRPC from now on).
func (w *tierWireConns) dial(ctx context.Context, svc string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", svc)
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	var b [len(tierWireHello)]byte
	_, err = c.Write([]byte(tierWireHello))
	if err == nil {
		_, err = io.ReadFull(c, b[:])
	}
	switch {
	case err == nil && string(b[:]) == tierWireHello:
		if !stop() {
			c.Close()
			return nil, ctx.Err()
		}
		return c, nil
	case ctx.Err() != nil:
		c.Close()
		return nil, ctx.Err()
	}
	c.Close()
	// Connected, and answered otherwise or closed: not this wire.
	w.mu.Lock()
	if w.legacy == nil {
		w.legacy = make(map[string]bool)
	}
	w.legacy[svc] = true
	w.mu.Unlock()
	return nil, errNoTierWire
}

// batchGetStaged asks node svc for req on the staged read's own wire:
// on an idle connection (once more on a new one if the node had closed
// it: a node restarted since), else a new one. A node of a build before
// the wire is asked through cl (gRPC). Errors from the node come back as
// gRPC status errors, as cl's would.
func (t *tierConns) batchGetStaged(ctx context.Context, svc string, cl pb.TierReadClient, req *pb.BatchGetStagedRequest) (*pb.BatchGetStagedResponse, error) {
	w := &t.wire
	if w.isLegacy(svc) {
		return cl.BatchGetStaged(ctx, req)
	}
	payload, err := proto.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("staged read request: %w", err)
	}
	timeout := DefaultRPCTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
	}
	frame := encodeTierRequest(nil, tierFrameGet, timeout, payload)
	for pooled := true; ; pooled = false {
		var c net.Conn
		if pooled {
			c = w.take(svc)
		}
		if c == nil {
			pooled = false
			if c, err = w.dial(ctx, svc); errors.Is(err, errNoTierWire) {
				return cl.BatchGetStaged(ctx, req)
			} else if err != nil {
				return nil, status.Error(codes.Unavailable, fmt.Sprintf("connect to %s: %v", svc, err))
			}
		}
		resp, answered, err := exchangeTier(ctx, c, frame)
		switch {
		case err == nil || answered:
			// The connection is in step: the next read may use it.
			w.put(svc, c)
			if err == nil {
				w.exchanges.Add(1)
			}
			return resp, err
		}
		c.Close()
		if !pooled || ctx.Err() != nil {
			return nil, status.Error(codes.Unavailable, fmt.Sprintf("staged read from %s: %v", svc, err))
		}
	}
}

// exchangeTier sends frame on c and reads the answer. answered says the
// node answered (err is then its status error).
func exchangeTier(ctx context.Context, c net.Conn, frame []byte) (resp *pb.BatchGetStagedResponse, answered bool, err error) {
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	defer func() {
		if !stop() {
			// The deadline was set (or is being): the connection is
			// not reused.
			answered, err = false, errors.Join(err, ctx.Err())
		}
	}()
	if _, err := c.Write(frame); err != nil {
		return nil, false, err
	}
	var hdr [tierResponseHeader]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return nil, false, err
	}
	code, n, err := decodeTierResponseHeader(hdr[:])
	if err != nil {
		return nil, false, err
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(c, b); err != nil {
		return nil, false, err
	}
	if code != codes.OK {
		return nil, true, status.Error(code, string(b))
	}
	resp = new(pb.BatchGetStagedResponse)
	if err := proto.Unmarshal(b, resp); err != nil {
		return nil, false, fmt.Errorf("staged read answer: %w", err)
	}
	return resp, true, nil
}
