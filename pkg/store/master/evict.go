package master

import (
	"fmt"
)

// EvictIfNeeded runs one round of watermark eviction (Mooncake's only
// kind): when used space is above the high watermark, it frees about
// max(eviction_ratio, used - watermark + eviction_ratio) of capacity from
// evictable objects (complete, not leased, not pinned), in each shard's
// policy order; soft-pinned objects go in a second pass only when that was
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
		// Spread the work over the shards so the order stays close to
		// a global one: each shard gives its share, then the rest.
		share := (target-freed)/uint64(len(m.shards)) + 1
		for round := 0; round < 2 && freed < target; round++ {
			for i := range m.shards {
				if freed >= target {
					break
				}
				quota := share
				if round == 1 {
					quota = target - freed
				}
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
