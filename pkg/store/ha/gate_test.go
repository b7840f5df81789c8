package ha

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/kvcache-ops/mc/pkg/cororpc"
	"github.com/kvcache-ops/mc/pkg/store/master"
	"github.com/kvcache-ops/mc/pkg/store/mooncake"
	pb "github.com/kvcache-ops/mc/pkg/store/storepb"
)

// gatedServer serves m through c's gates for term tm on a loopback
// listener, and returns its address, a Session stream and a coro_rpc
// client to it (all closed when the test ends).
func gatedServer(t *testing.T, c *Candidate, m *master.Master, tm *term) (string, pb.Master_SessionClient, *cororpc.Client) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := master.NewGRPCServer(m, c.gate(tm))
	go srv.ServeShared(lis, master.NewMooncakeServer(m, c.mooncakeGate(tm), nil))
	t.Cleanup(srv.Stop)
	addr := lis.Addr().String()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	st, err := pb.NewMasterClient(cc).Session(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.CloseSend() })
	cl, err := cororpc.Dial(context.Background(), addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return addr, st, cl
}

// A master that is not the serving leader refuses mc's Session calls on
// the coro_rpc side exactly as on a Session stream (the same gate, the
// same answer), reads and writes alike.
func TestGateRefusesCoroSessionAsStreams(t *testing.T) {
	c := &Candidate{} // not ready: serves no term
	m, err := master.New(master.Config{})
	if err != nil {
		t.Fatal(err)
	}
	m.Start()
	defer m.Close()
	_, st, cl := gatedServer(t, c, m, nil)
	for _, req := range []*pb.SessionRequest{
		{Call: &pb.SessionRequest_ExistKey{ExistKey: &pb.BatchKeysRequest{Keys: []string{"k"}}}},
		{Call: &pb.SessionRequest_PutStart{PutStart: &pb.BatchPutStartRequest{Items: []*pb.PutStartItem{{Key: "k", Length: 10}}}}},
	} {
		if err := st.Send(req); err != nil {
			t.Fatal(err)
		}
		onStream, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		body, err := proto.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		name := "mc::Session::" + map[bool]string{true: "ExistKey", false: "PutStart"}[req.GetExistKey() != nil]
		out, err := cl.Call(context.Background(), cororpc.FunctionID(name), body)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		onCoro := &pb.SessionResponse{}
		if err := proto.Unmarshal(out, onCoro); err != nil {
			t.Fatal(err)
		}
		if codes.Code(onStream.StatusCode) != codes.FailedPrecondition || !strings.Contains(onStream.StatusMessage, "not the serving leader") {
			t.Fatalf("%s on a stream: %v, want the gate's refusal", name, onStream)
		}
		if !proto.Equal(onCoro, onStream) {
			t.Fatalf("%s: over coro_rpc %v, on a stream %v", name, onCoro, onStream)
		}
	}
}

// A leader paused past its lease's local deadline (SIGSTOP, a VM stall)
// resumes with requests and keepLease's timer ready at once, in no set
// order: every call looks at the deadline itself, so none is answered
// from a term another leader may have followed. Here the deadline has
// passed and keepLease has not run: mc's Session calls (stream and
// coro_rpc) and Mooncake's wire are refused, reads and writes alike,
// where the same master answered them a moment before.
func TestGateRefusesPastLeaseDeadline(t *testing.T) {
	c, tm, m := leadingTerm(t)
	addr, st, cl := gatedServer(t, c, m, tm)
	moon := mooncake.NewClient(addr, nil)
	defer moon.Close()

	exist := &pb.SessionRequest{Call: &pb.SessionRequest_ExistKey{ExistKey: &pb.BatchKeysRequest{Keys: []string{"k"}}}}
	put := &pb.SessionRequest{Call: &pb.SessionRequest_PutStart{PutStart: &pb.BatchPutStartRequest{Items: []*pb.PutStartItem{{Key: "k", Length: 10}}}}}
	// refused reports how each wire answered: nil when served.
	calls := func() map[string]error {
		out := map[string]error{}
		for name, req := range map[string]*pb.SessionRequest{"ExistKey": exist, "PutStart": put} {
			if err := st.Send(req); err != nil {
				t.Fatal(err)
			}
			resp, err := st.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if codes.Code(resp.StatusCode) == codes.FailedPrecondition {
				out["stream "+name] = errors.New(resp.StatusMessage)
			} else {
				out["stream "+name] = nil
			}
			body, err := proto.Marshal(req)
			if err != nil {
				t.Fatal(err)
			}
			b, err := cl.Call(context.Background(), cororpc.FunctionID("mc::Session::"+name), body)
			if err != nil {
				t.Fatal(err)
			}
			r := &pb.SessionResponse{}
			if err := proto.Unmarshal(b, r); err != nil {
				t.Fatal(err)
			}
			if codes.Code(r.StatusCode) == codes.FailedPrecondition {
				out["coro "+name] = errors.New(r.StatusMessage)
			} else {
				out["coro "+name] = nil
			}
		}
		_, out["mooncake ExistKey"] = moon.ExistKey(context.Background(), "k")
		_, out["mooncake GetReplicaList"] = moon.GetReplicaList(context.Background(), "k")
		return out
	}
	for name, err := range calls() {
		if err != nil && strings.Contains(err.Error(), "not the serving leader") {
			t.Fatalf("%s refused within the lease: %v", name, err)
		}
	}
	tm.setDeadline(time.Now().Add(-time.Millisecond))
	for name, err := range calls() {
		if err == nil || !strings.Contains(err.Error(), "not the serving leader") {
			t.Errorf("%s past the lease's deadline: %v, want the gate's refusal", name, err)
		}
	}
}

// A call during which the lease lapsed (the leader paused inside it) is
// answered with the gate's refusal, not with what the handler read: the
// gRPC gate, and the Mooncake wire's, look again once the call is done.
func TestGateRefusesLeaseLapsedDuringCall(t *testing.T) {
	c, tm, m := leadingTerm(t)
	lapse := func() { tm.setDeadline(time.Now().Add(-time.Millisecond)) }

	tm.setDeadline(time.Now().Add(time.Minute))
	resp, err := c.gate(tm)(context.Background(), nil, nil, func(context.Context, any) (any, error) {
		lapse()
		return "read while leading", nil
	})
	if err == nil || !strings.Contains(err.Error(), "lease lapsed during the call") {
		t.Fatalf("gRPC gate after a lease lapsed during the call: %v, %v", resp, err)
	}

	tm.setDeadline(time.Now().Add(time.Minute))
	addr, _, _ := gatedServer(t, c, m, tm)
	moon := mooncake.NewClient(addr, nil)
	defer moon.Close()
	if _, err := moon.ExistKey(context.Background(), "k"); err != nil {
		t.Fatalf("within the lease: %v", err)
	}
	// The Mooncake wire: the gate passes, the lease lapses in the
	// handler (here: before the second look, through the first look's
	// hook), and the answer is the refusal.
	looks := 0
	gate := c.mooncakeGate(tm)
	srv := master.NewMooncakeServer(m, func(ctx context.Context, call string) error {
		looks++
		if looks == 1 {
			defer lapse()
		}
		return gate(ctx, call)
	}, nil)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	defer srv.Close()
	tm.setDeadline(time.Now().Add(time.Minute))
	moon2 := mooncake.NewClient(lis.Addr().String(), nil)
	defer moon2.Close()
	if _, err := moon2.ExistKey(context.Background(), "k"); err == nil || !strings.Contains(err.Error(), "not the serving leader") || looks != 2 {
		t.Fatalf("Mooncake wire after a lease lapsed during the call: %v (gate looked %d times)", err, looks)
	}
}

// leadingTerm is a candidate serving a term of a fresh master, its lease
// a minute ahead (closed when the test ends).
func leadingTerm(t *testing.T) (*Candidate, *term, *master.Master) {
	t.Helper()
	m, err := master.New(master.Config{})
	if err != nil {
		t.Fatal(err)
	}
	m.Start()
	t.Cleanup(m.Close)
	c := &Candidate{}
	tm := &term{m: m}
	tm.setDeadline(time.Now().Add(time.Minute))
	c.cur.Store(tm)
	c.ready.Store(true)
	return c, tm, m
}
