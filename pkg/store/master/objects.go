package master

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/policy"
)

const (
	stateProcessing uint8 = iota + 1
	stateComplete
)

// Object is one key's metadata. It is kept small: the master must hold
// tens of millions of them. Policies see it through its methods.
type Object struct {
	// The fields a get reads come first and together (the get path is
	// bound by cache misses on millions of objects: this way it touches
	// two of the object's three cache lines, not all of them); the put's
	// bookkeeping comes after.
	state   uint8
	hardPin bool
	inPlace bool // a same-size upsert is rewriting the replicas
	// gen counts the object's writes (put ends, upsert starts): a drain
	// copy made under one gen is committed only if it still holds.
	gen      uint16
	size     uint64
	replicas []replicaRef
	// one is the backing array of replicas as placed at the object's
	// put, when that is one replica (the usual case): in the object, not
	// an allocation of its own, so a get reads the replica from the
	// object's own memory and the heap holds one object less per key
	// (fewer for the GC to mark). It is written only at creation; later
	// changes of replicas go through append, which never writes past a
	// capacity of one, or filter in place exactly as a separate array
	// would be.
	one   [1]replicaRef
	lease int64 // read lease expiry, unix nanos
	// held is when reads another master granted may have ended (unix
	// nanos; 0: none): an object restored from an HA op log may be read
	// under a lease the previous leader granted, which this one never
	// saw. Its ranges are not reused before (their frees wait), it is
	// not rewritten in place and eviction passes it by; removes and
	// upserts go ahead.
	held int64
	// sum is the writer's checksum of the value (store.Checksum form:
	// 1<<32 | CRC32C), 0 when it gave none; readers check it.
	sum uint64
	// lastUse is the master-wide order of the object's last put or read
	// (of its put only under fifo): eviction merges the shards' victims by
	// it, so a round takes the policy's first objects of the whole master,
	// not of each shard.
	lastUse uint64
	// tier is its disk-tier state, nil for an object never offloaded.
	tier *objTier
	// ent is the object's place in its shard's eviction policy: intrusive,
	// so a policy costs no allocation per object.
	ent policy.Entry[*Object]

	key string
	// putStart is, while a version is written, when its PutStart came
	// (unix nanos); once complete, when its PutEnd came (eviction takes
	// an object put within the last lease TTL after older ones), 0 when
	// unknown (restored). One field for both: tens of millions of them.
	putStart int64
	// pendPrev and pendNext link a put in progress into its shard's
	// pending list (oldest first) for the discard scan; an ended put
	// leaves the list at once, so the master keeps nothing of a put
	// after it ends or its object goes.
	pendPrev, pendNext *Object
	// writer is the client of the put or upsert in progress: only it may
	// end or revoke it (a writer whose abandoned put was replaced must not
	// complete or free the replacing writer's).
	writer  store.UUID
	softPin int64 // soft pin expiry, unix nanos; 0 = none
	// upsert holds the replicas of a resizing upsert until its End.
	upsert *upsertState
}

// lostWriter is the writer of a complete object whose last upsert was
// dropped before its End: the old version is nobody's in flight.
var lostWriter = store.UUID{First: ^uint64(0), Second: ^uint64(0)}

// upsertState is a resizing upsert in progress: its replicas and the size
// they hold (outside Object, which most objects never need it in).
type upsertState struct {
	refs []replicaRef
	size uint64
	// prev is the writer whose End completed the version being
	// resized (zero: unknown, lostWriter: nobody's): its revoke learns
	// that its End landed, though another writer now writes the key.
	prev store.UUID
}

type replicaRef struct {
	reg  *region
	addr uint64
}

// Key is the object's key.
func (o *Object) Key() string { return o.key }

// Size is the object's length in bytes.
func (o *Object) Size() uint64 { return o.size }

// Hits is how often the object was put or read since it became complete.
func (o *Object) Hits() uint32 { return o.ent.Hits() }

func (o *Object) onSegment(s *segment) bool {
	for _, r := range o.replicas {
		if r.reg.seg.info.ID == s.info.ID {
			return true
		}
	}
	if o.upsert != nil {
		for _, r := range o.upsert.refs {
			if r.reg.seg.info.ID == s.info.ID {
				return true
			}
		}
	}
	return false
}

// dropSegment forgets the replicas on s (their segment is gone: nothing
// to free) and returns how many replicas are left.
func (o *Object) dropSegment(s *segment) int {
	keep := o.replicas[:0]
	for _, r := range o.replicas {
		if r.reg.seg.info.ID != s.info.ID {
			keep = append(keep, r)
		}
	}
	clear(o.replicas[len(keep):])
	o.replicas = keep
	if o.upsert != nil {
		u := o.upsert.refs[:0]
		for _, r := range o.upsert.refs {
			if r.reg.seg.info.ID != s.info.ID {
				u = append(u, r)
			}
		}
		o.upsert.refs = u
	}
	return len(o.replicas)
}

func (o *Object) descriptors(complete bool) []store.Replica {
	return o.appendDescriptors(make([]store.Replica, 0, len(o.replicas)), complete)
}

// appendDescriptors appends o's replica descriptors to buf, so a batch
// lookup fills one array instead of allocating per key.
func (o *Object) appendDescriptors(buf []store.Replica, complete bool) []store.Replica {
	for _, r := range o.replicas {
		buf = append(buf, r.descriptor(o.size, complete))
	}
	return buf
}

// segName is the name of the replica's segment, as its descriptor says.
func (r replicaRef) segName() string { return r.reg.seg.info.Name }

func (r replicaRef) descriptor(size uint64, complete bool) store.Replica {
	s := r.reg.seg
	return store.Replica{
		Segment:  s.info.Name,
		Endpoint: s.info.Endpoint,
		Protocol: s.info.Protocol,
		Addr:     r.addr,
		Len:      size,
		Complete: complete,
	}
}

// shard holds a slice of the key space: its objects and their eviction
// order, under one lock.
type shard struct {
	mu sync.Mutex
	// ledger is the master's tenant ledger (nil without multi-tenant
	// mode): an object leaving the shard gives its charge back.
	ledger  *tenantTable
	objects map[string]*Object
	// pendHead and pendTail are the puts and upserts in progress, by
	// start (the discard scan's order).
	pendHead, pendTail *Object
	policy             policy.Policy[*Object]
	keys               int // complete objects
	// softPinned counts complete objects with a soft pin, live or
	// expired, so the metric needs no scan.
	softPinned int
	// memHits and memHitBytes count reads served from memory (under mu;
	// summed by memHitTotals).
	memHits, memHitBytes uint64
	// era is the master's first era (eraLog).
	era *eraLog
	_   [8]byte // keep neighbouring shard locks off one cache line
}

// eraLog is a master's first era, when nodes come back after a restart
// without HA and report disk records of versions from before it (not
// ours), which it re-adds when their key has no object. A key removed
// (or evicted, or put and revoked) on this master before that record's
// tier attaches makes the record stale, yet neither its version nor the
// absent object can tell: so the keys that leave the master during the
// era go into a Bloom filter (1 MiB whatever the count; a false positive
// only drops a record, a cache miss), and a record from before the
// master reported after its era is dropped, as what became of its key
// since is no longer known. The era is 3 x client_ttl (the time a node
// has to come back), ended early past eraKeys keys or once the master is
// restored from an op log (HA: every version is then ours).
type eraLog struct {
	end  atomic.Int64 // unix nanos; 0: over
	n    atomic.Int64 // keys added
	now  func() int64
	seed maphash.Seed
	mu   sync.Mutex
	bits atomic.Pointer[[]uint64] // nil until the first key, and once over
}

const (
	// eraKeys ends an era early: past it the filter's false positives
	// (about 2% at 1Mi keys) would drop too many records.
	eraKeys  = 1 << 20
	eraWords = 1 << 17 // 8 Mibit
	eraProbe = 4
)

// over reports whether the era has ended by now (ending it if so).
func (e *eraLog) over(now int64) bool {
	end := e.end.Load()
	if end != 0 && now <= end && e.n.Load() <= eraKeys {
		return false
	}
	e.end.Store(0)
	e.bits.Store(nil)
	return true
}

func (e *eraLog) probes(key string) (h1, h2 uint64) {
	h := maphash.String(e.seed, key)
	return h & 0xffffffff, h>>32 | 1
}

// left records that key left the master (removed, evicted, revoked, or
// removed while absent).
func (e *eraLog) left(key string) {
	if e == nil || e.end.Load() == 0 || e.over(e.now()) {
		return
	}
	bp := e.bits.Load()
	if bp == nil {
		e.mu.Lock()
		if bp = e.bits.Load(); bp == nil {
			b := make([]uint64, eraWords)
			bp = &b
			e.bits.Store(bp)
		}
		e.mu.Unlock()
	}
	e.n.Add(1)
	bits := *bp
	h1, h2 := e.probes(key)
	for i := range uint64(eraProbe) {
		bit := (h1 + i*h2) % (eraWords * 64)
		atomic.OrUint64(&bits[bit/64], 1<<(bit%64))
	}
}

// earlier reports whether a record of key from before this master,
// reported at now, may be re-added: the era is not over and key has not
// left the master during it.
func (e *eraLog) earlier(key string, now int64) bool {
	if e == nil {
		return true
	}
	if e.over(now) {
		return false
	}
	bp := e.bits.Load()
	if bp == nil {
		return true
	}
	bits := *bp
	h1, h2 := e.probes(key)
	for i := range uint64(eraProbe) {
		bit := (h1 + i*h2) % (eraWords * 64)
		if atomic.LoadUint64(&bits[bit/64])&(1<<(bit%64)) == 0 {
			return true
		}
	}
	return false
}

type hitTotals struct{ hits, bytes uint64 }

// memHitTotals sums the shards' memory read counters.
func (m *Master) memHitTotals() hitTotals {
	var t hitTotals
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		t.hits += sh.memHits
		t.bytes += sh.memHitBytes
		sh.mu.Unlock()
	}
	return t
}

// remove deletes o from the shard and its eviction order; the caller
// frees its replicas.
func (sh *shard) remove(key string, o *Object) {
	delete(sh.objects, key)
	sh.era.left(key)
	if sh.ledger != nil {
		sh.ledger.shift(key, chargeOf(o), 0)
	}
	sh.unlinkPending(o)
	if o.state == stateComplete {
		if o.ent.In() {
			sh.policy.Remove(&o.ent)
		}
		sh.keys--
		if o.softPin != 0 {
			sh.softPinned--
		}
	}
}

// track puts o, just complete, into the shard's eviction order at depth
// (its position in the batch that ended its put: the block's position in
// its request, which length-aware uses).
func (sh *shard) track(o *Object, depth int) {
	o.ent.V = o
	o.lastUse = useCounter.Add(1)
	sh.policy.Add(&o.ent, depth)
}

// touch records a read of o at depth (its position in the read's batch)
// with use stamp (from a block a batch reserves at once: one shared
// atomic per batch, not per key).
func (sh *shard) touch(o *Object, depth int, stamp uint64) {
	if !o.ent.In() {
		return
	}
	if sh.policy.Name() != "fifo" {
		o.lastUse = stamp
	}
	sh.policy.Touch(&o.ent, depth)
}

// linkPending appends o, whose put or upsert just started, to the
// shard's pending list (moving it to the end if it was there already).
func (sh *shard) linkPending(o *Object) {
	sh.unlinkPending(o)
	o.pendPrev = sh.pendTail
	if sh.pendTail != nil {
		sh.pendTail.pendNext = o
	} else {
		sh.pendHead = o
	}
	sh.pendTail = o
}

// unlinkPending takes o off the shard's pending list, if it is there.
func (sh *shard) unlinkPending(o *Object) {
	if o.pendPrev == nil && sh.pendHead != o {
		return
	}
	if o.pendPrev != nil {
		o.pendPrev.pendNext = o.pendNext
	} else {
		sh.pendHead = o.pendNext
	}
	if o.pendNext != nil {
		o.pendNext.pendPrev = o.pendPrev
	} else {
		sh.pendTail = o.pendPrev
	}
	o.pendPrev, o.pendNext = nil, nil
}

// pending holds the space of discarded puts waiting for the release
// timeout before it may be reused: the writer may still be moving bytes
// into it. (The puts in progress are on their shards' pending lists, so
// the discard scan is O(discarded), and a put that ends leaves nothing
// behind: a queue of every put started, kept for the discard timeout,
// held 30 s of puts and their evicted objects, 220 B a put.)
type pending struct {
	mu       sync.Mutex
	releases []pendingRelease
}

type pendingRelease struct {
	at       int64
	size     uint64
	replicas []replicaRef
	// leased: an old version kept for a reader's lease, not a discarded
	// put (master_put_start_release_cnt counts only those).
	leased bool
}

func (p *pending) addRelease(at int64, size uint64, r []replicaRef) {
	if len(r) == 0 {
		return
	}
	p.mu.Lock()
	p.releases = append(p.releases, pendingRelease{at: at, size: size, replicas: r})
	p.mu.Unlock()
}

// discardedBytes is the replica bytes of discarded puts (and abandoned
// upserts) whose space waits for the release timeout.
func (p *pending) discardedBytes() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var n uint64
	for _, r := range p.releases {
		if !r.leased {
			n += r.size * uint64(len(r.replicas))
		}
	}
	return n
}

// addLeased holds an old version's replicas until the lease of the
// reader still moving its bytes ends.
func (p *pending) addLeased(until int64, size uint64, r []replicaRef) {
	p.mu.Lock()
	p.releases = append(p.releases, pendingRelease{at: until, size: size, replicas: r, leased: true})
	p.mu.Unlock()
}

// discardStale removes puts whose PutEnd did not come within the discard
// timeout; their space is queued for release.
func (m *Master) discardStale(now int64) {
	cut := now - m.cfg.PutDiscardTimeout.Nanoseconds()
	for i := range m.shards {
		m.discardStaleIn(&m.shards[i], cut)
	}
}

func (m *Master) discardStaleIn(sh *shard, cut int64) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for o := sh.pendHead; o != nil && o.putStart <= cut; o = sh.pendHead {
		sh.unlinkPending(o)
		key := o.key
		if o.putStart == 0 || sh.objects[key] != o {
			continue
		}
		release := o.putStart + m.cfg.PutReleaseTimeout.Nanoseconds()
		switch {
		case o.upsert != nil:
			// A resizing upsert abandoned: the old version stays. The
			// resize's replicas hold upsert.size bytes, not the old size.
			before := m.charge(o)
			m.pend.addRelease(release, o.upsert.size, o.upsert.refs)
			o.upsert, o.writer = nil, lostWriter
			m.recharge(o, before)
			o.putStart = 0
		case o.state == stateProcessing:
			if o.inPlace {
				m.eventDropped(o)
			}
			sh.remove(key, o)
			m.pend.addRelease(release, o.size, o.replicas)
			if o.inPlace {
				m.emit(Change{Op: OpRemove, Key: key})
			}
		default:
			continue
		}
		m.m.putDiscards.Inc()
		m.log.Warn("discarded put with no PutEnd", "key", key, "after", m.cfg.PutDiscardTimeout)
	}
}

func (m *Master) releaseDue(now int64) {
	m.pend.mu.Lock()
	var due []pendingRelease
	keep := m.pend.releases[:0]
	for _, r := range m.pend.releases {
		if r.at <= now {
			due = append(due, r)
		} else {
			keep = append(keep, r)
		}
	}
	clear(m.pend.releases[len(keep):])
	m.pend.releases = keep
	m.pend.mu.Unlock()
	for _, r := range due {
		m.space.free(r.replicas, r.size)
		if !r.leased {
			m.m.putReleases.Inc()
		}
	}
}

func (m *Master) softPinExpiry(cfg store.ReplicateConfig, now int64) int64 {
	if !cfg.SoftPin {
		return 0
	}
	ttl := cfg.SoftPinTTL
	if ttl <= 0 {
		ttl = m.cfg.DefaultSoftPinTTL
	}
	ttl = min(ttl, m.cfg.MaxSoftPinTTL)
	return now + ttl.Nanoseconds()
}

func expiry(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// busyUntil is when every read that may move o's DRAM bytes has ended:
// its own read lease, or a previous leader's (held).
func (o *Object) busyUntil() int64 { return max(o.lease, o.held) }
