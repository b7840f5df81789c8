package master

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvcache-ops/mc/pkg/store"
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
// confirmed, at most DefaultTierSettle from the first naming. A tier
// still away then is left out of the roster and not waited for again;
// its records, if it comes back after this master died too, are the
// one case left (a tier away that long while the master restarts twice).
// With HA the op log knows every version: nothing is waited for.

// DefaultTierSettle is Config.TierSettle's default: long enough for a
// node's reconnect (its ping, re-mount and the tier stream's retry).
const DefaultTierSettle = 5 * time.Second

// roster is the master's list of the pool's disk tiers.
type roster struct {
	mu sync.Mutex
	// version changes with ids (a node asks with the one it has); it
	// starts from the master's start time, so a node's version from an
	// earlier master does not match by chance.
	version uint64
	ids     map[string]struct{}
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
}

func (r *roster) init(now int64) {
	r.version = uint64(now)
	r.ids = make(map[string]struct{})
	r.waiting = make(map[string]struct{})
	r.wake = make(chan struct{})
}

// wakeLocked wakes the callers waiting on the roster.
func (r *roster) wakeLocked() {
	close(r.wake)
	r.wake = make(chan struct{})
}

// Roster returns the pool's disk tiers as this master knows them and
// the roster's version, or nil and the same version when the caller's
// (seen) is current.
func (m *Master) Roster(seen uint64) (version uint64, ids []string) {
	r := &m.roster
	r.mu.Lock()
	defer r.mu.Unlock()
	if seen == r.version {
		return r.version, nil
	}
	ids = slices.Sorted(maps.Keys(r.ids))
	if ids == nil {
		ids = []string{}
	}
	return r.version, ids
}

// NameTiers takes the disk tiers a returning node says the pool had
// (its last roster): until each has attached, puts and removes wait
// (awaitTiers). A roster is a hint, not trusted to be sane: names past
// maxRoster, empty or longer than a tier id can be are ignored, never
// refused (a node that cannot re-mount serves nothing).
func (m *Master) NameTiers(ids []string) {
	if len(ids) == 0 {
		return
	}
	ids = ids[:min(len(ids), maxRoster)]
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
	if r.over.Load() || m.tiers.all.Load() {
		return
	}
	var named []string
	for _, id := range ids {
		if id == "" || len(id) > 256 || online[id] {
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
		bound := m.cfg.TierSettle
		if bound <= 0 {
			bound = DefaultTierSettle
		}
		r.end = m.now() + bound.Nanoseconds()
	}
	m.log.Info(fmt.Sprintf("disk tiers %s were in the pool before this master: puts and removes wait for them to attach (at most until %s)", strings.Join(named, ", "), time.Unix(0, r.end).Format("15:04:05.000")))
}

// maxRoster bounds the tiers named to a master (and so those it waits
// for): names from a node are not trusted to be few. Tiers that attach
// join the roster whatever their number.
const maxRoster = 4096

// tierJoined is called when tier id has attached and its stale records'
// DROPs are registered (so a put released now waits for them).
func (m *Master) tierJoined(id string) {
	r := &m.roster
	r.mu.Lock()
	defer r.mu.Unlock()
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

// tierLeft takes a tier given up on (away past the grace) out of the
// roster: a node gone for good is not waited for at the next restart.
func (m *Master) tierLeft(id string) {
	r := &m.roster
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.ids[id]; ok {
		delete(r.ids, id)
		r.version++
	}
}

// endSettle stops waiting for named tiers (restored from an op log, or
// the bound passed); those still away leave the roster.
func (m *Master) endSettle(why string) {
	r := &m.roster
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.over.Load() {
		return
	}
	r.over.Store(true)
	if len(r.waiting) > 0 {
		away := slices.Sorted(maps.Keys(r.waiting))
		for _, id := range away {
			delete(r.ids, id)
		}
		clear(r.waiting)
		r.nWaiting.Store(0)
		r.version++
		if why != "" {
			r.timeouts.Add(1)
			m.log.Warn(fmt.Sprintf("disk tiers %s named by returning nodes did not attach %s: acknowledging puts and removes without them; if this master also restarts before they attach, their records of keys put or removed meanwhile may be served again", strings.Join(away, ", "), why))
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
			m.endSettle("")
			return
		}
		if left <= 0 {
			m.endSettle(fmt.Sprintf("within %s", m.settleBound()))
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
