package master

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvcache-ops/mc/pkg/cororpc"
	"github.com/kvcache-ops/mc/pkg/store"
	pb "github.com/kvcache-ops/mc/pkg/store/storepb"
)

// GRPCServer is the gRPC server of m's RPC API.
type GRPCServer struct {
	*grpc.Server
	rpc *rpcServer

	mu     sync.Mutex
	moon   *cororpc.Server // ServeShared's coro_rpc side
	shared net.Listener

	noCoroSession bool // WithoutCoroSession
}

// WithoutCoroSession makes ServeShared leave mc's Session calls off the
// coro_rpc side, as a master from before them did: mc's clients then
// carry them on gRPC Session streams (tests of that fallback).
func (s *GRPCServer) WithoutCoroSession() *GRPCServer {
	s.noCoroSession = true
	return s
}

// NewGRPCServer returns a gRPC server serving m's RPC API, with the
// store's message size limit. gate, when not nil, runs before every call,
// unary or carried by a Session stream (HA refuses calls with it on a
// master that is not the serving leader).
func NewGRPCServer(m *Master, gate grpc.UnaryServerInterceptor) *GRPCServer {
	rs := &rpcServer{m: m, gate: gate, drain: make(chan struct{})}
	opts := []grpc.ServerOption{grpc.MaxRecvMsgSize(store.MaxMsgSize), grpc.MaxSendMsgSize(store.MaxMsgSize),
		// Handlers run on a fixed pool instead of a new goroutine per
		// call, and fixed flow-control windows turn off the BDP pings
		// that follow each small response: both are latency on every
		// get and put.
		grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0))),
		grpc.InitialWindowSize(store.RPCWindow), grpc.InitialConnWindowSize(store.RPCConnWindow),
	}
	// The budget's interceptors run first: a refused call is not worth
	// the gate's look.
	opts = append(opts, newGRPCBudget(m.budget, m.cfg.RequestReadTimeout).serverOptions()...)
	if gate != nil {
		opts = append(opts, grpc.ChainUnaryInterceptor(gate))
	}
	s := grpc.NewServer(opts...)
	pb.RegisterMasterServer(s, rs)
	pb.RegisterTierServer(s, newTierServer(m, gate))
	pb.RegisterDrainServer(s, &drainServer{m: m})
	return &GRPCServer{Server: s, rpc: rs}
}

// Serve serves m's RPC API on lis until the server is stopped: mc's gRPC
// and Mooncake's coro_rpc on the one port (ServeShared).
func Serve(m *Master, lis net.Listener) *GRPCServer {
	s := NewGRPCServer(m, nil)
	go s.ServeShared(lis, NewMooncakeServer(m, nil, m.cfg.Logger))
	return s
}

// Shutdown stops the server gracefully: calls under way are answered
// (within timeout), idle Session streams are ended, new calls are
// refused. Plain GracefulStop would wait for clients to close their idle
// sessions, which they never do.
func (s *GRPCServer) Shutdown(timeout time.Duration) {
	s.shutdownShared(timeout)
	s.rpc.drainOnce.Do(func() { close(s.rpc.drain) })
	stopped := make(chan struct{})
	go func() {
		s.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(timeout):
		s.Stop()
	}
}

type rpcServer struct {
	pb.UnimplementedMasterServer
	m    *Master
	gate grpc.UnaryServerInterceptor
	// drain closes when the server shuts down: Session streams end as
	// soon as they are not answering a call.
	drain     chan struct{}
	drainOnce sync.Once
}

var sessionInfo = &grpc.UnaryServerInfo{FullMethod: pb.Master_Session_FullMethodName}

// Session answers the calls a client sends on one stream, in order, each
// exactly as its unary form would (through the same gate); a call's
// error is carried in its response and the stream goes on. Calls are
// received and answered by a goroutine of the stream's own, so that the
// handler can end the stream when the server drains (a Recv cannot be
// interrupted): a call under way is answered first, and no call starts
// on the stream after the drain began.
func (s *rpcServer) Session(st pb.Master_SessionServer) error {
	ctx := st.Context()
	var mu sync.Mutex
	busy, closed := false, false
	ended := make(chan struct{}, 1) // the call the drain waits for was answered
	done := make(chan error, 1)
	go func() {
		for {
			req, err := st.Recv()
			if err != nil {
				done <- err
				return
			}
			mu.Lock()
			if closed || s.draining() {
				// Not applied: the client sees the stream end instead
				// of an answer.
				closed = true
				mu.Unlock()
				return
			}
			busy = true
			mu.Unlock()
			err = st.Send(s.sessionCall(ctx, req))
			mu.Lock()
			busy = false
			drained := closed
			mu.Unlock()
			if drained {
				// The handler is waiting for this call to end the
				// stream.
				ended <- struct{}{}
				return
			}
			if err != nil {
				done <- err
				return
			}
		}
	}()
	streamErr := func(err error) error {
		if errors.Is(err, io.EOF) {
			return nil
		}
		return err
	}
	select {
	case err := <-done:
		return streamErr(err)
	case <-s.drain:
	}
	mu.Lock()
	wait := busy
	closed = true
	mu.Unlock()
	if wait {
		select {
		case <-ended:
		case err := <-done:
			return streamErr(err)
		}
	}
	return nil
}

func (s *rpcServer) draining() bool { return isClosed(s.drain) }

func (s *rpcServer) sessionCall(ctx context.Context, req *pb.SessionRequest) *pb.SessionResponse {
	var in any
	var h grpc.UnaryHandler
	switch c := req.Call.(type) {
	case *pb.SessionRequest_PutStart:
		in, h = c.PutStart, func(ctx context.Context, r any) (any, error) {
			return s.putStartTable(ctx, r.(*pb.BatchPutStartRequest), false)
		}
	case *pb.SessionRequest_UpsertStart:
		in, h = c.UpsertStart, func(ctx context.Context, r any) (any, error) {
			return s.putStartTable(ctx, r.(*pb.BatchPutStartRequest), true)
		}
	case *pb.SessionRequest_PutEnd:
		in, h = c.PutEnd, func(ctx context.Context, r any) (any, error) { return s.BatchPutEnd(ctx, r.(*pb.BatchKeysRequest)) }
	case *pb.SessionRequest_PutRevoke:
		in, h = c.PutRevoke, func(ctx context.Context, r any) (any, error) { return s.BatchPutRevoke(ctx, r.(*pb.BatchKeysRequest)) }
	case *pb.SessionRequest_UpsertEnd:
		in, h = c.UpsertEnd, func(ctx context.Context, r any) (any, error) { return s.BatchUpsertEnd(ctx, r.(*pb.BatchKeysRequest)) }
	case *pb.SessionRequest_UpsertRevoke:
		in, h = c.UpsertRevoke, func(ctx context.Context, r any) (any, error) {
			return s.BatchUpsertRevoke(ctx, r.(*pb.BatchKeysRequest))
		}
	case *pb.SessionRequest_GetReplicaList:
		in, h = c.GetReplicaList, func(_ context.Context, r any) (any, error) {
			return s.getReplicaTable(r.(*pb.BatchKeysRequest))
		}
	case *pb.SessionRequest_ExistKey:
		in, h = c.ExistKey, func(ctx context.Context, r any) (any, error) { return s.BatchExistKey(ctx, r.(*pb.BatchKeysRequest)) }
	case *pb.SessionRequest_Remove:
		in, h = c.Remove, func(ctx context.Context, r any) (any, error) { return s.BatchRemove(ctx, r.(*pb.BatchRemoveRequest)) }
	default:
		return &pb.SessionResponse{StatusCode: uint32(codes.InvalidArgument), StatusMessage: store.InvalidParams.String() + ": session request names no call"}
	}
	var out any
	var err error
	if s.gate != nil {
		out, err = s.gate(ctx, in, sessionInfo, h)
	} else {
		out, err = h(ctx, in)
	}
	if err != nil {
		st := status.Convert(err)
		return &pb.SessionResponse{StatusCode: uint32(st.Code()), StatusMessage: st.Message()}
	}
	switch o := out.(type) {
	case *pb.ReplicaTable:
		return &pb.SessionResponse{Reply: &pb.SessionResponse_ReplicaTable{ReplicaTable: o}}
	case *pb.BatchResults:
		return &pb.SessionResponse{Reply: &pb.SessionResponse_Results{Results: o}}
	case *pb.BatchExistResponse:
		return &pb.SessionResponse{Reply: &pb.SessionResponse_Exist{Exist: o}}
	}
	return &pb.SessionResponse{StatusCode: uint32(codes.Internal), StatusMessage: fmt.Sprintf("session: no reply form for %T", out)}
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
		l.Checksum = r.Sum
		l.Staged = r.Staged
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

// replicaTable is replicaLists in the Session's column form. Segments
// are found by a scan of those already in the table (a batch's replicas
// sit on few segments), by a map past a dozen.
func replicaTable(rs []ReplicaResult) (*pb.ReplicaTable, bool) {
	total := 0
	for _, r := range rs {
		total += len(r.Replicas)
	}
	n := len(rs)
	t := &pb.ReplicaTable{Codes: make([]int32, n), LeaseTtlMs: make([]uint64, n), ReplicaCounts: make([]uint32, n),
		Segment: make([]uint32, 0, total), Address: make([]uint64, 0, total), Length: make([]uint64, 0, total),
		Status: make([]pb.ReplicaStatus, 0, total)}
	type segKey struct{ name, endpoint, protocol string }
	var byKey map[segKey]uint32
	index := func(x store.Replica) uint32 {
		k := segKey{x.Segment, x.Endpoint, x.Protocol}
		if byKey != nil {
			if i, ok := byKey[k]; ok {
				return i
			}
		} else {
			for i, s := range t.Segments {
				if s.SegmentName == k.name && s.TeEndpoint == k.endpoint && s.Protocol == k.protocol {
					return uint32(i)
				}
			}
		}
		i := uint32(len(t.Segments))
		t.Segments = append(t.Segments, &pb.ReplicaTable_SegmentRef{SegmentName: k.name, TeEndpoint: k.endpoint, Protocol: k.protocol})
		if byKey == nil && len(t.Segments) > 12 {
			byKey = make(map[segKey]uint32, 2*len(t.Segments))
			for j, s := range t.Segments {
				byKey[segKey{s.SegmentName, s.TeEndpoint, s.Protocol}] = uint32(j)
			}
		} else if byKey != nil {
			byKey[k] = i
		}
		return i
	}
	failed := false
	for i, r := range rs {
		if r.Err != nil {
			failed = true
			t.Codes[i] = int32(store.CodeOf(r.Err))
			t.Messages = append(t.Messages, r.Err.Error())
			continue
		}
		t.LeaseTtlMs[i] = uint64(r.LeaseTTL.Milliseconds())
		t.ReplicaCounts[i] = uint32(len(r.Replicas))
		if r.Sum != 0 {
			// A column only when some key has a checksum.
			if t.Checksums == nil {
				t.Checksums = make([]uint64, n)
			}
			t.Checksums[i] = r.Sum
		}
		if r.Staged != 0 {
			if t.Staged == nil {
				t.Staged = make([]uint64, n)
			}
			t.Staged[i] = r.Staged
		}
		if r.DiskVersion != 0 {
			if t.DiskVersion == nil {
				t.DiskVersion, t.DiskService, t.DiskTier, t.DiskKey = make([]uint64, n), make([]string, n), make([]string, n), make([]string, n)
			}
			t.DiskVersion[i], t.DiskService[i], t.DiskTier[i], t.DiskKey[i] = r.DiskVersion, r.DiskService, r.DiskTier, r.DiskKey
		}
		for _, x := range r.Replicas {
			st := pb.ReplicaStatus_PROCESSING
			if x.Complete {
				st = pb.ReplicaStatus_COMPLETE
			}
			t.Segment = append(t.Segment, index(x))
			t.Address = append(t.Address, x.Addr)
			t.Length = append(t.Length, x.Len)
			t.Status = append(t.Status, st)
		}
	}
	return t, failed
}

// replicaCall runs a batch call answered with replica lists and counts
// it under name; form turns the results into the unary message or the
// Session's table.
func replicaCall[T any](s *rpcServer, name string, n int, run func() []ReplicaResult, form func([]ReplicaResult) (T, bool)) (T, error) {
	if err := checkBatch(n); err != nil {
		var zero T
		return zero, err
	}
	out, failed := form(run())
	s.m.m.Op(name, failed)
	s.m.m.Items(name, n)
	return out, nil
}

// startPuts is BatchPutStart or BatchUpsertStart in either form.
func startPuts[T any](ctx context.Context, s *rpcServer, r *pb.BatchPutStartRequest, upsert bool, form func([]ReplicaResult) (T, bool)) (T, error) {
	// A writer may let its put wait for a read lease to end (mc's
	// clients do): see BatchPutStartWait.
	start := func(client store.UUID, host string, items []PutItem, cfg store.ReplicateConfig) []ReplicaResult {
		return s.m.BatchPutStartWait(ctx, client, host, items, cfg, time.Duration(min(r.LeaseWaitMs, 1<<40))*time.Millisecond)
	}
	name := "batch_put_start"
	if upsert {
		start, name = s.m.BatchUpsertStart, "batch_upsert_start"
	}
	out, err := replicaCall(s, name, len(r.Items), func() []ReplicaResult {
		client := store.UUIDFromPB(r.ClientId)
		t, terr := s.m.WriteTenant(r.Tenant, true, true)
		its := items(t, r.Items)
		if terr != nil {
			return failAll(make([]ReplicaResult, len(its)), terr)
		}
		res := start(client, r.ClientHost, its, store.ConfigFromPB(r.Config))
		if ctx.Err() != nil {
			s.giveBack(client, its, res, upsert)
		}
		return res
	}, form)
	if err == nil && ctx.Err() != nil {
		var zero T
		return zero, status.FromContextError(ctx.Err()).Err()
	}
	return out, err
}

// giveBack revokes the grants of a put start whose caller gave up before
// its answer could reach it (its deadline passed, it was cancelled, its
// connection went). The caller revokes what it may have started too, on
// another stream, but that revoke can be handled before this start (it
// then finds nothing): left alone, the grant would hold the key against
// every other writer until the discard timeout (30 s) and its space
// until the release timeout. Over one connection the caller's
// cancellation arrives before its revoke, so one of the two always
// finds the grant.
func (s *rpcServer) giveBack(client store.UUID, in []PutItem, res []ReplicaResult, upsert bool) {
	var keys []string
	for i, r := range res {
		if r.Err == nil {
			keys = append(keys, in[i].Key)
		}
	}
	if len(keys) == 0 {
		return
	}
	revoke := s.m.BatchPutRevoke
	if upsert {
		revoke = s.m.BatchUpsertRevoke
	}
	n := 0
	for _, err := range revoke(client, keys) {
		if err == nil {
			n++
		}
	}
	s.m.log.Info(fmt.Sprintf("put start of %d keys (first %q) by client %s: the caller gave up before the answer; revoked %d grants", len(keys), keys[0], client, n))
}

func (s *rpcServer) getReplicaTable(r *pb.BatchKeysRequest) (*pb.ReplicaTable, error) {
	read := s.m.BatchGetReplicaList
	if r.ReadDisk {
		read = func(keys []string) []ReplicaResult { return s.m.BatchGetReplicaListDirect(time.Time{}, keys) }
	}
	return replicaCall(s, "batch_get_replica_list", len(r.Keys), func() []ReplicaResult {
		return s.readKeys(r.Tenant, r.Keys, read)
	}, replicaTable)
}

// readKeys runs a read of keys in tenant raw's scope.
func (s *rpcServer) readKeys(raw string, keys []string, read func([]string) []ReplicaResult) []ReplicaResult {
	t, err := s.m.ReadTenant(raw)
	if err != nil {
		return failAll(make([]ReplicaResult, len(keys)), err)
	}
	return read(store.ScopeKeys(t, keys))
}

func (s *rpcServer) putStartTable(ctx context.Context, r *pb.BatchPutStartRequest, upsert bool) (*pb.ReplicaTable, error) {
	if err := s.m.AwaitTakeover(ctx); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	return startPuts(ctx, s, r, upsert, replicaTable)
}

// putStartResponse is replicaLists in BatchPutStartResponse's message.
func putStartResponse(rs []ReplicaResult) (*pb.BatchPutStartResponse, bool) {
	l, failed := replicaLists(rs)
	return &pb.BatchPutStartResponse{Results: l.Results}, failed
}

func (s *rpcServer) BatchPutStart(ctx context.Context, r *pb.BatchPutStartRequest) (*pb.BatchPutStartResponse, error) {
	if err := s.m.AwaitTakeover(ctx); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	return startPuts(ctx, s, r, false, putStartResponse)
}

func (s *rpcServer) BatchUpsertStart(ctx context.Context, r *pb.BatchPutStartRequest) (*pb.BatchPutStartResponse, error) {
	if err := s.m.AwaitTakeover(ctx); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	return startPuts(ctx, s, r, true, putStartResponse)
}

func (s *rpcServer) BatchGetReplicaList(ctx context.Context, r *pb.BatchKeysRequest) (*pb.BatchReplicaListResponse, error) {
	deadline, _ := ctx.Deadline()
	return replicaCall(s, "batch_get_replica_list", len(r.Keys), func() []ReplicaResult {
		return s.readKeys(r.Tenant, r.Keys, func(keys []string) []ReplicaResult { return s.m.BatchGetReplicaListBy(deadline, keys) })
	}, replicaLists)
}

// BatchReleaseStaged hands back staged reads of disk objects.
func (s *rpcServer) BatchReleaseStaged(_ context.Context, r *pb.ReleaseStagedRequest) (*pb.Result, error) {
	if err := checkBatch(len(r.Staged)); err != nil {
		return nil, err
	}
	s.m.ReleaseStaged(r.Staged)
	return &pb.Result{}, nil
}

func (s *rpcServer) BatchQuery(_ context.Context, r *pb.BatchKeysRequest) (*pb.BatchReplicaListResponse, error) {
	return replicaCall(s, "batch_query", len(r.Keys), func() []ReplicaResult { return s.readKeys(r.Tenant, r.Keys, s.m.BatchQuery) }, replicaLists)
}

// items are a put start's items, their keys scoped for tenant t.
func items(t string, in []*pb.PutStartItem) []PutItem {
	out := make([]PutItem, len(in))
	for i, it := range in {
		out[i] = PutItem{Key: it.GetKey(), Size: it.GetLength()}
	}
	for i := range out {
		out[i].Key = store.ScopeKey(t, out[i].Key)
	}
	return out
}

func (s *rpcServer) Ping(_ context.Context, r *pb.PingRequest) (*pb.PingResponse, error) {
	v, st := s.m.Ping(store.UUIDFromPB(r.ClientId))
	s.m.m.Op("ping", false)
	if r.ChecksumMismatches > 0 {
		s.m.m.checksumMismatches.Add(float64(r.ChecksumMismatches))
	}
	cs := pb.ClientStatus_OK
	if st == store.ClientNeedRemount {
		cs = pb.ClientStatus_NEED_REMOUNT
	}
	seq, dropped := s.m.DroppedSince(r.DropsSeen)
	var rv uint64
	var roster, fenced []string
	if st == store.ClientOK {
		rv, roster, fenced = s.m.Roster(r.RosterSeen)
	}
	return &pb.PingResponse{ViewVersion: v, ClientStatus: cs, EvictedKeys: s.m.TakeEvictedKeys(store.UUIDFromPB(r.ClientId)), DropsSeq: seq, DroppedEndpoints: dropped,
		RosterVersion: rv, TierRoster: roster, FencedTiers: fenced}, nil
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
	// Before the segments: a put placed on them must find the tiers named.
	s.m.NameTiers(r.TierRoster, r.FencedTiers)
	res, failed := results(s.durable(s.m.ReMountKnown(store.UUIDFromPB(r.ClientId), segs)))
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

func (s *rpcServer) keysOp(name string, r *pb.BatchKeysRequest, f func(store.UUID, []string) []error) (*pb.BatchResults, error) {
	if err := checkBatch(len(r.Keys)); err != nil {
		return nil, err
	}
	t, err := s.m.WriteTenant(r.Tenant, true, false)
	var errs []error
	if err != nil {
		errs = failErrsN(len(r.Keys), err)
	} else {
		errs = s.durable(f(store.UUIDFromPB(r.ClientId), store.ScopeKeys(t, r.Keys)))
	}
	res, failed := results(errs)
	s.m.m.Op(name, failed)
	s.m.m.Items(name, len(r.Keys))
	return res, nil
}

// endWithSums ends puts (or upserts: the same) with the writer's
// checksums, when it sent them.
func (s *rpcServer) endWithSums(r *pb.BatchKeysRequest) func(store.UUID, []string) []error {
	return func(client store.UUID, keys []string) []error {
		var sums []uint64
		if len(r.Checksums) > 0 {
			sums = r.Checksums
		}
		failed, err := failedReplicas(r)
		if err != nil {
			return failErrs(make([]error, len(keys)), err)
		}
		return s.m.BatchPutEndFailed(client, keys, sums, failed)
	}
}

// failedReplicas reads a PutEnd's or PutRevoke's failed replicas.
func failedReplicas(r *pb.BatchKeysRequest) ([]FailedReplica, error) {
	if len(r.FailedKeys) != len(r.FailedSegments) {
		return nil, store.Errorf(store.InvalidParams, "%d failed_keys but %d failed_segments", len(r.FailedKeys), len(r.FailedSegments))
	}
	if len(r.FailedKeys) == 0 {
		return nil, nil
	}
	out := make([]FailedReplica, len(r.FailedKeys))
	for i, k := range r.FailedKeys {
		out[i] = FailedReplica{Key: int(k), Segment: r.FailedSegments[i]}
	}
	return out, nil
}

// revokeReporting revokes puts (or upserts), first recording the
// segments the writer could not write to.
func (s *rpcServer) revokeReporting(r *pb.BatchKeysRequest, revoke func(store.UUID, []string) []error) func(store.UUID, []string) []error {
	return func(client store.UUID, keys []string) []error {
		if len(r.FailedSegments) > 0 {
			s.m.ReportUnreachable(client, r.FailedSegments)
		}
		return revoke(client, keys)
	}
}

func (s *rpcServer) BatchPutEnd(_ context.Context, r *pb.BatchKeysRequest) (*pb.BatchResults, error) {
	return s.keysOp("batch_put_end", r, s.endWithSums(r))
}

func (s *rpcServer) BatchPutRevoke(_ context.Context, r *pb.BatchKeysRequest) (*pb.BatchResults, error) {
	return s.keysOp("batch_put_revoke", r, s.revokeReporting(r, s.m.BatchPutRevoke))
}

func (s *rpcServer) BatchUpsertEnd(_ context.Context, r *pb.BatchKeysRequest) (*pb.BatchResults, error) {
	return s.keysOp("batch_upsert_end", r, s.endWithSums(r))
}

func (s *rpcServer) BatchUpsertRevoke(_ context.Context, r *pb.BatchKeysRequest) (*pb.BatchResults, error) {
	return s.keysOp("batch_upsert_revoke", r, s.revokeReporting(r, s.m.BatchUpsertRevoke))
}

func (s *rpcServer) BatchExistKey(_ context.Context, r *pb.BatchKeysRequest) (*pb.BatchExistResponse, error) {
	if err := checkBatch(len(r.Keys)); err != nil {
		return nil, err
	}
	t, err := s.m.ReadTenant(r.Tenant)
	var exists []bool
	var errs []error
	if err != nil {
		exists, errs = make([]bool, len(r.Keys)), failErrsN(len(r.Keys), err)
	} else {
		exists, errs = s.m.BatchExistKey(store.ScopeKeys(t, r.Keys))
	}
	res, failed := results(errs)
	s.m.m.Op("batch_exist_key", failed)
	s.m.m.Items("batch_exist_key", len(r.Keys))
	return &pb.BatchExistResponse{Results: res.Results, Exists: exists}, nil
}

func (s *rpcServer) BatchRemove(_ context.Context, r *pb.BatchRemoveRequest) (*pb.BatchResults, error) {
	if err := checkBatch(len(r.Keys)); err != nil {
		return nil, err
	}
	t, err := s.m.ReadTenant(r.Tenant)
	var errs []error
	if err != nil {
		errs = failErrsN(len(r.Keys), err)
	} else {
		var sums []uint64
		if len(r.IfSums) > 0 {
			sums = r.IfSums
		}
		errs = s.durable(s.m.BatchRemoveIf(store.ScopeKeys(t, r.Keys), r.Force, sums))
	}
	res, failed := results(errs)
	s.m.m.Op("batch_remove", failed)
	return res, nil
}

func (s *rpcServer) RemoveAll(ctx context.Context, r *pb.RemoveAllRequest) (*pb.RemoveAllResponse, error) {
	if err := s.m.adminAuthorized(ctx); err != nil {
		s.m.m.Op("remove_all", true)
		return nil, err
	}
	t := ""
	if !r.AllTenants {
		var err error
		if t, err = s.m.ReadTenant(r.Tenant); err != nil {
			s.m.m.Op("remove_all", true)
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
	}
	n := s.m.RemoveAllIn(t)
	if err := s.durable([]error{nil})[0]; err != nil {
		s.m.m.Op("remove_all", true)
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	}
	s.m.m.Op("remove_all", false)
	return &pb.RemoveAllResponse{Removed: uint64(n)}, nil
}
