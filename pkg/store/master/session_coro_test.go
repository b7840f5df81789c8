package master

import (
	"context"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/kvcache-ops/mc/pkg/cororpc"
	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/mooncake"
	pb "github.com/kvcache-ops/mc/pkg/store/storepb"
)

// mc's Session functions take ids of their own: registering them beside
// every Mooncake handler collides with nothing.
func TestCoroSessionNamesCollideWithNothing(t *testing.T) {
	m, _ := newTestMaster(t, Config{})
	s := NewGRPCServer(m, nil)
	if err := s.registerSession(NewMooncakeServer(m, nil, discardLogger())); err != nil {
		t.Fatal(err)
	}
	for _, name := range append(store.CoroSessionCalls(), store.CoroSessionHello) {
		if !strings.HasPrefix(name, "mc::") {
			t.Errorf("%s is inside another service's namespace", name)
		}
	}
}

// Over coro_rpc, a Session function answers as a Session stream does;
// a body that is no SessionRequest, or carries another function's call,
// is refused with INVALID_PARAMS naming the function, and the connection
// serves the next call.
func TestCoroSessionBadBodies(t *testing.T) {
	m, _ := newTestMaster(t, Config{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := Serve(m, lis)
	t.Cleanup(srv.Stop)
	cl, err := cororpc.Dial(context.Background(), lis.Addr().String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	call := func(name string, body []byte) *pb.SessionResponse {
		t.Helper()
		out, err := cl.Call(context.Background(), cororpc.FunctionID(name), body)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		r := &pb.SessionResponse{}
		if err := proto.Unmarshal(out, r); err != nil {
			t.Fatalf("%s: answer: %v", name, err)
		}
		return r
	}
	exist := "mc::Session::ExistKey"
	for _, tc := range []struct {
		body []byte
		want string
	}{
		{[]byte{0xff, 0xff, 0xff}, "is not a SessionRequest"},
		{nil, "carries no call"},
		{mustMarshal(t, &pb.SessionRequest{Call: &pb.SessionRequest_Remove{Remove: &pb.BatchRemoveRequest{Keys: []string{"k"}}}}), "carries mc::Session::Remove"},
	} {
		r := call(exist, tc.body)
		if codes.Code(r.StatusCode) != codes.InvalidArgument || !strings.Contains(r.StatusMessage, exist) || !strings.Contains(r.StatusMessage, tc.want) {
			t.Errorf("body %x: %v, want INVALID_PARAMS naming %s: %s", tc.body, r, exist, tc.want)
		}
	}
	r := call(exist, mustMarshal(t, &pb.SessionRequest{Call: &pb.SessionRequest_ExistKey{ExistKey: &pb.BatchKeysRequest{Keys: []string{"nope"}}}}))
	if r.StatusCode != 0 || r.GetExist() == nil || len(r.GetExist().Exists) != 1 || r.GetExist().Exists[0] {
		t.Fatalf("exist after the bad bodies: %v", r)
	}
}

func mustMarshal(t testing.TB, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// FuzzCoroSession feeds a Session function (chosen by fn) any body: the
// handler never panics, always answers a SessionResponse, and refuses
// what it cannot decode with INVALID_PARAMS naming the function.
func FuzzCoroSession(f *testing.F) {
	m, _ := newTestMaster(f, Config{})
	s := NewGRPCServer(m, nil)
	names := store.CoroSessionCalls()
	for i, req := range []*pb.SessionRequest{
		{Call: &pb.SessionRequest_PutStart{PutStart: &pb.BatchPutStartRequest{Items: []*pb.PutStartItem{{Key: "k", Length: 10}}}}},
		{Call: &pb.SessionRequest_GetReplicaList{GetReplicaList: &pb.BatchKeysRequest{Keys: []string{"k"}}}},
		{Call: &pb.SessionRequest_ExistKey{ExistKey: &pb.BatchKeysRequest{Keys: []string{"k"}, Tenant: "t"}}},
	} {
		f.Add(uint8(i), mustMarshal(f, req))
	}
	f.Fuzz(func(t *testing.T, fn uint8, body []byte) {
		name := names[int(fn)%len(names)]
		h := s.rpc.coroSession(name)
		out, err := h(context.Background(), &cororpc.Request{Body: body})
		if err != nil {
			t.Fatalf("%s: handler error %v (want an answer)", name, err)
		}
		r := &pb.SessionResponse{}
		if err := proto.Unmarshal(out, r); err != nil {
			t.Fatalf("%s: answer is no SessionResponse: %v", name, err)
		}
		if req, bad := decodeCoroSession(name, body); bad != nil {
			if req != nil || codes.Code(r.StatusCode) != codes.InvalidArgument || !strings.Contains(r.StatusMessage, name) {
				t.Fatalf("%s: refused body answered %v", name, r)
			}
		}
	})
}

// mc's client's gets run in the connection's read loop even while a node
// has a disk tier (it sends one call at a time per connection, so a get
// waiting for a load holds up nothing else); Mooncake's gets then get a
// goroutine of their own, as its client multiplexes a connection.
func TestSessionGetsInlineWithDiskTier(t *testing.T) {
	for _, ha := range []bool{false, true} {
		m, err := New(Config{})
		if err != nil {
			t.Fatal(err)
		}
		if ha {
			m.cfg.Sync = func() error { return nil }
		}
		rule := inlineRule(m)
		mcGet := cororpc.FunctionID("mc::Session::GetReplicaList")
		mooncakeGet := cororpc.FunctionID(mooncake.Service + "::GetReplicaList")
		if !rule(mcGet) || !rule(mooncakeGet) {
			t.Fatalf("ha %v, no disk tier: mc's get inline %v, Mooncake's %v; want both", ha, rule(mcGet), rule(mooncakeGet))
		}
		m.tiers.online.Store(1)
		if !rule(mcGet) || rule(mooncakeGet) {
			t.Errorf("ha %v, a disk tier online: mc's get inline %v, Mooncake's %v; want mc's only", ha, rule(mcGet), rule(mooncakeGet))
		}
		m.Close()
	}
}
