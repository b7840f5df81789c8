package store

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine"
	"github.com/kvcache-ops/mc/pkg/store/alloc"
)

// Defaults for Config.
const (
	DefaultMaster       = "127.0.0.1:50051"
	DefaultPingInterval = time.Second
	DefaultRPCTimeout   = 5 * time.Second
	DefaultStagingSize  = 64 << 20
)

// Config configures a Client.
type Config struct {
	// Master is the master's RPC address, host:port, or etcd://H:P[;H:P]
	// for HA masters: the client reads the leader view in etcd, watches
	// it and follows the leader on failover.
	Master string
	// ClusterID names the HA cluster with an etcd:// master (default
	// $MC_STORE_CLUSTER_ID, else mooncake_cluster).
	ClusterID string
	// Engine moves the bytes. Nil: the client starts its own from
	// EngineConfig and closes it on Close. A node and a client sharing
	// one engine reach the node's segment by memcpy.
	Engine       *engine.Engine
	EngineConfig engine.Config
	// SegmentSize > 0 makes this client a node: it registers a segment of
	// that many bytes with the engine and mounts it on the master.
	SegmentSize uint64
	// SegmentName names the segment on the master (default: the engine's
	// segment name, "host:port").
	SegmentName string
	// Replicate is the default placement of puts.
	Replicate ReplicateConfig
	// PingInterval is how often the client pings the master (1 s).
	PingInterval time.Duration
	// RPCTimeout bounds each call to the master (5 s).
	RPCTimeout time.Duration
	// StagingSize is the registered memory the copying forms (Put, Get)
	// stage values in (64 MiB); larger values get memory of their own.
	StagingSize int
	// Checksums makes the client record a checksum of each value it puts
	// (CRC32C, kept with the object at PutEnd) and check the bytes of
	// every get against the checksum its writer recorded before
	// returning them: a get then never returns bytes other than those
	// put, even if a write landed where it must not. Off by default: on
	// 1 MiB values it cost 13% (tcp) to 39% (shm) of get throughput on a
	// 2-core VM (README, "What fencing and checksums cost").
	Checksums bool
	// Tenant is the tenant the client's keys belong to on a master in
	// multi-tenant mode (Mooncake's tenant_id; "" is "default"); a
	// master without the mode ignores it.
	Tenant string
	Logger *slog.Logger
}

// Client talks to the master and moves bytes with the transfer engine.
// Its methods are safe for concurrent use.
type Client struct {
	cfg     Config
	roster  tierRoster
	id      UUID
	log     *slog.Logger
	w       masterWire
	eng     *engine.Engine
	ownsEng bool
	host    string

	// segMem and segInfo change when the segment is renewed (segMu):
	// readers outside the ping loop take them with segment().
	segMu   sync.Mutex
	segMem  *engine.Memory
	segInfo SegmentInfo

	stageMu  sync.Mutex
	stage    *engine.Memory
	stageAlc *alloc.Allocator
	// lingering are reads whose callers' deadlines passed while they
	// were in flight (abandon): their staging ranges stay taken.
	lingerMu  sync.Mutex
	lingering []*lingering

	segsMu sync.Mutex
	segs   map[string]*engine.Segment
	// tiers are the connections to nodes' disk-tier read services.
	tiers tierConns

	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
	mu       sync.Mutex
	masterUp bool
	view     uint64
	stats    ClientStats
	// populated closes when the segment's pages are in (or populating
	// gave up).
	populated chan struct{}
	evicted   evictionFeed

	// ops is held shared by every data call and exclusively by Close
	// before it releases the memory those calls read and write: a call
	// racing Close gets an error, never a read of unmapped memory.
	ops    sync.RWMutex
	closed atomic.Bool

	// afterPutStart, if set (tests only), runs between a put's grant and
	// its transfer.
	afterPutStart func(keys []string)
	// pingsHeld stops the ping loop (tests: a node stalled, as by
	// SIGSTOP, that hears no roster and re-mounts late).
	pingsHeld atomic.Bool
	// beforePutStart, if set (tests only), runs after a put's values are
	// staged, before its start is sent.
	beforePutStart func(keys []string)
	// afterRead, if set (tests only), runs on each value read before its
	// checksum is checked.
	afterRead func(key string, b []byte)
	// beforeTransfer (tests only) runs before a get's transfer round.
	beforeTransfer func()
	// mismatches counts checksum mismatches; reported the part the
	// master has been told of (Ping).
	mismatches, reported atomic.Uint64
	// streamMoves counts the transfers of staged chunks moved while a
	// node read on (stageStream), streamKeys the keys whose every byte
	// came so and whose node vouched for them.
	streamMoves, streamKeys atomic.Uint64
	// stagedReads counts the staged reads under way (stageOn).
	stagedReads atomic.Int64
	// dropsSeen is the master's drop number as of the last ping.
	dropsSeen atomic.Uint64
	// aborts counts abortEndpoint's aborts (Stats.DroppedPeerAborts).
	aborts atomic.Uint64
	// partialPuts counts puts stored with fewer replicas than granted.
	partialPuts atomic.Uint64
}

var errClientClosed = &Error{Code: UnavailableInCurrentStatus, Msg: "client closed"}

// enter admits a data call unless the client is closed; leave must
// follow. Only the outermost public method enters (the lock is not
// reentrant once Close waits).
func (c *Client) enter() error {
	if c.closed.Load() {
		return errClientClosed
	}
	c.ops.RLock()
	if c.closed.Load() {
		c.ops.RUnlock()
		return errClientClosed
	}
	return nil
}

func (c *Client) leave() { c.ops.RUnlock() }

// failAll is errs with every item set to err.
func failAll(errs []error, err error) []error {
	for i := range errs {
		errs[i] = err
	}
	return errs
}

// WaitPopulated waits until a node's segment is faulted in (at once for
// a pure client): a benchmark that starts its own node waits for it, so
// the kernel's page zeroing does not compete with what it measures.
func (c *Client) WaitPopulated(ctx context.Context) error {
	if c.populated == nil {
		return nil
	}
	select {
	case <-c.populated:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ClientStats counts the client's conversation with the master.
type ClientStats struct {
	MasterUp     bool
	Pings        uint64
	PingFailures uint64
	Remounts     uint64
	// ChecksumMismatches counts replicas whose bytes did not match the
	// writer's checksum (the get tried another replica or failed).
	ChecksumMismatches uint64
	// PartialPuts counts puts stored with fewer replicas than the master
	// granted: a transfer to one failed, the others were written (mc's
	// gRPC only; its segment is avoided until its node pings).
	PartialPuts uint64
	// Renewals counts segment renewals: re-mounts on a master that no
	// longer knew the segment, which revoke every earlier grant in it.
	Renewals uint64
	// EvictedKeys counts the keys the master said it evicted from this
	// client's regions.
	EvictedKeys uint64
	// DrainCopies and DrainBytes count the copies this node made for
	// drain jobs.
	DrainCopies, DrainBytes uint64
	// DroppedPeerAborts counts the times transfers in flight were failed
	// because the master dropped their node for going silent.
	DroppedPeerAborts uint64
}

// Stats reports the client's ping and re-mount counters.
func (c *Client) Stats() ClientStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.stats
	s.MasterUp = c.masterUp
	s.ChecksumMismatches = c.mismatches.Load()
	s.DroppedPeerAborts = c.aborts.Load()
	s.PartialPuts = c.partialPuts.Load()
	c.evicted.mu.Lock()
	s.EvictedKeys = c.evicted.total
	c.evicted.mu.Unlock()
	return s
}

// New connects to the master and, for a node, registers and mounts its
// segment. The client pings the master in the background and re-mounts
// its segment by itself when the master restarts or asks.
//
// Config.Master picks the wire: host:port or etcd://H:P[;H:P] is mc's own
// master (gRPC), mooncake://HOST:PORT a Mooncake master (coro_rpc).
func New(ctx context.Context, cfg Config) (*Client, error) {
	if cfg.Master == "" {
		cfg.Master = DefaultMaster
	}
	if err := CheckTenant(ResolveTenant(cfg.Tenant)); err != nil {
		return nil, fmt.Errorf("tenant: %w", err)
	}
	var etcdEndpoints []string
	var mooncakeAddr string
	switch {
	case IsMooncakeAddress(cfg.Master):
		var err error
		if mooncakeAddr, err = ParseMooncakeAddress(cfg.Master); err != nil {
			return nil, fmt.Errorf("master address: %w", err)
		}
	case IsEtcdAddress(cfg.Master):
		var err error
		if etcdEndpoints, err = ParseEtcdAddress(cfg.Master); err != nil {
			return nil, fmt.Errorf("master address: %w", err)
		}
		cfg.ClusterID = ClusterID(cfg.ClusterID)
	default:
		if _, _, err := net.SplitHostPort(cfg.Master); err != nil {
			return nil, fmt.Errorf("master address %q: want host:port, etcd://HOST:PORT[;HOST:PORT] or mooncake://HOST:PORT", cfg.Master)
		}
	}
	if cfg.PingInterval <= 0 {
		cfg.PingInterval = DefaultPingInterval
	}
	if cfg.RPCTimeout <= 0 {
		cfg.RPCTimeout = DefaultRPCTimeout
	}
	if cfg.StagingSize <= 0 {
		cfg.StagingSize = DefaultStagingSize
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Replicate.ReplicaNum == 0 {
		cfg.Replicate.ReplicaNum = 1
	}
	c := &Client{cfg: cfg, id: NewUUID(), log: cfg.Logger, segs: make(map[string]*engine.Segment), stop: make(chan struct{})}
	fail := func(err error) (*Client, error) {
		c.closeLocal(ctx)
		return nil, err
	}
	var err error
	c.eng = cfg.Engine
	if c.eng == nil {
		if c.eng, err = engine.New(ctx, cfg.EngineConfig); err != nil {
			return fail(err)
		}
		c.ownsEng = true
	}
	c.host = hostOf(c.eng.SegmentName())
	wc := wireConfig{id: c.id, master: cfg.Master, timeout: cfg.RPCTimeout, clusterID: cfg.ClusterID, host: c.host, tenant: ResolveTenant(cfg.Tenant), roster: &c.roster}
	if mooncakeAddr != "" {
		c.w, err = dialMooncake(mooncakeAddr, wc, c.log)
	} else {
		c.w, err = dialGRPC(ctx, wc, etcdEndpoints, c.log)
	}
	if err != nil {
		return fail(err)
	}
	if c.stage, err = c.eng.RegisterMemory(ctx, cfg.StagingSize, "cpu:0", false); err != nil {
		return fail(fmt.Errorf("staging buffer: %w", err))
	}
	if c.stageAlc, err = alloc.New(c.stage.Addr(), uint64(c.stage.Len())); err != nil {
		return fail(fmt.Errorf("staging buffer: %w", err))
	}
	// Register with the master (and learn it is there) before serving.
	if cfg.SegmentSize > 0 {
		err = c.mountSegment(ctx)
	} else {
		err = c.remount(ctx)
	}
	if err != nil {
		if mooncakeAddr == "" && CodeOf(err) == RPCFail && etcdEndpoints == nil && speaksMooncake(ctx, cfg.Master) && !speaksGRPC(ctx, cfg.Master) {
			err = fmt.Errorf("master %s speaks Mooncake's coro_rpc (a mooncake_master?): use --master mooncake://%s", cfg.Master, cfg.Master)
		}
		return fail(err)
	}
	c.masterUp = true
	c.wg.Add(1)
	go c.pingLoop()
	if dw, ok := c.w.(drainWire); ok && c.segMem != nil {
		c.wg.Add(1)
		go c.drainLoop(dw)
	}
	return c, nil
}

func hostOf(endpoint string) string {
	if h, _, err := net.SplitHostPort(endpoint); err == nil {
		return h
	}
	return endpoint
}

func (c *Client) mountSegment(ctx context.Context) error {
	if c.cfg.SegmentSize > uint64(maxInt) {
		return fmt.Errorf("segment size %d does not fit this platform", c.cfg.SegmentSize)
	}
	mem, err := c.eng.RegisterMemory(ctx, int(c.cfg.SegmentSize), "cpu:0", true)
	if err != nil {
		return fmt.Errorf("register segment of %d bytes: %w", c.cfg.SegmentSize, err)
	}
	c.segMem = mem
	c.populated = make(chan struct{})
	c.populate(mem, c.populated)
	name := c.cfg.SegmentName
	if name == "" {
		name = c.eng.SegmentName()
	}
	c.segInfo = SegmentInfo{
		ID: NewUUID(), Name: name, Base: mem.Addr(), Size: uint64(mem.Len()),
		Endpoint: c.eng.SegmentName(), Protocol: c.eng.Config().Protocol,
	}
	if c.segInfo.Protocol == "" {
		c.segInfo.Protocol = "tcp"
	}
	return c.w.mount(ctx, c.segInfo)
}

// populate faults mem in behind the mount, so puts do not pay page
// faults (they halved 1 MiB put throughput) and start-up stays quick;
// done (if not nil) closes when it is over.
func (c *Client) populate(mem *engine.Memory, done chan struct{}) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		if done != nil {
			defer close(done)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			select {
			case <-c.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		t0 := time.Now()
		if err := mem.Populate(ctx); err != nil {
			c.log.Info(fmt.Sprintf("segment pages will fault in on first use: %v", err))
			return
		}
		// Info: until this line puts may pay page faults and compete with
		// the faulting for CPU (on a VM whose host has to back the pages
		// first, 0.2-2.7 s per GiB), so operators and benchmarks wait for it.
		c.log.Info(fmt.Sprintf("segment of %d bytes populated in %s", mem.Len(), time.Since(t0).Round(time.Millisecond)))
	}()
}

// segment is the node's segment memory and description now (nil, zero
// for a pure client).
func (c *Client) segment() (*engine.Memory, SegmentInfo) {
	c.segMu.Lock()
	defer c.segMu.Unlock()
	return c.segMem, c.segInfo
}

const maxInt = int(^uint(0) >> 1)

// remount registers this client and its segment with the master again.
// A master that no longer knows the segment (a restart, a new HA leader
// with nothing of it in its op log, or it dropped this node) cannot know
// what was granted in it before: a writer holding such a grant, stalled
// by SIGSTOP, GC or a slow link, would write over objects placed anew.
// So the segment is renewed first (new memory at a new address, new
// rkeys and memfd: every earlier grant now reaches nothing) and mounted
// as a new incarnation. Its old contents go, as the master has forgotten
// them anyway.
func (c *Client) remount(ctx context.Context) error {
	mem, info := c.segment()
	if mem == nil {
		return c.w.remount(ctx, nil)
	}
	err := c.w.remount(ctx, []SegmentInfo{info})
	if CodeOf(err) != SegmentNotFound {
		return err
	}
	if err := c.renewSegment(ctx); err != nil {
		return err
	}
	_, info = c.segment()
	return c.w.mount(ctx, info)
}

// renewSegment replaces the segment's memory (engine.Renew) and gives the
// segment a new id: the master must not take it for the memory it knew.
func (c *Client) renewSegment(ctx context.Context) error {
	old, info := c.segment()
	t0 := time.Now()
	mem, err := c.eng.Renew(ctx, old)
	if err != nil {
		return fmt.Errorf("renew segment %q: %w", info.Name, err)
	}
	c.segMu.Lock()
	c.segMem = mem
	c.segInfo.ID = NewUUID()
	c.segInfo.Base = mem.Addr()
	info = c.segInfo
	c.segMu.Unlock()
	c.mu.Lock()
	c.stats.Renewals++
	c.mu.Unlock()
	c.log.Info(fmt.Sprintf("renewed segment %s for a master that did not know it: %d bytes at 0x%x (was 0x%x), id %s, in %s; grants of the old memory reach nothing",
		info.Name, mem.Len(), mem.Addr(), old.Addr(), info.ID, time.Since(t0).Round(time.Microsecond)))
	c.populate(mem, nil)
	return nil
}

func (c *Client) pingLoop() {
	defer c.wg.Done()
	t := time.NewTicker(c.cfg.PingInterval)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		case <-c.w.views():
			// A new HA leader: re-mount as soon as it serves rather than
			// at the next tick, so puts find segments again at once.
			for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
				ctx, cancel := context.WithTimeout(context.Background(), c.cfg.RPCTimeout)
				ok := c.ping(ctx)
				cancel()
				if ok {
					break
				}
				select {
				case <-c.stop:
					return
				case <-time.After(50 * time.Millisecond):
				}
			}
			continue
		}
		if c.pingsHeld.Load() {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.RPCTimeout)
		c.ping(ctx)
		cancel()
	}
}

// ping pings the master, re-mounting when asked; it reports whether the
// master answered and this client is mounted there.
func (c *Client) ping(ctx context.Context) bool {
	seen := c.mismatches.Load()
	resp, err := c.w.ping(ctx, seen-c.reported.Load(), c.dropsSeen.Load())
	if err == nil {
		c.reported.Store(seen)
	}
	c.mu.Lock()
	wasUp := c.masterUp
	c.masterUp = err == nil
	c.stats.Pings++
	if err != nil {
		c.stats.PingFailures++
	}
	c.mu.Unlock()
	if err != nil {
		if wasUp {
			c.log.Warn(fmt.Sprintf("master %s unreachable; retrying every %s: %v", c.cfg.Master, c.cfg.PingInterval, err))
		}
		return false
	}
	if !wasUp {
		c.log.Info(fmt.Sprintf("master %s reachable again", c.cfg.Master))
	}
	c.mu.Lock()
	c.view = resp.view
	c.mu.Unlock()
	c.evicted.deliver(resp.evicted)
	c.dropsSeen.Store(resp.dropsSeq)
	for _, ep := range resp.dropped {
		c.abortEndpoint(ep)
	}
	if resp.status == ClientNeedRemount {
		if err := c.remount(ctx); err != nil {
			c.log.Warn(fmt.Sprintf("re-mount on master %s: %v", c.cfg.Master, err))
			return false
		}
		c.mu.Lock()
		c.stats.Remounts++
		c.mu.Unlock()
		// A master that restarted may have taken the metadata server with
		// it (mooncake_master's built-in HTTP one): publish the segment
		// again so peers find it.
		if err := c.eng.Republish(ctx); err != nil {
			_, info := c.segment()
			c.log.Warn(fmt.Sprintf("re-publish segment %s after re-mount: %v", info.Name, err))
		}
		if mem, info := c.segment(); mem != nil {
			c.log.Info(fmt.Sprintf("re-mounted segment %s on master %s", info.Name, c.cfg.Master))
		}
	}
	return true
}

// ID is the client's id on the master.
func (c *Client) ID() UUID { return c.id }

// Engine is the transfer engine the client moves bytes with.
func (c *Client) Engine() *engine.Engine { return c.eng }

// Segment describes the segment this client contributes (ok false for a
// pure client).
func (c *Client) Segment() (SegmentInfo, bool) {
	mem, info := c.segment()
	return info, mem != nil
}

// ViewVersion is the master view version from the last ping.
func (c *Client) ViewVersion() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.view
}

// Close stops pinging; a node unmounts its segment gracefully first (the
// master waits for reads in flight), then the segment's memory and the
// client's own engine are released.
func (c *Client) Close(ctx context.Context) error {
	var err error
	c.stopOnce.Do(func() {
		// Calls under way finish (within their RPC timeout); later ones
		// are refused.
		c.ops.Lock()
		c.closed.Store(true)
		c.ops.Unlock()
		close(c.stop)
		c.flushReleases(ctx)
		c.wg.Wait()
		c.evicted.close()
		if mem, info := c.segment(); mem != nil {
			if err = c.w.unmount(ctx, info.ID); err != nil {
				err = fmt.Errorf("unmount segment %q: %w", info.Name, err)
			} else {
				c.log.Info(fmt.Sprintf("unmounted segment %s from master %s", info.Name, c.cfg.Master))
			}
		}
		// Leave, so the master's client count is true at once rather
		// than after client_ttl. Best effort: the master may be gone.
		_ = c.w.unregister(ctx)
		c.closeLocal(ctx)
	})
	return err
}

func (c *Client) closeLocal(ctx context.Context) {
	c.tiers.close()
	c.segsMu.Lock()
	for k, s := range c.segs {
		s.Close()
		delete(c.segs, k)
	}
	c.segsMu.Unlock()
	if c.eng != nil {
		if c.ownsEng {
			c.eng.Close()
		} else {
			seg, _ := c.segment()
			for _, m := range []*engine.Memory{c.stage, seg} {
				if m != nil {
					c.eng.UnregisterMemory(ctx, m)
				}
			}
		}
	}
	if c.w != nil {
		c.w.close()
	}
}

// openSegment returns the engine's handle for a replica's endpoint,
// cached; dropSegment forgets it after a failure so the next use looks
// the peer up again.
func (c *Client) openSegment(ctx context.Context, endpoint string) (*engine.Segment, error) {
	c.segsMu.Lock()
	s := c.segs[endpoint]
	c.segsMu.Unlock()
	if s != nil {
		return s, nil
	}
	s, err := c.eng.OpenSegment(ctx, endpoint)
	if pe, ok := err.(*engine.ProtocolError); ok {
		return nil, Errorf(TransferFail, "%v: the node serves its segment over %s: pass --protocol %s to reach it", err, pe.Protocol, pe.Protocol)
	}
	if err != nil {
		return nil, Errorf(TransferFail, "%v", err)
	}
	c.segsMu.Lock()
	if old := c.segs[endpoint]; old != nil {
		c.segsMu.Unlock()
		s.Close()
		return old, nil
	}
	c.segs[endpoint] = s
	c.segsMu.Unlock()
	return s, nil
}

// abortEndpoint fails the transfers in flight to a node the master
// dropped for going silent: they would otherwise wait out the transfer
// timeout against a peer that may never answer (a SIGSTOPped process, a
// hung host). A get then tries its next replica; a put fails and is
// revoked.
func (c *Client) abortEndpoint(endpoint string) {
	c.segsMu.Lock()
	s := c.segs[endpoint]
	delete(c.segs, endpoint)
	c.segsMu.Unlock()
	if s == nil {
		return
	}
	c.log.Warn(fmt.Sprintf("the master dropped the segment at %s (its node went silent): failing transfers in flight to it", endpoint))
	c.aborts.Add(1)
	s.Abort(fmt.Errorf("dropped by the master: its node stopped answering (no ping within client_ttl)"))
}

func (c *Client) dropSegment(endpoint string, s *engine.Segment) {
	c.segsMu.Lock()
	if c.segs[endpoint] == s {
		delete(c.segs, endpoint)
		s.Close()
	}
	c.segsMu.Unlock()
}
