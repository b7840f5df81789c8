package ha

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvcache-ops/mc/pkg/connlimit"
	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/master"
)

// Defaults.
const (
	DefaultLeaseTTL         = 5 * time.Second
	DefaultSnapshotInterval = 10 * time.Minute
	DefaultSnapshotRecords  = 100000
)

// Config configures a Candidate.
type Config struct {
	// Endpoints are the etcd client endpoints (host:port).
	Endpoints []string
	// ClusterID names the cluster's keys (default mooncake_cluster).
	ClusterID string
	// RPCAddress is where the master's gRPC API listens, host:port (port
	// 0 picks one).
	RPCAddress string
	// Advertise is the view's value, "<rpc_address>:<rpc_port>" (default:
	// RPCAddress with the port bound).
	Advertise string
	// AdminAddress serves the admin HTTP API ("" disables it).
	AdminAddress string
	// LeaseTTL is the leader lease (5 s); a leader that cannot renew it
	// steps down before it can expire.
	LeaseTTL time.Duration
	// SnapshotInterval and SnapshotRecords: the leader snapshots its
	// state and compacts the log after this long or this many records,
	// whichever comes first.
	SnapshotInterval time.Duration
	SnapshotRecords  int
	// Master configures each leader term's master (OnChange, Sync and
	// ViewVersion are set by the candidate).
	Master master.Config
	Logger *slog.Logger
}

// HA states, as the admin API reports them.
const (
	stateStarting   = "starting"
	stateStandby    = "standby"
	stateCandidate  = "candidate"
	stateRecovering = "recovering"
	stateWarmup     = "leader_warmup"
	stateServing    = "serving"
)

// Candidate is one HA master: a standby keeping a warm copy of the op
// log's state, campaigning for the leader view, and serving while it
// leads.
type Candidate struct {
	cfg       Config
	log       *slog.Logger
	cli       *clientv3.Client
	lis       *muxListener
	admin     *http.Server
	adminH    atomic.Value // http.Handler
	idle      *master.Master
	RPCAddr   string // bound RPC address
	AdminAddr string // bound admin address, "" without one
	// adminAdvertise is the admin address published with the view
	// (store.AdminKey), "" without an admin API.
	adminAdvertise string

	stateMu sync.Mutex // guards st
	st      *state     // the committed state (warm copy)

	haState   atomic.Value // string
	ready     atomic.Bool
	view      atomic.Pointer[store.View]
	cur       atomic.Pointer[term]
	applied   atomic.Uint64 // op log position: last record applied (committed, on a leader)
	lastSeen  atomic.Uint64 // last seq known to be in the log
	snapSeq   atomic.Uint64
	terms     atomic.Uint64
	commits   atomic.Uint64
	snapshots atomic.Uint64

	// snapRev is the etcd revision of the last snapshot this candidate
	// installed: the next one compacts etcd's history up to it. lastNoSpace
	// rate-limits the NOSPACE report of a candidate that keeps
	// campaigning (unix nanos).
	snapRev     atomic.Int64
	compactions atomic.Uint64
	lastNoSpace atomic.Int64

	// Mooncake's snapshot metrics: master_snapshot_success and _fail,
	// master_snapshot_duration_ms.
	snapOK, snapFail atomic.Uint64
	snapDur          prometheus.Histogram
	metrics          []prometheus.Collector

	ctx      context.Context
	cancel   context.CancelFunc
	graceful atomic.Bool
	wg       sync.WaitGroup
	closed   sync.Once
}

// term is one period of leadership.
type term struct {
	rev     int64
	granted time.Time // before the lease was granted: its expiry is later
	lease   clientv3.LeaseID
	m       *master.Master
	log     *committer
	grpc    *master.GRPCServer
	// until is the lease's local deadline (monoNanos): every call
	// checks it, not only keepLease's timer. A leader paused past it
	// (SIGSTOP, a VM stall) resumes with RPCs and that timer ready at
	// once, in no set order, and answered calls from a term another
	// leader may have followed.
	until atomic.Int64
}

// monoBase and monoNanos read the monotonic clock cheaply: a lease
// deadline is compared on every call.
var monoBase = time.Now()

func monoNanos(t time.Time) int64 { return int64(t.Sub(monoBase)) }

// setDeadline records the lease's local deadline for the calls' check.
func (t *term) setDeadline(d time.Time) { t.until.Store(monoNanos(d)) }

// leased reports whether the lease's local deadline is still ahead.
func (t *term) leased() bool { return monoNanos(time.Now()) < t.until.Load() }

// Start connects to etcd, binds the RPC (and admin) listeners, loads the
// op log's state and starts campaigning. It returns at once: the
// candidate serves when it wins.
func Start(ctx context.Context, cfg Config) (*Candidate, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Master.Logger == nil {
		cfg.Master.Logger = cfg.Logger
	}
	cfg.ClusterID = store.ClusterID(cfg.ClusterID)
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = DefaultLeaseTTL
	}
	if cfg.LeaseTTL < 2*time.Second || cfg.LeaseTTL%time.Second != 0 {
		return nil, fmt.Errorf("HA lease TTL %s: want whole seconds, at least 2 s (etcd's lease granularity)", cfg.LeaseTTL)
	}
	if cfg.SnapshotInterval <= 0 {
		cfg.SnapshotInterval = DefaultSnapshotInterval
	}
	if cfg.SnapshotRecords <= 0 {
		cfg.SnapshotRecords = DefaultSnapshotRecords
	}
	if len(cfg.Endpoints) == 0 {
		return nil, errors.New("HA: no etcd endpoint")
	}
	idleCfg := cfg.Master
	idleCfg.Events = nil // only a leader term's master publishes KV events
	idle, err := master.New(idleCfg)
	if err != nil {
		return nil, err
	}
	c := &Candidate{cfg: cfg, log: cfg.Logger, st: newState(), idle: idle}
	c.haState.Store(stateStarting)
	if c.cli, err = store.NewEtcdClient(cfg.Endpoints); err != nil {
		return nil, fmt.Errorf("HA: %w", err)
	}
	base, err := net.Listen("tcp", cfg.RPCAddress)
	if err != nil {
		c.cli.Close()
		return nil, fmt.Errorf("master RPC listener: %w", err)
	}
	c.lis = newMuxListener(connlimit.Default().Listener(base, "master rpc"))
	c.RPCAddr = base.Addr().String()
	if c.cfg.Advertise == "" {
		h, _, _ := net.SplitHostPort(cfg.RPCAddress)
		_, p, _ := net.SplitHostPort(c.RPCAddr)
		c.cfg.Advertise = net.JoinHostPort(h, p)
	}
	c.metrics = c.newMetrics()
	c.setAdmin(idle)
	if cfg.AdminAddress != "" {
		alis, err := net.Listen("tcp", cfg.AdminAddress)
		if err != nil {
			c.lis.Close()
			c.cli.Close()
			return nil, fmt.Errorf("admin HTTP listener: %w", err)
		}
		alis = connlimit.Default().Listener(alis, "admin http")
		c.AdminAddr = alis.Addr().String()
		c.adminAdvertise = advertiseAdmin(c.cfg.Advertise, c.AdminAddr)
		c.admin = master.NewAdminServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			c.adminH.Load().(http.Handler).ServeHTTP(w, r)
		}), c.log)
		go c.admin.Serve(alis)
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.wg.Add(1)
	go c.run()
	return c, nil
}

// Advertise is the address this candidate publishes when it leads.
func (c *Candidate) Advertise() string { return c.cfg.Advertise }

// AdvertiseAdmin is the admin address this candidate publishes with its
// view when it leads (store.AdminKey), "" without an admin API.
func (c *Candidate) AdvertiseAdmin() string { return c.adminAdvertise }

// advertiseAdmin is the admin address to publish for one bound at bound:
// an admin API on every interface is reached at the RPC address's host,
// as clients reach the leader.
func advertiseAdmin(rpc, bound string) string {
	h, p, err := net.SplitHostPort(bound)
	if err != nil {
		return bound
	}
	if ip := net.ParseIP(h); h == "" || (ip != nil && ip.IsUnspecified()) {
		if rh, _, err := net.SplitHostPort(rpc); err == nil {
			h = rh
		}
	}
	return net.JoinHostPort(h, p)
}

// Master is the serving master while this candidate leads, else nil.
func (c *Candidate) Master() *master.Master {
	if t := c.cur.Load(); t != nil && c.ready.Load() {
		return t.m
	}
	return nil
}

// WaitLeader waits until some candidate of the cluster leads (this one,
// or another whose view it has read), for at most d. A node started
// beside a candidate waits here first: on a loaded machine the first
// term (campaign, op log replay) can outlast the node's RPC timeout.
func (c *Candidate) WaitLeader(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if c.ready.Load() || c.view.Load() != nil {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-c.ctx.Done():
			return false
		case <-t.C:
			return false
		case <-tick.C:
		}
	}
}

// Leading reports whether this candidate serves as the leader.
func (c *Candidate) Leading() bool { return c.Master() != nil }

// State is what the admin API reports.
func (c *Candidate) State() master.HAState {
	s := master.HAState{Role: "standby", State: c.haState.Load().(string), Ready: c.ready.Load()}
	if s.Ready {
		s.Role = "leader"
	}
	if v := c.view.Load(); v != nil {
		s.Leader, s.ViewVersion, s.HasView = v.Leader, v.Version, true
	}
	return s
}

// Close steps down (revoking the lease, so another candidate takes over
// at once) and stops.
func (c *Candidate) Close() {
	c.graceful.Store(true)
	c.shutdown()
}

// Kill stops as a crash would: the lease is left to expire, the servers
// stop abruptly. For failover tests.
func (c *Candidate) Kill() { c.shutdown() }

func (c *Candidate) shutdown() {
	c.closed.Do(func() {
		c.cancel()
		c.wg.Wait()
		if c.admin != nil {
			sctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = c.admin.Shutdown(sctx)
			cancel()
		}
		c.lis.Close()
		c.cli.Close()
	})
}

func (c *Candidate) setState(s string) { c.haState.Store(s) }

func (c *Candidate) commitTimeout() time.Duration { return c.cfg.LeaseTTL / 2 }

func (c *Candidate) setAdmin(m *master.Master) {
	for _, col := range c.metrics {
		_ = m.Metrics().Registry.Register(col)
	}
	c.adminH.Store(master.NewAdminHandler(m, master.AdminOptions{HA: c.State}))
}

// run alternates standby and leader terms until the candidate stops.
func (c *Candidate) run() {
	defer c.wg.Done()
	var abandoned clientv3.LeaseID
	for c.ctx.Err() == nil {
		tctx, stopTail := context.WithCancel(c.ctx)
		tailDone := make(chan struct{})
		go func() { defer close(tailDone); c.tail(tctx) }()
		t := c.campaignUntilWon(&abandoned)
		stopTail()
		<-tailDone
		if t == nil {
			return
		}
		abandoned = c.lead(t)
	}
}

// campaignUntilWon campaigns, and while another candidate leads, waits
// for its view to go. It returns nil when the candidate stops.
func (c *Candidate) campaignUntilWon(abandoned *clientv3.LeaseID) *term {
	warned := false
	for c.ctx.Err() == nil {
		if *abandoned != 0 {
			// A lease from a term that ended without revoking it
			// (etcd was unreachable): revoke it now, so nobody waits
			// for it to expire.
			rctx, cancel := context.WithTimeout(c.ctx, time.Second)
			_, err := c.cli.Revoke(rctx, *abandoned)
			cancel()
			if err == nil || errors.Is(err, rpctypes.ErrLeaseNotFound) {
				*abandoned = 0
			}
		}
		if c.haState.Load() != stateStarting {
			c.setState(stateCandidate)
		}
		t, rev, err := c.campaign()
		if err != nil {
			if isNoSpace(err) {
				c.logEtcdError(fmt.Sprintf("HA campaign for %s: %v; retrying", store.ViewKey(c.cfg.ClusterID), err), err)
			} else if !warned {
				c.log.Warn(fmt.Sprintf("HA campaign for %s: %v; retrying", store.ViewKey(c.cfg.ClusterID), err))
				warned = true
			}
			c.sleep(500 * time.Millisecond)
			continue
		}
		warned = false
		if t != nil {
			return t
		}
		if c.haState.Load() != stateStarting {
			c.setState(stateStandby)
		}
		c.waitViewGone(rev)
	}
	return nil
}

func (c *Candidate) sleep(d time.Duration) {
	select {
	case <-c.ctx.Done():
	case <-time.After(d):
	}
}

// campaign tries once to create the view. It returns the new term, or
// nil and the revision at which another leader's view was read.
func (c *Candidate) campaign() (*term, int64, error) {
	ctx, cancel := context.WithTimeout(c.ctx, c.commitTimeout())
	defer cancel()
	key := store.ViewKey(c.cfg.ClusterID)
	// Is there a leader? Only grant a lease when there is none.
	get, err := c.cli.Get(ctx, key)
	if err != nil {
		return nil, 0, err
	}
	if len(get.Kvs) > 0 {
		kv := get.Kvs[0]
		c.view.Store(&store.View{Leader: string(kv.Value), Version: uint64(kv.CreateRevision)})
		return nil, get.Header.Revision, nil
	}
	c.view.Store(nil)
	granted := time.Now()
	lease, err := c.cli.Grant(ctx, int64(c.cfg.LeaseTTL/time.Second))
	if err != nil {
		return nil, 0, fmt.Errorf("grant lease: %w", err)
	}
	// The view is Mooncake's key and value; the admin address goes
	// beside it in the same transaction, under the same lease.
	puts := []clientv3.Op{clientv3.OpPut(key, c.cfg.Advertise, clientv3.WithLease(lease.ID))}
	if c.adminAdvertise != "" {
		puts = append(puts, clientv3.OpPut(store.AdminKey(c.cfg.ClusterID), c.adminAdvertise, clientv3.WithLease(lease.ID)))
	}
	resp, err := c.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(puts...).
		Else(clientv3.OpGet(key)).Commit()
	if err != nil || !resp.Succeeded {
		rctx, rcancel := context.WithTimeout(c.ctx, time.Second)
		_, _ = c.cli.Revoke(rctx, lease.ID)
		rcancel()
	}
	if err != nil {
		return nil, 0, fmt.Errorf("create %s: %w", key, err)
	}
	if !resp.Succeeded {
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
			c.view.Store(&store.View{Leader: string(kvs[0].Value), Version: uint64(kvs[0].CreateRevision)})
		}
		return nil, resp.Header.Revision, nil
	}
	return &term{rev: resp.Header.Revision, lease: lease.ID, granted: granted}, 0, nil
}

// waitViewGone watches the view from rev until it is deleted (the leader
// stepped down or its lease expired). A broken watch returns too: the
// caller campaigns again, which re-reads.
func (c *Candidate) waitViewGone(rev int64) {
	ctx, cancel := context.WithCancel(c.ctx)
	defer cancel()
	key := store.ViewKey(c.cfg.ClusterID)
	wch := c.cli.Watch(clientv3.WithRequireLeader(ctx), key, clientv3.WithRev(rev+1))
	safety := time.NewTimer(30 * time.Second)
	defer safety.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-safety.C:
			return
		case wr, ok := <-wch:
			if !ok || wr.Err() != nil {
				c.sleep(200 * time.Millisecond)
				return
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete {
					c.view.Store(nil)
					return
				}
				c.view.Store(&store.View{Leader: string(ev.Kv.Value), Version: uint64(ev.Kv.CreateRevision)})
			}
		}
	}
}

// lead serves one term: finish replay, restore into a fresh master,
// serve, keep the lease; then step down. It returns the lease when it
// could not be revoked.
func (c *Candidate) lead(t *term) (abandoned clientv3.LeaseID) {
	c.terms.Add(1)
	c.setState(stateRecovering)
	deadline := t.granted.Add(c.cfg.LeaseTTL - c.margin())
	t.setDeadline(deadline)
	why := c.serveTerm(t, deadline)
	// Step down: refuse at once, then take the term apart.
	c.ready.Store(false)
	c.setAdmin(c.idle)
	if t.log != nil {
		t.log.stop(errStopped)
		<-t.log.exited
	}
	if t.grpc != nil {
		t.grpc.Stop()
	}
	if t.m != nil {
		t.m.Close()
	}
	c.cur.Store(nil)
	c.view.Store(nil)
	c.setState(stateStandby)
	killed := c.ctx.Err() != nil && !c.graceful.Load()
	if !killed {
		msg := fmt.Sprintf("HA: leader term at view %d ended: %s; standing by", t.rev, why)
		if t.log != nil && isNoSpace(t.log.failure()) {
			c.logEtcdError(msg, t.log.failure())
		} else {
			c.log.Warn(msg)
		}
		rctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := c.cli.Revoke(rctx, t.lease)
		cancel()
		if err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return t.lease
		}
	}
	return 0
}

func (c *Candidate) margin() time.Duration { return c.cfg.LeaseTTL / 5 }

// takeoverGrace bounds how long a new leader's puts wait for the
// segments of its op log to mount again (nodes re-mount within a ping of
// the view change; one that is not back by then is dead or cut off).
const takeoverGrace = 3 * time.Second

// serveTerm runs a term until it must end, and says why.
func (c *Candidate) serveTerm(t *term, deadline time.Time) string {
	// The old leader can no longer append (its fence broke with its
	// view), so the log read now is complete.
	ctx, cancel := context.WithDeadline(c.ctx, deadline)
	_, err := c.catchUp(ctx)
	cancel()
	if err != nil {
		return fmt.Sprintf("replay before serving: %v", err)
	}
	c.setState(stateWarmup)
	c.stateMu.Lock()
	release := c.cfg.Master.PutReleaseTimeout
	if release <= 0 {
		release = master.DefaultPutReleaseTimeout
	}
	objs, dropped := c.st.restoredAt(time.Now(), release)
	// Reads the previous leader granted may still be moving bytes: it
	// granted none after its lease's local deadline, which passed before
	// this term began, so each ends within one KV lease TTL from now
	// (the candidates of a cluster share --default_kv_lease_ttl). Until
	// then no restored object's range is reused.
	leaseTTL := c.cfg.Master.KVLeaseTTL
	if leaseTTL <= 0 {
		leaseTTL = master.DefaultKVLeaseTTL
	}
	heldUntil := time.Now().Add(leaseTTL)
	for i := range objs {
		if !objs[i].Pending && objs[i].ReserveUntil.IsZero() {
			objs[i].ReadLeasedUntil = heldUntil
		}
	}
	drains := c.st.drainJobs()
	from := c.st.Seq
	segs := make(map[string]store.SegmentInfo, len(c.st.Segments))
	for k, v := range c.st.Segments {
		segs[k] = v
	}
	c.stateMu.Unlock()
	t.log = newCommitter(c, t.rev, from, segs)
	mc := c.cfg.Master
	mc.ViewVersion, mc.OnChange, mc.Sync = uint64(t.rev), t.log.onChange, t.log.sync
	if nt, ok := mc.Events.(interface{ NewTerm() }); ok {
		// This term's KV events start a new sequence (from 1), so a
		// consumer of this endpoint can tell that other leaders may
		// have changed the pool since its stream last moved.
		nt.NewTerm()
	}
	m, err := master.New(mc)
	if err == nil {
		err = m.Restore(objs)
	}
	if err == nil {
		m.RestoreDrains(drains)
	}
	if err != nil {
		close(t.log.exited)
		return fmt.Sprintf("restore %d objects: %v", len(objs), err)
	}
	// Puts wait (up to takeoverGrace) for the nodes the log knows to
	// mount again: they follow the view at once.
	names := make([]string, 0, len(segs))
	for n := range segs {
		names = append(names, n)
	}
	m.ExpectSegments(names, takeoverGrace)
	t.m = m
	t.log.master.Store(m)
	m.Start()
	go t.log.run(c.ctx)
	t.grpc = master.NewGRPCServer(m, c.gate(t))
	// Mooncake's clients reach the leader on the same port, through the
	// same gate and op log.
	go t.grpc.ServeShared(c.lis.open(), master.NewMooncakeServer(m, c.mooncakeGate(t), c.log))
	c.cur.Store(t)
	c.view.Store(&store.View{Leader: c.cfg.Advertise, Version: uint64(t.rev)})
	c.setAdmin(m)
	c.ready.Store(true)
	c.setState(stateServing)
	msg := fmt.Sprintf("HA: leading at view %d as %s: %d objects restored from op log seq %d", t.rev, c.cfg.Advertise, len(objs), from)
	if dropped > 0 {
		msg += fmt.Sprintf(" (%d dropped: no located replica)", dropped)
	}
	c.log.Info(msg)
	return c.keepLease(t, deadline)
}

// gate refuses every RPC unless t is the serving term: a master that is
// stepping down answers UNAVAILABLE_IN_CURRENT_MODE, never stale data.
// It looks again once the call is answered: a leader paused inside a
// call (its lease lapsing meanwhile) must not send what it read then.
func (c *Candidate) gate(t *term) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if !c.serving(t) {
			return nil, status.Error(codes.FailedPrecondition, notLeading)
		}
		resp, err := h(ctx, req)
		if !c.serving(t) {
			return nil, status.Error(codes.FailedPrecondition, notLeading+" (its lease lapsed during the call, which may or may not have taken effect)")
		}
		return resp, err
	}
}

const notLeading = "UNAVAILABLE_IN_CURRENT_MODE: this master is not the serving leader"

// serving reports whether t is the serving term, its lease's local
// deadline is ahead and its op log still commits: once the log stops
// (the term winds down, or a commit failed), nothing the master does is
// durable, and its reads may miss what the next leader has already
// acknowledged.
func (c *Candidate) serving(t *term) bool {
	return t != nil && c.ready.Load() && c.cur.Load() == t && t.leased() && (t.log == nil || !t.log.stopped.Load())
}

// mooncakeGate is gate for calls on Mooncake's wire (run before and
// after each call, as gate's looks).
func (c *Candidate) mooncakeGate(t *term) master.MooncakeGate {
	return func(ctx context.Context, call string) error {
		if !c.serving(t) {
			return fmt.Errorf("%s: %s", call, notLeading)
		}
		return nil
	}
}

// keepLease renews the lease every third of its TTL. The local deadline
// runs from when a renewal was sent, minus a margin, so it passes before
// etcd can expire the lease: the leader stops serving before anyone else
// can win.
func (c *Candidate) keepLease(t *term, deadline time.Time) string {
	every := c.cfg.LeaseTTL / 3
	next := time.Now().Add(every)
	for {
		wait := time.Until(next)
		if d := time.Until(deadline); d < wait {
			wait = d
		}
		timer := time.NewTimer(max(wait, 0))
		select {
		case <-c.ctx.Done():
			timer.Stop()
			return "stopping"
		case <-t.log.failed:
			timer.Stop()
			return t.log.failure().Error()
		case <-timer.C:
		}
		now := time.Now()
		if !now.Before(deadline) {
			return "lease not renewed in time (etcd unreachable?)"
		}
		if now.Before(next) {
			continue
		}
		ctx, cancel := context.WithDeadline(c.ctx, deadline)
		resp, err := c.cli.KeepAliveOnce(ctx, t.lease)
		cancel()
		switch {
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			return "lease expired"
		case err == nil && resp.TTL > 0:
			deadline = now.Add(time.Duration(resp.TTL)*time.Second - c.margin())
			t.setDeadline(deadline)
			next = now.Add(every)
		default:
			next = now.Add(200 * time.Millisecond)
		}
	}
}

// catchUp brings the warm state to the end of the log (through the
// snapshot when the log it needs was compacted) and returns the revision
// it read at.
func (c *Candidate) catchUp(ctx context.Context) (int64, error) {
	c.stateMu.Lock()
	seq := c.st.Seq
	c.stateMu.Unlock()
	cid := c.cfg.ClusterID
	resp, err := c.cli.Get(ctx, snapshotKey(cid))
	if err != nil {
		return 0, fmt.Errorf("read snapshot key: %w", err)
	}
	rev := resp.Header.Revision
	var meta snapshotMeta
	if len(resp.Kvs) > 0 {
		if err := json.Unmarshal(resp.Kvs[0].Value, &meta); err != nil {
			return 0, fmt.Errorf("snapshot key: %w", err)
		}
		c.snapSeq.Store(meta.Seq)
	}
	if meta.Seq > seq {
		st, err := c.loadSnapshot(ctx, meta, rev)
		if err != nil {
			return 0, err
		}
		c.stateMu.Lock()
		c.st = st
		c.stateMu.Unlock()
		seq = st.Seq
		c.applied.Store(seq)
		c.log.Info(fmt.Sprintf("HA: loaded snapshot at op log seq %d (%d objects, %d segments)", seq, len(st.Objects), len(st.Segments)))
	}
	end := clientv3.GetPrefixRangeEnd(oplogPrefix(cid))
	from := oplogKey(cid, seq+1)
	for {
		page, err := c.cli.Get(ctx, from, clientv3.WithRange(end), clientv3.WithRev(rev), clientv3.WithLimit(256))
		if err != nil {
			return 0, fmt.Errorf("read op log: %w", err)
		}
		for _, kv := range page.Kvs {
			if err := c.applyBatch(kv.Value); err != nil {
				return 0, err
			}
		}
		if !page.More || len(page.Kvs) == 0 {
			return rev, nil
		}
		from = string(page.Kvs[len(page.Kvs)-1].Key) + "\x00"
	}
}

var errGap = errors.New("op log gap")

// applyBatch applies one op log value to the warm state.
func (c *Candidate) applyBatch(v []byte) error {
	recs, err := decodeBatch(v)
	if err != nil {
		return err
	}
	last := recs[len(recs)-1].Seq
	if last > c.lastSeen.Load() {
		c.lastSeen.Store(last)
	}
	c.stateMu.Lock()
	defer c.stateMu.Unlock()
	if recs[0].Seq > c.st.Seq+1 {
		return fmt.Errorf("%w: batch at seq %d, state at %d", errGap, recs[0].Seq, c.st.Seq)
	}
	for _, r := range recs {
		c.st.apply(r)
	}
	c.applied.Store(c.st.Seq)
	return nil
}

func (c *Candidate) loadSnapshot(ctx context.Context, meta snapshotMeta, rev int64) (*state, error) {
	resp, err := c.cli.Get(ctx, snapshotChunks(c.cfg.ClusterID, meta.Seq), clientv3.WithPrefix(), clientv3.WithRev(rev),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return nil, fmt.Errorf("read snapshot at seq %d: %w", meta.Seq, err)
	}
	if len(resp.Kvs) != meta.Chunks {
		return nil, fmt.Errorf("snapshot at seq %d: %d chunks, want %d", meta.Seq, len(resp.Kvs), meta.Chunks)
	}
	var b []byte
	for _, kv := range resp.Kvs {
		b = append(b, kv.Value...)
	}
	st, err := decodeState(b)
	if err != nil {
		return nil, err
	}
	if st.Seq != meta.Seq {
		return nil, fmt.Errorf("snapshot at seq %d holds seq %d", meta.Seq, st.Seq)
	}
	return st, nil
}

// tail keeps the warm state current while standing by: catch up, then
// apply each batch the watch delivers; on a gap or a broken watch, catch
// up again.
func (c *Candidate) tail(ctx context.Context) {
	for ctx.Err() == nil {
		rev, err := c.catchUp(ctx)
		if err != nil {
			if ctx.Err() == nil {
				c.log.Debug(fmt.Sprintf("HA: op log catch-up: %v", err))
				select {
				case <-ctx.Done():
				case <-time.After(500 * time.Millisecond):
				}
			}
			continue
		}
		if c.haState.Load() == stateStarting {
			c.setState(stateStandby)
		}
		c.watchLog(ctx, rev)
	}
}

func (c *Candidate) watchLog(ctx context.Context, rev int64) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := c.cli.Watch(clientv3.WithRequireLeader(wctx), oplogPrefix(c.cfg.ClusterID), clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	for wr := range wch {
		if wr.Err() != nil {
			return
		}
		for _, ev := range wr.Events {
			if ev.Type != clientv3.EventTypePut {
				continue
			}
			if err := c.applyBatch(ev.Kv.Value); err != nil {
				c.log.Debug(fmt.Sprintf("HA: %v; catching up", err))
				return
			}
		}
	}
}

func (c *Candidate) newMetrics() []prometheus.Collector {
	// Mooncake's buckets, in milliseconds.
	c.snapDur = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "master_snapshot_duration_ms", Help: "time to write an HA snapshot, ms (failed ones too)",
		Buckets: []float64{0, 500, 1000, 5000, 10000, 30000, 60000, 120000, 180000, 240000, 300000}})
	g := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f)
	}
	u := func(v *atomic.Uint64) func() float64 { return func() float64 { return float64(v.Load()) } }
	last := func() uint64 {
		if t := c.cur.Load(); t != nil && t.log != nil {
			return t.log.lastQueued()
		}
		return max(c.lastSeen.Load(), c.applied.Load())
	}
	return []prometheus.Collector{
		g("mc_store_ha_is_leader", "1 while this master serves as the leader", func() float64 {
			if c.ready.Load() {
				return 1
			}
			return 0
		}),
		g("mc_store_ha_view_version", "view version of the current leader (0: none known)", func() float64 {
			if v := c.view.Load(); v != nil {
				return float64(v.Version)
			}
			return 0
		}),
		g("mc_store_ha_oplog_applied_seq", "op log position: last record applied to this master's state (committed, on the leader)", u(&c.applied)),
		g("mc_store_ha_oplog_last_seq", "last op log record known (queued, on the leader)", func() float64 { return float64(last()) }),
		g("mc_store_ha_oplog_lag_records", "records known but not yet applied (queued but not committed, on the leader)", func() float64 {
			return float64(last() - min(last(), c.applied.Load()))
		}),
		g("mc_store_ha_snapshot_seq", "op log seq of the latest snapshot", u(&c.snapSeq)),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "mc_store_ha_leader_terms_total", Help: "times this master won the election"}, u(&c.terms)),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "mc_store_ha_oplog_commits_total", Help: "op log batches this master committed"}, u(&c.commits)),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "mc_store_ha_snapshots_total", Help: "snapshots this master wrote"}, u(&c.snapshots)),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "mc_store_ha_etcd_compactions_total", Help: "etcd history compactions this master made after a snapshot"}, u(&c.compactions)),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "master_snapshot_success", Help: "HA snapshots written"}, u(&c.snapOK)),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "master_snapshot_fail", Help: "HA snapshots that failed"}, u(&c.snapFail)),
		c.snapDur,
	}
}

// Summary is the leader's summary line, or the standby's state.
func (c *Candidate) Summary() string {
	if m := c.Master(); m != nil {
		return m.Summary()
	}
	return "HA " + c.haState.Load().(string) + ": op log at seq " + strconv.FormatUint(c.applied.Load(), 10)
}

// isNoSpace reports etcd's NOSPACE: its database reached its quota.
func isNoSpace(err error) bool {
	return err != nil && (errors.Is(err, rpctypes.ErrNoSpace) || strings.Contains(err.Error(), rpctypes.ErrNoSpace.Error()))
}

// noSpaceAdvice is what an operator does about NOSPACE.
const noSpaceAdvice = "etcd is out of space (NOSPACE alarm: its database reached its quota, --quota-backend-bytes, 2 GiB by default) and refuses every write: " +
	"no master can lead or commit, so every put fails. On etcd: compact its history, defragment, disarm the alarm " +
	"(etcdctl compaction <current revision>; etcdctl defrag; etcdctl alarm disarm), or restart it with a larger quota; " +
	"mc serve metadata does this itself. The leader compacts etcd's history after each snapshot: a database this full holds keys other than the op log, or snapshots failed"

// logEtcdError logs msg at error level, with what to do when err is
// NOSPACE (at most every 10 s: a candidate retries every 500 ms);
// other errors are warnings.
func (c *Candidate) logEtcdError(msg string, err error) {
	if !isNoSpace(err) {
		c.log.Warn(msg)
		return
	}
	now := time.Now().UnixNano()
	if last := c.lastNoSpace.Load(); now-last < int64(10*time.Second) || !c.lastNoSpace.CompareAndSwap(last, now) {
		return
	}
	c.log.Error(msg + ": " + noSpaceAdvice)
}
