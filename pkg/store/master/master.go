// Package master is the store's master: metadata only. It knows the
// mounted segments and the space inside them, every object's replicas and
// state (PROCESSING until the writer's PutEnd, then COMPLETE), read leases
// and pins, and which clients are alive. Bytes never pass through it.
//
// The state is split so that the hot paths do not queue behind each other:
// objects live in shards (a key's shard lock covers its object, its lease
// and the shard's eviction order); space (segments, regions, allocators)
// has one lock taken only to place or free replicas; client liveness is a
// read-mostly map with atomic timestamps, so a Ping never waits behind the
// data plane. Lock order: shard, then space.
//
// Space is handed out in regions (store.md): a segment is carved into
// RegionSize pieces, a writing client instance is given regions on demand,
// and its objects are placed inside its own regions with an offset
// allocator. Eviction orders come from package policy (chosen by
// Config.EvictionPolicy); HA plugs in at the OnChange hook and Restore.
//
// Main types: Master, Config, Change.
package master

import (
	"context"
	"fmt"
	"hash/maphash"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvcache-ops/mc/pkg/budget"
	"github.com/kvcache-ops/mc/pkg/store"
)

// Defaults, as mooncake_master's.
const (
	DefaultKVLeaseTTL = 10 * time.Second
	// DefaultStagingTTL is Config.StagingTTL's default, Mooncake's
	// client_buffer_gc_ttl_ms.
	DefaultStagingTTL         = 5 * time.Second
	DefaultSoftPinTTL         = 30 * time.Minute
	DefaultMaxSoftPinTTL      = 24 * time.Hour
	DefaultEvictionRatio      = 0.05
	DefaultHighWatermark      = 0.90
	DefaultClientTTL          = 10 * time.Second
	DefaultPutDiscardTimeout  = 30 * time.Second
	DefaultPutReleaseTimeout  = 600 * time.Second
	DefaultRegionSize         = 64 << 20
	DefaultEvictionInterval   = 10 * time.Millisecond
	DefaultMaintenanceTick    = 100 * time.Millisecond
	defaultShards             = 256
	strategyRandom            = "random"
	strategyFreeRatioFirst    = "free_ratio_first"
	strategyLocalFirst        = "local_first"
	DefaultAllocationStrategy = strategyRandom
)

// Strategies lists the values of Config.AllocationStrategy.
var Strategies = []string{strategyRandom, strategyFreeRatioFirst, strategyLocalFirst}

// Config configures a Master. Zero fields take mooncake_master's defaults.
type Config struct {
	KVLeaseTTL           time.Duration
	DefaultSoftPinTTL    time.Duration
	MaxSoftPinTTL        time.Duration
	AllowEvictSoftPinned *bool // default true
	EvictionRatio        float64
	HighWatermark        float64
	ClientTTL            time.Duration
	PutDiscardTimeout    time.Duration
	PutReleaseTimeout    time.Duration
	AllocationStrategy   string
	// ExistKeyGrantLease makes ExistKey grant a read lease as Mooncake's
	// does. Off by default: frequent probes then kept a full pool
	// unevictable (Mooncake #2187).
	ExistKeyGrantLease bool
	// RegionSize is the piece of a segment handed to one writing instance;
	// objects of at least half a region get a region of their own.
	RegionSize uint64
	// MaxRegionsPerInstance bounds the regions one instance holds (0 =
	// unlimited).
	MaxRegionsPerInstance int
	// EvictionPolicy orders objects for eviction: lru (default), lfu,
	// fifo, length-aware (package policy), or none (never evict: a put
	// into a full store fails, as in Mooncake without its loop).
	EvictionPolicy string
	// OnChange is called for every metadata change, in order, while the
	// changed key (or the space) is locked: the HA op log hooks in here.
	// It must not block for long or call back into the Master.
	OnChange func(Change)
	// Sync, when set, is called by the RPC layer before it acknowledges a
	// change that must survive a failover (put end, remove, revoke,
	// mount): it returns once every change OnChange has seen so far is
	// durable. An error fails the call's items with
	// UNAVAILABLE_IN_CURRENT_MODE, since the change may be lost.
	Sync func() error
	// Events, when set, is told of objects stored and removed (KV
	// events for cache-aware routers; events.go).
	Events Events
	// ViewVersion is reported by Ping (the HA view version; 0 without HA).
	ViewVersion uint64
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
	// EvictionInterval is the watermark loop's period while usage is at
	// or above the high watermark (default 10 ms). Below it the loop
	// sleeps for evictionIdleInterval and an allocation that takes usage
	// over the watermark wakes it.
	EvictionInterval time.Duration
	// MaintenanceTick is the period of the loop that drops silent
	// clients, discards unfinished puts and frees expired staging copies
	// (default 100 ms).
	MaintenanceTick time.Duration
	// PromoteAfter is the disk read on which an object whose only copy
	// is on a node's disk tier is promoted back into DRAM (0: the
	// default, 2; negative: never): earlier reads get a staging copy
	// freed when their lease ends.
	PromoteAfter int
	// StagingTTL bounds how long a staged read of a disk object holds its
	// range of the node's staging pool after its last grant when its
	// reader does not hand it back (it died, or is a Mooncake client,
	// whose wire has no such call): default DefaultStagingTTL.
	StagingTTL time.Duration
	// DropFence bounds how long, without HA, a put or remove of a key
	// waits for its node to confirm dropping the key's old disk record
	// (default DefaultDropFence; see dropDiskLocked), and then, the node
	// fenced, for another node to hold the roster that says so
	// (fenceSlow).
	DropFence time.Duration
	// TierSettle bounds how long, without HA, a restarted master holds
	// puts and removes for the disk tiers returning nodes say the pool
	// had (default DefaultTierSettle; see settle.go).
	TierSettle time.Duration
	// GracefulUnmountWait bounds how long a graceful unmount waits for
	// leased reads (default 2 s, at most the lease TTL): a read moves its
	// bytes in milliseconds, the lease is only its upper bound.
	GracefulUnmountWait time.Duration
	// AdminToken, when set, is the bearer token the admin HTTP API asks
	// of every call that changes state (any method but GET and HEAD:
	// remove_all, drain jobs); reads stay open, as Mooncake's are.
	AdminToken string
	// RequestBudget bounds the request bytes the master's RPC servers
	// hold at once, both wires together (budget.go): DefaultRequestBudget
	// when 0, unlimited when negative.
	RequestBudget int64
	// RequestReadTimeout bounds reading one request once its first byte
	// came (a coro_rpc frame, a unary gRPC message): default 30 s.
	RequestReadTimeout time.Duration
	// Tenants turns on multi-tenant mode (tenants.go).
	Tenants TenantConfig
	Logger  *slog.Logger
}

func (c *Config) setDefaults() error {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.KVLeaseTTL, DefaultKVLeaseTTL)
	def(&c.StagingTTL, DefaultStagingTTL)
	def(&c.DefaultSoftPinTTL, DefaultSoftPinTTL)
	def(&c.MaxSoftPinTTL, DefaultMaxSoftPinTTL)
	def(&c.ClientTTL, DefaultClientTTL)
	def(&c.PutDiscardTimeout, DefaultPutDiscardTimeout)
	def(&c.PutReleaseTimeout, DefaultPutReleaseTimeout)
	def(&c.EvictionInterval, DefaultEvictionInterval)
	def(&c.GracefulUnmountWait, 2*time.Second)
	def(&c.RequestReadTimeout, DefaultRequestReadTimeout)
	if c.RequestBudget == 0 {
		c.RequestBudget = DefaultRequestBudget
	}
	c.GracefulUnmountWait = min(c.GracefulUnmountWait, c.KVLeaseTTL)
	if c.AllowEvictSoftPinned == nil {
		t := true
		c.AllowEvictSoftPinned = &t
	}
	if c.EvictionRatio == 0 {
		c.EvictionRatio = DefaultEvictionRatio
	}
	if c.HighWatermark == 0 {
		c.HighWatermark = DefaultHighWatermark
	}
	if c.RegionSize == 0 {
		c.RegionSize = DefaultRegionSize
	}
	if c.AllocationStrategy == "" {
		c.AllocationStrategy = DefaultAllocationStrategy
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.PromoteAfter == 0 {
		c.PromoteAfter = DefaultPromoteAfter
	}
	if c.EvictionPolicy == "" {
		c.EvictionPolicy = DefaultEvictionPolicy
	}
	if _, err := newShardPolicy(c.EvictionPolicy); err != nil {
		return err
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	switch {
	// Written so that NaN fails them too.
	case !(c.EvictionRatio >= 0 && c.EvictionRatio <= 1):
		return fmt.Errorf("eviction_ratio %g: want a fraction in [0, 1]", c.EvictionRatio)
	case !(c.HighWatermark > 0 && c.HighWatermark <= 1):
		return fmt.Errorf("eviction_high_watermark_ratio %g: want a fraction in (0, 1]", c.HighWatermark)
	case c.PutReleaseTimeout <= c.PutDiscardTimeout:
		return fmt.Errorf("put_start_release_timeout_sec (%s) must exceed put_start_discard_timeout_sec (%s)", c.PutReleaseTimeout, c.PutDiscardTimeout)
	case c.RegionSize < 4096:
		return fmt.Errorf("region size %d: want at least 4096 bytes", c.RegionSize)
	case c.MaxRegionsPerInstance < 0:
		return fmt.Errorf("max regions per instance %d: want 0 (unlimited) or more", c.MaxRegionsPerInstance)
	}
	for _, s := range Strategies {
		if s == c.AllocationStrategy {
			return nil
		}
	}
	return fmt.Errorf("allocation_strategy %q: want one of %v", c.AllocationStrategy, Strategies)
}

// ChangeOp names a metadata change.
type ChangeOp uint8

const (
	OpMount ChangeOp = iota + 1
	OpUnmount
	OpPutEnd
	OpRemove
	OpEvict
	OpDiscard
	// OpDiskOnly: the object's only copy is now its disk replica (an
	// offload landed, its DRAM copy was evicted, or a node reported it).
	OpDiskOnly
	// OpPromote: a disk object is back in DRAM (Replicas), its disk
	// replica kept.
	OpPromote
	// OpDrain: a drain job was created or ended (Drain), so that a new
	// HA leader can answer for it.
	OpDrain
	// OpPutStart: space was granted to a writer (Client) for Key at
	// Replicas, at Started. A next HA leader must hold that space as the
	// writer's until the put ends, is revoked or is released: the writer
	// may still be writing into it.
	OpPutStart
	// OpRevoke: the writer gave a put's space back (it stopped writing).
	OpRevoke
	// OpHold: Key's ranges at Replicas (Size bytes each) left the object
	// while a read lease still covered them: they are freed at Started,
	// when that lease ends. A next HA leader must not reuse them before:
	// the reader may still be moving their bytes.
	OpHold
)

func (o ChangeOp) String() string {
	return [...]string{"", "mount", "unmount", "put_end", "remove", "evict", "discard", "disk_only", "promote", "drain", "put_start", "revoke", "hold"}[o]
}

// Change is one metadata change, as the OnChange hook sees it.
type Change struct {
	Op       ChangeOp
	Key      string          // object changes
	Size     uint64          // object size
	Replicas []store.Replica // put_end: where the bytes are
	SoftPin  time.Time       // put_end: soft pin expiry, zero if none
	HardPin  bool
	Segment  store.SegmentInfo // mount / unmount
	Client   store.UUID
	// Version and Tier: the disk replica (disk_only, promote): the
	// object version and the id of the node's disk tier holding it.
	Version uint64
	Tier    string
	// Drain is the job of a drain change.
	Drain *DrainJob
	// Started is when a put started (put_start).
	Started time.Time
	// Sum is the writer's checksum of the value (put_end; 0: none).
	Sum uint64
}

// Master is the store's metadata service. Its methods are safe for
// concurrent use.
type Master struct {
	cfg Config
	log *slog.Logger
	// tenants is nil without multi-tenant mode.
	tenants *tenantTable
	// budget bounds request bytes in flight on both RPC wires.
	budget *budget.Budget
	// drops are the segments dropped for a silent owner, told with pings.
	drops  *dropLog
	seed   maphash.Seed
	shards []shard
	space  space
	pend   pending
	tiers  tiers
	era    eraLog
	roster roster
	early  earlyHold
	drains drains
	// takeover holds puts while a new HA leader's segments mount again.
	takeover takeover
	// evictMu serializes allocation-failure eviction (evictForPuts).
	evictMu sync.Mutex
	m       *Metrics

	clientsMu sync.RWMutex
	clients   map[store.UUID]*clientState

	evictKick chan struct{}
	// evictIdle: the watermark loop is in its long sleep (usage was
	// below the high watermark); an allocation that takes usage over it
	// kicks the loop (noteUsage).
	evictIdle atomic.Bool
	// evictLooks counts the watermark loop's rounds (tests).
	evictLooks atomic.Uint64
	// massSilence: Maintain is holding clients that fell silent together
	// (warned once per episode).
	massSilence atomic.Bool
	closeOnce   sync.Once
	done        chan struct{}
	wg          sync.WaitGroup
}

type clientState struct {
	id       store.UUID
	lastPing atomic.Int64 // unix nanos
	segments map[store.UUID]struct{}
}

// New makes a master; Start runs its background loops.
func New(cfg Config) (*Master, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	m := &Master{
		cfg:       cfg,
		log:       cfg.Logger,
		budget:    budget.New(cfg.RequestBudget, "--request-budget"),
		drops:     newDropLog(),
		seed:      maphash.MakeSeed(),
		shards:    make([]shard, defaultShards),
		clients:   make(map[store.UUID]*clientState),
		evictKick: make(chan struct{}, 1),
		done:      make(chan struct{}),
	}
	tt, err := newTenantTable(cfg.Tenants)
	if err != nil {
		return nil, err
	}
	m.tenants = tt
	m.m = newMetrics(m)
	m.era.now = m.now
	m.era.seed = maphash.MakeSeed()
	m.era.end.Store(m.now() + 3*m.cfg.ClientTTL.Nanoseconds())
	m.roster.init(m.now())
	m.tiers.onDropDone = m.slowDropDone
	for i := range m.shards {
		m.shards[i].objects = make(map[string]*Object)
		m.shards[i].ledger = m.tenants
		m.shards[i].era = &m.era
		m.shards[i].policy, _ = newShardPolicy(cfg.EvictionPolicy)
	}
	m.space.init(&m.cfg)
	m.tiers.init()
	m.space.tiered = m.tiers.any
	m.space.grew = m.noteUsage
	m.drains.init()
	return m, nil
}

// Config returns the effective configuration.
func (m *Master) Config() Config { return m.cfg }

// Start runs the background loops (client TTL, discard and release of
// abandoned puts, watermark eviction) until Close.
func (m *Master) Start() {
	m.wg.Add(2)
	go m.maintenanceLoop()
	go m.evictionLoop()
}

// Close stops the background loops.
func (m *Master) Close() {
	m.closeOnce.Do(func() { close(m.done) })
	m.wg.Wait()
}

func (m *Master) now() int64 { return m.cfg.Now().UnixNano() }

// massSilenceHold is how many client TTLs clients that fell silent
// together are held before they are dropped.
const massSilenceHold = 3

func (m *Master) shardOf(key string) *shard {
	return &m.shards[maphash.String(m.seed, key)%uint64(len(m.shards))]
}

func (m *Master) emit(c Change) {
	if m.cfg.OnChange != nil {
		m.cfg.OnChange(c)
	}
}

// ---- clients and segments ----

// Ping records that client is alive and tells it whether it must
// re-mount (the master does not know it: a restart, or it was dropped).
func (m *Master) Ping(client store.UUID) (viewVersion uint64, status store.ClientStatus) {
	m.clientsMu.RLock()
	c := m.clients[client]
	m.clientsMu.RUnlock()
	if c == nil {
		return m.cfg.ViewVersion, store.ClientNeedRemount
	}
	c.lastPing.Store(m.now())
	if back := m.space.reachable(client); len(back) > 0 {
		m.log.Info(fmt.Sprintf("segments %s, reported unreachable by a writer, are placed on again: their node %s pinged", strings.Join(back, ", "), client))
	}
	return m.cfg.ViewVersion, store.ClientOK
}

// ReportUnreachable records that client could not write to the named
// segments (a failed transfer): nothing is placed there while another
// segment can take the replica, until the segment's node pings again. A
// dead node stays avoided until client_ttl drops it; a node that is
// alive comes back within its ping interval.
func (m *Master) ReportUnreachable(client store.UUID, segments []string) {
	if len(segments) == 0 {
		return
	}
	for _, seg := range m.space.markUnreachable(segments) {
		m.m.unreachableReports.Inc()
		m.log.Warn(fmt.Sprintf("client %s could not write to segment %s (%s, node %s): placing nothing there until its node pings again", client, seg.Info.Name, seg.Info.Endpoint, seg.Client))
	}
}

// touchClient returns client's state, registering it when new.
func (m *Master) touchClient(client store.UUID) *clientState {
	m.clientsMu.RLock()
	c := m.clients[client]
	m.clientsMu.RUnlock()
	if c == nil {
		m.clientsMu.Lock()
		if c = m.clients[client]; c == nil {
			c = &clientState{id: client, segments: make(map[store.UUID]struct{})}
			m.clients[client] = c
		}
		m.clientsMu.Unlock()
	}
	c.lastPing.Store(m.now())
	return c
}

// ActiveClients counts the clients the master currently knows.
func (m *Master) ActiveClients() int {
	m.clientsMu.RLock()
	defer m.clientsMu.RUnlock()
	return len(m.clients)
}

// MountSegment adds a segment owned by client. Mounting the same segment
// again from the same client is a no-op.
func (m *Master) MountSegment(client store.UUID, seg store.SegmentInfo) error {
	if client.IsZero() {
		return store.Errorf(store.InvalidParams, "mount segment %q: no client id", seg.Name)
	}
	c := m.touchClient(client)
	err := m.space.mount(client, seg)
	if old := m.space.supersededBy(seg); store.CodeOf(err) == store.SegmentAlreadyExists && old != nil {
		// The same name at the same endpoint with a new id: the node
		// restarted (or renewed its memory) before this master dropped
		// the old incarnation. That memory is gone, and its objects
		// with it: unmount it now and mount the new one.
		m.log.Warn(fmt.Sprintf("segment %s at %s mounted again as %s: the earlier incarnation %s is gone, unmounting it and the objects on it", seg.Name, seg.Endpoint, seg.ID, old.info.ID))
		if uerr := m.UnmountSegment(store.UUID{}, old.info.ID); uerr != nil && store.CodeOf(uerr) != store.SegmentNotFound {
			return uerr
		}
		err = m.space.mount(client, seg)
	}
	if err != nil {
		return err
	}
	m.clientsMu.Lock()
	c.segments[seg.ID] = struct{}{}
	m.clientsMu.Unlock()
	m.emit(Change{Op: OpMount, Segment: seg, Client: client})
	m.takeover.mounted(seg.Name)
	m.log.Info(fmt.Sprintf("mounted segment %s (%s) of %s at 0x%x from client %s via %s", seg.Name, seg.ID, fmtBytes(seg.Size), seg.Base, client, seg.Endpoint))
	return nil
}

// ReMountSegment mounts every segment in segs for client, as a client does
// after NEED_REMOUNT; segments already mounted are left as they are. The
// client becomes known even when segs is empty.
func (m *Master) ReMountSegment(client store.UUID, segs []store.SegmentInfo) []error {
	m.touchClient(client)
	errs := make([]error, len(segs))
	for i, s := range segs {
		err := m.MountSegment(client, s)
		if store.CodeOf(err) == store.SegmentAlreadyExists && m.space.ownedBy(s.ID, client) {
			err = nil
			// The same id must still describe the same memory: a range
			// that changed means the node's memory is not what the
			// replicas on it point into.
			if base, size := m.space.rangeOf(s.ID); base != s.Base || size != s.Size {
				err = store.Errorf(store.SegmentAlreadyExists, "segment %q (%s) is mounted at 0x%x+%d, not 0x%x+%d: unmount it first", s.Name, s.ID, base, size, s.Base, s.Size)
			}
		}
		errs[i] = err
	}
	return errs
}

// ReMountKnown is ReMountSegment for mc's nodes, which can renew their
// memory: it takes back only a segment this master knows (mounted by
// the client, or restored from the HA op log with the replicas on it).
// Any other fails with SEGMENT_NOT_FOUND: this master cannot know what
// was granted in that memory before it (a restart) or before it dropped
// the segment, and a writer holding such a grant would land on the
// objects it placed anew. The node then renews the memory and mounts it
// as a new segment (Client.remount).
func (m *Master) ReMountKnown(client store.UUID, segs []store.SegmentInfo) []error {
	errs := make([]error, len(segs))
	var take []store.SegmentInfo
	var at []int
	for i, s := range segs {
		if m.space.knows(s.ID, client) {
			take = append(take, s)
			at = append(at, i)
			continue
		}
		errs[i] = store.Errorf(store.SegmentNotFound, "segment %q (%s) is not known to this master: mount it anew, with new memory", s.Name, s.ID)
	}
	m.touchClient(client)
	for j, err := range m.ReMountSegment(client, take) {
		errs[at[j]] = err
	}
	return errs
}

// UnmountSegment removes a segment at once: every replica on it goes, and
// objects left with no replica are removed.
func (m *Master) UnmountSegment(client store.UUID, id store.UUID) error {
	seg, err := m.space.beginUnmount(client, id, SegUnmounting)
	if err != nil {
		return err
	}
	m.finishUnmount(seg)
	return nil
}

// GracefulUnmountSegment stops placing new replicas on the segment, waits
// (up to Config.GracefulUnmountWait, or ctx) for reads holding leases on
// its objects to end, then unmounts it.
func (m *Master) GracefulUnmountSegment(ctx context.Context, client store.UUID, id store.UUID) error {
	seg, err := m.space.beginUnmount(client, id, SegGracefullyUnmounting)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(m.cfg.GracefulUnmountWait)
	for time.Now().Before(deadline) && m.leasedOn(seg) {
		select {
		case <-ctx.Done():
			deadline = time.Time{}
		case <-time.After(20 * time.Millisecond):
		}
	}
	m.finishUnmount(seg)
	return nil
}

func (m *Master) leasedOn(seg *segment) bool {
	now := m.now()
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		for _, o := range sh.objects {
			if o.lease > now && o.onSegment(seg) {
				sh.mu.Unlock()
				return true
			}
		}
		sh.mu.Unlock()
	}
	return false
}

func (m *Master) finishUnmount(seg *segment) {
	var dropped, lost int
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		for key, o := range sh.objects {
			if !o.onSegment(seg) {
				continue
			}
			dropped++
			before := m.charge(o)
			left := o.dropSegment(seg)
			m.recharge(o, before)
			if left == 0 && o.onDisk() {
				// Its disk replica lives on (on this node's disk: it
				// comes back if the node does).
				if o.ent.In() {
					sh.policy.Remove(&o.ent)
				}
			} else if len(o.replicas) == 0 {
				lost++
				if o.state == stateComplete || o.inPlace {
					m.eventDropped(o)
				}
				sh.remove(key, o)
				if o.upsert != nil {
					// The resize's replicas on other segments: its
					// writer may still be writing them, as for a
					// discarded put.
					m.pend.addRelease(o.putStart+m.cfg.PutReleaseTimeout.Nanoseconds(), o.upsert.size, o.upsert.refs)
					o.upsert = nil
				}
				if o.state == stateComplete || o.inPlace {
					m.emit(Change{Op: OpRemove, Key: key})
				}
			} else if o.upsert != nil && len(o.upsert.refs) == 0 {
				// The resize lost every new replica: the old version
				// stays, and the writer's End finds no resize (nor
				// takes the old version for its own: lostWriter).
				o.upsert, o.putStart, o.writer = nil, 0, lostWriter
				sh.unlinkPending(o)
			}
		}
		sh.mu.Unlock()
	}
	m.space.unmount(seg)
	m.clientsMu.Lock()
	if c := m.clients[seg.owner]; c != nil {
		delete(c.segments, seg.info.ID)
	}
	m.clientsMu.Unlock()
	m.emit(Change{Op: OpUnmount, Segment: seg.info, Client: seg.owner})
	m.log.Info(fmt.Sprintf("unmounted segment %s (%s): %d replicas dropped, %d objects lost their last replica", seg.info.Name, seg.info.ID, dropped, lost))
}

// dropClient forgets a client that stopped pinging and unmounts its
// segments.
func (m *Master) dropClient(c *clientState, why string) {
	m.clientsMu.Lock()
	ids := make([]store.UUID, 0, len(c.segments))
	for id := range c.segments {
		ids = append(ids, id)
	}
	m.clientsMu.Unlock()
	if why == "" {
		m.log.Warn(fmt.Sprintf("client %s silent for more than client_ttl %s: dropping it and unmounting its %d segments", c.id, m.cfg.ClientTTL, len(ids)))
	}
	// Its segments are marked unmounting before the client is forgotten:
	// a ping in between was told to re-mount, and took back a segment
	// still marked mounted (ReMountKnown), which the unmount then
	// removed; the node went on pinging with a segment the master no
	// longer had (TestFenceNodeRemount, clean-clone CI).
	var segs []*segment
	for _, id := range ids {
		if seg, err := m.space.beginUnmount(c.id, id, SegUnmounting); err == nil {
			segs = append(segs, seg)
		}
	}
	m.clientsMu.Lock()
	if m.clients[c.id] == c {
		delete(m.clients, c.id)
	}
	m.clientsMu.Unlock()
	if h := clientForgotten.Load(); h != nil {
		(*h)(c.id)
	}
	for _, seg := range segs {
		m.finishUnmount(seg)
		if why == "" {
			m.drops.add(seg.info.Endpoint, time.Now())
		}
	}
	m.space.dropInstance(c.id)
	m.drains.forget(c.id)
}

// clientForgotten, when set (tests), runs after dropClient forgot a
// client and before its segments are unmounted.
var clientForgotten atomic.Pointer[func(store.UUID)]

// UnregisterClient forgets a client that is leaving, unmounting any
// segment it still has; its objects in other segments stay.
func (m *Master) UnregisterClient(client store.UUID) error {
	m.clientsMu.RLock()
	c := m.clients[client]
	m.clientsMu.RUnlock()
	if c == nil {
		return store.Errorf(store.ClientNotFound, "client %s is not registered", client)
	}
	m.dropClient(c, "unregistered")
	return nil
}

// ---- background loops ----

func (m *Master) maintenanceLoop() {
	defer m.wg.Done()
	tick := m.cfg.MaintenanceTick
	if tick <= 0 {
		tick = DefaultMaintenanceTick
	}
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-m.done:
			return
		case <-t.C:
			m.Maintain()
		}
	}
}

// Maintain runs one round of housekeeping: drop clients silent for
// client_ttl, discard puts with no PutEnd after the discard timeout,
// release their space after the release timeout. The background loop
// calls it; tests call it directly.
func (m *Master) Maintain() {
	now := m.now()
	ttl := m.cfg.ClientTTL.Nanoseconds()
	var dead []*clientState
	m.clientsMu.RLock()
	total := len(m.clients)
	for _, c := range m.clients {
		if now-c.lastPing.Load() > ttl {
			dead = append(dead, c)
		}
	}
	m.clientsMu.RUnlock()
	// A dead node silences its own clients; most clients silent at once
	// says the master could not answer pings in time (a long GC mark
	// under load, master_bench's 128 segments pinged one after another)
	// or the network split. Dropping them would unmount live segments
	// and lose their objects, so they are held up to massSilenceHold
	// client TTLs.
	if len(dead) >= 3 && 2*len(dead) > total {
		held := dead[:0:0]
		keep := dead[:0]
		for _, c := range dead {
			if now-c.lastPing.Load() <= massSilenceHold*ttl {
				held = append(held, c)
			} else {
				keep = append(keep, c)
			}
		}
		if len(held) > 0 && !m.massSilence.Load() {
			m.log.Warn(fmt.Sprintf("%d of %d clients silent for more than client_ttl %s at once: holding them up to %s (a master too busy to answer pings, or a network split, silences many clients at once; a dead node only its own)", len(dead), total, m.cfg.ClientTTL, massSilenceHold*m.cfg.ClientTTL))
		}
		m.massSilence.Store(len(held) > 0)
		dead = keep
	} else {
		m.massSilence.Store(false)
	}
	for _, c := range dead {
		m.dropClient(c, "")
	}
	m.discardStale(now)
	m.releaseDue(now)
	m.expireStaged(now)
	m.giveUpTiers(now)
	for _, ph := range m.space.staleRestored(now - m.restoredMountGrace().Nanoseconds()) {
		m.log.Warn(fmt.Sprintf("restored segment %s (%s) was not re-mounted within %s: dropping its replicas", ph.info.Name, ph.info.ID, m.restoredMountGrace()))
		m.finishUnmount(ph)
	}
}

// restoredMountGrace is how long a segment known from a restore (an HA
// failover) may take to re-mount: three client TTLs, since a live node
// re-mounts within a ping or two.
func (m *Master) restoredMountGrace() time.Duration { return 3 * m.cfg.ClientTTL }

// evictionIdleInterval is how often the watermark loop looks while usage
// is below the high watermark: allocations wake it when they cross it, so
// this is only a backstop (for a watermark crossed by a segment going
// away or an offload landing without an allocation). Waking every
// EvictionInterval instead cost an idle `mc serve store` ~400 context
// switches a second (the runtime wakes a second thread for each timer),
// and each one's CPU a one-at-a-time caller's calls then competed with
// (issue 39).
const evictionIdleInterval = time.Second

func (m *Master) evictionLoop() {
	defer m.wg.Done()
	t := time.NewTimer(m.cfg.EvictionInterval)
	defer t.Stop()
	for {
		select {
		case <-m.done:
			return
		case <-t.C:
		case <-m.evictKick:
		}
		m.evictIdle.Store(false)
		m.evictLooks.Add(1)
		m.EvictIfNeeded()
		next := m.cfg.EvictionInterval
		if !m.overHighWatermark() {
			// Idle first, then look again: an allocation in between
			// either sees the flag and kicks, or is seen here.
			m.evictIdle.Store(true)
			if m.overHighWatermark() {
				m.evictIdle.Store(false)
			} else {
				next = max(next, evictionIdleInterval)
			}
		}
		t.Reset(next)
	}
}

// overHighWatermark reports whether usage (less replicas being offloaded)
// is at or above the high watermark, with eviction on.
func (m *Master) overHighWatermark() bool {
	ratio, capacity := m.usage()
	return capacity > 0 && ratio >= m.cfg.HighWatermark
}

// noteUsage wakes an idle watermark loop when usage has reached the high
// watermark (space calls it after usage grows or capacity shrinks).
func (m *Master) noteUsage() {
	if m.evictIdle.Load() && m.overHighWatermark() {
		m.kickEviction()
	}
}

// kickEviction asks the watermark loop to run now (a PutStart found no
// space); it never blocks.
func (m *Master) kickEviction() {
	select {
	case m.evictKick <- struct{}{}:
	default:
	}
}

func fmtBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for v := n / unit; v >= unit; v /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
