package ha

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"time"

	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/alloc"
	"github.com/kvcache-ops/mc/pkg/store/master"
)

// record is one metadata change in the op log. JSON, short names: a
// record is a few hundred bytes and an operator can read a batch with
// etcdctl.
type record struct {
	Seq     uint64             `json:"s"`
	Op      string             `json:"o"`
	Key     string             `json:"k,omitempty"`
	Size    uint64             `json:"z,omitempty"`
	Reps    []rep              `json:"r,omitempty"`
	SoftPin int64              `json:"sp,omitempty"` // unix nanos
	HardPin bool               `json:"hp,omitempty"`
	Segment *store.SegmentInfo `json:"g,omitempty"`
	// Ver and Tier: an object's disk replica (disk_only, promote): the
	// version it was offloaded as and the node tier holding it.
	Ver  uint64 `json:"v,omitempty"`
	Tier string `json:"t,omitempty"`
	// Drain is a drain job as it was created or ended.
	Drain *master.DrainJob `json:"dj,omitempty"`
	// W and At: a put_start's writer and start (unix nanos).
	W  *store.UUID `json:"w,omitempty"`
	At int64       `json:"at,omitempty"`
	// X is a put_end's checksum of the value (0: none).
	X uint64 `json:"x,omitempty"`
}

// rep is where one replica is: segment name and address. The segment's
// full description comes from its mount record.
type rep struct {
	Seg  string `json:"g"`
	Addr uint64 `json:"a"`
}

func recordOf(c master.Change) record {
	r := record{Op: c.Op.String(), Key: c.Key}
	switch c.Op {
	case master.OpMount, master.OpUnmount:
		seg := c.Segment
		r.Segment = &seg
	case master.OpPutEnd, master.OpPromote:
		r.Size, r.HardPin = c.Size, c.HardPin
		if !c.SoftPin.IsZero() {
			r.SoftPin = c.SoftPin.UnixNano()
		}
		r.Reps = repsOf(c.Replicas)
		r.Ver, r.Tier = c.Version, c.Tier
		r.X = c.Sum
	case master.OpDiskOnly:
		r.Size, r.Ver, r.Tier = c.Size, c.Version, c.Tier
	case master.OpDrain:
		r.Drain = c.Drain
	case master.OpPutStart:
		r.Size = c.Size
		r.Reps = repsOf(c.Replicas)
		w := c.Client
		r.W, r.At = &w, c.Started.UnixNano()
	case master.OpHold:
		r.Size = c.Size
		r.Reps = repsOf(c.Replicas)
		r.At = c.Started.UnixNano() // when the read lease ends
	}
	return r
}

// repsOf is where replicas are, as records name them.
func repsOf(rs []store.Replica) []rep {
	out := make([]rep, len(rs))
	for i, x := range rs {
		out[i] = rep{Seg: x.Segment, Addr: x.Addr}
	}
	return out
}

// maxBatchBytes keeps one batch well inside etcd's request limit (1.5 MiB).
const maxBatchBytes = 512 << 10

// decodeBatch reads one op log value; a batch must be non-empty and its
// seqs consecutive.
func decodeBatch(b []byte) ([]record, error) {
	var recs []record
	if err := json.Unmarshal(b, &recs); err != nil {
		return nil, fmt.Errorf("op log batch: %w", err)
	}
	if len(recs) == 0 {
		return nil, fmt.Errorf("op log batch: empty")
	}
	for i := 1; i < len(recs); i++ {
		if recs[i].Seq != recs[i-1].Seq+1 {
			return nil, fmt.Errorf("op log batch: seq %d follows %d", recs[i].Seq, recs[i-1].Seq)
		}
	}
	return recs, nil
}

// object is a complete object as the op log knows it.
type object struct {
	Size    uint64 `json:"z"`
	Reps    []rep  `json:"r"`
	SoftPin int64  `json:"sp,omitempty"`
	HardPin bool   `json:"hp,omitempty"`
	Seq     uint64 `json:"s"` // record that put it: newer wins an overlap
	// DiskTier and DiskVer: its replica on a node's disk tier, if any.
	DiskTier string `json:"dt,omitempty"`
	DiskVer  uint64 `json:"dv,omitempty"`
	// Sum is the writer's checksum of the value (0: none).
	Sum uint64 `json:"x,omitempty"`
	// Lost: an upsert of it was dropped (its new replicas' segment went
	// away). Its writer's End and revoke must learn that, not take the
	// version here for theirs (RestoredObject.Upsert with no replica).
	Lost bool `json:"l,omitempty"`
}

// state is the metadata the op log describes up to Seq: what a standby
// keeps warm and a snapshot holds. Segments are keyed by name, as
// replicas name them.
type state struct {
	Seq      uint64                       `json:"seq"`
	Segments map[string]store.SegmentInfo `json:"segments"`
	Objects  map[string]*object           `json:"objects"`
	// Drains are the drain jobs by id (the latest record of each).
	Drains map[string]*master.DrainJob `json:"drains,omitempty"`
	// Pending are the puts granted and not yet ended, revoked or
	// discarded, by key: their writers may be writing into them.
	Pending map[string]*pendingPut `json:"pending,omitempty"`
	// Stale are the ranges of puts discarded or superseded while their
	// writers might still write: held until their release timeout.
	Stale []*pendingPut `json:"stale,omitempty"`
}

// pendingPut is a grant as the op log knows it.
type pendingPut struct {
	Key    string     `json:"k,omitempty"` // stale ones: for the record
	Size   uint64     `json:"z"`
	Reps   []rep      `json:"r"`
	Writer store.UUID `json:"w"`
	At     int64      `json:"at"`
	Seq    uint64     `json:"s"`
	// Until, on a stale entry, is when it ends (unix nanos) instead of
	// At plus the release timeout: the ranges a read lease held when
	// they left their object (a hold record).
	Until int64 `json:"u,omitempty"`
}

// endsAt is when a stale entry's ranges may be reused.
func (p *pendingPut) endsAt(release time.Duration) time.Time {
	if p.Until != 0 {
		return time.Unix(0, p.Until)
	}
	return time.Unix(0, p.At).Add(release)
}

// maxStale bounds the stale grants kept: past it the oldest go (their
// release timeout is long over in any but a pathological log).
const maxStale = 1 << 16

// staleOut moves key's pending grant, if any, to the stale ones.
func (s *state) staleOut(key string) {
	p := s.Pending[key]
	if p == nil {
		return
	}
	delete(s.Pending, key)
	s.Stale = append(s.Stale, p)
	if n := len(s.Stale) - maxStale; n > 0 {
		s.Stale = append(s.Stale[:0], s.Stale[n:]...)
	}
}

func newState() *state {
	return &state{Segments: make(map[string]store.SegmentInfo), Objects: make(map[string]*object)}
}

// apply applies one record. Records at or below Seq were applied
// already (a batch read twice) and are skipped.
func (s *state) apply(r record) {
	if r.Seq <= s.Seq {
		return
	}
	s.Seq = r.Seq
	switch r.Op {
	case "mount":
		if r.Segment != nil {
			s.Segments[r.Segment.Name] = *r.Segment
		}
	case "unmount":
		if r.Segment == nil {
			return
		}
		if cur, ok := s.Segments[r.Segment.Name]; ok && cur.ID == r.Segment.ID {
			delete(s.Segments, r.Segment.Name)
		}
		// Grants in the segment go with it: its node renews its memory
		// before it mounts again, so a late write there reaches nothing.
		for k, p := range s.Pending {
			if slices.ContainsFunc(p.Reps, func(x rep) bool { return x.Seg == r.Segment.Name }) {
				if o := s.Objects[k]; o != nil && o.Seq < p.Seq {
					// A resize that lost its new replicas: the master
					// keeps the old version as no writer's (Lost).
					o.Lost = true
				}
				delete(s.Pending, k)
			}
		}
		s.Stale = slices.DeleteFunc(s.Stale, func(p *pendingPut) bool {
			return slices.ContainsFunc(p.Reps, func(x rep) bool { return x.Seg == r.Segment.Name })
		})
		// The master drops the segment's replicas without a record each.
		for k, o := range s.Objects {
			kept := o.Reps[:0]
			for _, x := range o.Reps {
				if x.Seg != r.Segment.Name {
					kept = append(kept, x)
				}
			}
			if o.Reps = kept; len(kept) == 0 && o.DiskTier == "" {
				delete(s.Objects, k)
			}
		}
	case "put_start":
		if s.Pending == nil {
			s.Pending = make(map[string]*pendingPut)
		}
		// A grant of the key before this one was abandoned (the master
		// replaces a put only after its discard timeout): its writer may
		// still write until its release.
		s.staleOut(r.Key)
		p := &pendingPut{Key: r.Key, Size: r.Size, Reps: append([]rep(nil), r.Reps...), At: r.At, Seq: r.Seq}
		if r.W != nil {
			p.Writer = *r.W
		}
		s.Pending[r.Key] = p
	case "revoke":
		delete(s.Pending, r.Key)
	case "put_end":
		delete(s.Pending, r.Key)
		s.Objects[r.Key] = &object{Size: r.Size, Reps: append([]rep(nil), r.Reps...), SoftPin: r.SoftPin, HardPin: r.HardPin, Seq: r.Seq, Sum: r.X}
	case "discard":
		delete(s.Objects, r.Key)
		s.staleOut(r.Key)
	case "remove", "evict":
		delete(s.Objects, r.Key)
	case "hold":
		// Ranges a read lease held when they left their object: held
		// until it ends, as the stale grants are until their release.
		s.Stale = append(s.Stale, &pendingPut{Key: r.Key, Size: r.Size, Reps: append([]rep(nil), r.Reps...), Until: r.At, Seq: r.Seq})
		if n := len(s.Stale) - maxStale; n > 0 {
			s.Stale = append(s.Stale[:0], s.Stale[n:]...)
		}
	case "disk_only":
		// Its DRAM replicas are gone (freed, maybe reused): only the
		// disk replica is left.
		o := s.Objects[r.Key]
		if o == nil {
			o = &object{Size: r.Size}
			s.Objects[r.Key] = o
		}
		o.Reps, o.Seq, o.DiskTier, o.DiskVer = nil, r.Seq, r.Tier, r.Ver
	case "drain":
		if r.Drain == nil {
			return
		}
		if s.Drains == nil {
			s.Drains = make(map[string]*master.DrainJob)
		}
		s.Drains[r.Drain.ID.String()] = r.Drain
		s.pruneDrains()
	case "promote":
		o := s.Objects[r.Key]
		if o == nil {
			o = &object{Size: r.Size}
			s.Objects[r.Key] = o
		}
		o.Reps, o.Seq, o.DiskTier, o.DiskVer = append([]rep(nil), r.Reps...), r.Seq, r.Tier, r.Ver
	}
}

// restored turns the state into what master.Restore installs, with the
// master's default release timeout and the time now (restoredAt).
func (s *state) restored() (objs []master.RestoredObject, dropped int) {
	return s.restoredAt(time.Now(), master.DefaultPutReleaseTimeout)
}

// restoredAt turns the state into what master.Restore installs: complete
// objects, the puts still being written (Pending) and the ranges of
// abandoned ones still within their release timeout (reservations).
// Replicas on a segment the log never saw mounted cannot be located and
// are dropped. Where two ranges overlap on a segment, the older one's
// space was freed and reused before its end was committed: the newer
// wins.
func (s *state) restoredAt(now time.Time, release time.Duration) (objs []master.RestoredObject, dropped int) {
	// entry is anything that holds ranges: an object, a pending put or a
	// stale grant.
	type entry struct {
		key     string
		size    uint64
		reps    []rep
		seq     uint64
		obj     *object
		pending *pendingPut
		stale   bool
	}
	var entries []*entry
	for _, k := range slices.Sorted(maps.Keys(s.Objects)) {
		o := s.Objects[k]
		entries = append(entries, &entry{key: k, size: o.Size, reps: o.Reps, seq: o.Seq, obj: o})
	}
	for _, k := range slices.Sorted(maps.Keys(s.Pending)) {
		p := s.Pending[k]
		entries = append(entries, &entry{key: k, size: p.Size, reps: p.Reps, seq: p.Seq, pending: p})
	}
	for _, p := range s.Stale {
		if now.Before(p.endsAt(release)) {
			entries = append(entries, &entry{key: p.Key, size: p.Size, reps: p.Reps, seq: p.Seq, pending: p, stale: true})
		}
	}
	type span struct {
		e         *entry
		idx       int
		addr, end uint64
	}
	bySeg := make(map[string][]*span)
	for _, e := range entries {
		for i, x := range e.reps {
			if seg, ok := s.Segments[x.Seg]; !ok || !inside(seg, x.Addr, e.size) {
				continue
			}
			bySeg[x.Seg] = append(bySeg[x.Seg], &span{e: e, idx: i, addr: x.Addr, end: x.Addr + e.size})
		}
	}
	drop := make(map[*entry]map[int]bool)
	for _, spans := range bySeg {
		sort.Slice(spans, func(i, j int) bool { return spans[i].addr < spans[j].addr })
		var last *span
		for _, sp := range spans {
			if last != nil && sp.addr < last.end {
				loser := last
				if sp.e.seq < last.e.seq {
					loser = sp
				}
				if drop[loser.e] == nil {
					drop[loser.e] = make(map[int]bool)
				}
				drop[loser.e][loser.idx] = true
				if loser == last {
					last = sp
				}
				continue
			}
			last = sp
		}
	}
	located := func(e *entry) []master.RestoredReplica {
		var out []master.RestoredReplica
		for i, x := range e.reps {
			seg, ok := s.Segments[x.Seg]
			if !ok || drop[e][i] || !inside(seg, x.Addr, e.size) {
				continue
			}
			out = append(out, master.RestoredReplica{Segment: seg, Addr: x.Addr})
		}
		return out
	}
	// A key with a put pending newer than its complete object is being
	// rewritten (an upsert): in place, the object's bytes are torn and it
	// is restored as the pending put; resized, the object stays with the
	// resize under way on it (RestoredObject.Upsert), its writer's.
	rewritten := make(map[string]*entry)
	for _, e := range entries {
		if e.pending == nil || e.stale {
			continue
		}
		if o := s.Objects[e.key]; o != nil && o.Seq < e.seq {
			rewritten[e.key] = e
		}
	}
	// onObject: the resizes restored on their objects (which stay). A
	// resize of an object that does not (its replicas lost, its key
	// refused) is held as a reservation.
	onObject := make(map[*entry]bool)
	for _, e := range entries {
		up := rewritten[e.key]
		if e.obj == nil || up == nil || inPlace(e.obj, up.pending) || store.CheckStoredKey(e.key) != nil {
			continue
		}
		if e.obj.DiskTier != "" || len(located(e)) > 0 {
			onObject[up] = true
		}
	}
	for _, e := range entries {
		switch {
		case e.obj != nil:
			if store.CheckStoredKey(e.key) != nil {
				dropped++
				continue
			}
			up := rewritten[e.key]
			if up != nil && inPlace(e.obj, up.pending) {
				continue // the pending put stands for it
			}
			o := e.obj
			ro := master.RestoredObject{Key: e.key, Size: o.Size, HardPin: o.HardPin, DiskTier: o.DiskTier, DiskVersion: o.DiskVer, Sum: o.Sum}
			switch {
			case onObject[up]:
				ro.Upsert = &master.RestoredUpsert{Size: up.size, Replicas: located(up), Writer: up.pending.Writer, Started: time.Unix(0, up.pending.At)}
			case o.Lost:
				ro.Upsert = &master.RestoredUpsert{Size: o.Size}
			}
			if o.SoftPin != 0 {
				ro.SoftPin = time.Unix(0, o.SoftPin)
			}
			ro.Replicas = located(e)
			if len(ro.Replicas) == 0 && ro.DiskTier == "" {
				dropped++
				continue
			}
			objs = append(objs, ro)
		default:
			if onObject[e] {
				continue // restored on its object (Upsert)
			}
			reps := located(e)
			if len(reps) == 0 {
				continue
			}
			ro := master.RestoredObject{Key: e.key, Size: e.size, Replicas: reps, Pending: true, Writer: e.pending.Writer, Started: time.Unix(0, e.pending.At)}
			if e.stale || store.CheckStoredKey(e.key) != nil || rewritten[e.key] != nil && !inPlace(s.Objects[e.key], e.pending) {
				ro = master.RestoredObject{Key: e.key, Size: e.size, Replicas: reps, ReserveUntil: e.pending.endsAt(release)}
			}
			objs = append(objs, ro)
		}
	}
	return objs, dropped
}

// inPlace reports whether pending put p rewrites object o's own ranges.
func inPlace(o *object, p *pendingPut) bool {
	if o == nil || p == nil || o.Size != p.Size || len(o.Reps) != len(p.Reps) {
		return false
	}
	for i := range o.Reps {
		if o.Reps[i] != p.Reps[i] {
			return false
		}
	}
	return true
}

// inside reports whether [addr, addr+size) lies in seg as the master's
// allocator can hold it there: starting a whole number of granules from
// the segment's base and ending, rounded up to a granule, within its
// whole granules. The master's own records always do; a record that says
// otherwise is corrupt, and Restore would refuse the whole state (every
// candidate's takeover with it), so its replica is dropped instead.
func inside(seg store.SegmentInfo, addr, size uint64) bool {
	if seg.Base+seg.Size < seg.Base || size == 0 || addr < seg.Base || (addr-seg.Base)%alloc.Align != 0 {
		return false
	}
	limit := seg.Size &^ (alloc.Align - 1) // the allocator's whole granules
	rounded := (size + alloc.Align - 1) &^ (alloc.Align - 1)
	return rounded >= size && addr-seg.Base <= limit && rounded <= limit-(addr-seg.Base)
}

func (s *state) encode() ([]byte, error) { return json.Marshal(s) }

func decodeState(b []byte) (*state, error) {
	s := newState()
	if err := json.Unmarshal(b, s); err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	if s.Segments == nil {
		s.Segments = make(map[string]store.SegmentInfo)
	}
	if s.Objects == nil {
		s.Objects = make(map[string]*object)
	}
	return s, nil
}

// maxLoggedDrains bounds the drain jobs the state keeps: ended ones go,
// oldest first, beyond it.
const maxLoggedDrains = 64

func (s *state) pruneDrains() {
	if len(s.Drains) <= maxLoggedDrains {
		return
	}
	var ended []*master.DrainJob
	for _, j := range s.Drains {
		if j.Status.Done() {
			ended = append(ended, j)
		}
	}
	sort.Slice(ended, func(a, b int) bool { return ended[a].Updated.Before(ended[b].Updated) })
	for _, j := range ended {
		if len(s.Drains) <= maxLoggedDrains {
			break
		}
		delete(s.Drains, j.ID.String())
	}
}

// drainJobs lists the logged drain jobs, oldest first.
func (s *state) drainJobs() []master.DrainJob {
	out := make([]master.DrainJob, 0, len(s.Drains))
	for _, j := range s.Drains {
		out = append(out, *j)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Created.Before(out[b].Created) })
	return out
}
