package master

import (
	"cmp"
	"slices"
	"time"

	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/alloc"
)

// RestoredObject is a complete object known from before this master
// started (an HA op log or snapshot): its replicas are on segments that
// are not mounted yet and will be re-mounted by their nodes.
type RestoredObject struct {
	Key      string
	Size     uint64
	Replicas []RestoredReplica
	SoftPin  time.Time
	HardPin  bool
	// DiskTier and DiskVersion name its replica on a node's disk tier
	// (none when DiskTier is ""): it is readable once that node's tier
	// attaches and reports the record at that version.
	DiskTier    string
	DiskVersion uint64
	// Pending marks a put that was started (granted) and not ended: it is
	// restored as being written by Writer since Started, so its range
	// stays the writer's (it may still be writing there), the writer can
	// still end it, and the usual timeouts discard and release it.
	Pending bool
	Writer  store.UUID
	Started time.Time
	// ReserveUntil, when set, makes the entry a reservation, not an
	// object: a range a discarded or superseded put may still write,
	// held until then (Key is ignored).
	ReserveUntil time.Time
	// Sum is the writer's checksum of the value (0: none).
	Sum uint64
	// ReadLeasedUntil, when set on a complete object, is when reads the
	// master that granted them (an HA leader before this one) may still
	// move its bytes: its ranges are not reused until then (Object.held).
	ReadLeasedUntil time.Time
	// Upsert, on a complete object, is a resizing upsert of it that was
	// granted and not ended. It is restored as under way, so that its
	// writer's End completes it and its revoke gives it back, as on the
	// master that granted it; restored as a mere reservation, the
	// writer's revoke found the old version complete and took it for its
	// own End having landed (make soak with HA: an upsert acknowledged
	// across a failover, the version before it read back). An Upsert
	// none of whose replicas could be located is lost: its writer's End
	// and revoke are told so.
	Upsert *RestoredUpsert
}

// RestoredUpsert is a resizing upsert under way at a restore.
type RestoredUpsert struct {
	Size     uint64
	Replicas []RestoredReplica
	Writer   store.UUID
	Started  time.Time
}

// RestoredReplica is where one copy of a restored object lives.
type RestoredReplica struct {
	Segment store.SegmentInfo
	Addr    uint64
}

// Restore installs complete objects before their segments are mounted.
// When a segment is (re-)mounted, its allocators are rebuilt around the
// restored replicas, so no new allocation lands on their bytes (the
// corruption of Mooncake #3826 and #1336). Replicas must lie inside their
// segment; restoring onto a segment that is already mounted is refused.
// A restored segment not re-mounted within RestoredMountGrace (3 ×
// client_ttl) is taken for dead: its replicas go, as a silent node's do.
func (m *Master) Restore(objs []RestoredObject) error {
	// The op log records every disk replica's version: a node's record
	// of an object the log does not have is stale (tiers.ours).
	m.tiers.all.Store(true)
	m.era.end.Store(0) // every version is ours: no record from before is re-added
	m.endSettle(false) // nor is a tier waited for
	placeholders := make(map[store.UUID]*segment)
	var refs []*restoredRef
	built := make([]*Object, 0, len(objs))
	type reservation struct {
		until int64
		size  uint64
		refs  []replicaRef
	}
	var reserve []reservation
	for _, ro := range objs {
		reserved := !ro.ReserveUntil.IsZero()
		if err := store.CheckStoredKey(ro.Key); err != nil && !reserved {
			return err
		}
		if ro.Size == 0 {
			return store.Errorf(store.InvalidReplica, "restore %q: size 0", ro.Key)
		}
		if len(ro.Replicas) == 0 && (ro.DiskTier == "" || ro.Pending || reserved) {
			return store.Errorf(store.InvalidReplica, "restore %q: no replica", ro.Key)
		}
		o := &Object{key: ro.Key, size: ro.Size, state: stateComplete, hardPin: ro.HardPin, sum: ro.Sum}
		if !ro.ReadLeasedUntil.IsZero() && !ro.Pending {
			o.held = ro.ReadLeasedUntil.UnixNano()
		}
		if ro.Pending {
			o.state, o.writer, o.putStart = stateProcessing, ro.Writer, ro.Started.UnixNano()
		}
		if ro.DiskTier != "" {
			o.tier = &objTier{node: m.tiers.placeholder(ro.DiskTier, m.now()), version: ro.DiskVersion}
			m.tiers.seeVersion(ro.DiskVersion)
		}
		if !ro.SoftPin.IsZero() {
			o.softPin = ro.SoftPin.UnixNano()
		}
		// place takes ranges of size bytes in restored segments.
		place := func(rs []RestoredReplica, size uint64, out []replicaRef) ([]replicaRef, error) {
			for _, r := range rs {
				info := r.Segment
				if r.Addr < info.Base || r.Addr+size > info.Base+info.Size || r.Addr+size < r.Addr {
					return nil, store.Errorf(store.InvalidReplica, "restore %q: replica at 0x%x+%d lies outside segment %q", ro.Key, r.Addr, size, info.Name)
				}
				// A placeholder segment until the mount rebuilds the
				// real one: it names the segment so reads and unmounts
				// work.
				ph := placeholders[info.ID]
				if ph == nil {
					ph = &segment{info: info, host: hostOf(info.Endpoint)}
					placeholders[info.ID] = ph
				}
				reg := &region{seg: ph, base: r.Addr, len: size, dedicated: true, objects: 1}
				out = append(out, replicaRef{reg: reg, addr: r.Addr})
				refs = append(refs, &restoredRef{reg: reg, addr: r.Addr, size: size})
			}
			return out, nil
		}
		var err error
		if o.replicas, err = place(ro.Replicas, ro.Size, o.one[:0:1]); err != nil {
			return err
		}
		if u := ro.Upsert; u != nil && !ro.Pending && !reserved {
			if u.Size == 0 {
				return store.Errorf(store.InvalidReplica, "restore %q: upsert of size 0", ro.Key)
			}
			up, err := place(u.Replicas, u.Size, nil)
			if err != nil {
				return err
			}
			if len(up) == 0 {
				o.writer = lostWriter
			} else {
				o.upsert = &upsertState{refs: up, size: u.Size}
				o.writer, o.putStart = u.Writer, u.Started.UnixNano()
			}
		}
		if reserved {
			reserve = append(reserve, reservation{until: ro.ReserveUntil.UnixNano(), size: ro.Size, refs: o.replicas})
			continue
		}
		built = append(built, o)
	}
	m.space.mu.Lock()
	for id, ph := range placeholders {
		if m.space.segs[id] != nil {
			m.space.mu.Unlock()
			return store.Errorf(store.SegmentAlreadyExists, "restore: segment %q is already mounted", ph.info.Name)
		}
		if err := m.space.checkRestored(ph.info, refs); err != nil {
			m.space.mu.Unlock()
			return err
		}
	}
	now := m.now()
	for _, r := range refs {
		id := r.reg.seg.info.ID
		m.space.restored[id] = append(m.space.restored[id], r)
		if _, ok := m.space.restoredAt[id]; !ok {
			m.space.restoredAt[id] = now
		}
	}
	m.space.mu.Unlock()
	// Pending puts join the discard queue oldest first, as it expects.
	slices.SortStableFunc(built, func(a, b *Object) int { return cmp.Compare(a.putStart, b.putStart) })
	for _, r := range reserve {
		m.pend.addRelease(r.until, r.size, r.refs)
	}
	for _, o := range built {
		sh := m.shardOf(o.key)
		sh.mu.Lock()
		if old := sh.objects[o.key]; old != nil {
			// The restored version replaces it; the space of a version
			// still being written is held until its release timeout.
			sh.remove(o.key, old)
			release := old.putStart + m.cfg.PutReleaseTimeout.Nanoseconds()
			if old.upsert != nil {
				m.pend.addRelease(release, old.upsert.size, old.upsert.refs)
			}
			if old.state == stateComplete {
				m.space.free(old.replicas, old.size)
			} else {
				m.pend.addRelease(release, old.size, old.replicas)
			}
		}
		sh.objects[o.key] = o
		m.recharge(o, 0)
		if o.state == stateProcessing {
			// Complete at its writer's PutEnd, or discarded and released
			// on the usual timeouts from when it started.
			sh.linkPending(o)
			sh.mu.Unlock()
			continue
		}
		if len(o.replicas) > 0 {
			sh.track(o, 0)
		}
		sh.keys++
		if o.softPin != 0 {
			sh.softPinned++
		}
		if o.upsert != nil {
			// Ended or revoked by its writer, or discarded on the
			// usual timeout from when it started.
			sh.linkPending(o)
		}
		sh.mu.Unlock()
	}
	return nil
}

// checkRestored refuses restored replicas that the mount could not reserve
// in the segment's allocator (overlapping each other or earlier restored
// ones, or off its grid): the mount would fail, and the node's next mount
// would then place new objects over their bytes. It builds the allocator
// the mount will, over every replica restored on the segment so far.
func (s *space) checkRestored(info store.SegmentInfo, refs []*restoredRef) error {
	var used []alloc.Range
	for _, r := range s.restored[info.ID] {
		used = append(used, alloc.Range{Addr: r.addr, Len: r.size})
	}
	for _, r := range refs {
		if r.reg.seg.info.ID == info.ID {
			used = append(used, alloc.Range{Addr: r.addr, Len: r.size})
		}
	}
	if _, err := alloc.NewWithUsed(info.Base, info.Size, used); err != nil {
		return store.Errorf(store.InvalidReplica, "restore onto segment %q: %v", info.Name, err)
	}
	return nil
}
