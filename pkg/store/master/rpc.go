package master

import (
	"context"
	"net"
	"runtime"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvcache-ops/mc/pkg/store"
	pb "github.com/kvcache-ops/mc/pkg/store/storepb"
)

// NewGRPCServer returns a gRPC server serving m's RPC API, with the
// store's message size limit; extra options (HA's gate interceptor) are
// added to the server's.
func NewGRPCServer(m *Master, extra ...grpc.ServerOption) *grpc.Server {
	opts := append([]grpc.ServerOption{grpc.MaxRecvMsgSize(store.MaxMsgSize), grpc.MaxSendMsgSize(store.MaxMsgSize),
		// Handlers run on a fixed pool instead of a new goroutine per
		// call, and fixed flow-control windows turn off the BDP pings
		// that follow each small response: both are latency on every
		// get and put.
		grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0))),
		grpc.InitialWindowSize(store.RPCWindow), grpc.InitialConnWindowSize(store.RPCConnWindow),
	}, extra...)
	s := grpc.NewServer(opts...)
	pb.RegisterMasterServer(s, &rpcServer{m: m})
	return s
}

// Serve serves m's RPC API on lis until the server is stopped.
func Serve(m *Master, lis net.Listener) *grpc.Server {
	s := NewGRPCServer(m)
	go s.Serve(lis)
	return s
}

type rpcServer struct {
	pb.UnimplementedMasterServer
	m *Master
}

// checkBatch refuses batches over the limit as a whole: an RPC-level
// error, since no item was looked at.
func checkBatch(n int) error {
	if n > store.MaxBatchSize {
		return status.Errorf(codes.InvalidArgument, "%s: batch of %d items exceeds the limit of %d", store.InvalidParams, n, store.MaxBatchSize)
	}
	return nil
}

// durable waits, when HA asks for it (Config.Sync), until the changes
// behind errs are committed; if they cannot be, every item that succeeded
// is reported as failed: an acknowledged change must survive a failover.
func (s *rpcServer) durable(errs []error) []error {
	sync := s.m.cfg.Sync
	if sync == nil {
		return errs
	}
	ok := false
	for _, err := range errs {
		ok = ok || err == nil
	}
	if !ok {
		return errs
	}
	if err := sync(); err != nil {
		e := store.Errorf(store.UnavailableInCurrentMode, "change not committed to the HA op log: %v", err)
		for i := range errs {
			if errs[i] == nil {
				errs[i] = e
			}
		}
	}
	return errs
}

func results(errs []error) (*pb.BatchResults, bool) {
	out := &pb.BatchResults{Results: make([]*pb.Result, len(errs))}
	failed := false
	for i, err := range errs {
		out.Results[i] = store.ResultToPB(err)
		failed = failed || err != nil
	}
	return out, failed
}

// replicaLists converts a batch's results to their message. The messages
// are carved out of three arrays (lists, replicas, pointers) rather than
// allocated one by one: on a batched get this was most of the master's
// garbage per key.
func replicaLists(rs []ReplicaResult) (*pb.BatchReplicaListResponse, bool) {
	total := 0
	for _, r := range rs {
		total += len(r.Replicas)
	}
	lists := make([]pb.ReplicaList, len(rs))
	reps := make([]pb.Replica, total)
	ptrs := make([]*pb.Replica, total)
	out := &pb.BatchReplicaListResponse{Results: make([]*pb.ReplicaList, len(rs))}
	failed := false
	for i, r := range rs {
		l := &lists[i]
		out.Results[i] = l
		if r.Err != nil {
			failed = true
			l.Code, l.Message = int32(store.CodeOf(r.Err)), r.Err.Error()
			continue
		}
		l.LeaseTtlMs = uint64(r.LeaseTTL.Milliseconds())
		l.Replicas = ptrs[:len(r.Replicas):len(r.Replicas)]
		ptrs = ptrs[len(r.Replicas):]
		for j, x := range r.Replicas {
			p := &reps[0]
			reps = reps[1:]
			store.FillReplicaPB(p, x)
			l.Replicas[j] = p
		}
	}
	return out, failed
}

func items(in []*pb.PutStartItem) []PutItem {
	out := make([]PutItem, len(in))
	for i, it := range in {
		out[i] = PutItem{Key: it.GetKey(), Size: it.GetLength()}
	}
	return out
}

func (s *rpcServer) Ping(_ context.Context, r *pb.PingRequest) (*pb.PingResponse, error) {
	v, st := s.m.Ping(store.UUIDFromPB(r.ClientId))
	s.m.m.Op("ping", false)
	cs := pb.ClientStatus_OK
	if st == store.ClientNeedRemount {
		cs = pb.ClientStatus_NEED_REMOUNT
	}
	return &pb.PingResponse{ViewVersion: v, ClientStatus: cs, EvictedKeys: s.m.TakeEvictedKeys(store.UUIDFromPB(r.ClientId))}, nil
}

func (s *rpcServer) MountSegment(_ context.Context, r *pb.MountSegmentRequest) (*pb.Result, error) {
	err := s.durable([]error{s.m.MountSegment(store.UUIDFromPB(r.ClientId), store.SegmentFromPB(r.Segment))})[0]
	s.m.m.Op("mount_segment", err != nil)
	return store.ResultToPB(err), nil
}

func (s *rpcServer) ReMountSegment(_ context.Context, r *pb.ReMountSegmentRequest) (*pb.ReMountSegmentResponse, error) {
	if err := checkBatch(len(r.Segments)); err != nil {
		return nil, err
	}
	segs := make([]store.SegmentInfo, len(r.Segments))
	for i, x := range r.Segments {
		segs[i] = store.SegmentFromPB(x)
	}
	res, failed := results(s.durable(s.m.ReMountSegment(store.UUIDFromPB(r.ClientId), segs)))
	s.m.m.Op("remount_segment", failed)
	return &pb.ReMountSegmentResponse{Results: res.Results}, nil
}

func (s *rpcServer) UnmountSegment(_ context.Context, r *pb.UnmountSegmentRequest) (*pb.Result, error) {
	err := s.m.UnmountSegment(store.UUIDFromPB(r.ClientId), store.UUIDFromPB(r.SegmentId))
	s.m.m.Op("unmount_segment", err != nil)
	return store.ResultToPB(err), nil
}

func (s *rpcServer) GracefulUnmountSegment(ctx context.Context, r *pb.UnmountSegmentRequest) (*pb.Result, error) {
	err := s.m.GracefulUnmountSegment(ctx, store.UUIDFromPB(r.ClientId), store.UUIDFromPB(r.SegmentId))
	s.m.m.Op("unmount_segment", err != nil)
	return store.ResultToPB(err), nil
}

func (s *rpcServer) UnregisterClient(_ context.Context, r *pb.PingRequest) (*pb.Result, error) {
	err := s.m.UnregisterClient(store.UUIDFromPB(r.ClientId))
	s.m.m.Op("unregister_client", err != nil)
	return store.ResultToPB(err), nil
}

func (s *rpcServer) BatchPutStart(_ context.Context, r *pb.BatchPutStartRequest) (*pb.BatchPutStartResponse, error) {
	if err := checkBatch(len(r.Items)); err != nil {
		return nil, err
	}
	res, failed := replicaLists(s.m.BatchPutStart(store.UUIDFromPB(r.ClientId), r.ClientHost, items(r.Items), store.ConfigFromPB(r.Config)))
	s.m.m.Op("batch_put_start", failed)
	return &pb.BatchPutStartResponse{Results: res.Results}, nil
}

func (s *rpcServer) BatchUpsertStart(_ context.Context, r *pb.BatchPutStartRequest) (*pb.BatchPutStartResponse, error) {
	if err := checkBatch(len(r.Items)); err != nil {
		return nil, err
	}
	res, failed := replicaLists(s.m.BatchUpsertStart(store.UUIDFromPB(r.ClientId), r.ClientHost, items(r.Items), store.ConfigFromPB(r.Config)))
	s.m.m.Op("batch_upsert_start", failed)
	return &pb.BatchPutStartResponse{Results: res.Results}, nil
}

func (s *rpcServer) keysOp(name string, r *pb.BatchKeysRequest, f func(store.UUID, []string) []error) (*pb.BatchResults, error) {
	if err := checkBatch(len(r.Keys)); err != nil {
		return nil, err
	}
	res, failed := results(s.durable(f(store.UUIDFromPB(r.ClientId), r.Keys)))
	s.m.m.Op(name, failed)
	return res, nil
}

func (s *rpcServer) BatchPutEnd(_ context.Context, r *pb.BatchKeysRequest) (*pb.BatchResults, error) {
	return s.keysOp("batch_put_end", r, s.m.BatchPutEnd)
}

func (s *rpcServer) BatchPutRevoke(_ context.Context, r *pb.BatchKeysRequest) (*pb.BatchResults, error) {
	return s.keysOp("batch_put_revoke", r, s.m.BatchPutRevoke)
}

func (s *rpcServer) BatchUpsertEnd(_ context.Context, r *pb.BatchKeysRequest) (*pb.BatchResults, error) {
	return s.keysOp("batch_upsert_end", r, s.m.BatchUpsertEnd)
}

func (s *rpcServer) BatchUpsertRevoke(_ context.Context, r *pb.BatchKeysRequest) (*pb.BatchResults, error) {
	return s.keysOp("batch_upsert_revoke", r, s.m.BatchUpsertRevoke)
}

func (s *rpcServer) BatchGetReplicaList(_ context.Context, r *pb.BatchKeysRequest) (*pb.BatchReplicaListResponse, error) {
	if err := checkBatch(len(r.Keys)); err != nil {
		return nil, err
	}
	res, failed := replicaLists(s.m.BatchGetReplicaList(r.Keys))
	s.m.m.Op("batch_get_replica_list", failed)
	return res, nil
}

func (s *rpcServer) BatchQuery(_ context.Context, r *pb.BatchKeysRequest) (*pb.BatchReplicaListResponse, error) {
	if err := checkBatch(len(r.Keys)); err != nil {
		return nil, err
	}
	res, failed := replicaLists(s.m.BatchQuery(r.Keys))
	s.m.m.Op("batch_query", failed)
	return res, nil
}

func (s *rpcServer) BatchExistKey(_ context.Context, r *pb.BatchKeysRequest) (*pb.BatchExistResponse, error) {
	if err := checkBatch(len(r.Keys)); err != nil {
		return nil, err
	}
	exists, errs := s.m.BatchExistKey(r.Keys)
	res, failed := results(errs)
	s.m.m.Op("batch_exist_key", failed)
	return &pb.BatchExistResponse{Results: res.Results, Exists: exists}, nil
}

func (s *rpcServer) BatchRemove(_ context.Context, r *pb.BatchRemoveRequest) (*pb.BatchResults, error) {
	if err := checkBatch(len(r.Keys)); err != nil {
		return nil, err
	}
	res, failed := results(s.durable(s.m.BatchRemove(r.Keys, r.Force)))
	s.m.m.Op("batch_remove", failed)
	return res, nil
}

func (s *rpcServer) RemoveAll(_ context.Context, r *pb.RemoveAllRequest) (*pb.RemoveAllResponse, error) {
	n := s.m.RemoveAll()
	if err := s.durable([]error{nil})[0]; err != nil {
		s.m.m.Op("remove_all", true)
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	}
	s.m.m.Op("remove_all", false)
	return &pb.RemoveAllResponse{Removed: uint64(n)}, nil
}
