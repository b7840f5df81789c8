package master

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvcache-ops/mc/pkg/store"
	pb "github.com/kvcache-ops/mc/pkg/store/storepb"
)

// The pool's disk tiers after a restart without HA.
//
// A master restarted without HA knows nothing of what the pool held: it
// learns it from the nodes as they come back, a disk tier's records from
// its hello. A put or remove it acknowledged before a tier that holds a
// record of the key attached could not drop that record, and if this
// master died too, the next one re-added the record: a get after the
// acknowledged put returned the version before it (two restarts in a
// row, the tier node slower to come back than the others; found by the
// soak). So every master tells its nodes which disk tiers the pool has
// (the roster, in ping answers); a node names them when it re-mounts on
// a restarted master (a tier node also in its hello, from its
// directory), and that master holds the answers of puts and removes
// until every tier named has attached and its stale records' DROPs are
// confirmed, at most DefaultTierSettle from the first naming.
//
// A tier still away then is fenced: the master goes on acknowledging
// without it, so its records from before are stale wherever it comes
// back. The roster says so (fenced), nodes carry that to later masters,
// and whichever master the tier attaches to drops those records instead
// of re-adding them (its own versions excepted); the tier is then back in
// the roster. A tier given up on while the master runs (away past the
// restored-mount grace) is fenced the same way, for the master after a
// restart, which does not know which of its keys were put again. With HA
// the op log knows every version: nothing is waited for or fenced.

// DefaultTierSettle is Config.TierSettle's default: long enough for a
// node's reconnect (its ping, re-mount and the tier stream's retry).
const DefaultTierSettle = 5 * time.Second

// roster is the master's list of the pool's disk tiers.
type roster struct {
	mu sync.Mutex
	// version changes with ids and fenced (a node asks with the one it
	// has); it starts from the master's start time, so a node's version
	// from an earlier master does not match by chance.
	version uint64
	ids     map[string]struct{}
	// fenced: tier id -> the version clock when it was fenced: its
	// records of versions below are from before (fenceEntry).
	fenced map[string]uint64
	// waiting are tiers named by returning nodes that have not attached
	// (nWaiting, read without the lock); wake is closed when one does,
	// or when the wait ends (end, unix nanos; 0 before the first naming).
	waiting  map[string]struct{}
	nWaiting atomic.Int64
	end      int64
	wake     chan struct{}
	// over: names are no longer waited for (the settle bound passed, or
	// the master was restored from an op log).
	over     atomic.Bool
	timeouts atomic.Uint64
	// nFenced mirrors len(fenced) for attach's fast path.
	nFenced atomic.Int64
	// slow: tiers fenced because DROPs to them were not confirmed within
	// the drop fence (fenceSlow), lifted once those are.
	slow map[string]*slowFence
	// start is the roster's first version; seen the highest version of
	// this master's rosters a node said it holds, seenWake closed when
	// it rises.
	start, seen uint64
	seenWake    chan struct{}
}

// slowFence is a tier fenced for DROPs not confirmed in time: v the
// fence's version, prev the tier's fence before it (0: none), ops the
// DROPs still unconfirmed; failed: one ended unapplied (the node's
// stream ended), so the fence stays until the tier attaches again.
type slowFence struct {
	v, prev uint64
	ops     map[*tierOp]struct{}
	failed  bool
}

func (r *roster) init(now int64) {
	r.version = uint64(now)
	r.start = r.version
	r.slow = make(map[string]*slowFence)
	r.seenWake = make(chan struct{})
	r.ids = make(map[string]struct{})
	r.fenced = make(map[string]uint64)
	r.waiting = make(map[string]struct{})
	r.wake = make(chan struct{})
}

// wakeLocked wakes the callers waiting on the roster.
func (r *roster) wakeLocked() {
	close(r.wake)
	r.wake = make(chan struct{})
}

// fenceLocked marks id fenced at version v. Whether it is still waited
// for is the caller's to say: a tier fenced as it is given up on is not
// (all it holds is from before), one a node names fenced still is (the
// note may be older than the tier's return to another master, and it
// may hold newer records).
func (r *roster) fenceLocked(id string, v uint64) {
	r.fenced[id] = max(r.fenced[id], v)
	r.nFenced.Store(int64(len(r.fenced)))
	r.version++
}

// Roster returns the pool's disk tiers as this master knows them (in
// the pool, and fenced) and the roster's version, or nils and the same
// version when the caller's (seen) is current.
func (m *Master) Roster(seen uint64) (version uint64, ids, fenced []string) {
	r := &m.roster
	r.mu.Lock()
	defer r.mu.Unlock()
	if seen > r.seen && seen >= r.start && seen <= r.version {
		// A node holds this master's roster of that version: fences in
		// it reach the next master through the node (fenceSlow).
		r.seen = seen
		close(r.seenWake)
		r.seenWake = make(chan struct{})
	}
	if seen == r.version {
		return r.version, nil, nil
	}
	ids = slices.Sorted(maps.Keys(r.ids))
	if ids == nil {
		ids = []string{}
	}
	for _, id := range slices.Sorted(maps.Keys(r.fenced)) {
		fenced = append(fenced, fenceEntry(id, r.fenced[id]))
	}
	return r.version, ids, fenced
}

// fenceEntry is how a fence travels in rosters: "id@version".
func fenceEntry(id string, v uint64) string { return id + "@" + strconv.FormatUint(v, 10) }

// parseFence reads a fenceEntry (ok false: not one).
func parseFence(s string) (id string, v uint64, ok bool) {
	id, vs, ok := strings.Cut(s, "@")
	if !ok || id == "" {
		return "", 0, false
	}
	v, err := strconv.ParseUint(vs, 10, 64)
	return id, v, err == nil && v > 0
}

// fenceVersion is a fence's version now: above every version handed
// out or seen so far, so every record a tier holds from before is
// below it, and every record written after (by any later master, whose
// versions start above the time) is not.
func (m *Master) fenceVersion() uint64 {
	return max(m.tiers.lastVersion.Load()+1, uint64(m.now()))
}

// sane drops the names no tier id can be, and bounds their number: a
// roster is a node's hint, not trusted to be sane, and ignored rather
// than refused (a node that cannot re-mount serves nothing).
func sane(ids []string) []string {
	ids = ids[:min(len(ids), maxRoster)]
	return slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return id == "" || len(id) > 256 })
}

// NameTiers takes the disk tiers a returning node says the pool had
// (its last roster): until each has attached, puts and removes wait
// (awaitTiers); and those it says are fenced: their records from before
// are dropped, now if this master re-added some, else when they attach.
func (m *Master) NameTiers(ids, fenced []string) {
	m.openEarly()
	ids, fenced = sane(ids), sane(fenced)
	if len(ids)+len(fenced) == 0 || m.tiers.all.Load() {
		return
	}
	for _, f := range fenced {
		if id, v, ok := parseFence(f); ok {
			m.fenceTier(id, v)
		}
	}
	r := &m.roster
	m.tiers.mu.Lock()
	online := make(map[string]bool, len(ids))
	for _, id := range ids {
		if n := m.tiers.byID[id]; n != nil {
			n.mu.Lock()
			online[id] = n.online
			n.mu.Unlock()
		}
	}
	m.tiers.mu.Unlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.over.Load() {
		return
	}
	var named []string
	for _, id := range ids {
		if online[id] {
			continue
		}
		if _, ok := r.ids[id]; ok {
			continue
		}
		if len(r.ids) >= maxRoster {
			break
		}
		r.ids[id] = struct{}{}
		r.waiting[id] = struct{}{}
		named = append(named, id)
	}
	if len(named) == 0 {
		return
	}
	r.version++
	r.nWaiting.Store(int64(len(r.waiting)))
	if r.end == 0 {
		r.end = m.now() + m.settleBound().Nanoseconds()
	}
	m.log.Info(fmt.Sprintf("disk tiers %s were in the pool before this master: puts and removes wait for them to attach (at most until %s)", strings.Join(named, ", "), time.Unix(0, r.end).Format("15:04:05.000")))
}

// fenceTier marks tier id fenced at version v, as a returning node
// said: the records below v that this master re-added from the tier (not
// its own versions) are dropped now (a node that knew of the fence
// re-mounted after the tier attached), and the tier's DROPs of them
// sent; the rest go when the tier attaches again. A fence heard again
// after the tier attached drops nothing more: what it kept is newer.
func (m *Master) fenceTier(id string, v uint64) {
	r := &m.roster
	r.mu.Lock()
	if r.fenced[id] >= v {
		r.mu.Unlock()
		return
	}
	r.fenceLocked(id, v)
	r.mu.Unlock()
	m.tiers.mu.Lock()
	n := m.tiers.byID[id]
	m.tiers.mu.Unlock()
	if n == nil {
		m.log.Info(fmt.Sprintf("disk tier %s is fenced (an earlier master acknowledged puts and removes without it): its records from before are dropped when it attaches", id))
		return
	}
	var drops []*pb.TierCommand
	lost := m.forgetTier(n, func(o *Object) bool {
		if m.tiers.ours(o.tier.version) || o.tier.version >= v {
			return false
		}
		drops = append(drops, &pb.TierCommand{Kind: pb.TierCommand_DROP, Key: o.key, Version: o.tier.version})
		return true
	})
	for _, d := range drops {
		n.enqueue(d, nil)
	}
	m.early.wakeAll()
	m.log.Warn(fmt.Sprintf("disk tier %s is fenced (an earlier master acknowledged puts and removes without it): dropped the %d disk replicas re-added from it, which may be older than what was acknowledged", n.name(), lost))
}

// maxRoster bounds the tiers named to a master (and so those it waits
// for): names from a node are not trusted to be few. Tiers that attach
// join the roster whatever their number.
const maxRoster = 4096

// tierFence returns the version below which tier id's records (not
// this master's own) are dropped when it attaches (0: not fenced).
func (m *Master) tierFence(id string) uint64 {
	r := &m.roster
	if r.nFenced.Load() == 0 {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.fenced[id]
}

// tierJoined is called when tier id has attached and its stale records'
// DROPs are registered (so a put released now waits for them).
func (m *Master) tierJoined(id string) {
	r := &m.roster
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.slow, id)
	if _, ok := r.fenced[id]; ok {
		delete(r.fenced, id)
		r.nFenced.Store(int64(len(r.fenced)))
		r.version++
	}
	if _, ok := r.ids[id]; !ok {
		r.ids[id] = struct{}{}
		r.version++
	}
	if _, ok := r.waiting[id]; ok {
		delete(r.waiting, id)
		r.nWaiting.Store(int64(len(r.waiting)))
		r.wakeLocked()
	}
}

// tierLeft fences a tier given up on (away past the grace): this master
// knows which of its keys were put again since and judges its records
// when it returns, but a master after a restart would not.
func (m *Master) tierLeft(id string) {
	if m.tiers.all.Load() {
		return
	}
	v := m.fenceVersion()
	r := &m.roster
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.ids, id)
	r.fenceLocked(id, v)
}

// endSettle stops waiting for named tiers: restored from an op log
// (timeout false: nothing to fence), or the bound passed (those still
// away are fenced).
func (m *Master) endSettle(timeout bool) {
	r := &m.roster
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.over.Load() {
		return
	}
	r.over.Store(true)
	if len(r.waiting) > 0 {
		away := slices.Sorted(maps.Keys(r.waiting))
		v := m.fenceVersion()
		for _, id := range away {
			delete(r.ids, id)
			if timeout {
				r.fenceLocked(id, v)
			}
		}
		clear(r.waiting)
		r.nWaiting.Store(0)
		r.version++
		if timeout {
			r.timeouts.Add(1)
			m.log.Warn(fmt.Sprintf("disk tiers %s named by returning nodes did not attach within %s: acknowledging puts and removes without them; they are fenced: their records from before are dropped when they come back", strings.Join(away, ", "), m.settleBound()))
		}
	}
	r.wakeLocked()
}

// awaitTiers holds a put's or remove's answer while tiers the pool had
// before this master are still to attach (see above). A master closed
// meanwhile fails the calls still unanswered (out, when given).
func (m *Master) awaitTiers(keys []string, out []error) {
	r := &m.roster
	if r.nWaiting.Load() == 0 || r.over.Load() {
		return
	}
	for {
		r.mu.Lock()
		if len(r.waiting) == 0 || r.over.Load() {
			r.mu.Unlock()
			return
		}
		wake, left := r.wake, r.end-m.now()
		r.mu.Unlock()
		if m.tiers.all.Load() {
			m.endSettle(false)
			return
		}
		if left <= 0 {
			m.endSettle(true)
			return
		}
		timer := time.NewTimer(time.Duration(left))
		select {
		case <-wake:
		case <-timer.C:
		case <-m.done:
			timer.Stop()
			for i := range out {
				if out[i] == nil {
					out[i] = store.Errorf(store.InternalError, "key %q: the master stopped while waiting for the pool's disk tiers to come back; the call may not have taken effect", keys[i])
				}
			}
			return
		}
		timer.Stop()
	}
}

func (m *Master) settleBound() time.Duration {
	if m.cfg.TierSettle > 0 {
		return m.cfg.TierSettle
	}
	return DefaultTierSettle
}

// fenceSlow is called when the drop fence passed with some of ops (the
// DROPs a put or remove waits for; late the first one not confirmed)
// still unconfirmed. Without HA, each such DROP's tier is fenced in the
// roster as of now, as a tier given up on is: a master restarted before
// the node applies the DROP, which knows nothing of the put or remove,
// then drops the tier's records from before instead of re-adding the old
// record (before, the call was acknowledged with the record left to come
// back). The fence is lifted once the tier confirms those DROPs; it costs
// the tier's older records only if the master restarts meanwhile. The
// call then waits, at most bound more, until a node says it holds the
// roster with the fence (its next ping), so that the next master hears
// of it. It returns false when the master stopped meanwhile: the call
// must not be acknowledged.
func (m *Master) fenceSlow(ops []*tierOp, bound time.Duration, late *tierOp) bool {
	if m.tiers.all.Load() {
		m.log.Warn(fmt.Sprintf("disk tier: the DROP of %q (version %d) is not confirmed after %s: acknowledging (the op log keeps the call for the next leader)", late.key, late.version, bound))
		return true
	}
	r := &m.roster
	r.mu.Lock()
	var fenced []string
	for _, op := range ops {
		select {
		case <-op.done:
			if op.err == nil || op.cleared.Load() {
				continue // confirmed, or judged when its tier came back
			}
			// Ended unapplied: fenced like one unconfirmed, until the
			// tier attaches again (tierJoined).
		default:
		}
		if op.tier == "" {
			continue
		}
		sf := r.slow[op.tier]
		if sf == nil {
			sf = &slowFence{prev: r.fenced[op.tier], ops: make(map[*tierOp]struct{})}
			r.slow[op.tier] = sf
		}
		if _, ok := sf.ops[op]; ok {
			continue // fenced for it already (another call waits on it too)
		}
		// Fenced (again) as of now even when it is already: this DROP's
		// record may be newer than the earlier fence.
		if !slices.Contains(fenced, op.tier) {
			fenced = append(fenced, op.tier)
		}
		sf.ops[op] = struct{}{}
	}
	if len(fenced) > 0 {
		v := m.fenceVersion()
		for _, id := range fenced {
			r.slow[id].v = v
			r.fenceLocked(id, v)
		}
	}
	want, wake := r.version, r.seenWake
	announced := r.seen >= want
	r.mu.Unlock()
	if len(fenced) > 0 {
		why := fmt.Sprintf("is not confirmed after %s", bound)
		if late.ended() && late.err != nil {
			why = fmt.Sprintf("ended unapplied (%v)", late.err)
		}
		m.log.Warn(fmt.Sprintf("disk tier: the DROP of %q (version %d) %s: tier %s fenced until it confirms (a master restarted meanwhile drops its records from before)", late.key, late.version, why, strings.Join(fenced, ", ")))
	}
	if announced {
		return true
	}
	timer := time.NewTimer(bound)
	defer timer.Stop()
	for {
		select {
		case <-wake:
		case <-timer.C:
			m.tiers.fenceUnannounced.Add(1)
			m.log.Warn(fmt.Sprintf("disk tier: no node reported the roster fencing the tiers of unconfirmed DROPs within %s: acknowledging anyway; without HA, a master restarted before a node hears it may serve %q version %d again", bound, late.key, late.version))
			return true
		case <-m.done:
			return false
		}
		r.mu.Lock()
		announced, wake = r.seen >= want, r.seenWake
		r.mu.Unlock()
		if announced {
			return true
		}
	}
}

// slowDropDone lifts a slow fence (fenceSlow) once its tier has
// confirmed every DROP it was fenced for; one that ended unapplied keeps
// it until the tier attaches again (tierJoined), when this master judges
// its records itself.
func (m *Master) slowDropDone(op *tierOp, err error) {
	if op.tier == "" {
		return
	}
	r := &m.roster
	r.mu.Lock()
	defer r.mu.Unlock()
	sf := r.slow[op.tier]
	if sf == nil {
		return
	}
	if _, ok := sf.ops[op]; !ok {
		return
	}
	delete(sf.ops, op)
	if err != nil {
		sf.failed = true
	}
	if len(sf.ops) > 0 {
		return
	}
	delete(r.slow, op.tier)
	if sf.failed || r.fenced[op.tier] != sf.v {
		return // fenced since for another reason, or still to be judged
	}
	if sf.prev == 0 {
		delete(r.fenced, op.tier)
	} else {
		r.fenced[op.tier] = sf.prev
	}
	r.nFenced.Store(int64(len(r.fenced)))
	r.version++
	m.log.Info(fmt.Sprintf("disk tier %s confirmed the DROPs it was fenced for: fence lifted", op.tier))
}

// earlyHold holds the reads of disk records re-added from before this
// master (restarted without HA) during its first moments (maxEarlyHold,
// at most the settle bound), counted from the first node back. A tier
// fenced by an earlier master (its DROPs unconfirmed, or it was away)
// may attach before any node that knows of the fence has re-mounted:
// typically the fenced tier's node is the one that was stalled and never
// heard it. Its records are then re-added as if current, and served
// stale until a node naming the fence re-mounts (fenceTier drops them).
// Nodes come back together after a restart (each at its next ping), so
// reads of those records wait until the bound (or a fence drops them)
// instead of being answered at once.
type earlyHold struct {
	// end: unix nanos the window closes (0: not open yet).
	end  atomic.Int64
	mu   sync.Mutex
	wake chan struct{}
	// held counts reads that waited, timeouts those whose caller's
	// deadline came first.
	held, timeouts atomic.Uint64
}

// open starts the window at now, once.
func (h *earlyHold) open(now int64, bound time.Duration) {
	h.end.CompareAndSwap(0, now+bound.Nanoseconds())
}

// in reports whether a record re-added at now is held.
func (h *earlyHold) in(now int64) bool {
	e := h.end.Load()
	return e > 0 && now < e
}

// changed returns the channel closed at the next fence (wakeAll).
func (h *earlyHold) changed() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.wake == nil {
		h.wake = make(chan struct{})
	}
	return h.wake
}

// wakeAll wakes the held reads: a fence heard may have dropped theirs.
func (h *earlyHold) wakeAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.wake != nil {
		close(h.wake)
		h.wake = nil
	}
}

// errEarly marks a lookup result held by earlyHold (lookupOne); never
// returned to a caller.
var errEarly = errors.New("held: a disk record from before this master")

// maxEarlyHold bounds the early hold: two of a node's default ping
// intervals (a node re-mounts at its first ping that finds the master
// restarted), and below a client's RPC timeout, so that a held read is
// answered late rather than timed out.
const maxEarlyHold = 2 * time.Second

// openEarly opens the early hold when a node comes back (re-mount, tier
// attach) to a master restarted without HA.
func (m *Master) openEarly() {
	if !m.tiers.all.Load() {
		m.early.open(m.now(), min(m.settleBound(), maxEarlyHold))
	}
}

// awaitEarly answers the reads lookupOne held (errEarly in out): it waits
// until the window closes, a fence is heard, the caller's deadline or the
// master stops, and looks them up again.
func (m *Master) awaitEarly(keys []string, lease, direct bool, deadline time.Time, start int64, out []ReplicaResult) {
	var idx []int
	for i := range out {
		if out[i].Err == errEarly {
			idx = append(idx, i)
		}
	}
	if len(idx) == 0 {
		return
	}
	m.early.held.Add(uint64(len(idx)))
	for {
		// The fence channel first, then the lookup: a fence heard in
		// between wakes the wait below instead of being missed (the
		// first pass repeats the caller's lookup for that reason).
		changed := m.early.changed()
		sub := make([]string, len(idx))
		for j, i := range idx {
			sub[j] = keys[i]
		}
		now := m.now()
		res, _ := m.lookupRaw(sub, lease, direct, deadline, now, nil, nil)
		left := idx[:0]
		for j, i := range idx {
			out[i] = res[j]
			if out[i].LeaseTTL > 0 {
				// As awaitDisk's: the lease told counts from the call.
				out[i].LeaseTTL += time.Duration(now - start)
			}
			if res[j].Err == errEarly {
				left = append(left, i)
			}
		}
		if idx = left; len(idx) == 0 {
			return
		}
		wait := time.Duration(m.early.end.Load() - now)
		timedOut := false
		if !deadline.IsZero() {
			if until := time.Until(deadline); until < wait {
				wait, timedOut = until, true
			}
		}
		if wait > 0 {
			timer := time.NewTimer(wait)
			select {
			case <-timer.C:
			case <-changed:
				timedOut = false
			case <-m.done:
				timer.Stop()
				for _, i := range idx {
					out[i].Err = store.Errorf(store.InternalError, "key %q: the master stopped", keys[i])
				}
				return
			}
			timer.Stop()
		}
		if timedOut && !deadline.After(time.Now()) {
			m.early.timeouts.Add(uint64(len(idx)))
			for _, i := range idx {
				out[i].Err = store.Errorf(store.RPCTimeout, "key %q: its disk record is from before this master's restart, and its reads wait until %s for the nodes that may know it is stale", keys[i], time.Unix(0, m.early.end.Load()).Format("15:04:05.000"))
			}
			return
		}
	}
}
