package ha

import (
	"context"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/kvcache-ops/mc/pkg/cororpc"
	"github.com/kvcache-ops/mc/pkg/store/master"
	pb "github.com/kvcache-ops/mc/pkg/store/storepb"
)

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
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := master.NewGRPCServer(m, c.gate(nil))
	go srv.ServeShared(lis, master.NewMooncakeServer(m, c.mooncakeGate(nil), nil))
	defer srv.Stop()
	addr := lis.Addr().String()

	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	st, err := pb.NewMasterClient(cc).Session(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer st.CloseSend()
	cl, err := cororpc.Dial(context.Background(), addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
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
