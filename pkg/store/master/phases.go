package master

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/kvcache-ops/mc/pkg/store"
)

// Allocation-failure eviction (store.md, the CXL design), inside the
// BatchPutStart that found no room, so the writer pays no extra round
// trip:
//
//   - Phase 1: evict the policy's first objects among those in the
//     writer's own regions, and place again in the space they leave.
//   - Phase 2 is the policy itself (Config.EvictionPolicy).
//   - Phase 3: when that is not enough, take whole regions from the
//     instances with the lowest reference count (regionTally), free every
//     object in them, and queue their keys for the owners' next ping.
//
// A batch adds up its whole shortage first and evicts once for all its
// items; a put fails only when nothing evictable is left, with
// NO_AVAILABLE_HANDLE saying what is in the way. A put that fits pays for
// none of this: evictForPuts returns at its first loop.

// Reference-count weights of phase 3. Every live object counts 1; one
// that is being read (leased) or pinned says its owner still uses the
// region, so it counts more, and the instance holding it is among the
// last to lose a region.
const (
	leasedWeight  = 4
	softPinWeight = 16
	hardPinWeight = 64
)

// wantsRoom reports whether an item that failed with err lacks only
// room, which evicting may make: NO_AVAILABLE_HANDLE, but not a
// refusal that no eviction for room changes (the watermark's, which is
// about what a round would take after; a tenant's quota, which only
// its own objects leaving meets, and whose item holds no reservation).
func wantsRoom(err error) bool {
	var wm *watermarkRefusal
	var qr *quotaRefusal
	return err != nil && store.CodeOf(err) == store.NoAvailableHandle && !errors.As(err, &wm) && !errors.As(err, &qr)
}

// evictForPuts retries, after evicting, the items of a batch that failed
// for want of space, and returns what it found in the way. With
// freshSpared it evicts no object put within the last lease TTL; with
// freshFirst, those only after every older one it may take.
func (m *Master) evictForPuts(client store.UUID, host string, items []PutItem, cfg store.ReplicateConfig, out []ReplicaResult, ar *descArena, fr freshRule) (seen blockers) {
	var largest uint64
	hopeless := make([]bool, len(out)) // eviction cannot make room: failed, not retried
	short := func() (idx []int, need uint64) {
		for i, r := range out {
			if !wantsRoom(r.Err) || hopeless[i] {
				continue
			}
			if largest == 0 {
				largest = m.space.largestSegment()
			}
			if items[i].Size <= largest {
				idx = append(idx, i)
				need += items[i].Size * uint64(max(cfg.ReplicaNum, 1))
			}
		}
		return idx, need
	}
	idx, need := short()
	if len(idx) == 0 || !m.evicting() {
		return seen
	}
	var cut int64 // the fresh objects of phase 3 and of the room estimate
	if fr == freshSpared {
		cut = m.freshCut(m.now())
	}
	retry := func() {
		for _, i := range idx {
			out[i] = m.putStart(client, host, items[i], cfg, ar)
		}
		idx, need = short()
	}
	// Writers that evict go one at a time: two of them picking the same
	// first victims would leave one with nothing freed. The first retry
	// uses what a writer ahead in line freed.
	m.evictMu.Lock()
	defer m.evictMu.Unlock()
	if retry(); len(idx) == 0 {
		return seen
	}
	// Evict only for puts that eviction can serve: one that would still
	// be short with every evictable object gone fails now, and costs
	// nobody else their objects.
	ok, b := m.roomAfterEviction(items, idx, out, hopeless, cut)
	seen.merge(b)
	if !ok {
		return seen
	}
	if idx, need = short(); len(idx) == 0 {
		return seen
	}
	var blocked blockers
	var total, offloading uint64
	stuck := 0
	// Several rounds: space freed in bytes may still be too fragmented for
	// the retry, another writer may take it first, and writers evicting
	// at once race for the same first victims (the loser frees nothing).
	for round := 0; round < maxEvictRounds && len(idx) > 0; round++ {
		var freed uint64
		blocked = blockers{}
		if own := m.space.ownRegions(client); len(own) > 0 {
			f, l, b := m.evictRound(phaseOwnRegions, need, func(o *Object) bool {
				for _, r := range o.replicas {
					if _, ok := own[r.reg]; ok {
						return true
					}
				}
				return false
			}, fr)
			freed, blocked = freed+f, b
			seen.merge(b)
			offloading += l
			if f > 0 {
				retry()
			}
		}
		if len(idx) > 0 && offloading < need {
			f, l, b := m.evictOtherRegions(client, need-min(need, offloading), cut)
			freed = freed + f
			offloading += l
			seen.merge(b)
			if b.any() {
				blocked = b
			}
			if f > 0 {
				retry()
			}
		}
		if len(idx) > 0 && offloading < need && fr == freshSpared {
			// Older objects outside the writer's regions and in
			// regions that cannot go whole (a leased neighbour): their
			// room is borrowed, or the region returns once empty. Not
			// with freshFirst: this stage took them already.
			f, l, b := m.evictRound(phasePolicy, need-min(need, offloading), nil, freshSpared)
			freed = freed + f
			offloading += l
			seen.merge(b)
		}
		total += freed
		if len(idx) > 0 {
			// Also when this round freed nothing: a racing writer
			// may have.
			retry()
		}
		// A round that frees nothing is the sign of a full store, but
		// one such round can also be a race lost to other writers:
		// three of them in a row are not. (Each round may scan every
		// object, so they stay few.)
		if freed > 0 {
			stuck = 0
		} else if stuck++; stuck == 3 || fr == freshSpared {
			// Sparing fresh objects, a round that frees nothing ends
			// the try: the next one may take them.
			break
		}
		if len(idx) > 0 && offloading >= need {
			// The room is coming, once the disk writes land: a put does
			// not wait for them, nor evict more meanwhile.
			break
		}
	}
	if len(idx) == 0 {
		return seen
	}
	for _, i := range idx {
		switch {
		case offloading > 0:
			out[i].Err = store.Errorf(store.NoAvailableHandle, "key %q: no room for %d bytes yet: %s of DRAM is being offloaded to disk; retry (%v)", items[i].Key, items[i].Size, fmtBytes(offloading), out[i].Err)
		case blocked.any():
			out[i].Err = store.Errorf(store.NoAvailableHandle, "key %q: no room for %d bytes and nothing evictable is left: %s (%v)", items[i].Key, items[i].Size, blocked, out[i].Err)
		case total > 0:
			out[i].Err = store.Errorf(store.NoAvailableHandle, "key %q: no room for %d bytes: this put evicted %s, and concurrent puts took it (%v)", items[i].Key, items[i].Size, fmtBytes(total), out[i].Err)
		}
	}
	return seen
}

// roomAfterEviction checks the items of out at idx against the most room
// eviction could make on one segment in service: its free bytes plus
// those of the objects this put may evict there (and of those being
// offloaded to disk, free once the writes land). An item larger than that
// is failed in out and marked hopeless. It reports whether any item is
// left for eviction to serve.
//
// The walk stops as soon as a segment has room for the largest item, so
// a small put into a full store of evictable objects looks at a few
// objects; only a put that cannot fit (or barely can) walks them all.
func (m *Master) roomAfterEviction(items []PutItem, idx []int, out []ReplicaResult, hopeless []bool, fresh int64) (bool, blockers) {
	var biggest uint64
	for _, i := range idx {
		biggest = max(biggest, items[i].Size)
	}
	// By segment id: a restored object's replicas name the placeholder
	// segment it was restored on, not the mounted one (looked up by
	// pointer, every restored object was left out, and a put into a
	// pool full of them failed as hopeless).
	room := make(map[store.UUID]uint64)
	inService := make(map[store.UUID]*segment)
	var best uint64
	var bestSeg *segment
	m.space.mu.Lock()
	for _, seg := range m.space.order {
		if seg.status != SegOK || m.space.segs[seg.info.ID] != seg {
			continue
		}
		free := seg.info.Size - min(seg.info.Size, seg.used.Load())
		room[seg.info.ID], inService[seg.info.ID] = free, seg
		if bestSeg == nil || free > best {
			best, bestSeg = free, seg
		}
	}
	outOfService := m.space.outOfServiceLocked()
	m.space.mu.Unlock()
	if bestSeg == nil {
		// No segment in service (none mounted, or all drained): no
		// eviction makes room, and the errors already say why.
		return false, blockers{}
	}
	sw := &sweep{now: m.now(), allowSoft: *m.cfg.AllowEvictSoftPinned, fresh: fresh}
walk:
	for i := range m.shards {
		if best >= biggest {
			break
		}
		sh := &m.shards[i]
		sh.mu.Lock()
		for _, o := range sh.objects {
			if !(o.tier != nil && o.tier.offloading) && !sw.take(o) {
				continue
			}
			for _, r := range o.replicas {
				id := r.reg.seg.info.ID
				n, ok := room[id]
				if !ok {
					continue
				}
				n += o.size
				room[id] = n
				if n > best {
					best, bestSeg = n, inService[id]
				}
			}
			if best >= biggest {
				sh.mu.Unlock()
				break walk
			}
		}
		sh.mu.Unlock()
	}
	left := false
	for _, i := range idx {
		if items[i].Size <= best {
			left = true
			continue
		}
		hopeless[i] = true
		why := "every object on it may be evicted"
		if sw.blocked.any() {
			why = "the rest cannot go: " + sw.blocked.String()
		}
		out[i].Err = store.Errorf(store.NoAvailableHandle,
			"key %q: no room for %d bytes, and eviction cannot make it: at most %s on one segment (%s) with every evictable object gone (%s); evicted nothing%s",
			items[i].Key, items[i].Size, fmtBytes(best), bestSeg.info.Name, why, drainedHint(outOfService))
	}
	return left, sw.blocked
}

// maxEvictRounds bounds the evict-and-retry rounds of one put.
const maxEvictRounds = 8

// regionTally is one region's reference count as phase 3 weighs it.
type regionTally struct {
	weight uint64
	// blocked: it holds an object that cannot go now (hard-pinned,
	// leased, being written), so it cannot be freed whole.
	blocked bool
}

// evictOtherRegions is phase 3: it frees whole regions of instances other
// than client's, lowest reference count first, until their bytes cover
// need. It walks every object twice (to weigh the regions, then to evict
// the chosen ones' objects): the last resort costs O(objects).
func (m *Master) evictOtherRegions(client store.UUID, need uint64, fresh int64) (freed, later uint64, blocked blockers) {
	m.m.evictAttempts.Add(1)
	sw := &sweep{now: m.now(), allowSoft: *m.cfg.AllowEvictSoftPinned, fresh: fresh}
	tally := make(map[*region]*regionTally)
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		for _, o := range sh.objects {
			ok := sw.take(o)
			w := uint64(1)
			switch {
			case o.hardPin:
				w += hardPinWeight
			case o.busyUntil() > sw.now:
				w += leasedWeight
			case o.softPin > sw.now:
				w += softPinWeight
			}
			mark := func(refs []replicaRef) {
				for _, r := range refs {
					t := tally[r.reg]
					if t == nil {
						t = &regionTally{}
						tally[r.reg] = t
					}
					t.weight += w
					t.blocked = t.blocked || !ok
				}
			}
			mark(o.replicas)
			if o.upsert != nil {
				mark(o.upsert.refs)
			}
		}
		sh.mu.Unlock()
	}
	chosen, owners := m.space.pickRegions(client, tally, need)
	if len(chosen) == 0 {
		m.countEvicted(phaseOtherRegions, 0, 0)
		return 0, 0, sw.blocked
	}
	var keys uint64
	quiet := &sweep{now: m.now(), allowSoft: sw.allowSoft, fresh: fresh}
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		for _, o := range sh.objects {
			if !slices.ContainsFunc(o.replicas, func(r replicaRef) bool { return chosen[r.reg] }) || !quiet.take(o) {
				continue
			}
			f, l := m.evictVictimLocked(sh, o)
			if f > 0 {
				keys++
			}
			freed += f
			later += l
		}
		sh.mu.Unlock()
	}
	m.countEvicted(phaseOtherRegions, keys, freed)
	m.log.Info(fmt.Sprintf("put of %s by client %s: took %d regions from %d other instances, evicted %d objects (%s), %s being offloaded to disk", fmtBytes(need), client, len(chosen), owners, keys, fmtBytes(freed), fmtBytes(later)))
	return freed, later, sw.blocked
}

// pickRegions chooses whole regions to free for client, at least need
// bytes of them: regions of the instance with the lowest reference count
// first (the sum of its regions' weights), then the lightest regions of
// it. Regions of client itself, regions that cannot be freed whole, and
// regions on segments that are leaving are not taken.
func (s *space) pickRegions(client store.UUID, tally map[*region]*regionTally, need uint64) (map[*region]bool, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	req := s.instances[client]
	type cand struct {
		reg        *region
		inst, self uint64
	}
	instWeight := make(map[*instance]uint64)
	var cands []cand
	for reg, t := range tally {
		seg := reg.seg
		if s.segs[seg.info.ID] != seg {
			continue // a restored placeholder, or gone
		}
		instWeight[reg.owner] += t.weight
		if t.blocked || seg.status != SegOK || (req != nil && reg.owner == req) {
			continue
		}
		cands = append(cands, cand{reg: reg, self: t.weight})
	}
	for i := range cands {
		cands[i].inst = instWeight[cands[i].reg.owner]
	}
	slices.SortFunc(cands, func(a, b cand) int {
		return cmp.Or(cmp.Compare(a.inst, b.inst), cmp.Compare(a.self, b.self),
			cmp.Compare(a.reg.seg.info.Name, b.reg.seg.info.Name), cmp.Compare(a.reg.base, b.reg.base))
	})
	chosen := make(map[*region]bool)
	owners := make(map[*instance]bool)
	var got uint64
	for _, c := range cands {
		if got >= need {
			break
		}
		chosen[c.reg] = true
		owners[c.reg.owner] = true
		got += c.reg.len
	}
	return chosen, len(owners)
}

// ownRegions is the set of regions client holds (phase 1's scope).
func (s *space) ownRegions(client store.UUID) map[*region]struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	in := s.instances[client]
	if in == nil {
		return nil
	}
	own := make(map[*region]struct{}, len(in.regions)+len(in.dedicated))
	for _, r := range in.regions {
		own[r] = struct{}{}
	}
	for _, r := range in.dedicated {
		own[r] = struct{}{}
	}
	return own
}

// largestSegment is the size of the largest mounted segment.
func (s *space) largestSegment() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.largestLocked()
}
