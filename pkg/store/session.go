package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/kvcache-ops/mc/pkg/store/storepb"
)

// maxIdleSessions bounds the streams a client keeps open between calls;
// more concurrent callers open more, and the extra ones close when done.
const maxIdleSessions = 64

// sessions runs the data path's calls on the master's Session streams:
// a pool of streams, each carrying one call at a time. Its methods have
// the unary client's signatures, so a call site does not care which form
// carries it, and calls fail the way unary calls would (gRPC status
// errors, the caller's deadline and cancellation honoured).
//
// When the master serves them on its coro_rpc side (coro_session.go),
// the calls go there instead, and over the streams only when it does not
// or cannot be reached that way.
type sessions struct {
	rpc  pb.MasterClient
	coro *coroSessions // nil: streams only
	mu   sync.Mutex
	idle []*session

	// calls answered over coro_rpc and over streams (tests look)
	coroCalls, streamCalls atomic.Uint64
}

type session struct {
	st     pb.Master_SessionClient
	cancel context.CancelFunc
}

func (s *session) close() {
	s.st.CloseSend()
	s.cancel()
}

// open starts a stream. Its context is its own (a stream outlives the
// call that opened it); ctx bounds only the wait for a connection.
func (p *sessions) open(ctx context.Context) (*session, error) {
	sctx, cancel := context.WithCancel(context.Background())
	stop := context.AfterFunc(ctx, cancel)
	st, err := p.rpc.Session(sctx)
	if !stop() {
		err = ctxStatus(ctx)
	}
	if err != nil {
		cancel()
		return nil, err
	}
	return &session{st: st, cancel: cancel}, nil
}

func (p *sessions) get() *session {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := len(p.idle); n > 0 {
		s := p.idle[n-1]
		p.idle = p.idle[:n-1]
		return s
	}
	return nil
}

func (p *sessions) put(s *session) {
	p.mu.Lock()
	if len(p.idle) < maxIdleSessions {
		p.idle = append(p.idle, s)
		s = nil
	}
	p.mu.Unlock()
	if s != nil {
		s.close()
	}
}

// closeAll ends the idle streams and connections (the client is
// closing).
func (p *sessions) closeAll() {
	if p.coro != nil {
		p.coro.closeAll()
	}
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, s := range idle {
		s.close()
	}
}

// ctxStatus is ctx's error as the status a unary call would have ended
// with.
func ctxStatus(ctx context.Context) error {
	return status.FromContextError(context.Cause(ctx)).Err()
}

// do sends req and waits for its answer. A pooled stream may have died
// since its last call (the master restarted, a leader failed over): when
// sending on it fails, the request never left, so it goes out again on a
// new stream; a failure after it was sent is the caller's to judge, as
// with a unary call.
func (p *sessions) do(ctx context.Context, req *pb.SessionRequest) (*pb.SessionResponse, error) {
	if p.coro != nil {
		resp, err := p.coro.do(ctx, req)
		if !errors.Is(err, errNotHere) {
			p.coroCalls.Add(1)
			return resp, err
		}
	}
	p.streamCalls.Add(1)
	return p.doStream(ctx, req)
}

// doStream is do on a Session stream.
func (p *sessions) doStream(ctx context.Context, req *pb.SessionRequest) (*pb.SessionResponse, error) {
	for {
		s, fresh := p.get(), false
		if s == nil {
			var err error
			if s, err = p.open(ctx); err != nil {
				return nil, err
			}
			fresh = true
		}
		stop := context.AfterFunc(ctx, s.cancel)
		if err := s.st.Send(req); err != nil {
			if !stop() || ctx.Err() != nil {
				s.cancel()
				return nil, ctxStatus(ctx)
			}
			if !fresh {
				s.cancel()
				continue
			}
			// Send reports io.EOF for a stream that ended; the reason is
			// in its status.
			_, err = s.st.Recv()
			s.cancel()
			return nil, statusOr(err, codes.Unavailable, "session stream ended")
		}
		resp, err := s.st.Recv()
		if !stop() {
			// The caller gave up: the stream was cancelled under the
			// call and cannot be reused.
			return nil, ctxStatus(ctx)
		}
		if err != nil {
			s.cancel()
			return nil, statusOr(err, codes.Unavailable, "session stream ended")
		}
		p.put(s)
		if resp.StatusCode != uint32(codes.OK) {
			return nil, status.Error(codes.Code(resp.StatusCode), resp.StatusMessage)
		}
		return resp, nil
	}
}

// statusOr keeps a gRPC status error; any other error (io.EOF from a
// stream that ended without one) becomes code with msg.
func statusOr(err error, code codes.Code, msg string) error {
	if _, ok := status.FromError(err); ok && err != nil {
		return err
	}
	if err == nil {
		return status.Error(code, msg)
	}
	return status.Error(code, fmt.Sprintf("%s: %v", msg, err))
}

var errNoReply = errors.New("session: the master's answer has no reply of the expected kind")

func noReply(what string) error {
	return status.Error(codes.Internal, fmt.Sprintf("%s: %v", what, errNoReply))
}

// PutStart starts a batch of puts (upserts with upsert), answered as a
// replica table.
func (p *sessions) PutStart(ctx context.Context, r *pb.BatchPutStartRequest, upsert bool) (*pb.ReplicaTable, error) {
	req := &pb.SessionRequest{Call: &pb.SessionRequest_PutStart{PutStart: r}}
	if upsert {
		req = &pb.SessionRequest{Call: &pb.SessionRequest_UpsertStart{UpsertStart: r}}
	}
	return p.tableCall(ctx, req)
}

// GetReplicaLists asks where keys' replicas are, granting read leases.
func (p *sessions) GetReplicaLists(ctx context.Context, r *pb.BatchKeysRequest) (*pb.ReplicaTable, error) {
	return p.tableCall(ctx, &pb.SessionRequest{Call: &pb.SessionRequest_GetReplicaList{GetReplicaList: r}})
}

func (p *sessions) tableCall(ctx context.Context, req *pb.SessionRequest) (*pb.ReplicaTable, error) {
	resp, err := p.do(ctx, req)
	if err != nil {
		return nil, err
	}
	if r := resp.GetReplicaTable(); r != nil {
		return r, nil
	}
	return nil, noReply("replica table")
}

func (p *sessions) resultsCall(ctx context.Context, req *pb.SessionRequest) (*pb.BatchResults, error) {
	resp, err := p.do(ctx, req)
	if err != nil {
		return nil, err
	}
	if r := resp.GetResults(); r != nil {
		return r, nil
	}
	return nil, noReply("batch results")
}

func (p *sessions) BatchPutEnd(ctx context.Context, r *pb.BatchKeysRequest, _ ...grpc.CallOption) (*pb.BatchResults, error) {
	return p.resultsCall(ctx, &pb.SessionRequest{Call: &pb.SessionRequest_PutEnd{PutEnd: r}})
}

func (p *sessions) BatchPutRevoke(ctx context.Context, r *pb.BatchKeysRequest, _ ...grpc.CallOption) (*pb.BatchResults, error) {
	return p.resultsCall(ctx, &pb.SessionRequest{Call: &pb.SessionRequest_PutRevoke{PutRevoke: r}})
}

func (p *sessions) BatchUpsertEnd(ctx context.Context, r *pb.BatchKeysRequest, _ ...grpc.CallOption) (*pb.BatchResults, error) {
	return p.resultsCall(ctx, &pb.SessionRequest{Call: &pb.SessionRequest_UpsertEnd{UpsertEnd: r}})
}

func (p *sessions) BatchUpsertRevoke(ctx context.Context, r *pb.BatchKeysRequest, _ ...grpc.CallOption) (*pb.BatchResults, error) {
	return p.resultsCall(ctx, &pb.SessionRequest{Call: &pb.SessionRequest_UpsertRevoke{UpsertRevoke: r}})
}

func (p *sessions) BatchRemove(ctx context.Context, r *pb.BatchRemoveRequest, _ ...grpc.CallOption) (*pb.BatchResults, error) {
	return p.resultsCall(ctx, &pb.SessionRequest{Call: &pb.SessionRequest_Remove{Remove: r}})
}

func (p *sessions) BatchExistKey(ctx context.Context, r *pb.BatchKeysRequest, _ ...grpc.CallOption) (*pb.BatchExistResponse, error) {
	resp, err := p.do(ctx, &pb.SessionRequest{Call: &pb.SessionRequest_ExistKey{ExistKey: r}})
	if err != nil {
		return nil, err
	}
	if r := resp.GetExist(); r != nil {
		return r, nil
	}
	return nil, noReply("exist key")
}
