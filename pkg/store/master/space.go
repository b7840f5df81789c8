package master

import (
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/alloc"
)

// SegStatus is a segment's state as the admin API reports it.
type SegStatus uint8

const (
	SegOK SegStatus = iota
	SegDraining
	SegDrained
	SegGracefullyUnmounting
	SegUnmounting
)

func (s SegStatus) String() string {
	return [...]string{"OK", "DRAINING", "DRAINED", "GRACEFULLY_UNMOUNTING", "UNMOUNTING"}[s]
}

type segment struct {
	info  store.SegmentInfo
	host  string // for local-first placement
	owner store.UUID
	// regions carves the segment into regions.
	regions *alloc.Allocator
	status  SegStatus
	used    atomic.Uint64 // object bytes (replica lengths)
	nreg    int
	shared  []*region // its shareable (not dedicated) regions, for borrowing
	// owned counts the regions each live instance holds here, so an
	// unmount gives the instances their region budget back (dedicated
	// regions are in no instance's list).
	owned map[*instance]int
	// live is set on the placeholder of a restored segment once the real
	// segment is mounted (guarded by space.mu).
	live *segment
	// writesSent is when its node's disk tier was last told that puts
	// into it are under way (unix nanos; tiers.noteWrites).
	writesSent atomic.Int64
	// unreachable: a writer reported a transfer to it failed, and its
	// node has not pinged since (guarded by space.mu). Placement avoids
	// it while any other segment can take the replica.
	unreachable bool
}

// region is a piece of a segment owned by one writing instance; its
// objects are placed inside with an allocator of its own.
type region struct {
	seg       *segment
	base, len uint64
	alloc     *alloc.Allocator
	owner     *instance
	objects   int32 // live replicas in the region
	dedicated bool  // holds one object of at least half a region
}

// instance is a writing client's placement state: its open regions.
type instance struct {
	id        store.UUID
	regions   []*region // not dedicated ones
	dedicated []*region // for phase-1 eviction, which looks at all its own
	count     int       // all regions, dedicated included
}

type space struct {
	mu        sync.Mutex
	cfg       *Config
	segs      map[store.UUID]*segment
	byName    map[string]*segment
	order     []*segment // mounted, for placement scans
	instances map[store.UUID]*instance
	// restored holds replicas known before their segment is (re-)mounted
	// (Restore): mount rebuilds the allocators around them so no new
	// allocation lands on live data (Mooncake #3826, #1336).
	restored map[store.UUID][]*restoredRef
	// restoredAt is when a restored segment was first expected back: one
	// that never re-mounts is dropped (staleRestored) like a dead node's.
	restoredAt map[store.UUID]int64
	capacity   atomic.Uint64
	used       atomic.Uint64
	// nunreachable counts segments marked unreachable, so a ping looks
	// for its node's segments only when some are.
	nunreachable atomic.Int32
	// withUnreachable lets placement use unreachable segments (the last
	// try of place; guarded by mu).
	withUnreachable bool
	rng             *rand.Rand
	// tiered reports whether a disk tier is attached (set by the master;
	// nil in tests of space alone): eviction then offloads.
	tiered func() bool
	// grew, when set, is called after usage grew or capacity shrank (the
	// master wakes its watermark loop if that crossed the watermark).
	grew func()
	// notices are the evicted keys each region owner learns on its next
	// ping; a lock of their own, so a ping never waits for space.mu.
	notices notices
}

type restoredRef struct {
	reg  *region
	addr uint64
	size uint64
}

func (s *space) init(cfg *Config) {
	s.cfg = cfg
	s.segs = make(map[store.UUID]*segment)
	s.byName = make(map[string]*segment)
	s.instances = make(map[store.UUID]*instance)
	s.restored = make(map[store.UUID][]*restoredRef)
	s.restoredAt = make(map[store.UUID]int64)
	s.rng = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
}

func hostOf(endpoint string) string {
	if h, _, err := net.SplitHostPort(endpoint); err == nil {
		return h
	}
	return endpoint
}

func (s *space) mount(client store.UUID, info store.SegmentInfo) error {
	switch {
	case info.ID.IsZero():
		return store.Errorf(store.InvalidParams, "mount segment %q: no segment id", info.Name)
	case info.Name == "":
		return store.Errorf(store.InvalidParams, "mount segment %s: no name", info.ID)
	case info.Size == 0:
		return store.Errorf(store.InvalidParams, "mount segment %q: size 0", info.Name)
	case info.Base+info.Size < info.Base:
		return store.Errorf(store.InvalidParams, "mount segment %q: base 0x%x + size %d overflows", info.Name, info.Base, info.Size)
	case info.Endpoint == "":
		return store.Errorf(store.InvalidParams, "mount segment %q: no transfer endpoint", info.Name)
	}
	if info.Protocol == "" {
		info.Protocol = "tcp"
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if old := s.segs[info.ID]; old != nil {
		return store.Errorf(store.SegmentAlreadyExists, "segment %q (%s) is already mounted", info.Name, info.ID)
	}
	if old := s.byName[info.Name]; old != nil {
		return store.Errorf(store.SegmentAlreadyExists, "a segment named %q is already mounted (id %s)", info.Name, old.info.ID)
	}
	seg := &segment{info: info, host: hostOf(info.Endpoint), owner: client, owned: make(map[*instance]int)}
	var err error
	if restored := s.restored[info.ID]; len(restored) > 0 {
		err = s.rebuild(seg, restored)
		delete(s.restored, info.ID)
		delete(s.restoredAt, info.ID)
	} else {
		seg.regions, err = alloc.New(info.Base, info.Size)
	}
	if err != nil {
		return store.Errorf(store.InvalidParams, "mount segment %q: %v", info.Name, err)
	}
	s.segs[info.ID] = seg
	s.byName[info.Name] = seg
	s.order = append(s.order, seg)
	s.capacity.Add(info.Size)
	return nil
}

// rebuild makes the allocators of a re-mounted segment from the replicas
// the master already knows on it: each restored replica becomes a
// dedicated region reserved in the segment's allocator.
func (s *space) rebuild(seg *segment, refs []*restoredRef) error {
	used := make([]alloc.Range, len(refs))
	for i, r := range refs {
		used[i] = alloc.Range{Addr: r.addr, Len: r.size}
	}
	a, err := alloc.NewWithUsed(seg.info.Base, seg.info.Size, used)
	if err != nil {
		return fmt.Errorf("restored replicas do not fit the segment: %w", err)
	}
	seg.regions = a
	for _, r := range refs {
		// The object keeps its placeholder region; frees resolve it to
		// the live segment through live.
		r.reg.seg.live = seg
		seg.nreg++
		seg.used.Add(r.size)
		s.used.Add(r.size)
	}
	s.noteGrew()
	return nil
}

func (s *space) noteGrew() {
	if s.grew != nil {
		s.grew()
	}
}

// rangeOf is a mounted segment's base and size (zeros when unknown).
func (s *space) rangeOf(id store.UUID) (base, size uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if seg := s.segs[id]; seg != nil {
		return seg.info.Base, seg.info.Size
	}
	return 0, 0
}

// staleRestored takes out the restored segments expected back before cut
// that never re-mounted, returning their placeholders.
func (s *space) staleRestored(cut int64) []*segment {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*segment
	for id, at := range s.restoredAt {
		if at > cut {
			continue
		}
		if refs := s.restored[id]; len(refs) > 0 {
			out = append(out, refs[0].reg.seg)
		}
		delete(s.restored, id)
		delete(s.restoredAt, id)
	}
	return out
}

// supersededBy is the mounted segment that info replaces: same name and
// transfer endpoint, another id (nil if none).
func (s *space) supersededBy(info store.SegmentInfo) *segment {
	s.mu.Lock()
	defer s.mu.Unlock()
	if old := s.byName[info.Name]; old != nil && old.info.ID != info.ID && old.info.Endpoint == info.Endpoint {
		return old
	}
	return nil
}

// knows reports whether segment id is mounted by client, or expected
// back with restored replicas on it.
func (s *space) knows(id, client store.UUID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if seg := s.segs[id]; seg != nil {
		// One being unmounted is not taken back: it is gone once the
		// unmount ends.
		return seg.owner == client && seg.status < SegGracefullyUnmounting
	}
	return len(s.restored[id]) > 0
}

func (s *space) ownedBy(id, client store.UUID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	seg := s.segs[id]
	return seg != nil && seg.owner == client
}

// beginUnmount marks a segment as leaving: nothing new is placed on it.
func (s *space) beginUnmount(client, id store.UUID, st SegStatus) (*segment, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	seg := s.segs[id]
	if seg == nil {
		return nil, store.Errorf(store.SegmentNotFound, "segment %s is not mounted", id)
	}
	if !client.IsZero() && seg.owner != client {
		return nil, store.Errorf(store.InvalidParams, "segment %q belongs to client %s, not %s", seg.info.Name, seg.owner, client)
	}
	if seg.status >= SegGracefullyUnmounting {
		return nil, store.Errorf(store.UnavailableInCurrentStatus, "segment %q is already unmounting", seg.info.Name)
	}
	seg.status = st
	return seg, nil
}

// unmount forgets a segment whose objects have been dropped.
func (s *space) unmount(seg *segment) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.segs[seg.info.ID] != seg {
		return
	}
	delete(s.segs, seg.info.ID)
	delete(s.byName, seg.info.Name)
	s.order = slices.DeleteFunc(s.order, func(x *segment) bool { return x == seg })
	if seg.unreachable {
		seg.unreachable = false
		s.nunreachable.Add(-1)
	}
	for _, in := range s.instances {
		in.regions = slices.DeleteFunc(in.regions, func(r *region) bool { return r.seg == seg })
		in.dedicated = slices.DeleteFunc(in.dedicated, func(r *region) bool { return r.seg == seg })
	}
	for in, n := range seg.owned {
		in.count -= n
	}
	s.capacity.Add(-seg.info.Size)
	s.used.Add(-seg.used.Load())
	s.noteGrew()
}

func (s *space) dropInstance(id store.UUID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	in := s.instances[id]
	if in == nil {
		return
	}
	// Its regions stay (their objects live on); they are simply no longer
	// anyone's to fill, and are returned when they empty. The newest one
	// may be empty already (kept for the writer's next put): it goes back
	// now, or nothing would ever return it.
	for _, r := range in.regions {
		r.owner = nil
		if r.objects == 0 {
			_ = r.seg.regions.Free(r.base, r.len)
			r.seg.nreg--
		}
	}
	for _, r := range in.dedicated {
		r.owner = nil
	}
	for _, seg := range s.order {
		delete(seg.owned, in)
	}
	delete(s.instances, id)
	s.notices.forget(id)
}

// place allocates up to cfg.ReplicaNum replicas of size bytes on distinct
// segments for the writer client, appended to dst (an object's inline
// array for the usual single replica: no allocation). It returns at least
// one replica or an error saying why none could be placed.
func (s *space) place(dst []replicaRef, client store.UUID, host string, size uint64, cfg store.ReplicateConfig) ([]replicaRef, error) {
	want := max(cfg.ReplicaNum, 1)
	kept := s.keptByWatermark(size, want)
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.order) == 0 {
		return nil, store.Errorf(store.NoAvailableHandle, "no segment is mounted")
	}
	if kept == 0 {
		if largest := s.largestLocked(); size > largest {
			return nil, errLargerThanAnySegment(size, largest)
		}
		capacity := s.capacity.Load()
		return nil, store.Errorf(store.NoAvailableHandle,
			"value of %d bytes is above the eviction high watermark on its own (%.2f x %d bytes of capacity = %d): the store would evict it as soon as it is put",
			size, s.cfg.HighWatermark, capacity, uint64(s.cfg.HighWatermark*float64(capacity)))
	}
	want = kept
	in := s.instances[client]
	if in == nil {
		in = &instance{id: client}
		s.instances[client] = in
	}
	out := dst[:0]
	if cap(out) < want {
		out = make([]replicaRef, 0, want)
	}
	var usedArr [4]*segment
	used := usedArr[:0]
	for len(out) < want {
		r, ok := s.placeOne(in, host, size, cfg, used)
		if !ok {
			break
		}
		out = append(out, r)
		used = append(used, r.reg.seg)
	}
	if len(out) == 0 && s.nunreachable.Load() > 0 {
		// Only segments a writer could not reach have room: one
		// replica there beats a refusal (the report may be a writer's
		// own trouble, and a dead node is dropped after client_ttl).
		s.withUnreachable = true
		if r, ok := s.placeOne(in, host, size, cfg, used); ok {
			out = append(out, r)
		}
		s.withUnreachable = false
	}
	if len(out) == 0 {
		return nil, s.whyNoSpace(in, size)
	}
	for _, r := range out {
		r.reg.seg.used.Add(size)
	}
	s.used.Add(size * uint64(len(out)))
	s.noteGrew()
	return out, nil
}

// keptByWatermark is how many of want replicas of size bytes the
// watermark loop would keep: n replicas whose bytes alone are at or above
// the high watermark of the capacity are evicted by its next round, as
// soon as the put ends (mooncake_master at 3b5a594 acknowledges such a
// put and its eviction thread drops it at once). Without eviction, or
// with a disk tier attached (eviction offloads instead of dropping), every
// replica is kept.
func (s *space) keptByWatermark(size uint64, want int) int {
	capacity := s.capacity.Load()
	if capacity == 0 || size == 0 || s.cfg.EvictionPolicy == policyNone {
		return want
	}
	limit := s.cfg.HighWatermark * float64(capacity)
	n := want
	for n > 0 && float64(size)*float64(n) >= limit {
		n--
	}
	if n < want && s.tiered != nil && s.tiered() {
		return want
	}
	return n
}

func (s *space) largestLocked() uint64 {
	var largest uint64
	for _, seg := range s.order {
		largest = max(largest, seg.info.Size)
	}
	return largest
}

func errLargerThanAnySegment(size, largest uint64) error {
	return store.Errorf(store.NoAvailableHandle, "value of %d bytes is larger than any segment (largest %d bytes)", size, largest)
}

func (s *space) whyNoSpace(in *instance, size uint64) error {
	largest := s.largestLocked()
	switch {
	case size > largest:
		return errLargerThanAnySegment(size, largest)
	case s.cfg.MaxRegionsPerInstance > 0 && in.count >= s.cfg.MaxRegionsPerInstance:
		return store.Errorf(store.NoAvailableHandle, "no room for %d bytes in this client's %d regions (max_regions_per_instance) and eviction has not freed space yet", size, in.count)
	}
	if out := s.outOfServiceLocked(); len(out) > 0 {
		// The store-wide figures would show room on segments that take
		// no new objects: give those of the segments in service.
		var used, capacity uint64
		for _, seg := range s.order {
			if seg.status == SegOK {
				used += seg.used.Load()
				capacity += seg.info.Size
			}
		}
		fig := "none is"
		if capacity > 0 {
			fig = fmt.Sprintf("used %d of %d in service", used, capacity)
		}
		return store.Errorf(store.NoAvailableHandle, "no segment in service has %d free bytes (%s)%s", size, fig, drainedHint(out))
	}
	return store.Errorf(store.NoAvailableHandle, "no segment has %d free bytes (used %d of %d); eviction runs in the background", size, s.used.Load(), s.capacity.Load())
}

func (s *space) eligible(seg *segment, used []*segment) bool {
	return seg.status == SegOK && (!seg.unreachable || s.withUnreachable) && !slices.Contains(used, seg)
}

// markUnreachable records that a writer could not move bytes to the
// named segments, and returns those newly marked. Placement avoids them
// until their node pings again (reachable).
func (s *space) markUnreachable(names []string) []SegmentStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []SegmentStatus
	for _, name := range names {
		seg := s.byName[name]
		if seg == nil || seg.unreachable {
			continue
		}
		seg.unreachable = true
		s.nunreachable.Add(1)
		out = append(out, SegmentStatus{Info: seg.info, Client: seg.owner})
	}
	return out
}

// reachable clears the mark on client's segments (its node pinged) and
// returns the names cleared. It costs one atomic load when no segment is
// marked.
func (s *space) reachable(client store.UUID) []string {
	if s.nunreachable.Load() == 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, seg := range s.order {
		if seg.unreachable && seg.owner == client {
			seg.unreachable = false
			s.nunreachable.Add(-1)
			out = append(out, seg.info.Name)
		}
	}
	return out
}

func (s *space) placeOne(in *instance, host string, size uint64, cfg store.ReplicateConfig, used []*segment) (replicaRef, bool) {
	try := func(seg *segment) (replicaRef, bool) {
		if !s.eligible(seg, used) {
			return replicaRef{}, false
		}
		if size < s.regionSize(seg)/2 {
			if r, ok := s.inOwnRegions(in, seg, size, 0); ok {
				return r, true
			}
		}
		return s.newRegion(in, seg, size, 0)
	}
	// 1. Preferred segments, in the caller's order.
	for _, name := range cfg.PreferredSegments {
		if seg := s.byName[name]; seg != nil {
			if r, ok := try(seg); ok {
				return r, true
			}
		}
	}
	// 2. The writer's own host (local_first applies to single-replica
	// puts, as in Mooncake).
	if host != "" && (cfg.PreferLocal || s.cfg.AllocationStrategy == strategyLocalFirst && max(cfg.ReplicaNum, 1) == 1) {
		for _, seg := range s.order {
			if seg.host == host {
				if r, ok := try(seg); ok {
					return r, true
				}
			}
		}
	}
	// 3. Room in a region this writer already holds.
	for i := len(in.regions) - 1; i >= 0; i-- {
		reg := in.regions[i]
		if !s.eligible(reg.seg, used) || reg.alloc.LargestFree() < size {
			continue
		}
		if addr, err := reg.alloc.Alloc(size); err == nil {
			reg.objects++
			return replicaRef{reg, addr}, true
		}
	}
	// 4. A new region on a segment chosen by the strategy.
	for _, seg := range s.candidates(size, used) {
		if r, ok := s.newRegion(in, seg, size, 0); ok {
			return r, true
		}
	}
	// 5. No region to be had: rather than refuse a put while bytes are
	// free, borrow room in another writer's region. Such objects count in
	// the lender's region (its reference count) like its own.
	for _, seg := range s.order {
		if !s.eligible(seg, used) {
			continue
		}
		for _, reg := range seg.shared {
			if reg.alloc == nil || reg.alloc.LargestFree() < size {
				continue
			}
			if addr, err := reg.alloc.Alloc(size); err == nil {
				reg.objects++
				return replicaRef{reg, addr}, true
			}
		}
	}
	return replicaRef{}, false
}

// regionSize is the region size on seg: the configured size, but at most
// a sixteenth of the segment (at least 1 MiB), so one writer never takes
// a small segment whole.
func (s *space) regionSize(seg *segment) uint64 {
	return min(s.cfg.RegionSize, max(seg.info.Size/16, 1<<20))
}

// allocIn allocates size bytes from a, on an align boundary when align is
// above the allocator's granule.
func allocIn(a *alloc.Allocator, size, align uint64) (uint64, error) {
	if align > alloc.Align {
		return a.AllocAligned(size, align)
	}
	return a.Alloc(size)
}

// inOwnRegions places size bytes (on an align boundary, 0 for none) in a
// region of seg that in already holds.
func (s *space) inOwnRegions(in *instance, seg *segment, size, align uint64) (replicaRef, bool) {
	for i := len(in.regions) - 1; i >= 0; i-- {
		reg := in.regions[i]
		if reg.seg != seg || reg.alloc.LargestFree() < size {
			continue
		}
		if addr, err := allocIn(reg.alloc, size, align); err == nil {
			reg.objects++
			return replicaRef{reg, addr}, true
		}
	}
	return replicaRef{}, false
}

// candidates lists the segments that can take a region for size bytes,
// in the order the allocation strategy prefers. Each placement draws
// afresh, so a newly mounted empty segment receives its share of new
// regions, not every put (Mooncake #3688).
func (s *space) candidates(size uint64, used []*segment) []*segment {
	var c []*segment
	for _, seg := range s.order {
		if s.eligible(seg, used) && seg.regions.LargestFree() >= size {
			c = append(c, seg)
		}
	}
	switch s.cfg.AllocationStrategy {
	case strategyFreeRatioFirst:
		// Best of a small random sample, so the emptiest segment is
		// favoured without taking every region.
		s.rng.Shuffle(len(c), func(i, j int) { c[i], c[j] = c[j], c[i] })
		k := min(len(c), 2)
		sort.SliceStable(c[:k], func(i, j int) bool { return freeRatio(c[i]) > freeRatio(c[j]) })
	default:
		s.rng.Shuffle(len(c), func(i, j int) { c[i], c[j] = c[j], c[i] })
	}
	return c
}

func freeRatio(seg *segment) float64 {
	return 1 - float64(seg.used.Load())/float64(seg.info.Size)
}

// newRegion takes a new region of seg for in and places size bytes (on an
// align boundary, 0 for none) in it.
func (s *space) newRegion(in *instance, seg *segment, size, align uint64) (replicaRef, bool) {
	if s.cfg.MaxRegionsPerInstance > 0 && in.count >= s.cfg.MaxRegionsPerInstance {
		return replicaRef{}, false
	}
	free := seg.regions.LargestFree()
	if free < size {
		return replicaRef{}, false
	}
	rs := s.regionSize(seg)
	dedicated := size >= rs/2
	n := size
	if !dedicated {
		n = max(size, min(rs, free))
	}
	// A dedicated region is the object's range: it takes the alignment.
	var base uint64
	var err error
	if dedicated {
		base, err = allocIn(seg.regions, n, align)
	} else {
		base, err = seg.regions.Alloc(n)
	}
	if err != nil {
		return replicaRef{}, false
	}
	reg := &region{seg: seg, base: base, len: n, owner: in, objects: 1, dedicated: dedicated}
	seg.nreg++
	in.count++
	seg.owned[in]++
	if dedicated {
		in.dedicated = append(in.dedicated, reg)
		return replicaRef{reg, base}, true
	}
	reg.alloc, err = alloc.New(base, n)
	if err == nil {
		var addr uint64
		if addr, err = allocIn(reg.alloc, size, align); err == nil {
			in.regions = append(in.regions, reg)
			seg.shared = append(seg.shared, reg)
			return replicaRef{reg, addr}, true
		}
	}
	_ = seg.regions.Free(base, n)
	seg.nreg--
	in.count--
	seg.owned[in]--
	return replicaRef{}, false
}

// free returns replicas' space; regions that empty go back to their
// segment.
func (s *space) free(refs []replicaRef, size uint64) {
	if len(refs) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range refs {
		s.freeOne(r, size)
	}
}

func (s *space) freeOne(r replicaRef, size uint64) {
	reg, seg := r.reg, r.reg.seg
	if seg.live != nil {
		seg = seg.live
	}
	if s.segs[seg.info.ID] != seg {
		if reg.seg.regions == nil && seg.live == nil {
			// A restored replica whose segment is not mounted yet: the
			// mount must not reserve its range any more.
			s.forgetRestored(seg.info.ID, reg)
		}
		return // the segment is gone, and its space with it
	}
	seg.used.Add(-size)
	s.used.Add(-size)
	reg.objects--
	if !reg.dedicated {
		_ = reg.alloc.Free(r.addr, size)
	}
	if reg.objects > 0 {
		return
	}
	// An empty region goes back to its segment at once: holding it for
	// its writer would starve the others, and taking a new one is cheap.
	if !reg.dedicated {
		if in := reg.owner; in != nil {
			in.regions = slices.DeleteFunc(in.regions, func(x *region) bool { return x == reg })
		}
		seg.shared = slices.DeleteFunc(seg.shared, func(x *region) bool { return x == reg })
	}
	if in := reg.owner; in != nil {
		if reg.dedicated {
			in.dedicated = slices.DeleteFunc(in.dedicated, func(x *region) bool { return x == reg })
		}
		in.count--
		if s.instances[in.id] == in {
			if seg.owned[in]--; seg.owned[in] == 0 {
				delete(seg.owned, in)
			}
		}
	}
	_ = seg.regions.Free(reg.base, reg.len)
	seg.nreg--
}

func (s *space) forgetRestored(id store.UUID, reg *region) {
	refs := slices.DeleteFunc(s.restored[id], func(r *restoredRef) bool { return r.reg == reg })
	if len(refs) == 0 {
		delete(s.restored, id)
		delete(s.restoredAt, id)
	} else {
		s.restored[id] = refs
	}
}

// SegmentStatus is one segment as the admin API shows it.
type SegmentStatus struct {
	Info     store.SegmentInfo
	Client   store.UUID
	Status   SegStatus
	Used     uint64 // object bytes
	Capacity uint64
	Regions  int
	// Unreachable: a writer could not reach it and its node has not
	// pinged since; placement avoids it.
	Unreachable bool
}

func (s *space) list() []SegmentStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]SegmentStatus, 0, len(s.order))
	for _, seg := range s.order {
		out = append(out, SegmentStatus{
			Info: seg.info, Client: seg.owner, Status: seg.status,
			Used: seg.used.Load(), Capacity: seg.info.Size, Regions: seg.nreg,
			Unreachable: seg.unreachable,
		})
	}
	return out
}
