package master

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvcache-ops/mc/pkg/store"
	pb "github.com/kvcache-ops/mc/pkg/store/storepb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The disk tier, master side (store.md "Disk tier"). A node with an SSD
// tier holds a Tier.Attach stream (tierNode); through it the master
//
//   - offloads: eviction that picks an object with a replica on such a
//     node sends OFFLOAD (the node writes the bytes from its own segment
//     to disk: no network) and frees the DRAM range only when the node
//     says the record is durable (offloadDone); meanwhile the object is
//     out of the eviction order and still readable from DRAM;
//   - reads: a get from a reader that stages disk objects itself (mc's
//     client, read_disk) of an object whose only copy is on disk is
//     answered with where the record is (the node's TierRead endpoint,
//     tier id, version): the reader asks the node. For other readers
//     (Mooncake's wire) the master sends STAGE: the node reads the
//     record into a range of its staging pool (memory it registered for
//     it, apart from its segment: a read never takes DRAM room nor
//     evicts; the node owns its allocator and waits for room) and
//     answers where, and the master hands the range out as a replica
//     with a staged id. Readers of the object meanwhile share that copy;
//     each hands its read back when its bytes have moved
//     (ReleaseStaged) and the master RELEASEs the range when the last
//     one has, or when the staging TTL passes since the last grant (a
//     reader that died). On its
//     PromoteAfter-th disk read an object is loaded into its node's
//     segment instead, if there is free room there (no eviction), and
//     stays as a DRAM replica in the eviction order. The disk record
//     stays until the node's tier evicts it (its file), so evicting a
//     promoted object from DRAM again costs no write;
//   - drops: a removed, re-put or replaced object's record is dropped.
//
// An object has at most one disk replica, identified by the node's tier
// id and the object version given at its first offload; a restarted node
// reports its records in its hello and versions decide which come back
// (attach).

// DefaultPromoteAfter is Config.PromoteAfter's default.
const DefaultPromoteAfter = 2

// tierCmdQueue bounds the commands waiting for a node's stream: a node
// that far behind gets no more offloads (its victims stay in DRAM).
const tierCmdQueue = 4096

// objTier is an object's disk-tier state (nil until it first matters, to
// keep Object small).
type objTier struct {
	node    *tierNode // holder of the disk replica; nil: none
	version uint64    // given at the first offload; 0: none yet
	// reads counts disk reads since the object was last promoted.
	reads      uint32
	offloading bool // its replicas are being written to disk
	// offloadTo is the tier an offload under way writes to (its DROP's,
	// should the object go meanwhile).
	offloadTo string
	// stage is the copy of the disk record in its node's staging pool
	// that reads are granted now (nil: none).
	stage   *stagedCopy
	loading *tierOp // a LOAD into the staging pool (or the segment) under way
	// dropOp fences the record an offload under way is writing, of an
	// object removed or replaced meanwhile: its DROP follows the
	// offload (offloadDone), and the remove or put waits for it.
	dropOp *tierOp
	// promoted: the DRAM replicas were just loaded from disk by a
	// promotion; the first read of them is the disk hit that did it.
	promoted bool
	// early: re-added from before this master while its early hold was
	// open (earlyHold): its reads wait until the hold ends.
	early bool
}

func (o *Object) onDisk() bool { return o.tier != nil && o.tier.node != nil }

// busyOnTier: the object's replicas are being written to or read from
// disk, so they may not be freed or rewritten now.
func (o *Object) busyOnTier() bool {
	return o.tier != nil && (o.tier.offloading || o.tier.loading != nil)
}

// tierNode is one node's disk tier as the master knows it. It outlives
// its stream: while the node is away its disk replicas are kept (not
// readable) for the restored-mount grace. A node makes its drops durable
// (its tier's drop log), so what it reports after a restart leaves them
// out; a returning node may still report records of keys removed long
// ago (a drop it could not log, a drop sent while it was away, a node of
// an older mc), so records of this master's own versions are judged by
// what it knows (tiers.ours), and the removals of older ones are
// remembered as tombstones.
type tierNode struct {
	id string // the tier's directory id, stable across restarts

	mu      sync.Mutex
	online  bool
	client  store.UUID
	segID   store.UUID
	segName string
	send    chan *pb.TierCommand
	// overflow holds DROPs enqueued while send was full, kick (1 slot)
	// wakes the sender for them: a DROP is never lost to a busy queue
	// (the record would stay on disk, unknown to this master, for the
	// next one to re-add).
	overflow   []*pb.TierCommand
	kick       chan struct{}
	pending    map[uint64]*tierOp
	offSince   int64             // unix nanos the node went away
	tombstones map[string]uint64 // key -> version removed, for versions not ours
	stats      *pb.TierStats
	// gen counts attachments, so a stale stream's end does not take a
	// newer one offline.
	gen uint64
	// What the master did with this tier (mc store stat).
	nOffloads, nOffloadFull, nDiskHits, nPromotions atomic.Uint64

	// service is the node's TierRead endpoint ("": none; under mu).
	service string
	// dropAcks: the node answers DROPs that carry an op id (set at
	// attach; read with a shard locked, so not under mu).
	dropAcks atomic.Bool
	// nStageReclaimed counts the master's staged reads whose readers
	// never handed them back (its TTL freed them); the node counts its
	// own (stats).
	nStageReclaimed, nStaged atomic.Uint64
}

// tierOp is one OFFLOAD or LOAD in flight.
type tierOp struct {
	id      uint64
	kind    pb.TierCommand_Kind
	key     string
	version uint64
	// tier is a DROP's tier id ("" when not known).
	tier string
	obj  *Object
	refs []replicaRef // the ranges the node reads (offload) or writes (load)
	size uint64
	done chan struct{} // closed when err is set
	err  error
	// cleared: a DROP that ended unapplied whose tier attached again
	// (this master judged its records then; clearEnded).
	cleared atomic.Bool
	// LOAD: into the segment, to stay as a DRAM replica (promote); or
	// STAGE: into the node's staging pool, which answered where
	// (stageAddr) and by which id to release it (staged; gen: the
	// attachment it was staged under).
	promote bool
	// quota is the tenant quota a promotion reserved (0: none), given
	// back when it lands (charged then) or fails.
	quota     uint64
	stageAddr uint64
	staged    uint64
	stageGen  uint64
}

// ended reports whether op ended (its err is then set for good).
func (op *tierOp) ended() bool { return isClosed(op.done) }

// isClosed reports whether ch (closed to signal, never sent on) is
// closed.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// tiers is the master's registry of disk tiers.
type tiers struct {
	mu    sync.Mutex
	byID  map[string]*tierNode
	bySeg map[store.UUID]*tierNode // online nodes by their segment
	// online is len(bySeg), read without the lock: with none, a get
	// never waits for a disk load or staging room.
	online atomic.Int64
	nextOp atomic.Uint64
	// inflight is the bytes of DRAM replicas being offloaded: the
	// watermark loop counts them as free already, or it would pick more
	// victims every round until the first offloads land.
	inflight atomic.Int64
	// lastVersion is the last object version handed out.
	lastVersion atomic.Uint64
	// first is the first version this master handed out (0: none yet):
	// every version from it on is one it knows the fate of. A master
	// restored from an op log (HA) knows the fate of every version
	// (all): an object it does not have was removed, evicted or never
	// completed.
	first atomic.Uint64
	all   atomic.Bool
	// givenUp holds the disk objects of ours dropped because their node
	// stayed away too long (giveUpTiers): that node's records of them
	// come back when it does, unless the key was put again since (a put
	// supersedes the entry). nGivenUp keeps puts off the lock while it
	// is empty.
	givenUpMu sync.Mutex
	givenUp   map[string]givenUpRecord
	nGivenUp  atomic.Int64

	// drops are the DROPs a node has not confirmed yet, by key: a put or
	// remove of the key is acknowledged once they are (fenceDrops).
	// nDrops (their number) keeps puts off the lock while there are none.
	dropMu sync.Mutex
	drops  map[string][]*tierOp
	nDrops atomic.Int64
	// ended are DROPs that ended unapplied (the node's stream ended, or
	// it refused), by tier: they stay among drops, so that a call on
	// their key fences the tier before it is acknowledged, until the
	// tier attaches again (clearEnded).
	ended map[string][]*tierOp

	// copies are the staged copies by id (stagedMu; lock order: shard,
	// then stagedMu).
	stagedMu sync.Mutex
	copies   map[uint64]*stagedCopy
	nextCopy atomic.Uint64

	// counters (mc_store_tier_*, and Mooncake's names where they exist)
	offloads, offloadBytes, offloadFull, offloadFailed atomic.Uint64
	diskHits, promotions, loadFailures                 atomic.Uint64
	diskHitBytes                                       atomic.Uint64
	diskEvicted                                        atomic.Uint64
	stagedReleased, stagedReclaimed                    atomic.Uint64
	fenceTimeouts, fenceUnannounced                    atomic.Uint64
	// onDropDone is told of each DROP ended (the roster's slow fences).
	onDropDone func(op *tierOp, err error)
}

// stagedCopy is a disk record read into its node's staging pool for
// readers: freed when every grant is handed back, or ttl after the last
// grant (a reader that died).
type stagedCopy struct {
	id      uint64
	key     string
	obj     *Object
	node    *tierNode
	gen     uint64 // the node attachment whose pool holds addr
	staged  uint64 // the node's id of the range
	addr    uint64
	size    uint64
	readers int   // grants not handed back
	until   int64 // unix nanos: freed then whatever readers says
}

func (t *tiers) init() {
	t.byID = make(map[string]*tierNode)
	t.bySeg = make(map[store.UUID]*tierNode)
	t.copies = make(map[uint64]*stagedCopy)
	t.drops = make(map[string][]*tierOp)
}

// any reports whether a node's tier is attached.
func (t *tiers) any() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.bySeg) > 0
}

// nextVersion hands out object versions: increasing, and above any time
// stamp of an earlier master run, so a version never repeats across
// restarts (a restarted master adopts the versions nodes report).
func (t *tiers) nextVersion(now int64) uint64 {
	for {
		last := t.lastVersion.Load()
		v := max(last+1, uint64(now))
		if t.lastVersion.CompareAndSwap(last, v) {
			for {
				f := t.first.Load()
				if f != 0 && f <= v || t.first.CompareAndSwap(f, v) {
					return v
				}
			}
		}
	}
}

// ours reports whether this master knows the fate of an object of
// version v: it handed v out (versions only grow, and the first one it
// handed out was above every version it had seen), or it was restored
// from an op log that records every version. A node's record of such a
// version whose object it does not have is stale, never new.
func (t *tiers) ours(v uint64) bool {
	if t.all.Load() {
		return true
	}
	f := t.first.Load()
	return f != 0 && v >= f
}

type givenUpRecord struct {
	tier    string
	version uint64
}

// supersede is called by every put of key: a record given up before it
// is of an older incarnation, not to be re-added.
func (t *tiers) supersede(key string) {
	if t.nGivenUp.Load() == 0 {
		return
	}
	t.givenUpMu.Lock()
	if _, ok := t.givenUp[key]; ok {
		delete(t.givenUp, key)
		t.nGivenUp.Add(-1)
	}
	t.givenUpMu.Unlock()
}

// takeGivenUp reports (and forgets) whether tier's record of key at
// version was given up on and not superseded since.
func (t *tiers) takeGivenUp(tier, key string, version uint64) bool {
	if t.nGivenUp.Load() == 0 {
		return false
	}
	t.givenUpMu.Lock()
	defer t.givenUpMu.Unlock()
	g, ok := t.givenUp[key]
	if !ok || g.tier != tier || g.version != version {
		return false
	}
	delete(t.givenUp, key)
	t.nGivenUp.Add(-1)
	return true
}

// tombstone remembers that key's record of version v (not ours) was
// dropped, so the node's rescan after a restart does not bring it back.
// Kept for the master's life: at most one per record re-added from an
// earlier master's era.
func (n *tierNode) tombstone(key string, v uint64) {
	n.mu.Lock()
	if n.tombstones == nil {
		n.tombstones = make(map[string]uint64)
	}
	n.tombstones[key] = v
	n.mu.Unlock()
}

func (t *tiers) seeVersion(v uint64) {
	for {
		last := t.lastVersion.Load()
		if v <= last || t.lastVersion.CompareAndSwap(last, v) {
			return
		}
	}
}

// placeholder returns the tier known by id, making an offline one for a
// tier that replicas were restored onto (an HA failover): it is given up
// on like a node that left, unless its node attaches within the grace.
func (t *tiers) placeholder(id string, now int64) *tierNode {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := t.byID[id]
	if n == nil {
		n = &tierNode{id: id, offSince: now}
		t.byID[id] = n
	}
	return n
}

// onlineFor returns the online tier of the node owning seg, if any.
func (t *tiers) onlineFor(seg *segment) *tierNode {
	if seg.live != nil {
		seg = seg.live
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.bySeg[seg.info.ID]
}

// writesWindow is how long a node's disk reads stay background work
// after the master told it that puts into its segment are under way;
// the master tells it again every half window while they go on.
const writesWindow = 100 * time.Millisecond

// noteWrites tells the disk tiers of the nodes a put is placed on that
// DRAM puts into their segments are under way (WRITES), so that their
// disk reads yield the CPU to them: at most every half writesWindow per
// segment, and without the registry's lock otherwise.
func (t *tiers) noteWrites(refs []replicaRef, now int64) {
	if t.online.Load() == 0 {
		return
	}
	for _, r := range refs {
		seg := r.reg.seg // a new put's: a mounted segment, no placeholder
		last := seg.writesSent.Load()
		if now-last < int64(writesWindow/2) || !seg.writesSent.CompareAndSwap(last, now) {
			continue
		}
		if n := t.onlineFor(seg); n != nil {
			n.enqueue(&pb.TierCommand{Kind: pb.TierCommand_WRITES, WaitMs: uint64(writesWindow.Milliseconds())}, nil)
		}
	}
}

// enqueue hands cmd to n's stream; false when n is away or too far
// behind.
func (n *tierNode) enqueue(cmd *pb.TierCommand, op *tierOp) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.online {
		return false
	}
	if len(n.overflow) > 0 && cmd.Kind == pb.TierCommand_DROP {
		// Behind those already waiting.
		n.overflow = append(n.overflow, cmd)
	} else {
		select {
		case n.send <- cmd:
		default:
			if cmd.Kind != pb.TierCommand_DROP {
				return false
			}
			n.overflow = append(n.overflow, cmd)
			select {
			case n.kick <- struct{}{}:
			default:
			}
		}
	}
	if op != nil {
		n.pending[op.id] = op
	}
	return true
}

// takeOverflow returns up to max DROPs that waited for room, for the
// sender of attachment gen (an older stream's sender, not stopped yet,
// takes none: they would go down a dead stream).
func (n *tierNode) takeOverflow(max int, gen uint64) []*pb.TierCommand {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.gen != gen {
		return nil
	}
	k := min(max, len(n.overflow))
	if k == 0 {
		return nil
	}
	out := slices.Clone(n.overflow[:k])
	n.overflow = n.overflow[k:]
	if len(n.overflow) == 0 {
		n.overflow = nil
	} else {
		select { // the rest in the next message
		case n.kick <- struct{}{}:
		default:
		}
	}
	return out
}

// ---- eviction: offload instead of drop ----

// evictVictimLocked takes o (its shard locked, evictable) out of DRAM and
// returns the bytes freed now and the bytes that will be free once an
// offload lands:
//   - a copy already on disk (promoted, or staged): its DRAM replicas go;
//   - a replica on a node with a disk tier: that node writes it to disk,
//     and the replicas are freed when it is durable (offloadDone);
//   - otherwise the object is dropped, as without a disk tier.
func (m *Master) evictVictimLocked(sh *shard, o *Object) (freed, later uint64) {
	n := o.size * uint64(len(o.replicas))
	if o.onDisk() {
		m.dropMemoryLocked(sh, o)
		return n, 0
	}
	for _, r := range o.replicas {
		node := m.tiers.onlineFor(r.reg.seg)
		if node == nil {
			continue
		}
		if o.tier == nil {
			o.tier = &objTier{}
		}
		if o.tier.version == 0 {
			o.tier.version = m.tiers.nextVersion(m.now())
		}
		// The op keeps its own list of the ranges: an unmount may
		// compact o.replicas meanwhile.
		op := &tierOp{id: m.tiers.nextOp.Add(1), kind: pb.TierCommand_OFFLOAD, key: o.key, version: o.tier.version,
			obj: o, refs: slices.Clone(o.replicas), size: o.size, done: make(chan struct{})}
		cmd := &pb.TierCommand{Op: op.id, Kind: op.kind, Key: o.key, Version: op.version, Addr: r.addr, Size: o.size}
		if !node.enqueue(cmd, op) {
			// The node is away or far behind: the object stays in DRAM
			// and eviction takes another.
			return 0, 0
		}
		o.tier.offloading, o.tier.offloadTo = true, node.id
		if o.ent.In() {
			sh.policy.Remove(&o.ent)
		}
		m.tiers.inflight.Add(int64(n))
		return 0, n
	}
	m.evictLocked(sh, o)
	return n, 0
}

// dropMemoryLocked frees o's DRAM replicas, leaving its disk replica as
// its only copy. The caller made sure no read holds them (or queues them
// for the lease's end).
func (m *Master) dropMemoryLocked(sh *shard, o *Object) {
	if o.ent.In() {
		sh.policy.Remove(&o.ent)
	}
	m.freeMemoryLocked(o)
	m.emit(Change{Op: OpDiskOnly, Key: o.key, Size: o.size, Version: o.tier.version, Tier: o.tier.node.id})
}

// freeMemoryLocked frees o's DRAM replicas now, or when the lease of a
// read still moving their bytes ends.
func (m *Master) freeMemoryLocked(o *Object) {
	if len(o.replicas) == 0 {
		return
	}
	defer m.recharge(o, m.charge(o))
	if busy := o.busyUntil(); busy > m.now() {
		m.holdLocked(o.key, o.replicas, o.size, busy)
	} else {
		m.space.free(o.replicas, o.size)
	}
	o.replicas = nil
}

// holdLocked frees refs (ranges of size bytes that were key's) when a
// read lease that may still be moving their bytes ends, at until, and
// tells the op log (OpHold), so that a next HA leader does not reuse
// them before either. The caller holds key's shard lock.
func (m *Master) holdLocked(key string, refs []replicaRef, size uint64, until int64) {
	m.pend.addLeased(until, size, refs)
	if m.cfg.OnChange != nil {
		reps := make([]store.Replica, len(refs))
		for i, r := range refs {
			reps[i] = r.descriptor(size, true)
		}
		m.emit(Change{Op: OpHold, Key: key, Size: size, Replicas: reps, Started: time.Unix(0, until)})
	}
}

// releaseLocked frees what o holds as it leaves the master (removed,
// evicted, replaced): its DRAM replicas, unless a node is still reading
// or writing them (the op's end frees them then), and its disk record.
func (m *Master) releaseLocked(o *Object) {
	switch {
	case o.busyOnTier():
	case o.held > m.now():
		// A previous leader's reads may still move its bytes.
		m.holdLocked(o.key, o.replicas, o.size, o.held)
	default:
		m.space.free(o.replicas, o.size)
	}
	m.dropDiskLocked(o)
}

// dropDiskLocked forgets o's disk replica and tells its node to drop the
// record (or remembers to, when the node is away).
//
// Without HA the DROP is also a fence: until the node confirms it, a put
// or remove of the key is not acknowledged (fenceDrops). A master that
// died with the DROP unsent or unapplied left the record on disk, and the
// next master, which knows nothing of the put or remove, re-added it when
// the node reported it: a get after an acknowledged upsert returned the
// version before (two restarts in a row; TestTierDropFence). With HA the
// op log is the fence: the next leader knows every version's fate.
//
// An offload under way is writing a record the caller does not see yet:
// without HA its DROP is fenced too, sent when the offload ends. Before,
// a remove acknowledged meanwhile left that record to be dropped after
// the offload, unfenced, and a master killed in between left it on disk
// for the next one to re-add (the soak: a get after an acknowledged
// remove returned the removed version; TestTierOffloadDropFence).
func (m *Master) dropDiskLocked(o *Object) {
	if o.tier != nil && o.tier.offloading && o.tier.dropOp == nil && !m.tiers.all.Load() {
		o.tier.dropOp = m.tiers.addDrop(o.key, o.tier.version, o.tier.offloadTo)
	}
	if !o.onDisk() {
		return
	}
	n := o.tier.node
	o.tier.node = nil
	if !m.tiers.ours(o.tier.version) {
		n.tombstone(o.key, o.tier.version)
	}
	cmd := &pb.TierCommand{Kind: pb.TierCommand_DROP, Key: o.key, Version: o.tier.version}
	if !n.dropAcks.Load() || m.tiers.all.Load() {
		// A node away gets no DROP: it drops the record when it reports
		// it (attach).
		n.enqueue(cmd, nil)
		return
	}
	op := m.tiers.addDrop(o.key, o.tier.version, n.id)
	cmd.Op = op.id
	if !n.enqueue(cmd, op) {
		m.tiers.dropDone(op, errDetached)
	}
}

// addDrop registers a DROP of key's record of version on tier id as
// unconfirmed and returns its op, for the command that carries it.
func (t *tiers) addDrop(key string, version uint64, tier string) *tierOp {
	op := &tierOp{id: t.nextOp.Add(1), kind: pb.TierCommand_DROP, key: key, version: version, tier: tier, done: make(chan struct{})}
	t.dropMu.Lock()
	t.drops[op.key] = append(t.drops[op.key], op)
	t.nDrops.Add(1)
	t.dropMu.Unlock()
	return op
}

// dropDone ends op: confirmed by its node (err nil), or failed with its
// node's stream (the node reports the record when it attaches again, and
// this master drops it then).
func (t *tiers) dropDone(op *tierOp, err error) {
	t.dropMu.Lock()
	if err != nil && op.tier != "" {
		// Unapplied: the record may still be on the node's disk. Kept
		// among drops for calls still to come on its key (a call that
		// found it gone would be acknowledged unfenced) until the tier
		// attaches again.
		if t.ended == nil {
			t.ended = make(map[string][]*tierOp)
		}
		t.ended[op.tier] = append(t.ended[op.tier], op)
	} else {
		t.removeDropLocked(op)
	}
	t.dropMu.Unlock()
	op.err = err
	close(op.done)
	if f := t.onDropDone; f != nil {
		f(op, err)
	}
}

func (t *tiers) removeDropLocked(op *tierOp) {
	ops := t.drops[op.key]
	for i, o := range ops {
		if o == op {
			ops = slices.Delete(ops, i, i+1)
			t.nDrops.Add(-1)
			break
		}
	}
	if len(ops) == 0 {
		delete(t.drops, op.key)
	} else {
		t.drops[op.key] = ops
	}
}

// clearEnded forgets tier's DROPs that ended unapplied: it attached
// again, and this master judged the records it reported (dropping the
// stale ones with DROPs of their own).
func (t *tiers) clearEnded(tier string) {
	t.dropMu.Lock()
	defer t.dropMu.Unlock()
	for _, op := range t.ended[tier] {
		op.cleared.Store(true)
		t.removeDropLocked(op)
	}
	delete(t.ended, tier)
}

// unconfirmed returns the DROPs of keys not confirmed yet (all of them
// for keys nil).
func (t *tiers) unconfirmed(keys []string) []*tierOp {
	if t.nDrops.Load() == 0 {
		return nil
	}
	t.dropMu.Lock()
	defer t.dropMu.Unlock()
	var out []*tierOp
	if keys == nil {
		for _, ops := range t.drops {
			out = append(out, ops...)
		}
		return out
	}
	for _, k := range keys {
		out = append(out, t.drops[k]...)
	}
	return out
}

// DefaultDropFence bounds how long a put or remove waits for its key's
// DROPs to be confirmed (Config.DropFence).
const DefaultDropFence = 2 * time.Second

// fenceDrops waits until every DROP of keys (nil: of any key) is
// confirmed by its node or failed with the node's stream, at most the
// configured bound; a node that does not answer by then has its tier
// fenced (fenceSlow) and the caller goes on once a node holds the roster
// that says so, or the bound passes again. A master closed meanwhile fails the
// calls still unanswered (out, when given: one per key): their DROPs may
// never be applied, so they must not be acknowledged.
//
// Before that, a restarted master waits for the disk tiers the pool had
// (awaitTiers): their stale records' DROPs are among those waited for.
func (m *Master) fenceDrops(keys []string, out []error) {
	m.awaitTiers(keys, out)
	ops := m.tiers.unconfirmed(keys)
	if len(ops) == 0 {
		return
	}
	if f := fenceWaitHook; f != nil {
		f(ops)
	}
	bound := m.cfg.DropFence
	if bound <= 0 {
		bound = DefaultDropFence
	}
	timer := time.NewTimer(bound)
	defer timer.Stop()
	stopped := func() {
		for i := range out {
			if out[i] == nil {
				out[i] = store.Errorf(store.InternalError, "key %q: the master stopped before the disk tier confirmed dropping the previous version's record; the call may not have taken effect", keys[i])
			}
		}
	}
	for _, op := range ops {
		select {
		case <-op.done:
			if op.err == nil || op.cleared.Load() {
				continue
			}
			// Ended unapplied (its node's stream ended): the record stays
			// on disk until the node attaches to this master again. A
			// master stopping now never sees that; one restarted before
			// it would re-add the record. Not a confirmation: the call
			// is failed, or the tier fenced first. Before, this counted
			// as confirmed, and a master closing (which ends the streams)
			// acknowledged calls whose DROPs it never applied
			// (TestTierDropFence, one run in a few hundred).
			if m.stopping() {
				stopped()
				return
			}
			if !m.fenceSlow(ops, bound, op) {
				stopped()
			}
			return
		case <-m.done:
			stopped()
			return
		case <-timer.C:
			m.tiers.fenceTimeouts.Add(1)
			if !m.fenceSlow(ops, bound, op) {
				stopped()
			}
			return
		}
	}
}

// fenceWaitHook, when set (tests), is called with the DROPs a call is
// about to wait for: a test ends them there to choose what the wait sees.
var fenceWaitHook func(ops []*tierOp)

// stopping reports whether Close was called.
func (m *Master) stopping() bool { return isClosed(m.done) }

// opDone is called with a node's answer to op (or the stream's end).
func (m *Master) opDone(n *tierNode, op *tierOp, err error) {
	switch op.kind {
	case pb.TierCommand_OFFLOAD:
		m.offloadDone(n, op, err)
	case pb.TierCommand_LOAD, pb.TierCommand_STAGE:
		m.loadDone(n, op, err)
	case pb.TierCommand_DROP:
		m.tiers.dropDone(op, err)
	}
}

func (m *Master) offloadDone(n *tierNode, op *tierOp, err error) {
	m.tiers.inflight.Add(-int64(op.size * uint64(len(op.refs))))
	m.noteUsage()
	sh := m.shardOf(op.key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	o := sh.objects[op.key]
	if o != op.obj || o.tier == nil || !o.tier.offloading || o.tier.version != op.version {
		// Removed (or replaced) while the node wrote it: the ranges were
		// left for us to free, and the record is nobody's. The remove or
		// put that did it waits for its DROP (dropDiskLocked).
		m.space.free(op.refs, op.size)
		var fence *tierOp
		if t := op.obj.tier; t != nil && t.dropOp != nil && t.dropOp.version == op.version {
			fence, t.dropOp = t.dropOp, nil
		}
		if err == nil {
			cmd := &pb.TierCommand{Kind: pb.TierCommand_DROP, Key: op.key, Version: op.version}
			if fence != nil && n.dropAcks.Load() {
				cmd.Op = fence.id
				if !n.enqueue(cmd, fence) {
					m.tiers.dropDone(fence, errDetached)
				}
				return
			}
			n.enqueue(cmd, nil)
		}
		if fence != nil {
			if !errors.Is(err, errDetached) {
				// The node failed the write: no record to drop. (A
				// stream that ended leaves it unknown: unapplied.)
				err = nil
			}
			m.tiers.dropDone(fence, err)
		}
		return
	}
	o.tier.offloading = false
	if errors.Is(err, errDetached) {
		// The node's stream ended, not its disk: the object stays in
		// DRAM (if the node is gone its segment goes, and the object
		// with it).
		sh.track(o, 0)
		return
	}
	if err != nil {
		if store.CodeOf(err) == store.NoAvailableHandle {
			m.tiers.offloadFull.Add(1)
			n.nOffloadFull.Add(1)
		} else {
			m.tiers.offloadFailed.Add(1)
		}
		if o.busyUntil() > m.now() {
			// Being read: it stays in DRAM after all.
			sh.track(o, 0)
			return
		}
		m.log.Debug(fmt.Sprintf("offload of %q to %s failed, evicting it: %v", op.key, n.name(), err))
		m.evictLocked(sh, o)
		m.countEvicted(phaseOffload, 1, o.size*uint64(len(o.replicas)))
		return
	}
	o.tier.node = n
	bytes := o.size * uint64(len(o.replicas))
	m.freeMemoryLocked(o)
	m.tiers.offloads.Add(1)
	n.nOffloads.Add(1)
	m.tiers.offloadBytes.Add(o.size)
	m.countEvicted(phaseOffload, 1, bytes)
	m.emit(Change{Op: OpDiskOnly, Key: o.key, Size: o.size, Version: o.tier.version, Tier: n.id})
}

// ---- reads of objects on disk ----

// stageLocked starts loading o (its shard locked, complete, with no DRAM
// replica but a disk one) into its node's staging pool, or returns the
// load already under way. On the object's PromoteAfter-th disk read the
// load goes into the node's segment instead, when it has free room, and
// the copy stays as a DRAM replica.
func (m *Master) stageLocked(o *Object, deadline time.Time) (*tierOp, error) {
	return m.loadLocked(o, false, deadline)
}

// promoteDue reports whether o's next disk read is the one that promotes
// it.
func (m *Master) promoteDue(o *Object) bool {
	p := m.cfg.PromoteAfter
	return p > 0 && int(o.tier.reads)+1 >= p
}

// loadLocked is stageLocked; with onlyPromote it starts nothing (nil,
// nil) unless the load is a promotion into free room of the segment (a
// read that would otherwise share a staged copy).
func (m *Master) loadLocked(o *Object, onlyPromote bool, deadline time.Time) (*tierOp, error) {
	if op := o.tier.loading; op != nil {
		return op, nil
	}
	n := o.tier.node
	n.mu.Lock()
	online, client, segID, gen := n.online, n.client, n.segID, n.gen
	n.mu.Unlock()
	if !online {
		return nil, store.Errorf(store.ObjectNotFound, "key %q: its only copy is on the disk of %s, which is not connected", o.key, n.name())
	}
	op := &tierOp{id: m.tiers.nextOp.Add(1), kind: pb.TierCommand_LOAD, key: o.key, version: o.tier.version,
		obj: o, size: o.size, done: make(chan struct{})}
	var addr uint64
	if m.promoteDue(o) {
		// Promotion takes free room only: a read never evicts. Nor does
		// it take its tenant over its quota (Mooncake refuses such a
		// promotion): the read is staged instead.
		if q, ok := m.reservePromotion(o); ok {
			if ref, err := m.space.placeOn(client, segID, o.size); err == nil {
				op.promote, op.refs, addr, op.quota = true, []replicaRef{ref}, ref.addr, q
			} else {
				m.unreservePromotion(o.key, q)
			}
		}
	}
	if onlyPromote && !op.promote {
		return nil, nil
	}
	cmd := &pb.TierCommand{Op: op.id, Kind: op.kind, Key: o.key, Version: op.version, Addr: addr, Size: o.size}
	if !op.promote {
		// The node picks the range and waits for room in its pool, a
		// little less long than the read waits for the answer (so the
		// read fails naming the full pool, not a timeout).
		op.kind, cmd.Kind, op.stageGen = pb.TierCommand_STAGE, pb.TierCommand_STAGE, gen
		wait := m.loadBound(deadline)
		cmd.WaitMs = uint64(max(wait-max(wait/4, 20*time.Millisecond), 0).Milliseconds())
	}
	if !n.enqueue(cmd, op) {
		m.freeLoadTarget(n, op)
		return nil, store.Errorf(store.ObjectNotFound, "key %q: the disk of %s is not answering", o.key, n.name())
	}
	o.tier.loading = op
	return op, nil
}

// loadBound is how long a read waits for a disk load or staging: at
// least a staged read's TTL, within which readers that do not hand
// theirs back (Mooncake's clients) free them, so a scan larger than the
// pool waits instead of failing; a caller's deadline comes first.
func (m *Master) loadBound(deadline time.Time) time.Duration {
	bound := max(loadWait, m.stagedTTL()+time.Second)
	if !deadline.IsZero() {
		bound = min(bound, time.Until(deadline))
	}
	return bound
}

// freeLoadTarget frees the range a LOAD or STAGE that did not make it
// was to fill (a STAGE the node answered: the range it took).
func (m *Master) freeLoadTarget(n *tierNode, op *tierOp) {
	if op.promote {
		m.space.free(op.refs, op.size)
		m.unreservePromotion(op.key, op.quota)
		return
	}
	n.releaseStaged(op.stageGen, op.staged)
}

// releaseStaged tells n to free its staged range id of attachment gen (a
// range of an earlier attachment went with its stream: the node frees
// the master's ranges when the stream ends).
func (n *tierNode) releaseStaged(gen, id uint64) {
	if id == 0 {
		return
	}
	n.mu.Lock()
	same := n.gen == gen
	n.mu.Unlock()
	if same {
		n.enqueue(&pb.TierCommand{Kind: pb.TierCommand_RELEASE, Staged: id}, nil)
	}
}

func (m *Master) loadDone(n *tierNode, op *tierOp, err error) {
	sh := m.shardOf(op.key)
	sh.mu.Lock()
	o := sh.objects[op.key]
	switch {
	case o != op.obj || o.tier == nil || o.tier.loading != op:
		// Removed meanwhile: the range is ours to free.
		m.freeLoadTarget(n, op)
		if err == nil {
			err = store.Errorf(store.ObjectNotFound, "key %q was removed while it was loaded from disk", op.key)
		}
	case errors.Is(err, errDetached):
		o.tier.loading = nil
		m.freeLoadTarget(n, op)
		err = store.Errorf(store.ObjectNotFound, "key %q: its only copy is on the disk of %s, which disconnected", op.key, n.name())
	case store.CodeOf(err) == store.NoAvailableHandle:
		// The node's staging pool stayed full: the record is fine.
		o.tier.loading = nil
		err = store.Errorf(store.NoAvailableHandle, "key %q is on the disk of %s: %v", op.key, n.name(), err)
	case err != nil:
		o.tier.loading = nil
		m.freeLoadTarget(n, op)
		// The record is unreadable (gone, corrupt, an I/O error): that
		// disk replica is dropped, never served. A reader's direct read of
		// the same record may have failed first and had it dropped while
		// this load was on its way: that is one failure, counted there.
		if o.tier.node == n && o.tier.version == op.version {
			m.tiers.loadFailures.Add(1)
			m.log.Warn(fmt.Sprintf("load of %q (version %d) from the disk of %s failed: %v; dropping that disk replica", op.key, op.version, n.name(), err))
			m.dropDiskLocked(o)
			m.loseDiskLocked(sh, o)
		}
		err = store.Errorf(store.ObjectNotFound, "key %q: its disk copy on %s could not be read: %v", op.key, n.name(), err)
	case op.promote:
		o.tier.loading = nil
		before := m.charge(o)
		o.replicas = append(o.replicas, op.refs...)
		m.recharge(o, before)
		m.unreservePromotion(op.key, op.quota)
		o.tier.reads = 0
		o.tier.promoted = true
		sh.track(o, 0)
		m.tiers.promotions.Add(1)
		n.nPromotions.Add(1)
		if o.onDisk() {
			m.emit(Change{Op: OpPromote, Key: o.key, Size: o.size, Replicas: o.descriptors(true), Version: o.tier.version, Tier: o.tier.node.id})
		}
	default:
		o.tier.loading = nil
		c := &stagedCopy{id: m.tiers.nextCopy.Add(1), key: o.key, obj: o, node: n, gen: op.stageGen, staged: op.staged, addr: op.stageAddr, size: o.size,
			until: m.now() + m.stagedTTL().Nanoseconds()}
		o.tier.stage = c
		n.nStaged.Add(1)
		m.tiers.stagedMu.Lock()
		m.tiers.copies[c.id] = c
		m.tiers.stagedMu.Unlock()
	}
	sh.mu.Unlock()
	op.err = err
	close(op.done)
}

// stagedTTL is how long a staged read is held for a reader that does not
// hand it back, and the lease its reader is told: the staging TTL, or the
// read lease when that is shorter. Held no longer than told, so that a
// reader that never hands back (Mooncake's clients) frees the range as
// soon as it could no longer trust it anyway.
func (m *Master) stagedTTL() time.Duration { return min(m.cfg.StagingTTL, m.cfg.KVLeaseTTL) }

// grantStagedLocked grants a read of o's staged copy (shard locked): the
// replica to read, counted as a disk hit.
func (m *Master) grantStagedLocked(o *Object, now int64) store.Replica {
	c := o.tier.stage
	m.tiers.stagedMu.Lock()
	c.readers++
	c.until = max(c.until, now+m.stagedTTL().Nanoseconds())
	m.tiers.stagedMu.Unlock()
	m.tiers.diskHits.Add(1)
	m.tiers.diskHitBytes.Add(o.size)
	c.node.nDiskHits.Add(1)
	o.tier.reads++
	c.node.mu.Lock()
	segID := c.node.segID
	c.node.mu.Unlock()
	rep := store.Replica{Addr: c.addr, Len: c.size, Complete: true}
	m.space.mu.Lock()
	if seg := m.space.segs[segID]; seg != nil {
		rep.Segment, rep.Endpoint, rep.Protocol = seg.info.Name, seg.info.Endpoint, seg.info.Protocol
	}
	m.space.mu.Unlock()
	return rep
}

// ReleaseStaged hands back staged reads (their ids, from the replica
// lists) whose bytes have moved: a copy no reader holds any more is freed
// at once. Unknown ids (freed by the TTL already) are ignored.
func (m *Master) ReleaseStaged(ids []uint64) {
	for _, id := range ids {
		m.tiers.stagedMu.Lock()
		c := m.tiers.copies[id]
		m.tiers.stagedMu.Unlock()
		if c == nil {
			continue
		}
		m.tiers.stagedReleased.Add(1)
		m.dropCopy(c, func(c *stagedCopy) bool {
			if c.readers > 0 {
				c.readers--
			}
			return c.readers == 0
		}, false)
	}
}

// dropCopy frees staged copy c if done (called under stagedMu) says so.
func (m *Master) dropCopy(c *stagedCopy, done func(*stagedCopy) bool, reclaimed bool) {
	sh := m.shardOf(c.key)
	sh.mu.Lock()
	m.tiers.stagedMu.Lock()
	if m.tiers.copies[c.id] != c || !done(c) {
		m.tiers.stagedMu.Unlock()
		sh.mu.Unlock()
		return
	}
	delete(m.tiers.copies, c.id)
	m.tiers.stagedMu.Unlock()
	if c.obj.tier != nil && c.obj.tier.stage == c {
		c.obj.tier.stage = nil
	}
	sh.mu.Unlock()
	if reclaimed {
		m.tiers.stagedReclaimed.Add(1)
		c.node.nStageReclaimed.Add(1)
	}
	c.node.releaseStaged(c.gen, c.staged)
}

// expireStaged frees the staged copies whose TTL has passed: a copy with
// readers left is one whose readers died (or took longer than the TTL),
// counted as reclaimed.
func (m *Master) expireStaged(now int64) {
	m.tiers.stagedMu.Lock()
	var due []*stagedCopy
	for _, c := range m.tiers.copies {
		if c.until <= now {
			due = append(due, c)
		}
	}
	m.tiers.stagedMu.Unlock()
	for _, c := range due {
		var readers int
		m.dropCopy(c, func(c *stagedCopy) bool {
			readers = c.readers
			return c.until <= now
		}, false)
		if readers > 0 {
			m.tiers.stagedReclaimed.Add(1)
			c.node.nStageReclaimed.Add(1)
			m.log.Debug(fmt.Sprintf("staged read of %q on %s: %d readers did not hand it back within %s; freed", c.key, c.node.name(), readers, m.cfg.StagingTTL))
		}
	}
}

// readLocked records a leased read of o's DRAM replicas (shard locked):
// a memory hit, or the disk hit of the read that promoted them.
func (m *Master) readLocked(sh *shard, o *Object, depth int) {
	if o.tier != nil && o.tier.promoted {
		o.tier.promoted = false
		m.tiers.diskHits.Add(1)
		m.tiers.diskHitBytes.Add(o.size)
		if n := o.tier.node; n != nil {
			n.nDiskHits.Add(1)
		}
		return
	}
	// Counted in the shard (its lock is held): one master-wide counter
	// bumped per key read was a contended cache line that cost a tenth
	// of a batch get's CPU.
	sh.memHits++
	sh.memHitBytes += o.size
}

// ---- nodes attaching and leaving ----

func (n *tierNode) name() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.segName != "" {
		return fmt.Sprintf("node %s (tier %s)", n.segName, n.id)
	}
	return "tier " + n.id
}

// attach brings a node's tier online (a first hello, a reconnect, or a
// restarted node) and reconciles the records it reports with the
// objects: a record comes back as the object's disk replica when the
// key is unknown (a restarted master) or has that version; a record of a
// key re-put or removed meanwhile is dropped. Objects said to be on this
// tier that it no longer reports lose that replica.
//
// It returns the DROPs of the records not re-added, for the stream's
// first messages (they are not limited by the command queue). Without
// HA each is fenced like dropDiskLocked's: a put or remove of its key
// held meanwhile (awaitTiers, fenceDrops) is answered once the node has
// dropped it.
func (m *Master) attach(h *pb.TierHello) (*tierNode, uint64, []*pb.TierCommand, error) {
	client, segID := store.UUIDFromPB(h.GetClientId()), store.UUIDFromPB(h.GetSegmentId())
	if h.GetTierId() == "" {
		return nil, 0, nil, store.Errorf(store.InvalidParams, "tier hello: no tier id")
	}
	m.space.mu.Lock()
	seg := m.space.segs[segID]
	m.space.mu.Unlock()
	if seg == nil {
		return nil, 0, nil, store.Errorf(store.SegmentNotFound, "tier %s: segment %s is not mounted (mount it first)", h.GetTierId(), segID)
	}
	if seg.owner != client {
		return nil, 0, nil, store.Errorf(store.InvalidParams, "tier %s: segment %q belongs to client %s, not %s", h.GetTierId(), seg.info.Name, seg.owner, client)
	}
	m.NameTiers(slices.DeleteFunc(slices.Clone(h.GetRoster()), func(id string) bool { return id == h.GetTierId() }), h.GetFenced())
	m.tiers.mu.Lock()
	n := m.tiers.byID[h.GetTierId()]
	if n == nil {
		n = &tierNode{id: h.GetTierId()}
		m.tiers.byID[n.id] = n
	}
	m.tiers.mu.Unlock()
	// A node that reconnects before its old stream is known dead: the
	// old one's operations fail now.
	m.detach(n, 0)
	n.mu.Lock()
	n.gen++
	gen := n.gen
	prev := n.client
	n.client, n.segID, n.segName = client, segID, seg.info.Name
	n.pending = make(map[uint64]*tierOp)
	n.send = make(chan *pb.TierCommand, tierCmdQueue)
	n.overflow, n.kick = nil, make(chan struct{}, 1)
	n.stats = &pb.TierStats{Capacity: h.GetCapacity()}
	tomb := maps.Clone(n.tombstones)
	n.service = h.GetStagingService()
	n.dropAcks.Store(h.GetDropAcks())
	n.online = true
	n.mu.Unlock()

	if !prev.IsZero() && prev != client {
		// The directory's lock passed to another process: the node
		// restarted. Its previous incarnation's segment is gone with the
		// process; waiting out client_ttl would keep handing out
		// replicas on it (a promoted object's, say) that fail, while the
		// same bytes are on this disk.
		m.clientsMu.RLock()
		old := m.clients[prev]
		m.clientsMu.RUnlock()
		if old != nil {
			m.log.Info(fmt.Sprintf("disk tier %s re-attached from a new node process (client %s, was %s): dropping the previous one's segments", n.id, client, prev))
			m.dropClient(old, "restarted")
		}
	}
	reported := make(map[string]struct{}, len(h.GetRecords()))
	m.openEarly()
	now := m.now()
	early := m.early.in(now)
	// A fenced tier's records from before this master are stale: a
	// master acknowledged puts and removes while it was away.
	fence := m.tierFence(n.id)
	var added, kept, dropped int
	var drops []*pb.TierCommand
	for _, r := range h.GetRecords() {
		reported[r.GetKey()] = struct{}{}
		m.tiers.seeVersion(r.GetVersion())
		if v, ok := tomb[r.GetKey()]; ok && v == r.GetVersion() || store.CheckStoredKey(r.GetKey()) != nil || r.GetSize() == 0 {
			drops = append(drops, &pb.TierCommand{Kind: pb.TierCommand_DROP, Key: r.GetKey(), Version: r.GetVersion()})
			dropped++
			continue
		}
		sh := m.shardOf(r.GetKey())
		sh.mu.Lock()
		o := sh.objects[r.GetKey()]
		switch {
		case r.GetVersion() < fence && !m.tiers.ours(r.GetVersion()):
			drops = append(drops, &pb.TierCommand{Kind: pb.TierCommand_DROP, Key: r.GetKey(), Version: r.GetVersion()})
			dropped++
		case o == nil && m.tiers.ours(r.GetVersion()) && !m.tiers.takeGivenUp(n.id, r.GetKey(), r.GetVersion()):
			// Removed (or evicted) since: this master handed out that
			// version, or restored every version from its op log.
			drops = append(drops, &pb.TierCommand{Kind: pb.TierCommand_DROP, Key: r.GetKey(), Version: r.GetVersion()})
			dropped++
		case o == nil && !m.tiers.ours(r.GetVersion()) && !m.era.earlier(r.GetKey(), now):
			// From before this master, but its key was removed here
			// since (a newer object of it gone by now), or its node
			// came back after the master's first era (eraLog).
			drops = append(drops, &pb.TierCommand{Kind: pb.TierCommand_DROP, Key: r.GetKey(), Version: r.GetVersion()})
			dropped++
		case o == nil:
			// A record from before this master (restarted without HA),
			// or one given up on while its node was away too long. Whose
			// version it is is unknown: no writer may take it for its
			// own End having landed (lostWriter; a writer whose upsert
			// was under way at the restart was told so by its revoke).
			o = &Object{key: r.GetKey(), size: r.GetSize(), state: stateComplete, tier: &objTier{node: n, version: r.GetVersion(), early: early}, writer: lostWriter}
			o.lastUse = useCounter.Add(1)
			sh.objects[o.key] = o
			sh.keys++
			added++
			m.emit(Change{Op: OpDiskOnly, Key: o.key, Size: o.size, Version: r.GetVersion(), Tier: n.id})
		case o.tier != nil && o.tier.version == r.GetVersion() && o.size == r.GetSize() && o.state == stateComplete:
			if o.tier.node != n && o.tier.node != nil {
				// Another tier holds it too: one disk replica is enough.
				drops = append(drops, &pb.TierCommand{Kind: pb.TierCommand_DROP, Key: r.GetKey(), Version: r.GetVersion()})
				dropped++
			} else {
				o.tier.node = n
				kept++
			}
		default:
			drops = append(drops, &pb.TierCommand{Kind: pb.TierCommand_DROP, Key: r.GetKey(), Version: r.GetVersion()})
			dropped++
		}
		sh.mu.Unlock()
	}
	lost := m.forgetTier(n, func(o *Object) bool {
		_, ok := reported[o.key]
		return !ok
	})
	if n.dropAcks.Load() && !m.tiers.all.Load() {
		n.mu.Lock()
		for _, d := range drops {
			op := m.tiers.addDrop(d.Key, d.Version, n.id)
			d.Op = op.id
			n.pending[op.id] = op
		}
		n.mu.Unlock()
	}
	m.log.Info(fmt.Sprintf("disk tier %s of segment %s attached (%s): %d records reported, %d re-added, %d kept, %d dropped (re-put or removed since), %d replicas it no longer has", n.id, seg.info.Name, fmtBytes(h.GetCapacity()), len(h.GetRecords()), added, kept, dropped, lost))
	m.tiers.mu.Lock()
	m.tiers.bySeg[segID] = n
	m.tiers.online.Store(int64(len(m.tiers.bySeg)))
	m.tiers.mu.Unlock()
	m.tiers.clearEnded(n.id)
	m.tierJoined(n.id)
	return n, gen, drops, nil
}

// forgetTier drops the disk replicas on n of the objects match picks;
// objects left with no copy are removed. It returns how many replicas
// went. It walks every object: it runs when a node attaches or is given
// up on, not per request.
func (m *Master) forgetTier(n *tierNode, match func(*Object) bool) int {
	var lost int
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		for _, o := range sh.objects {
			if o.tier == nil || o.tier.node != n || !match(o) {
				continue
			}
			o.tier.node = nil
			lost++
			m.loseDiskLocked(sh, o)
		}
		sh.mu.Unlock()
	}
	return lost
}

// detach takes n offline (its stream ended, or a newer one replaces it):
// operations in flight fail. gen 0 detaches whatever stream is current.
func (m *Master) detach(n *tierNode, gen uint64) {
	n.mu.Lock()
	if !n.online || (gen != 0 && gen != n.gen) {
		n.mu.Unlock()
		return
	}
	n.online = false
	n.offSince = m.now()
	pending := n.pending
	n.pending = nil
	n.overflow = nil // their ops are among pending
	segID := n.segID
	n.mu.Unlock()
	m.tiers.mu.Lock()
	if m.tiers.bySeg[segID] == n {
		delete(m.tiers.bySeg, segID)
	}
	m.tiers.online.Store(int64(len(m.tiers.bySeg)))
	m.tiers.mu.Unlock()
	for _, op := range pending {
		m.opDone(n, op, errDetached)
	}
	copies := m.dropCopiesOf(n)
	m.log.Info(fmt.Sprintf("disk tier %s detached; %d operations in flight failed, %d staged reads freed", n.name(), len(pending), copies))
}

// dropCopiesOf frees every staged copy in n's staging pool (its stream
// ended): the pool's memory is gone with a dead node, or renewed by a
// live one when it re-attaches, so the copies serve no later read, and a
// read granted one before fails its transfer (or reads the bytes it was
// granted, from memory the node no longer writes). Waiting for their TTL
// would grant them to later reads and count the pool as in use.
func (m *Master) dropCopiesOf(n *tierNode) int {
	m.tiers.stagedMu.Lock()
	var gone []*stagedCopy
	for _, c := range m.tiers.copies {
		if c.node == n {
			gone = append(gone, c)
		}
	}
	m.tiers.stagedMu.Unlock()
	for _, c := range gone {
		m.dropCopy(c, func(*stagedCopy) bool { return true }, false)
	}
	return len(gone)
}

// errDetached fails the operations of a node whose stream ended: its
// disk is not known to be bad, so nothing is dropped for it.
var errDetached = errors.New("the node's tier stream ended")

// loseDiskLocked settles o after its disk replica went (o.tier.node is
// already nil): with no DRAM copy the object is gone (reads holding a
// staged copy finish with it; it is freed as usual).
func (m *Master) loseDiskLocked(sh *shard, o *Object) {
	if len(o.replicas) == 0 && o.tier.loading == nil {
		m.eventDropped(o)
		sh.remove(o.key, o)
		m.emit(Change{Op: OpEvict, Key: o.key})
	}
}

// giveUpTiers drops the disk replicas of nodes away for longer than the
// restored-mount grace. Objects that went with them come back if the
// node does, with the same records, before the key is put again.
func (m *Master) giveUpTiers(now int64) {
	cut := now - m.restoredMountGrace().Nanoseconds()
	m.tiers.mu.Lock()
	var gone []*tierNode
	for _, n := range m.tiers.byID {
		n.mu.Lock()
		if !n.online && n.offSince != 0 && n.offSince <= cut {
			gone = append(gone, n)
			n.offSince = 0
		}
		n.mu.Unlock()
	}
	m.tiers.mu.Unlock()
	for _, n := range gone {
		lost := m.forgetTier(n, func(o *Object) bool {
			if len(o.replicas) == 0 && o.tier.loading == nil && m.tiers.ours(o.tier.version) {
				// Gone with this replica: the node may yet bring it back.
				m.tiers.givenUpMu.Lock()
				if m.tiers.givenUp == nil {
					m.tiers.givenUp = make(map[string]givenUpRecord)
				}
				if _, ok := m.tiers.givenUp[o.key]; !ok {
					m.tiers.nGivenUp.Add(1)
				}
				m.tiers.givenUp[o.key] = givenUpRecord{tier: n.id, version: o.tier.version}
				m.tiers.givenUpMu.Unlock()
			}
			return true
		})
		m.log.Warn(fmt.Sprintf("disk tier %s away for more than %s: dropped its %d disk replicas", n.name(), m.restoredMountGrace(), lost))
		m.tierLeft(n.id)
	}
}

// result applies a node's answer.
func (m *Master) result(n *tierNode, r *pb.TierResult) {
	n.mu.Lock()
	op := n.pending[r.GetOp()]
	delete(n.pending, r.GetOp())
	n.mu.Unlock()
	if op == nil {
		return // failed already when a stream ended
	}
	err := store.ResultFromPB(&pb.Result{Code: r.GetCode(), Message: r.GetMessage()})
	op.stageAddr, op.staged = r.GetAddr(), r.GetStaged()
	m.opDone(n, op, err)
}

// evicted applies records a node's tier dropped to make room, or
// (unreadable) because a reader's staged read of them failed.
func (m *Master) evicted(n *tierNode, recs []*pb.TierRecord, unreadable bool) {
	for _, r := range recs {
		sh := m.shardOf(r.GetKey())
		sh.mu.Lock()
		o := sh.objects[r.GetKey()]
		if o != nil && o.tier != nil && o.tier.node == n && o.tier.version == r.GetVersion() {
			o.tier.node = nil
			if unreadable {
				m.tiers.loadFailures.Add(1)
				m.log.Warn(fmt.Sprintf("disk copy of %q (version %d) on %s could not be read; that disk replica is dropped", r.GetKey(), r.GetVersion(), n.name()))
			} else {
				m.tiers.diskEvicted.Add(1)
			}
			m.loseDiskLocked(sh, o)
		}
		sh.mu.Unlock()
	}
}

// ---- the Attach stream ----

type tierServer struct {
	pb.UnimplementedTierServer
	m    *Master
	gate func(ctx context.Context) error
}

// Attach serves one node's tier stream.
func (s *tierServer) Attach(st pb.Tier_AttachServer) error {
	ctx := st.Context()
	if s.gate != nil {
		if err := s.gate(ctx); err != nil {
			return err
		}
	}
	first, err := st.Recv()
	if err != nil {
		return err
	}
	h := first.GetHello()
	if h == nil {
		return tierStatus(store.Errorf(store.InvalidParams, "tier stream: the first message must be a hello"))
	}
	n, gen, drops, err := s.m.attach(h)
	if err != nil {
		return tierStatus(err)
	}
	defer s.m.detach(n, gen)
	// The first message tells the node it is attached (commands may be
	// a while coming) and carries the staging TTL the node holds
	// readers' own staged reads for; the attach's DROPs follow it.
	down := &pb.TierDown{StagingTtlMs: uint64(s.m.stagedTTL().Milliseconds())}
	for {
		k := min(len(drops), 256)
		down.Commands = drops[:k]
		drops = drops[k:]
		if err := st.Send(down); err != nil {
			return err
		}
		if len(drops) == 0 {
			break
		}
		down = &pb.TierDown{}
	}
	n.mu.Lock()
	send, kick := n.send, n.kick
	n.mu.Unlock()
	sendErr := make(chan error, 1)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			var down pb.TierDown
			select {
			case cmd := <-send:
				down.Commands = append(down.Commands, cmd)
			case <-kick:
			case <-stop:
				return
			}
			// Whatever else is queued goes in the same message, DROPs
			// that waited for room first.
			down.Commands = append(down.Commands, n.takeOverflow(128, gen)...)
		more:
			for len(down.Commands) < 256 {
				select {
				case cmd := <-send:
					down.Commands = append(down.Commands, cmd)
				default:
					break more
				}
			}
			down.Commands = append(down.Commands, n.takeOverflow(256-len(down.Commands), gen)...)
			if len(down.Commands) == 0 {
				continue
			}
			if err := st.Send(&down); err != nil {
				sendErr <- err
				return
			}
		}
	}()
	recvErr := make(chan error, 1)
	go func() {
		for {
			up, err := st.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			switch msg := up.Msg.(type) {
			case *pb.TierUp_Result:
				s.m.result(n, msg.Result)
			case *pb.TierUp_Dropped:
				for _, id := range msg.Dropped.GetOps() {
					s.m.result(n, &pb.TierResult{Op: id})
				}
			case *pb.TierUp_Evicted:
				s.m.evicted(n, msg.Evicted.GetRecords(), msg.Evicted.GetUnreadable())
			case *pb.TierUp_Stats:
				n.mu.Lock()
				n.stats = msg.Stats
				n.mu.Unlock()
			}
		}
	}()
	select {
	case <-recvErr:
	case <-sendErr:
	case <-ctx.Done():
	case <-s.m.done:
	}
	return nil
}

func tierStatus(err error) error { return status.Error(codes.FailedPrecondition, err.Error()) }

// ---- visibility ----

// TierStatus is one node's disk tier as the master sees it.
type TierStatus struct {
	ID       string
	Segment  string
	Client   store.UUID
	Online   bool
	Capacity uint64
	Used     uint64
	Records  uint64
	Files    uint64
	Dir      string
	Direct   bool
	// Replicas counts objects whose disk replica is on this tier.
	Replicas int
	// Offloads, OffloadFull, DiskHits and Promotions count what the
	// master did with this tier since it first attached.
	Offloads, OffloadFull, DiskHits, Promotions uint64
	// StagingSize and StagingUsed are the node's staging pool and the
	// bytes of it holding staged reads (as the node reports them);
	// StagingWaits counts reads that waited for room in it,
	// StagingReclaimed staged reads the TTLs (the master's and the
	// node's) freed with readers left, StagingReleased readers' own
	// staged reads handed back to the node, DirectBatches the batches
	// readers asked the node for directly (not through the master).
	StagingSize, StagingUsed, StagingWaits, StagingReclaimed uint64
	StagingReleased, DirectBatches                           uint64
}

// DiskReplica is an object's replica on a node's disk tier, as the admin
// API shows it (Mooncake's LOCAL_DISK replica: the node's client id and
// transfer endpoint).
type DiskReplica struct {
	Tier     string
	Segment  string
	Client   store.UUID
	Endpoint string
	Size     uint64
	Version  uint64
	Online   bool
}

// diskReplicaLocked describes o's disk replica (shard locked; o on disk).
func (m *Master) diskReplicaLocked(o *Object) *DiskReplica {
	n := o.tier.node
	d := &DiskReplica{Tier: n.id, Size: o.size, Version: o.tier.version}
	n.mu.Lock()
	d.Segment, d.Client, d.Online = n.segName, n.client, n.online
	segID := n.segID
	n.mu.Unlock()
	m.space.mu.Lock()
	if seg := m.space.segs[segID]; seg != nil {
		d.Endpoint = seg.info.Endpoint
	}
	m.space.mu.Unlock()
	return d
}

// TierTotals are the master's disk-tier counters.
type TierTotals struct {
	Offloads, OffloadBytes, OffloadFull, OffloadFailed uint64
	DiskHits, MemHits, Promotions, LoadFailures        uint64
	DiskEvicted                                        uint64
	Inflight                                           int64
	// StagedReleased counts staged reads handed back by their readers
	// (to the master or to the node), StagedReclaimed those a staging
	// TTL freed with readers left, StagingWaits reads that waited for
	// room in a staging pool, DirectBatches the batches readers asked
	// nodes for directly.
	StagedReleased, StagedReclaimed, StagingWaits, DirectBatches uint64
}

// Tiers lists the disk tiers the master knows, by segment name, with the
// number of disk replicas on each (a walk over every object).
func (m *Master) Tiers() []TierStatus {
	out := m.tierNodes()
	count := make(map[string]int)
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		for _, o := range sh.objects {
			if o.onDisk() {
				count[o.tier.node.id]++
			}
		}
		sh.mu.Unlock()
	}
	for i := range out {
		out[i].Replicas = count[out[i].ID]
	}
	return out
}

// tierNodes lists the disk tiers without counting replicas.
func (m *Master) tierNodes() []TierStatus {
	m.tiers.mu.Lock()
	nodes := make([]*tierNode, 0, len(m.tiers.byID))
	for _, n := range m.tiers.byID {
		nodes = append(nodes, n)
	}
	m.tiers.mu.Unlock()
	out := make([]TierStatus, 0, len(nodes))
	for _, n := range nodes {
		n.mu.Lock()
		st := n.stats
		ts := TierStatus{ID: n.id, Segment: n.segName, Client: n.client, Online: n.online,
			Offloads: n.nOffloads.Load(), OffloadFull: n.nOffloadFull.Load(), DiskHits: n.nDiskHits.Load(), Promotions: n.nPromotions.Load()}
		if st != nil {
			ts.Capacity, ts.Used, ts.Records, ts.Files, ts.Dir, ts.Direct = st.GetCapacity(), st.GetUsed(), st.GetRecords(), st.GetFiles(), st.GetDir(), st.GetDirect()
			// The staging pool is the node's: as it last reported it.
			// A node away holds nothing (its pool went with it, or is
			// renewed when it is back).
			ts.StagingSize, ts.StagingWaits, ts.StagingReleased, ts.DirectBatches = st.GetStagingSize(), st.GetStagingWaits(), st.GetStagingReleased(), st.GetDirectBatches()
			ts.StagingReclaimed = st.GetStagingReclaimed()
			if n.online {
				ts.StagingUsed = st.GetStagingUsed()
			}
		}
		n.mu.Unlock()
		ts.StagingReclaimed += n.nStageReclaimed.Load()
		out = append(out, ts)
	}
	slices.SortFunc(out, func(a, b TierStatus) int {
		return cmp.Or(cmp.Compare(a.Segment, b.Segment), cmp.Compare(a.ID, b.ID))
	})
	return out
}

// TierTotals returns the disk-tier counters.
func (m *Master) TierTotals() TierTotals {
	t := &m.tiers
	tt := TierTotals{
		Offloads: t.offloads.Load(), OffloadBytes: t.offloadBytes.Load(), OffloadFull: t.offloadFull.Load(), OffloadFailed: t.offloadFailed.Load(),
		DiskHits: t.diskHits.Load(), MemHits: m.memHitTotals().hits, Promotions: t.promotions.Load(), LoadFailures: t.loadFailures.Load(),
		DiskEvicted: t.diskEvicted.Load(), Inflight: t.inflight.Load(),
		StagedReleased: t.stagedReleased.Load(), StagedReclaimed: t.stagedReclaimed.Load(),
	}
	// The nodes' own counts of their pools, as last reported.
	t.mu.Lock()
	nodes := slices.Collect(maps.Values(t.byID))
	t.mu.Unlock()
	for _, n := range nodes {
		n.mu.Lock()
		if st := n.stats; st != nil {
			tt.StagingWaits += st.GetStagingWaits()
			tt.StagedReleased += st.GetStagingReleased()
			tt.StagedReclaimed += st.GetStagingReclaimed()
			tt.DirectBatches += st.GetDirectBatches()
		}
		n.mu.Unlock()
	}
	return tt
}

// loadWait bounds how long a read waits for a node to load a disk
// object, and for room in its staging pool: a node that has not answered
// by then (a client's RPC timeout is 5 s) fails the read, not the call;
// the load, when it lands, serves the next one.
const loadWait = 4 * time.Second

// newTierServer serves the Attach streams, behind the same gate as the
// master's other calls (HA: only the serving leader).
func newTierServer(m *Master, gate grpc.UnaryServerInterceptor) *tierServer {
	s := &tierServer{m: m}
	if gate != nil {
		info := &grpc.UnaryServerInfo{FullMethod: pb.Tier_Attach_FullMethodName}
		s.gate = func(ctx context.Context) error {
			_, err := gate(ctx, nil, info, func(context.Context, any) (any, error) { return nil, nil })
			return err
		}
	}
	return s
}

// diskReadLocked answers a read of o, whose only copy is on its node's
// disk, for a reader that stages it itself (shard locked): where the
// record is, counted as a disk hit. The node checks the tier and the
// version, so a record dropped or re-put meanwhile is a not-found there,
// never other bytes.
func (m *Master) diskReadLocked(o *Object, now int64, descs *[]store.Replica) ReplicaResult {
	n := o.tier.node
	n.mu.Lock()
	online, service, segID := n.online, n.service, n.segID
	n.mu.Unlock()
	var r ReplicaResult
	switch {
	case !online:
		r.Err = store.Errorf(store.ObjectNotFound, "key %q: its only copy is on the disk of %s, which is not connected", o.key, n.name())
		return r
	case service == "":
		r.Err = store.Errorf(store.ObjectNotFound, "key %q: its only copy is on the disk of %s, which serves no staged reads (a node of an older mc)", o.key, n.name())
		return r
	}
	rep := store.Replica{Len: o.size, Complete: true}
	m.space.mu.Lock()
	if seg := m.space.segs[segID]; seg != nil {
		rep.Segment, rep.Endpoint, rep.Protocol = seg.info.Name, seg.info.Endpoint, seg.info.Protocol
	}
	m.space.mu.Unlock()
	k := len(*descs)
	*descs = append(*descs, rep)
	r.Replicas = (*descs)[k:len(*descs):len(*descs)]
	r.Sum, r.DiskVersion, r.DiskService, r.DiskTier, r.DiskKey = o.sum, o.tier.version, service, n.id, o.key
	r.LeaseTTL = m.cfg.KVLeaseTTL
	o.lease = max(o.lease, now+m.cfg.KVLeaseTTL.Nanoseconds())
	o.tier.reads++
	m.tiers.diskHits.Add(1)
	m.tiers.diskHitBytes.Add(o.size)
	n.nDiskHits.Add(1)
	return r
}
