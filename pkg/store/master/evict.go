package master

import (
	"cmp"
	"fmt"
	"slices"
)

// EvictIfNeeded runs one round of watermark eviction (Mooncake's only
// kind): when used space is above the high watermark, it frees about
// max(eviction_ratio, used - watermark + eviction_ratio) of capacity from
// evictable objects (complete, not leased, not pinned), least recently
// used first across the shards (each shard's policy orders its own);
// soft-pinned objects go in a second pass only when that was
// not enough and they may be evicted. Hard-pinned objects never go. It
// returns the bytes freed.
func (m *Master) EvictIfNeeded() uint64 {
	capacity := m.space.capacity.Load()
	used := m.space.used.Load()
	if capacity == 0 {
		return 0
	}
	ratio := float64(used) / float64(capacity)
	if ratio < m.cfg.HighWatermark {
		return 0
	}
	target := uint64(max(m.cfg.EvictionRatio, ratio-m.cfg.HighWatermark+m.cfg.EvictionRatio) * float64(capacity))
	return m.Evict(target)
}

// Evict frees at least target bytes of evictable objects when it can, and
// returns the bytes freed.
func (m *Master) Evict(target uint64) uint64 {
	m.m.evictAttempts.Inc()
	now := m.now()
	var freed, keys uint64
	for pass := 0; pass < 2 && freed < target; pass++ {
		allowSoft := pass == 1
		if allowSoft && !*m.cfg.AllowEvictSoftPinned {
			break
		}
		for i, quota := range m.evictQuotas(target-freed, now, allowSoft) {
			if quota > 0 {
				f, k := m.evictShard(&m.shards[i], quota, now, allowSoft)
				freed += f
				keys += k
			}
		}
	}
	if keys > 0 {
		m.m.evictSuccess.Inc()
		m.m.evictedKeys.Add(keys)
		m.m.evictedBytes.Add(freed)
		m.log.Info(fmt.Sprintf("evicted %d objects, %s (target %s)", keys, fmtBytes(freed), fmtBytes(target)))
	}
	return freed
}

type evictCandidate struct {
	rank, size uint64
	shard      int
}

// evictQuotas decides how many bytes each shard gives so that together
// they free need bytes of the least recently used objects of the whole
// master. A shard lists its evictable objects in its policy's order, at
// most need bytes of them, ranked by the latest use seen so far along that
// order (so the policy's order inside the shard is kept); the lowest ranks
// of all shards are chosen. Each shard contributing an equal share instead
// evicts a shard's newest objects while another keeps older ones, which
// with few objects per shard is no LRU at all.
func (m *Master) evictQuotas(need uint64, now int64, allowSoft bool) []uint64 {
	var cands []evictCandidate
	for i := range m.shards {
		sh := &m.shards[i]
		var listed, rank uint64
		sh.mu.Lock()
		sh.policy.Victims(func(o *Object) bool {
			if listed >= need {
				return false
			}
			if o.evictable(now, allowSoft) {
				rank = max(rank, o.lastUse)
				n := o.size * uint64(len(o.replicas))
				cands = append(cands, evictCandidate{rank, n, i})
				listed += n
			}
			return true
		})
		sh.mu.Unlock()
	}
	slices.SortStableFunc(cands, func(a, b evictCandidate) int { return cmp.Compare(a.rank, b.rank) })
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

func (m *Master) evictShard(sh *shard, quota uint64, now int64, allowSoft bool) (freed, keys uint64) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	var victims []*Object
	sh.policy.Victims(func(o *Object) bool {
		if freed >= quota {
			return false
		}
		if o.evictable(now, allowSoft) {
			victims = append(victims, o)
			freed += o.size * uint64(len(o.replicas))
		}
		return true
	})
	for _, o := range victims {
		sh.remove(o.key, o)
		m.space.free(o.replicas, o.size)
		m.emit(Change{Op: OpEvict, Key: o.key})
	}
	return freed, uint64(len(victims))
}
