package master

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kvcache-ops/mc/pkg/cororpc"
	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/mooncake"
	pb "github.com/kvcache-ops/mc/pkg/store/storepb"
	"github.com/kvcache-ops/mc/pkg/structpack"
)

// logBuf collects log lines for assertions.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// rawCall sends one coro_rpc request on a new connection and reads the
// answer.
func rawCall(t *testing.T, addr string, fn uint32, body []byte) (cororpc.ResponseHeader, []byte) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	h := cororpc.RequestHeader{Magic: cororpc.Magic, FunctionID: fn, Length: uint32(len(body)), Seq: 7}
	if _, err := c.Write(append(h.AppendTo(nil), body...)); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	rh, rb, _, err := cororpc.ReadResponse(c, 1<<20)
	if err != nil {
		t.Fatalf("read answer: %v", err)
	}
	return rh, rb
}

// serveShared serves a test master's gRPC and Mooncake wires on a loopback
// port.
func serveShared(t testing.TB, log *slog.Logger) string {
	t.Helper()
	m, _ := newTestMaster(t, Config{Logger: log})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := Serve(m, lis)
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

// TestSharedPortBadInput: garbage, truncated and oversized frames, an
// unknown function id, another version's types and a client that leaves
// mid-call are each answered or dropped alone; the gRPC side and the
// Mooncake side keep serving, and the version mismatch is logged once per
// client and call.
func TestSharedPortBadInput(t *testing.T) {
	var logs logBuf
	addr := serveShared(t, slog.New(slog.NewTextHandler(&logs, nil)))
	send := func(b []byte) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.Write(b)
		// Say no more is coming: the server answers or closes.
		c.(*net.TCPConn).CloseWrite()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		io.Copy(io.Discard, c)
		c.Close()
	}
	// Garbage that is neither protocol, a truncated coro_rpc header, a
	// header announcing more than the limit, then nothing.
	send([]byte("GET / HTTP/1.0\r\n\r\n"))
	send([]byte{cororpc.Magic, 0, 0, 0, 1, 2})
	big := cororpc.RequestHeader{Magic: cororpc.Magic, FunctionID: mooncake.FunctionID("Ping"), Length: 1 << 31}
	send(big.AppendTo(nil))

	// Unknown function id: coro_rpc's function_not_registered, as the
	// real server answers.
	rh, _ := rawCall(t, addr, 0xdeadbeef, nil)
	if cororpc.Errc(rh.ErrCode) != cororpc.ErrcFunctionNotRegistered {
		t.Fatalf("unknown function: err_code %d", rh.ErrCode)
	}

	// Another version's Ping argument (a struct where a pair was): the
	// client gets invalid arguments naming the versions, twice; the log
	// says it once.
	type uuidV2 struct{ A, B, C uint64 }
	body, err := structpack.MarshalArgs(uuidV2{1, 2, 3})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		rh, rb := rawCall(t, addr, mooncake.FunctionID("Ping"), body)
		if cororpc.Errc(rh.ErrCode) != cororpc.ErrcInvalidRPCArguments || !bytes.Contains(rb, []byte("another Mooncake version")) {
			t.Fatalf("another version's Ping: err_code %d, %q", rh.ErrCode, rb)
		}
	}
	if n := strings.Count(logs.String(), "another Mooncake version"); n != 1 {
		t.Fatalf("logged %d times, want once:\n%s", n, logs.String())
	}

	// A client that sends a call and leaves before the answer.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	ping, _ := structpack.MarshalArgs(mooncake.UUID{First: 1, Second: 1})
	h := cororpc.RequestHeader{Magic: cororpc.Magic, FunctionID: mooncake.FunctionID("Ping"), Length: uint32(len(ping))}
	c.Write(append(h.AppendTo(nil), ping...))
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()

	// Both sides still serve.
	_, gc, _ := grpcClient(t, addr)
	roundTrip(t, gc, "after-bad-input")
	mc := mooncake.NewClient(addr, nil)
	defer mc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if v, err := mc.ServiceReady(ctx); err != nil || v != mooncake.StoreVersion {
		t.Fatalf("ServiceReady after bad input: %q, %v", v, err)
	}
	if ok, err := mc.ExistKey(ctx, "after-bad-input"); err != nil || !ok {
		t.Fatalf("ExistKey over the Mooncake wire: %v, %v", ok, err)
	}
}

// TestSharedPortIdleConnections: thousands of connections that never send
// a byte (10,000 where the descriptor limit allows) do not stop either
// protocol from being served.
func TestSharedPortIdleConnections(t *testing.T) {
	addr := serveShared(t, nil)
	n := 10000
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err == nil && int(rl.Cur) < 2*n+500 {
		// Both ends of each connection live in this process.
		n = (int(rl.Cur) - 500) / 2
		t.Logf("descriptor limit %d: %d idle connections", rl.Cur, n)
	}
	if n < 1000 {
		t.Fatalf("descriptor limit %d leaves room for %d connections; the test needs 1000 or more", rl.Cur, n)
	}
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("idle connection %d: %v", len(conns), err)
		}
		conns = append(conns, c)
	}
	t0 := time.Now()
	_, gc, _ := grpcClient(t, addr)
	roundTrip(t, gc, "with-idle")
	mc := mooncake.NewClient(addr, nil)
	defer mc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if ok, err := mc.ExistKey(ctx, "with-idle"); err != nil || !ok {
		t.Fatalf("ExistKey with %d idle connections: %v, %v", n, ok, err)
	}
	t.Logf("%d idle connections; gRPC and coro_rpc calls served in %s", n, time.Since(t0))
}

// TestMooncakeHandlersCoverClientCalls: every call Mooncake's client and
// mooncake_client make in the captures has a handler here.
func TestMooncakeHandlersCoverClientCalls(t *testing.T) {
	s := &mooncakeServer{}
	h := s.handlers()
	for _, call := range []string{"ServiceReady", "GetStorageConfig", "MountSegment", "ReMountSegment", "UnmountSegment",
		"GracefulUnmountSegment", "Ping", "FetchTasks", "ExistKey", "BatchExistKey", "GetReplicaList", "BatchGetReplicaList",
		"PutStart", "BatchPutStart", "PutEnd", "BatchPutEnd", "PutRevoke", "BatchPutRevoke", "UpsertStart", "BatchUpsertStart",
		"UpsertEnd", "BatchUpsertEnd", "UpsertRevoke", "BatchUpsertRevoke", "Remove", "BatchRemove", "RemoveAll",
		"RemoveByRegex", "GetReplicaListByRegex"} {
		if h[call] == nil {
			t.Errorf("no handler for %s", call)
		}
	}
}

func grpcClient(t testing.TB, addr string) (*grpc.ClientConn, pb.MasterClient, string) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn, pb.NewMasterClient(conn), addr
}

// TestMooncakeUnsupportedAndBackgroundCalls: calls for features mc's
// master lacks answer NOT_SUPPORTED in their own type and are logged once;
// the calls Mooncake's client makes in the background answer as a master
// without those features does.
func TestMooncakeUnsupportedAndBackgroundCalls(t *testing.T) {
	var logs logBuf
	addr := serveShared(t, slog.New(slog.NewTextHandler(&logs, nil)))
	for range 2 {
		rh, rb := rawCall(t, addr, mooncake.FunctionID("CopyEnd"), nil)
		var r mooncake.ExpectVoid
		if rh.ErrCode != 0 || structpack.Unmarshal(rb, &r) != nil || !r.HasError || r.Error != mooncake.NotSupported {
			t.Fatalf("CopyEnd: err_code %d, %+v", rh.ErrCode, r)
		}
	}
	if n := strings.Count(logs.String(), "CopyEnd"); n != 1 {
		t.Fatalf("CopyEnd logged %d times:\n%s", n, logs.String())
	}
	body, _ := structpack.MarshalArgs(mooncake.UUID{First: 3, Second: 4})
	_, rb := rawCall(t, addr, mooncake.FunctionID("PollRemoveAll"), body)
	var poll mooncake.ExpectBool
	if err := structpack.Unmarshal(rb, &poll); err != nil || poll.HasError || poll.Value {
		t.Fatalf("PollRemoveAll: %+v, %v", poll, err)
	}
	mc := mooncake.NewClient(addr, nil)
	defer mc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	seg := mooncake.Segment{ID: mooncake.UUID{First: 5, Second: 6}, Name: "n", Base: 1 << 30, Size: 64 << 20, TEEndpoint: "n", Protocol: "tcp"}
	if err := mc.MountSegment(ctx, seg, mooncake.UUID{First: 3, Second: 4}); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[mooncake.UUID]string{seg.ID: "ok", {First: 9, Second: 9}: "not found"} {
		body, _ := structpack.MarshalArgs(id)
		_, rb := rawCall(t, addr, mooncake.FunctionID("QuerySegmentStatusById"), body)
		var st mooncake.ExpectSegmentStatus
		if err := structpack.Unmarshal(rb, &st); err != nil {
			t.Fatal(err)
		}
		switch want {
		case "ok":
			if st.HasError || st.Value != mooncake.SegmentOK {
				t.Fatalf("status of a mounted segment: %+v", st)
			}
		default:
			if !st.HasError || st.Error != mooncake.SegmentNotFound {
				t.Fatalf("status of an unknown segment: %+v", st)
			}
		}
	}
}

// TestMooncakeArgsElementLimit: a request whose vectors hold more
// elements than any batch may is refused before they are decoded, with
// invalid arguments naming the limit (before, 60 MB of empty keys decoded
// into 240 MB each, and six such calls at once took a live master to
// 2.2 GB, only for the batch limit to refuse them).
func TestMooncakeArgsElementLimit(t *testing.T) {
	addr := serveShared(t, slog.New(slog.NewTextHandler(io.Discard, nil)))
	body, err := structpack.MarshalArgs(make([]string, maxArgElems+1), "")
	if err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	rh, rb := rawCall(t, addr, mooncake.FunctionID("BatchExistKey"), body)
	runtime.ReadMemStats(&after)
	if cororpc.Errc(rh.ErrCode) != cororpc.ErrcInvalidRPCArguments || !bytes.Contains(rb, []byte("over the limit of")) {
		t.Fatalf("BatchExistKey of %d keys: err_code %d, %q", maxArgElems+1, rh.ErrCode, rb)
	}
	// The request is copied and read (4 MB each, the server reading in
	// growing pieces); its 16 MB of keys are never made.
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 5*uint64(len(body)) {
		t.Errorf("refusing a %d-byte request allocated %d bytes", len(body), grew)
	}
	// A batch at the limit still decodes (and is refused by the batch limit).
	ok, err := structpack.MarshalArgs(make([]string, store.MaxBatchSize), "")
	if err != nil {
		t.Fatal(err)
	}
	if rh, rb := rawCall(t, addr, mooncake.FunctionID("BatchExistKey"), ok); rh.ErrCode != 0 {
		t.Fatalf("BatchExistKey of %d keys: err_code %d, %q", store.MaxBatchSize, rh.ErrCode, rb)
	}
}

// TestSessionElementLimit: mc's own calls, on the coro_rpc side and over
// gRPC, refuse a request whose repeated fields hold more elements than
// any batch may before decoding it (before, one 60 MB ExistKey of 30
// million empty keys took a live master from 300 MB to 1.9 GB and 16 s
// of CPU, only for the batch limit to refuse it).
func TestSessionElementLimit(t *testing.T) {
	addr := serveShared(t, slog.New(slog.NewTextHandler(io.Discard, nil)))
	keys := &pb.BatchKeysRequest{Keys: make([]string, store.MaxRequestElements+1)}
	body, err := proto.Marshal(&pb.SessionRequest{Call: &pb.SessionRequest_ExistKey{ExistKey: keys}})
	if err != nil {
		t.Fatal(err)
	}
	rh, rb := rawCall(t, addr, cororpc.FunctionID("mc::Session::ExistKey"), body)
	var resp pb.SessionResponse
	if rh.ErrCode != 0 || proto.Unmarshal(rb, &resp) != nil {
		t.Fatalf("mc::Session::ExistKey: err_code %d, %q", rh.ErrCode, rb)
	}
	if codes.Code(resp.StatusCode) != codes.InvalidArgument || !strings.Contains(resp.StatusMessage, "elements in repeated fields") {
		t.Fatalf("mc::Session::ExistKey of %d keys: %d %q", len(keys.Keys), resp.StatusCode, resp.StatusMessage)
	}
	_, gc, _ := grpcClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = gc.BatchExistKey(ctx, keys, grpc.MaxCallSendMsgSize(store.MaxMsgSize))
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "elements in repeated fields") {
		t.Fatalf("gRPC BatchExistKey of %d keys: %v", len(keys.Keys), err)
	}
	roundTrip(t, gc, "after-many-keys")
}

// TestMooncakeWarnedBounded: the pairs remembered so that an undecodable
// call is logged once per client and call stay bounded when the calls
// come from ever new addresses (they grew with every one).
func TestMooncakeWarnedBounded(t *testing.T) {
	m, _ := newTestMaster(t, Config{})
	ms := &mooncakeServer{m: m, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	type uuidV2 struct{ A, B, C uint64 }
	body, err := structpack.MarshalArgs(uuidV2{1, 2, 3})
	if err != nil {
		t.Fatal(err)
	}
	var id mooncake.UUID
	for i := range 3 * maxWarned {
		peer := &net.TCPAddr{IP: net.ParseIP(fmt.Sprintf("2001:db8::%x", i+1)), Port: 5000}
		if err := ms.args("Ping", &cororpc.Request{Body: body, RemoteAddr: peer}, &id); err == nil {
			t.Fatal("another version's Ping decoded")
		}
	}
	n := 0
	ms.warned.Range(func(any, any) bool { n++; return true })
	if n > maxWarned {
		t.Fatalf("%d pairs remembered after %d addresses; want at most %d", n, 3*maxWarned, maxWarned)
	}
	// Still once per client and call.
	if !ms.warnOnce("a|Ping") || ms.warnOnce("a|Ping") {
		t.Fatal("a new pair not logged once")
	}
}
