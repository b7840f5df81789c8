package store

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/kvcache-ops/mc/pkg/store/storepb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// The staged read wire's frames, byte by byte.
func TestTierWireFrames(t *testing.T) {
	req := encodeTierRequest(nil, tierFrameGet, 1500*time.Millisecond, []byte("abc"))
	want := []byte{1, 0xdc, 0x05, 0, 0, 3, 0, 0, 0, 'a', 'b', 'c'}
	if !bytes.Equal(req, want) {
		t.Fatalf("request frame % x, want % x", req, want)
	}
	typ, timeout, n, err := decodeTierRequestHeader(req)
	if err != nil || typ != tierFrameGet || timeout != 1500*time.Millisecond || n != 3 {
		t.Fatalf("decode request header: %d %s %d %v", typ, timeout, n, err)
	}
	// A timeout below a millisecond is sent as one, never as none.
	if b := encodeTierRequest(nil, tierFrameGet, time.Microsecond, nil); !bytes.Equal(b, []byte{1, 1, 0, 0, 0, 0, 0, 0, 0}) {
		t.Fatalf("request frame with a 1 us timeout: % x", b)
	}
	resp := encodeTierResponse(nil, codes.InvalidArgument, []byte("no"))
	if want := []byte{3, 2, 0, 0, 0, 'n', 'o'}; !bytes.Equal(resp, want) {
		t.Fatalf("answer frame % x, want % x", resp, want)
	}
	code, n, err := decodeTierResponseHeader(resp)
	if err != nil || code != codes.InvalidArgument || n != 2 {
		t.Fatalf("decode answer header: %v %d %v", code, n, err)
	}
	for _, tc := range []struct {
		name string
		b    []byte
		want string
	}{
		{"short", []byte{1, 0, 0}, "header of 3 bytes"},
		{"unknown type", []byte{7, 1, 0, 0, 0, 0, 0, 0, 0}, "type 7"},
		{"too long", []byte{1, 1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff}, "4294967295 bytes"},
		{"no timeout", []byte{1, 0, 0, 0, 0, 0, 0, 0, 0}, "without a timeout"},
	} {
		if _, _, _, err := decodeTierRequestHeader(tc.b); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("request header %s: %v, want an error naming %q", tc.name, err, tc.want)
		}
	}
	if _, _, err := decodeTierResponseHeader([]byte{0, 0xff, 0xff, 0xff, 0xff}); err == nil || !strings.Contains(err.Error(), "4294967295 bytes") {
		t.Errorf("answer of 4 GiB: %v", err)
	}
	if _, _, err := decodeTierResponseHeader([]byte{0}); err == nil {
		t.Error("answer header of 1 byte decoded")
	}
}

func FuzzTierWireHeaders(f *testing.F) {
	f.Add(encodeTierRequest(nil, tierFrameGet, time.Second, []byte("x")))
	f.Add(encodeTierResponse(nil, codes.OK, []byte("x")))
	f.Add([]byte{1, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, timeout, n, err := decodeTierRequestHeader(b); err == nil && (n > MaxMsgSize || n < 0 || timeout <= 0) {
			t.Fatalf("request header % x accepted with %d bytes, timeout %s", b, n, timeout)
		}
		if _, n, err := decodeTierResponseHeader(b); err == nil && (n > MaxMsgSize || n < 0) {
			t.Fatalf("answer header % x accepted with %d bytes", b, n)
		}
	})
}

// fakeTierRead serves the staged read wire on a tierMux: each request's
// keys answered with addresses 1, 2, ...; a key "bad" fails the call
// with InvalidArgument, a key "hang" is never answered.
type fakeTierRead struct {
	pb.UnimplementedTierReadServer
	served atomic.Int64  // requests answered on the wire
	grpc   atomic.Int64  // through gRPC
	hang   chan struct{} // closed when the test ends
	active atomic.Int64  // wire connections being served

	mu    sync.Mutex
	conns []net.Conn // the wire's, for drop
}

// drop closes the node's side of every wire connection, as a node that
// restarted on the same address would have.
func (f *fakeTierRead) drop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.conns {
		c.Close()
	}
	f.conns = nil
}

func (f *fakeTierRead) resp(r *pb.BatchGetStagedRequest) (*pb.BatchGetStagedResponse, error) {
	out := &pb.BatchGetStagedResponse{BatchId: 9, TeEndpoint: "node"}
	for i, k := range r.GetKeys() {
		switch k {
		case "bad":
			return nil, status.Error(codes.InvalidArgument, "INVALID_PARAMS: bad key")
		case "hang":
			<-f.hang
		}
		out.Addrs, out.Codes, out.Messages = append(out.Addrs, uint64(i+1)), append(out.Codes, 0), append(out.Messages, "")
	}
	return out, nil
}

func (f *fakeTierRead) BatchGetStaged(_ context.Context, r *pb.BatchGetStagedRequest) (*pb.BatchGetStagedResponse, error) {
	f.grpc.Add(1)
	return f.resp(r)
}

func (f *fakeTierRead) serveConn(_ context.Context, c net.Conn) {
	f.active.Add(1)
	defer f.active.Add(-1)
	f.mu.Lock()
	f.conns = append(f.conns, c)
	f.mu.Unlock()
	if _, err := c.Write([]byte(tierWireHello)); err != nil {
		return
	}
	for {
		var hdr [tierRequestHeader]byte
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		_, _, n, err := decodeTierRequestHeader(hdr[:])
		if err != nil {
			return
		}
		b := make([]byte, n)
		if _, err := io.ReadFull(c, b); err != nil {
			return
		}
		var r pb.BatchGetStagedRequest
		if err := proto.Unmarshal(b, &r); err != nil {
			return
		}
		resp, err := f.resp(&r)
		var out []byte
		if err != nil {
			st, _ := status.FromError(err)
			out = encodeTierResponse(nil, st.Code(), []byte(st.Message()))
		} else {
			p, _ := proto.Marshal(resp)
			out = encodeTierResponse(nil, codes.OK, p)
		}
		f.served.Add(1)
		if _, err := c.Write(out); err != nil {
			return
		}
	}
}

// startFakeTierRead serves f on a new port, through the wire and gRPC
// (withWire) or through gRPC alone (a node of a build before the wire).
func startFakeTierRead(t *testing.T, f *fakeTierRead, withWire bool) (addr string, stop func()) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.hang = make(chan struct{})
	t.Cleanup(func() { close(f.hang) })
	s := grpc.NewServer()
	pb.RegisterTierReadServer(s, f)
	var lis net.Listener = ln
	if withWire {
		lis = newTierMux(ln, f.serveConn)
	}
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	return ln.Addr().String(), s.Stop
}

func askFake(t *testing.T, tc *tierConns, addr string, keys ...string) (*pb.BatchGetStagedResponse, error) {
	t.Helper()
	cl, err := tc.get(addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req := &pb.BatchGetStagedRequest{TierId: "t", Keys: keys}
	for range keys {
		req.Versions, req.Sizes = append(req.Versions, 1), append(req.Sizes, 1)
	}
	return tc.batchGetStaged(ctx, addr, cl, req)
}

// Staged reads go on the wire, one connection reused read after read;
// the node's errors come back as gRPC's would (the connection stays in
// step); gRPC clients are served on the same port.
func TestTierWireServesAndReuses(t *testing.T) {
	f := &fakeTierRead{}
	addr, _ := startFakeTierRead(t, f, true)
	var tc tierConns
	defer tc.close()
	for i := range 3 {
		resp, err := askFake(t, &tc, addr, "a", "b")
		if err != nil || len(resp.Addrs) != 2 || resp.Addrs[1] != 2 || resp.BatchId != 9 {
			t.Fatalf("read %d: %v %v", i, resp, err)
		}
	}
	if _, err := askFake(t, &tc, addr, "bad"); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "bad key") {
		t.Fatalf("a request the node refuses: %v, want InvalidArgument naming it", err)
	}
	if _, err := askFake(t, &tc, addr, "c"); err != nil {
		t.Fatalf("a read after a refused one: %v", err)
	}
	if f.served.Load() != 5 || f.grpc.Load() != 0 || tc.wire.exchanges.Load() != 4 {
		t.Fatalf("%d answered on the wire, %d through gRPC, %d exchanges counted; want 5, 0, 4", f.served.Load(), f.grpc.Load(), tc.wire.exchanges.Load())
	}
	if n := len(tc.wire.idle[addr]); n != 1 {
		t.Fatalf("%d idle connections after reads one at a time, want 1", n)
	}
	if resp, err := DialTierRead(t, addr).BatchGetStaged(context.Background(), &pb.BatchGetStagedRequest{Keys: []string{"a"}}); err != nil || len(resp.Addrs) != 1 || f.grpc.Load() != 1 {
		t.Fatalf("gRPC on the same port: %v %v", resp, err)
	}
}

// A node of a build before the wire (gRPC alone on its port) refuses the
// hello at once; the reader asks it through gRPC, then and from then on.
func TestTierWireOlderNode(t *testing.T) {
	f := &fakeTierRead{}
	addr, _ := startFakeTierRead(t, f, false)
	var tc tierConns
	defer tc.close()
	start := time.Now()
	for range 2 {
		if resp, err := askFake(t, &tc, addr, "a"); err != nil || len(resp.Addrs) != 1 {
			t.Fatalf("read from an older node: %v %v", resp, err)
		}
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("two reads from an older node took %s: the hello was not refused at once", el)
	}
	if f.grpc.Load() != 2 || !tc.wire.isLegacy(addr) {
		t.Fatalf("%d reads through gRPC (want 2), node marked without the wire: %v", f.grpc.Load(), tc.wire.isLegacy(addr))
	}
}

// An idle connection the node closed (restarted since) costs a new one,
// not the read; a node that does not answer fails the read by the
// caller's deadline; a node gone fails it.
func TestTierWireFailures(t *testing.T) {
	f := &fakeTierRead{}
	addr, stop := startFakeTierRead(t, f, true)
	var tc tierConns
	defer tc.close()
	if _, err := askFake(t, &tc, addr, "a"); err != nil {
		t.Fatal(err)
	}
	// The node's side of the idle connection goes.
	stale := tc.wire.idle[addr][0]
	f.drop()
	if resp, err := askFake(t, &tc, addr, "a"); err != nil || len(resp.Addrs) != 1 || f.served.Load() != 2 {
		t.Fatalf("read after the node dropped its connections: %v %v (%d served)", resp, err, f.served.Load())
	}
	if idle := tc.wire.idle[addr]; len(idle) != 1 || idle[0] == stale {
		t.Fatal("the stale connection was kept")
	}

	cl, _ := tc.get(addr)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := tc.batchGetStaged(ctx, addr, cl, &pb.BatchGetStagedRequest{Keys: []string{"hang"}, Versions: []uint64{1}, Sizes: []uint64{1}})
	if el := time.Since(start); err == nil || el > 2*time.Second {
		t.Fatalf("read the node never answers: %v after %s, want an error at the deadline", err, el)
	}
	stop()
	_, err = askFake(t, &tc, addr, "a")
	if err == nil || status.Code(err) != codes.Unavailable {
		t.Fatalf("read from a node gone: %v, want Unavailable", err)
	}
	if errors.Is(err, errNoTierWire) || tc.wire.isLegacy(addr) {
		t.Fatal("a node gone was taken for one without the wire")
	}
}

// The service's Stop ends the wire's connections, idle or not, and
// their goroutines with them.
func TestTierWireStopClosesConnections(t *testing.T) {
	f := &fakeTierRead{}
	addr, stop := startFakeTierRead(t, f, true)
	var tc tierConns
	defer tc.close()
	if _, err := askFake(t, &tc, addr, "a"); err != nil {
		t.Fatal(err)
	}
	if f.active.Load() != 1 {
		t.Fatalf("%d wire connections served, want 1", f.active.Load())
	}
	stop()
	deadline := time.Now().Add(2 * time.Second)
	for f.active.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("a wire connection still served 2 s after Stop")
		}
		time.Sleep(time.Millisecond)
	}
}
