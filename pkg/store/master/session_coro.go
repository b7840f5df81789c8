package master

import (
	"context"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/kvcache-ops/mc/pkg/cororpc"
	"github.com/kvcache-ops/mc/pkg/store"
	pb "github.com/kvcache-ops/mc/pkg/store/storepb"
)

// mc's own client's Session calls on the coro_rpc side of the port
// (store.CoroSessionCalls): each answered by sessionCall, exactly as on a
// Session stream, through the gRPC server's gate. Tenants travel in the
// requests' fields on both paths, so the scope is the same.

// sessionInline are the Session functions a connection's read loop may
// run itself (cororpc.ServerOptions.Inline), by the rule of Mooncake's
// calls (inlineCalls): reads, and without HA the writes. A put start may
// wait for read leases (its LeaseWaitMs), a get for a disk load once a
// node has a disk tier (a promotion); mc's client makes one call at a
// time per connection, so the loop has nothing else to read meanwhile,
// and the call's context still ends when the client hangs up (its Done
// and Err look at the connection: cororpc's CancelOnHangup).
func sessionInline(ha bool) map[uint32]bool {
	out := map[uint32]bool{
		cororpc.FunctionID(store.CoroSessionHello): true,
	}
	for _, name := range store.CoroSessionCalls() {
		k := strings.TrimPrefix(name, "mc::Session::")
		switch k {
		case "GetReplicaList", "ExistKey":
			out[cororpc.FunctionID(name)] = true
		default:
			if !ha {
				out[cororpc.FunctionID(name)] = true
			}
		}
	}
	return out
}

// sessionIDs are the ids of every Session function: their calls' contexts
// end when the client hangs up, as a stream's do when it is cancelled.
func sessionIDs() map[uint32]bool {
	out := map[uint32]bool{}
	for _, name := range store.CoroSessionCalls() {
		out[cororpc.FunctionID(name)] = true
	}
	return out
}

// registerSession registers the Session functions on moon, answered by
// s's rpcServer (its gate).
func (s *GRPCServer) registerSession(moon *cororpc.Server) error {
	if _, err := moon.Register(store.CoroSessionHello, func(context.Context, *cororpc.Request) ([]byte, error) {
		return nil, nil
	}); err != nil {
		return fmt.Errorf("mc session calls on coro_rpc: %w", err)
	}
	for _, name := range store.CoroSessionCalls() {
		if _, err := moon.Register(name, s.rpc.coroSession(name)); err != nil {
			return fmt.Errorf("mc session calls on coro_rpc: %w", err)
		}
	}
	return nil
}

// coroSession is the handler of the Session function name.
func (s *rpcServer) coroSession(name string) cororpc.Handler {
	return func(ctx context.Context, req *cororpc.Request) ([]byte, error) {
		r, bad := decodeCoroSession(name, req.Body)
		resp := bad
		if resp == nil {
			resp = s.sessionCall(ctx, r)
		}
		b, err := proto.Marshal(resp)
		if err != nil {
			return nil, fmt.Errorf("%s: encode answer: %w", name, err)
		}
		return b, nil
	}
}

// decodeCoroSession reads a Session function's body: the request, or
// the answer refusing a body that is no SessionRequest or carries
// another function's call.
func decodeCoroSession(name string, body []byte) (*pb.SessionRequest, *pb.SessionResponse) {
	r := &pb.SessionRequest{}
	if err := store.CheckElements(body, r.ProtoReflect().Descriptor(), store.MaxRequestElements); err != nil {
		return nil, &pb.SessionResponse{StatusCode: uint32(codes.InvalidArgument), StatusMessage: fmt.Sprintf("%s: %v", name, err)}
	}
	if err := proto.Unmarshal(body, r); err != nil {
		return nil, &pb.SessionResponse{StatusCode: uint32(codes.InvalidArgument),
			StatusMessage: fmt.Sprintf("%s: %s: body of %d bytes is not a SessionRequest: %v", store.InvalidParams, name, len(body), err)}
	}
	if got := store.CoroSessionCall(r); got != name {
		if got == "" {
			got = "no call"
		}
		return nil, &pb.SessionResponse{StatusCode: uint32(codes.InvalidArgument),
			StatusMessage: fmt.Sprintf("%s: %s: the request carries %s", store.InvalidParams, name, got)}
	}
	return r, nil
}
