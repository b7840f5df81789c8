package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pb "github.com/kvcache-ops/mc/pkg/store/storepb"
)

// grpcWire speaks mc's own master RPC (storepb): the data path's calls on
// pooled Session streams, the rest unary; an etcd:// master is followed
// through the HA view.
type grpcWire struct {
	cfg     wireConfig
	log     *slog.Logger
	conn    *grpc.ClientConn
	etcd    *clientv3.Client // etcd:// masters
	leaderR *leaderResolver  // etcd:// masters
	rpc     pb.MasterClient
	ses     *sessions

	// contacted is set once the master answered a mount or remount:
	// until then, following HA masters, the first contact waits for a
	// serving leader (see firstContact).
	contacted atomic.Bool

	newView chan struct{}
	stop    chan struct{}
	wg      sync.WaitGroup
	once    sync.Once
}

// dialGRPC prepares the connection (gRPC dials lazily; the first call
// finds out whether the master is there). It returns the masterWire
// interface, nil on failure: a nil *grpcWire in the Client's wire would
// be a non-nil interface that New's cleanup closes (issue 34.4).
func dialGRPC(ctx context.Context, cfg wireConfig, etcdEndpoints []string, log *slog.Logger) (masterWire, error) {
	w := &grpcWire{cfg: cfg, log: log, newView: make(chan struct{}, 1), stop: make(chan struct{})}
	target := cfg.master
	dialOpts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMsgSize), grpc.MaxCallSendMsgSize(MaxMsgSize)),
		grpc.WithInitialWindowSize(RPCWindow), grpc.WithInitialConnWindowSize(RPCConnWindow),
	}
	if etcdEndpoints != nil {
		var err error
		if w.leaderR, w.etcd, err = findLeader(ctx, etcdEndpoints, cfg); err != nil {
			return nil, err
		}
		target = w.leaderR.Scheme() + ":///leader"
		// HA masters fail over within the leader lease: a call waits
		// (within RPCTimeout) for the new leader instead of failing at
		// once on the dead one's address. A single master's outage is
		// not expected to end soon, so there calls fail fast, and a
		// caller (a KV-cache get) can fall back to recomputing.
		dialOpts = append(dialOpts, grpc.WithResolvers(w.leaderR), grpc.WithDefaultCallOptions(grpc.WaitForReady(true)))
	}
	// A failover or a restarted master must not wait out gRPC's default
	// reconnect backoff (up to 2 min): the master is dialled again within
	// a second.
	dialOpts = append(dialOpts, grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
		MinConnectTimeout: time.Second,
	}))
	var err error
	w.conn, err = grpc.NewClient(target, dialOpts...)
	if err != nil {
		w.close()
		return nil, fmt.Errorf("master %s: %w", cfg.master, err)
	}
	w.rpc = pb.NewMasterClient(w.conn)
	w.ses = &sessions{rpc: w.rpc, coro: newCoroSessions(w.leader, log)}
	if w.leaderR != nil {
		w.wg.Add(1)
		go w.followView()
	}
	return w, nil
}

// findLeader connects to etcd and waits (up to the RPC timeout) for a
// leader view.
func findLeader(ctx context.Context, endpoints []string, cfg wireConfig) (*leaderResolver, *clientv3.Client, error) {
	cli, err := NewEtcdClient(endpoints)
	if err != nil {
		return nil, nil, fmt.Errorf("master %s: %w", cfg.master, err)
	}
	wctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	v, err := WaitView(wctx, cli, cfg.clusterID)
	if err != nil {
		cli.Close()
		return nil, nil, fmt.Errorf("master %s: no leader within %s (is etcd up, and a master elected?): %w", cfg.master, cfg.timeout, err)
	}
	return &leaderResolver{addr: DialAddr(v.Leader), ccs: make(map[*leaderConn]struct{})}, cli, nil
}

func (w *grpcWire) views() <-chan struct{} { return w.newView }

func (w *grpcWire) leader() string {
	if w.leaderR != nil {
		return w.leaderR.current()
	}
	return w.cfg.master
}

func (w *grpcWire) close() {
	w.once.Do(func() {
		close(w.stop)
		w.wg.Wait()
		if w.ses != nil {
			w.ses.closeAll()
		}
		if w.conn != nil {
			w.conn.Close()
		}
		if w.etcd != nil {
			w.etcd.Close()
		}
	})
}

// failFast exempts a call from waiting for a leader (see dialGRPC): pings
// repeat anyway and must not hold Close, which waits for the ping loop,
// and an unmount at shutdown must not wait out a master that is gone.
var failFast = grpc.WaitForReady(false)

// call runs one RPC with the client's timeout and turns transport errors
// into store errors (RPC_FAIL, RPC_TIMEOUT) that name the master.
func (w *grpcWire) call(ctx context.Context, what string, f func(context.Context) error) error {
	return w.invoke(ctx, what, f, false)
}

// readCall is call for a read the master can answer twice with no harm
// (replica lists, exist, query). Following HA masters, a read that the
// dying leader dropped mid-call is asked again of the next one within
// the same RPC timeout, and so is one that reached the next leader while
// it was still taking over (it refuses with FailedPrecondition until it
// serves); a write is not, since whether it took effect is unknown.
func (w *grpcWire) readCall(ctx context.Context, what string, f func(context.Context) error) error {
	return w.invoke(ctx, what, f, w.leaderR != nil)
}

// firstContact is how a mount or remount is sent: fail-fast (pings and
// the ping loop's re-mounts repeat anyway, and must not hold Close) once
// the client has reached its master, but the client's first contact
// with HA masters waits, within its RPC timeout, for a serving leader,
// and is asked again when the leader goes under it. A client started
// during a failover (a one-shot `mc store put`) would otherwise fail at
// once on the dead leader's address, which the view names until its
// lease expires, or on the new leader still taking over, where a
// long-running client rides through. Both calls are safe to repeat (a
// mount that landed twice is taken back by a remount: see mount).
func (w *grpcWire) firstContact() (grpc.CallOption, retry) {
	if w.leaderR == nil || w.contacted.Load() {
		return failFast, retryNever
	}
	return grpc.WaitForReady(true), retryUnsure
}

// retry says which failures invoke asks again (following HA masters,
// within the call's RPC timeout).
type retry int

const (
	retryNever retry = iota
	// retryUnsure asks again a call that was lost on the way (a dying
	// leader's connection) or refused by a master that is not (yet)
	// the serving leader: for calls safe to repeat.
	retryUnsure
)

func (w *grpcWire) askAgain(err error, r retry) bool {
	if err == nil || w.leaderR == nil {
		return false
	}
	switch r {
	case retryUnsure:
		return status.Code(err) == codes.Unavailable || status.Code(err) == codes.FailedPrecondition
	}
	return false
}

func (w *grpcWire) invoke(ctx context.Context, what string, f func(context.Context) error, again bool) error {
	r := retryNever
	if again {
		r = retryUnsure
	}
	return w.invokeRetry(ctx, what, f, r)
}

func (w *grpcWire) invokeRetry(ctx context.Context, what string, f func(context.Context) error, again retry) error {
	return w.invokeFor(ctx, what, f, again, false)
}

// invokeFor is invokeRetry; untilCaller lets the call run to the
// caller's deadline when that is later than the RPC timeout.
func (w *grpcWire) invokeFor(ctx context.Context, what string, f func(context.Context) error, again retry, untilCaller bool) error {
	clock := startClock(ctx, w.cfg.timeout)
	timeout := w.cfg.timeout
	if untilCaller && !clock.caller.IsZero() && clock.caller.After(clock.start.Add(timeout)) {
		timeout, clock.untilCaller = clock.caller.Sub(clock.start), true
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := f(ctx)
	for ctx.Err() == nil && w.askAgain(err, again) {
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
		}
		err = f(ctx)
	}
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return Errorf(RPCFail, "%s: master %s: %v", what, w.cfg.master, err)
	}
	switch st.Code() {
	case codes.DeadlineExceeded:
		if ctx.Err() != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return clock.timeoutErr(what, w.cfg.master)
		}
		return Errorf(RPCTimeout, "%s: master %s: %s", what, w.cfg.master, st.Message())
	case codes.Canceled:
		return fmt.Errorf("%s: %w", what, context.Canceled)
	case codes.Unavailable:
		return Errorf(RPCFail, "%s: master %s unreachable: %s", what, w.cfg.master, st.Message())
	case codes.FailedPrecondition:
		// An HA master that is not (or no longer) the leader.
		return Errorf(UnavailableInCurrentMode, "%s: master %s: %s", what, w.leader(), st.Message())
	case codes.InvalidArgument, codes.ResourceExhausted:
		return Errorf(InvalidParams, "%s: %s", what, st.Message())
	case codes.Unauthenticated, codes.PermissionDenied:
		// An admin operation (RemoveAll) on a master with an admin token.
		return fmt.Errorf("%s: master %s: %s: %w", what, w.cfg.master, st.Message(), ErrAdminUnauthorized)
	}
	return Errorf(RPCFail, "%s: master %s: %s", what, w.cfg.master, st.Message())
}

func (w *grpcWire) mount(ctx context.Context, seg SegmentInfo) error {
	req := &pb.MountSegmentRequest{ClientId: UUIDToPB(w.cfg.id), Segment: SegmentToPB(seg)}
	var resp *pb.Result
	opt, again := w.firstContact()
	tries := 0
	err := w.invokeRetry(ctx, "mount segment", func(ctx context.Context) (err error) {
		tries++
		resp, err = w.rpc.MountSegment(ctx, req, opt)
		return err
	}, again)
	if err == nil {
		w.contacted.Store(true)
		err = ResultFromPB(resp)
		if tries > 1 && CodeOf(err) == SegmentAlreadyExists {
			// An earlier try landed, its answer lost (a leader that
			// went, its successor restoring the mount from the op
			// log): a remount takes the segment as this client's own
			// when the master has it at the same range.
			err = w.remount(ctx, []SegmentInfo{seg})
		}
	}
	if err != nil {
		return fmt.Errorf("mount segment %q: %w", seg.Name, err)
	}
	return nil
}

func (w *grpcWire) remount(ctx context.Context, segs []SegmentInfo) error {
	req := &pb.ReMountSegmentRequest{ClientId: UUIDToPB(w.cfg.id)}
	if w.cfg.roster != nil {
		req.TierRoster, req.FencedTiers = w.cfg.roster.list()
	}
	what := "connect" // a client with no segment only registers itself
	for _, s := range segs {
		req.Segments = append(req.Segments, SegmentToPB(s))
		what = "mount segment"
	}
	var resp *pb.ReMountSegmentResponse
	opt, again := w.firstContact()
	err := w.invokeRetry(ctx, what, func(ctx context.Context) (err error) {
		resp, err = w.rpc.ReMountSegment(ctx, req, opt)
		return err
	}, again)
	if err != nil {
		return err
	}
	w.contacted.Store(true)
	for i, r := range resp.Results {
		if err := ResultFromPB(r); err != nil {
			name := ""
			if i < len(segs) {
				name = segs[i].Name
			}
			return fmt.Errorf("mount segment %q: %w", name, err)
		}
	}
	return nil
}

func (w *grpcWire) ping(ctx context.Context, mismatches, dropsSeen uint64) (pingResult, error) {
	var resp *pb.PingResponse
	err := w.call(ctx, "ping", func(ctx context.Context) (err error) {
		req := &pb.PingRequest{ClientId: UUIDToPB(w.cfg.id), ChecksumMismatches: mismatches, DropsSeen: dropsSeen}
		if w.cfg.roster != nil {
			req.RosterSeen = w.cfg.roster.seen()
		}
		resp, err = w.rpc.Ping(ctx, req, failFast)
		return err
	})
	if err != nil {
		return pingResult{}, err
	}
	st := ClientOK
	if resp.ClientStatus == pb.ClientStatus_NEED_REMOUNT {
		st = ClientNeedRemount
	} else if w.cfg.roster != nil {
		// Not before a re-mount: a restarted master's roster is not yet
		// what this client names to it.
		w.cfg.roster.update(resp.RosterVersion, resp.TierRoster, resp.FencedTiers)
	}
	return pingResult{view: resp.ViewVersion, status: st, evicted: resp.EvictedKeys, dropsSeq: resp.DropsSeq, dropped: resp.DroppedEndpoints}, nil
}

func (w *grpcWire) unmount(ctx context.Context, seg UUID) error {
	return w.call(ctx, "unmount segment", func(ctx context.Context) error {
		r, err := w.rpc.GracefulUnmountSegment(ctx, &pb.UnmountSegmentRequest{ClientId: UUIDToPB(w.cfg.id), SegmentId: UUIDToPB(seg)}, failFast)
		if err == nil {
			if e := ResultFromPB(r); e != nil && CodeOf(e) != SegmentNotFound {
				return e
			}
		}
		return err
	})
}

func (w *grpcWire) unregister(ctx context.Context) error {
	return w.call(ctx, "unregister", func(ctx context.Context) error {
		_, err := w.rpc.UnregisterClient(ctx, &pb.PingRequest{ClientId: UUIDToPB(w.cfg.id)})
		return err
	})
}

func (w *grpcWire) putStart(ctx context.Context, items []putItem, rc ReplicateConfig, upsert bool) ([][]Replica, []error, error) {
	req := &pb.BatchPutStartRequest{ClientId: UUIDToPB(w.cfg.id), Config: ConfigToPB(rc), ClientHost: w.cfg.host, Tenant: w.cfg.tenant}
	req.Items = make([]*pb.PutStartItem, len(items))
	for i, it := range items {
		req.Items[i] = &pb.PutStartItem{Key: it.key, Length: it.n}
	}
	var table *pb.ReplicaTable
	// A put start may wait on the master for read leases to end (issue
	// 34 item 7), so it runs to the caller's deadline when that is later
	// than the RPC timeout: with 10 s leases and the 5 s timeout, a writer
	// that reads what it writes and gives itself 15 s had half its puts
	// refused in every lease cycle.
	err := w.invokeFor(ctx, "put start", func(ctx context.Context) (err error) {
		req.LeaseWaitMs = uint64(leaseWait(ctx) / time.Millisecond)
		table, err = w.ses.PutStart(ctx, req, upsert)
		return err
	}, retryNever, true)
	if err != nil {
		return nil, nil, err
	}
	return replicaTableFromPB(table, len(items))
}

func (w *grpcWire) endsPartial() bool { return true }

// leaseWait is how long a put start may wait on the master for a read
// lease to end (when leases are all that keeps it from room): what is
// left of the call's deadline but a margin for the answer's way back,
// a tenth of it (at least 100 ms, at most half).
func leaseWait(ctx context.Context) time.Duration {
	dl, ok := ctx.Deadline()
	if !ok {
		return 0
	}
	left := time.Until(dl)
	if left <= 0 {
		return 0
	}
	return left - min(max(left/10, 100*time.Millisecond), left/2)
}

func (w *grpcWire) putEnd(ctx context.Context, keys []string, sums []uint64, failed []failedReplica, upsert bool) []error {
	var fk []uint32
	var fs []string
	for _, f := range failed {
		fk = append(fk, uint32(f.key))
		fs = append(fs, f.segment)
	}
	return w.keysCall(ctx, "put end", keys, func(ctx context.Context, r *pb.BatchKeysRequest) (*pb.BatchResults, error) {
		r.Checksums = sums
		r.FailedKeys, r.FailedSegments = fk, fs
		if upsert {
			return w.ses.BatchUpsertEnd(ctx, r)
		}
		return w.ses.BatchPutEnd(ctx, r)
	})
}

// putRevoke gives grants back. A revoke is safe to repeat (a second one
// finds nothing), and one that does not land leaves, with HA, a grant the
// next leader holds until the discard timeout: following HA masters, it
// is asked again through a failover, within the RPC timeout, until the
// master answers for every key.
func (w *grpcWire) putRevoke(ctx context.Context, keys []string, upsert bool, unreachable []string) []error {
	ctx, cancel := context.WithTimeout(ctx, w.cfg.timeout)
	defer cancel()
	out := make([]error, len(keys))
	idx := make([]int, len(keys))
	for i := range idx {
		idx[i] = i
	}
	for {
		ks := make([]string, len(idx))
		for j, i := range idx {
			ks[j] = keys[i]
		}
		res := w.keysCallAgain(ctx, "put revoke", ks, w.leaderR != nil, func(ctx context.Context, r *pb.BatchKeysRequest) (*pb.BatchResults, error) {
			r.FailedSegments = unreachable
			if upsert {
				return w.ses.BatchUpsertRevoke(ctx, r)
			}
			return w.ses.BatchPutRevoke(ctx, r)
		})
		var left []int
		for j, i := range idx {
			out[i] = res[j]
			if unsure(res[j]) {
				left = append(left, i)
			}
		}
		if len(left) == 0 || ctx.Err() != nil || w.leaderR == nil {
			// A single master that did not answer is down: the grants
			// go with its state.
			return out
		}
		idx = left
		select {
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			return out
		}
	}
}

func (w *grpcWire) keysCall(ctx context.Context, what string, keys []string, f func(context.Context, *pb.BatchKeysRequest) (*pb.BatchResults, error)) []error {
	return w.keysCallAgain(ctx, what, keys, false, f)
}

// keysCallAgain is keysCall; with again, the call is asked again through
// a failover (for calls safe to repeat).
func (w *grpcWire) keysCallAgain(ctx context.Context, what string, keys []string, again bool, f func(context.Context, *pb.BatchKeysRequest) (*pb.BatchResults, error)) []error {
	out := make([]error, len(keys))
	var resp *pb.BatchResults
	err := w.invoke(ctx, what, func(ctx context.Context) (err error) {
		resp, err = f(ctx, &pb.BatchKeysRequest{ClientId: UUIDToPB(w.cfg.id), Keys: keys, Tenant: w.cfg.tenant})
		return err
	}, again)
	if err == nil && len(resp.Results) != len(keys) {
		err = Errorf(RPCFail, "%s: master answered %d items for %d", what, len(resp.Results), len(keys))
	}
	for i := range out {
		if err != nil {
			out[i] = err
		} else {
			out[i] = ResultFromPB(resp.Results[i])
		}
	}
	return out
}

func (w *grpcWire) replicaLists(ctx context.Context, keys []string) ([][]Replica, []uint64, []error, error) {
	var table *pb.ReplicaTable
	err := w.readCall(ctx, "get", func(ctx context.Context) (err error) {
		// read_disk: this client asks nodes for staged reads of disk
		// objects itself (stageDisk).
		table, err = w.ses.GetReplicaLists(ctx, &pb.BatchKeysRequest{ClientId: UUIDToPB(w.cfg.id), Keys: keys, Tenant: w.cfg.tenant, ReadDisk: true})
		return err
	})
	if err != nil {
		return nil, nil, nil, err
	}
	lists, errs, err := replicaTableFromPB(table, len(keys))
	var sums []uint64
	if err == nil && len(table.Checksums) == len(keys) {
		sums = table.Checksums
	}
	return lists, sums, errs, err
}

// releaseStaged hands staged reads back (best effort: the staging TTL
// frees what does not arrive).
func (w *grpcWire) releaseStaged(ctx context.Context, ids []uint64) error {
	return w.call(ctx, "release staged reads", func(ctx context.Context) error {
		_, err := w.rpc.BatchReleaseStaged(ctx, &pb.ReleaseStagedRequest{ClientId: UUIDToPB(w.cfg.id), Staged: ids})
		return err
	})
}

func (w *grpcWire) exist(ctx context.Context, keys []string) ([]bool, []error) {
	ex := make([]bool, len(keys))
	errs := make([]error, len(keys))
	var resp *pb.BatchExistResponse
	err := w.readCall(ctx, "exist", func(ctx context.Context) (err error) {
		resp, err = w.ses.BatchExistKey(ctx, &pb.BatchKeysRequest{ClientId: UUIDToPB(w.cfg.id), Keys: keys, Tenant: w.cfg.tenant})
		return err
	})
	if err == nil && (len(resp.Results) != len(keys) || len(resp.Exists) != len(keys)) {
		err = Errorf(RPCFail, "exist: master answered %d items for %d", len(resp.Results), len(keys))
	}
	for i := range keys {
		if err != nil {
			errs[i] = err
			continue
		}
		errs[i] = ResultFromPB(resp.Results[i])
		ex[i] = resp.Exists[i]
	}
	return ex, errs
}

func (w *grpcWire) remove(ctx context.Context, keys []string, force bool) []error {
	return w.keysCall(ctx, "remove", keys, func(ctx context.Context, r *pb.BatchKeysRequest) (*pb.BatchResults, error) {
		return w.ses.BatchRemove(ctx, &pb.BatchRemoveRequest{ClientId: r.ClientId, Keys: r.Keys, Force: force, Tenant: w.cfg.tenant})
	})
}

// removeIf removes keys whose objects are still the versions of the
// writers' checksums sums (condRemover).
func (w *grpcWire) removeIf(ctx context.Context, keys []string, sums []uint64) []error {
	return w.keysCall(ctx, "remove", keys, func(ctx context.Context, r *pb.BatchKeysRequest) (*pb.BatchResults, error) {
		return w.ses.BatchRemove(ctx, &pb.BatchRemoveRequest{ClientId: r.ClientId, Keys: r.Keys, Force: true, Tenant: w.cfg.tenant, IfSums: sums})
	})
}

func (w *grpcWire) removeAll(ctx context.Context) (uint64, error) {
	var resp *pb.RemoveAllResponse
	err := w.call(ctx, "remove all", func(ctx context.Context) (err error) {
		resp, err = w.rpc.RemoveAll(ctx, &pb.RemoveAllRequest{ClientId: UUIDToPB(w.cfg.id), Tenant: w.cfg.tenant})
		return err
	})
	if err != nil {
		return 0, err
	}
	return resp.Removed, nil
}

func (w *grpcWire) query(ctx context.Context, key string) ([]Replica, error) {
	var resp *pb.BatchReplicaListResponse
	err := w.readCall(ctx, "query", func(ctx context.Context) (err error) {
		resp, err = w.rpc.BatchQuery(ctx, &pb.BatchKeysRequest{ClientId: UUIDToPB(w.cfg.id), Keys: []string{key}, Tenant: w.cfg.tenant})
		return err
	})
	if err != nil {
		return nil, err
	}
	if len(resp.Results) != 1 {
		return nil, Errorf(RPCFail, "query: master answered %d items for 1", len(resp.Results))
	}
	reps, _, err := ReplicaListFromPB(resp.Results[0])
	return reps, err
}

// speaksGRPC reports whether addr answers mc's gRPC at all (any status
// from a server, an error code included). mc's master serves Mooncake's
// coro_rpc on the same port, so a call that failed there must not be
// blamed on addr being a mooncake_master.
func speaksGRPC(ctx context.Context, addr string) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return false
	}
	defer cc.Close()
	_, err = pb.NewMasterClient(cc).Ping(ctx, &pb.PingRequest{})
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return false
	}
	return true
}
