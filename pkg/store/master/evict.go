package master

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/kvcache-ops/mc/pkg/store/policy"
)

// DefaultEvictionPolicy is Config.EvictionPolicy's default.
const DefaultEvictionPolicy = "lru"

const policyNone = "none"

// EvictionPolicies lists the values of Config.EvictionPolicy.
var EvictionPolicies = append(slices.Clone(policy.Names), policyNone)

// newShardPolicy makes one shard's eviction order.
func newShardPolicy(name string) (policy.Policy[*Object], error) {
	if strings.EqualFold(name, policyNone) {
		return noEviction{}, nil
	}
	p, err := policy.New[*Object](name)
	if err != nil {
		return nil, fmt.Errorf("eviction policy %q: want one of %s", name, strings.Join(EvictionPolicies, ", "))
	}
	return p, nil
}

// noEviction is the "none" policy: it keeps no order, so nothing is ever
// a victim and a put into a full store fails.
type noEviction struct{}

func (noEviction) Add(*policy.Entry[*Object], int)           {}
func (noEviction) Touch(*policy.Entry[*Object], int)         {}
func (noEviction) Remove(*policy.Entry[*Object])             {}
func (noEviction) Victim() *policy.Entry[*Object]            { return nil }
func (noEviction) Victims(func(*policy.Entry[*Object]) bool) {}
func (noEviction) Len() int                                  { return 0 }
func (noEviction) Name() string                              { return policyNone }

func (m *Master) evicting() bool { return m.shards[0].policy.Name() != policyNone }

// rank places an object in the master-wide eviction order of the active
// policy, lowest first. Inside a shard the policy's own order is the
// order of these ranks (lru: last use; fifo: put, since a read does not
// restamp; lfu: use count, then last use; length-aware: deepest, then last
// use), so merging the shards' victims by rank gives the order one policy
// over all objects would.
type rank struct{ hi, lo uint64 }

func (a rank) cmp(b rank) int {
	if c := cmp.Compare(a.hi, b.hi); c != 0 {
		return c
	}
	return cmp.Compare(a.lo, b.lo)
}

func rankOf(name string, o *Object) rank {
	switch name {
	case "lfu":
		return rank{uint64(o.ent.Hits()), o.lastUse}
	case "length-aware":
		return rank{uint64(policy.MaxDepth - o.ent.Depth()), o.lastUse}
	}
	return rank{0, o.lastUse}
}

// Eviction phases, as the per-phase metrics name them.
const (
	phaseWatermark    = "watermark"     // the background loop
	phaseOwnRegions   = "own_regions"   // phase 1: the writer's own regions
	phaseOtherRegions = "other_regions" // phase 3: whole regions of others
	phasePolicy       = "policy"        // older objects anywhere, for a put phases 1 and 3 left short
	phaseOffload      = "offload"       // an offload to a disk tier landed (or failed)
	phaseStage        = "stage"         // room for a read of a disk object, on its node
	phaseTenantQuota  = "tenant_quota"  // a tenant over its quota: its own objects, for its put
)

// Phases are the eviction phases, in the order of the master's
// eviction metrics (master_eviction_keys_total{phase=...}).
var Phases = []string{phaseWatermark, phaseOwnRegions, phaseOtherRegions, phasePolicy, phaseOffload, phaseStage, phaseTenantQuota}

// sweep is one eviction round's view: which objects it may take, and
// what it found in the way.
type sweep struct {
	now       int64
	allowSoft bool
	// fresh spares the objects completed after it (unix nanos; 0 spares
	// none): see freshCut.
	fresh int64
	// in narrows the round (phase 1: objects in the writer's regions).
	in      func(o *Object) bool
	blocked blockers
}

// blockers counts the objects a round could not evict, and why: the
// message of a put that finds nothing evictable.
type blockers struct {
	leased, hardPinned, softPinned, writing, fresh int
	// held: of leased, the objects held only for a previous HA leader's
	// reads (Object.held), which the messages name apart.
	held int
	// leaseEnd is when the first lease in the way ends (unix nanos).
	leaseEnd int64
}

func (b blockers) any() bool {
	return b.leased+b.hardPinned+b.softPinned+b.writing+b.fresh > 0
}

// merge adds c's counts to b, keeping the earlier lease end.
func (b *blockers) merge(c blockers) {
	if c.leased > 0 && (b.leaseEnd == 0 || c.leaseEnd < b.leaseEnd) {
		b.leaseEnd = c.leaseEnd
	}
	b.leased += c.leased
	b.held += c.held
	b.hardPinned += c.hardPinned
	b.softPinned += c.softPinned
	b.writing += c.writing
	b.fresh += c.fresh
}

// freshCut is the sweep.fresh of a round at now: an object put (its
// PutEnd) within the last KV lease TTL is evicted only after every older
// evictable one. A writer that reads what it writes does so within about
// that long, and the object it just put is the one it is about to read.
func (m *Master) freshCut(now int64) int64 { return now - m.cfg.KVLeaseTTL.Nanoseconds() }

func (b blockers) String() string {
	var parts []string
	add := func(n int, what string) {
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, what))
		}
	}
	add(b.hardPinned, "hard-pinned")
	add(b.leased, leasedText(b.held))
	add(b.softPinned, "soft-pinned (allow_evict_soft_pinned_objects is off)")
	add(b.writing, "being written")
	add(b.fresh, "put within the last lease TTL")
	return strings.Join(parts, ", ")
}

// leasedText names the leased objects in the way, held of them only
// for a previous HA leader's reads.
func leasedText(held int) string {
	if held == 0 {
		return "leased (being read)"
	}
	return fmt.Sprintf("leased (being read; %d of them restored by this HA leader less than a KV lease TTL ago, which reads of the previous leader may still be moving)", held)
}

// take reports whether the round may evict o, counting it as a blocker
// when not.
func (sw *sweep) take(o *Object) bool {
	switch {
	case o.hardPin:
		sw.blocked.hardPinned++
	case o.state != stateComplete || o.upsert != nil || o.busyOnTier():
		sw.blocked.writing++
	case o.busyUntil() > sw.now:
		if end := o.busyUntil(); sw.blocked.leased == 0 || end < sw.blocked.leaseEnd {
			sw.blocked.leaseEnd = end
		}
		sw.blocked.leased++
		if o.lease <= sw.now {
			sw.blocked.held++
		}
	case !sw.allowSoft && o.softPin > sw.now:
		sw.blocked.softPinned++
	case sw.fresh != 0 && o.putStart > sw.fresh:
		// Complete with no upsert (above): putStart is its PutEnd.
		sw.blocked.fresh++
	default:
		return true
	}
	return false
}

// EvictIfNeeded runs one round of watermark eviction (Mooncake's kind):
// when used space is above the high watermark, it frees about
// max(eviction_ratio, used - watermark + eviction_ratio) of capacity from
// evictable objects (complete, not leased, not pinned) in the active
// policy's order across the whole master; soft-pinned objects go in a
// second pass only when that was not enough and they may be evicted.
// Hard-pinned objects never go. It returns the bytes freed.
func (m *Master) EvictIfNeeded() uint64 {
	ratio, capacity := m.usage()
	if capacity == 0 || ratio < m.cfg.HighWatermark {
		return 0
	}
	target := uint64(max(m.cfg.EvictionRatio, ratio-m.cfg.HighWatermark+m.cfg.EvictionRatio) * float64(capacity))
	return m.Evict(target)
}

// usage is the share of the capacity in use, as the watermark sees it,
// and the capacity; capacity 0 when there is none or eviction is off.
func (m *Master) usage() (ratio float64, capacity uint64) {
	capacity = m.space.capacity.Load()
	if capacity == 0 || !m.evicting() {
		return 0, 0
	}
	// Replicas being offloaded are as good as free: counting them again
	// would offload more every round until the first writes land.
	used := m.space.used.Load()
	used -= min(used, uint64(max(m.tiers.inflight.Load(), 0)))
	return float64(used) / float64(capacity), capacity
}

// Evict frees at least target bytes of evictable objects when it can, and
// returns the bytes freed.
func (m *Master) Evict(target uint64) uint64 {
	freed, _, _ := m.evictRound(phaseWatermark, target, nil, freshFirst)
	return freed
}

// How a round treats objects put within the last lease TTL (freshCut).
type freshRule uint8

const (
	freshFirst  freshRule = iota // after every older evictable object
	freshSpared                  // not at all
)

// evictRound frees at least need bytes of the objects in (nil: all) in
// policy order: those put within the last lease TTL in a second pass
// (none with freshSpared), soft-pinned ones in a third when allowed. It
// returns the bytes freed now and those being offloaded to disk (free
// once the writes land).
func (m *Master) evictRound(phase string, need uint64, in func(*Object) bool, fr freshRule) (freed, later uint64, blocked blockers) {
	m.m.evictAttempts.Add(1)
	var keys, offloads uint64
	for pass := 0; pass < 3 && freed+later < need; pass++ {
		now := m.now()
		sw := &sweep{now: now, allowSoft: pass == 2, in: in}
		if pass == 0 || fr == freshSpared {
			sw.fresh = m.freshCut(now)
		}
		if pass == 1 && fr == freshSpared {
			continue
		}
		if sw.allowSoft && !*m.cfg.AllowEvictSoftPinned {
			break
		}
		for i, quota := range m.evictQuotas(need-freed-later, sw) {
			if quota > 0 {
				f, l, k, o := m.evictShard(&m.shards[i], quota, sw)
				freed += f
				later += l
				keys += k
				offloads += o
			}
		}
		if pass == 0 || !blocked.any() {
			blocked = sw.blocked
		}
	}
	// Offloaded objects are counted when their offload lands.
	m.countEvicted(phase, keys, freed)
	if keys+offloads > 0 && phase == phaseWatermark {
		if offloads > 0 {
			m.log.Info(fmt.Sprintf("evicted %d objects (%s) and started offloading %d (%s) to disk (target %s)", keys, fmtBytes(freed), offloads, fmtBytes(later), fmtBytes(need)))
		} else {
			m.log.Info(fmt.Sprintf("evicted %d objects, %s (target %s)", keys, fmtBytes(freed), fmtBytes(need)))
		}
	}
	return freed, later, blocked
}

func (m *Master) countEvicted(phase string, keys, bytes uint64) {
	m.m.phaseRounds.WithLabelValues(phase).Inc()
	if keys == 0 {
		return
	}
	m.m.evictSuccess.Add(1)
	m.m.evictedKeys.Add(keys)
	m.m.evictedBytes.Add(bytes)
	m.m.phaseKeys.WithLabelValues(phase).Add(float64(keys))
	m.m.phaseBytes.WithLabelValues(phase).Add(float64(bytes))
}

type evictCandidate struct {
	rank  rank
	size  uint64
	shard int
}

// evictQuotas decides how many bytes each shard gives so that together
// they free need bytes of the master's first objects in policy order. A
// shard lists its evictable objects in its policy's order, at most need
// bytes of them, ranked by the highest rank seen so far along that order
// (so the policy's order inside the shard is kept even where ranks tie or
// disagree); the lowest ranks of all shards are chosen. Each shard
// contributing an equal share instead evicts a shard's newest objects
// while another keeps older ones, which with few objects per shard is no
// LRU at all.
func (m *Master) evictQuotas(need uint64, sw *sweep) []uint64 {
	var cands []evictCandidate
	name := m.shards[0].policy.Name()
	for i := range m.shards {
		sh := &m.shards[i]
		var listed uint64
		var r rank
		sh.mu.Lock()
		sh.policy.Victims(func(e *policy.Entry[*Object]) bool {
			if listed >= need {
				return false
			}
			o := e.V
			if (sw.in == nil || sw.in(o)) && sw.take(o) {
				if ro := rankOf(name, o); ro.cmp(r) > 0 {
					r = ro
				}
				n := o.size * uint64(len(o.replicas))
				cands = append(cands, evictCandidate{r, n, i})
				listed += n
			}
			return true
		})
		sh.mu.Unlock()
	}
	slices.SortStableFunc(cands, func(a, b evictCandidate) int { return a.rank.cmp(b.rank) })
	quotas := make([]uint64, len(m.shards))
	var chosen uint64
	for _, c := range cands {
		if chosen >= need {
			break
		}
		quotas[c.shard] += c.size
		chosen += c.size
	}
	return quotas
}

// evictShard evicts quota bytes of sh's first victims and returns the
// bytes freed now and the objects they were, and the bytes and objects
// to be freed when their offload to disk lands.
func (m *Master) evictShard(sh *shard, quota uint64, sw *sweep) (freed, later, keys, offloads uint64) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	var victims []*Object
	var chosen uint64
	quiet := *sw // the blockers were counted by evictQuotas
	sh.policy.Victims(func(e *policy.Entry[*Object]) bool {
		if chosen >= quota {
			return false
		}
		o := e.V
		if (sw.in == nil || sw.in(o)) && quiet.take(o) {
			victims = append(victims, o)
			chosen += o.size * uint64(len(o.replicas))
		}
		return true
	})
	for _, o := range victims {
		f, l := m.evictVictimLocked(sh, o)
		freed += f
		later += l
		switch {
		case f > 0:
			keys++
		case l > 0:
			offloads++
		}
	}
	return freed, later, keys, offloads
}

// evictLocked removes o (its shard locked) and frees its space; the
// owners of its regions learn of it on their next ping.
func (m *Master) evictLocked(sh *shard, o *Object) {
	m.eventDropped(o)
	sh.remove(o.key, o)
	m.space.freeEvicted(o.key, o.replicas, o.size)
	m.dropDiskLocked(o)
	m.emit(Change{Op: OpEvict, Key: o.key})
}
