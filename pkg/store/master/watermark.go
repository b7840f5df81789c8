package master

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/kvcache-ops/mc/pkg/store"
)

// watermarkVictim refuses a put the next watermark round would evict as
// soon as it is acknowledged (issue 35, item 2): one that takes the store
// over the high watermark while the other objects that round may take
// ahead of it (complete, not leased, not pinned) cannot free what the
// round frees. The new object is the policy's last choice among them
// (the most recent), so it survives only if they cover the round's
// target; soft-pinned objects go in a later pass, after it. A pinned put
// is never such a victim, and with a disk tier eviction offloads instead
// of dropping. Cheap when under the watermark; over it, the walk stops as
// soon as enough evictable bytes are found.
func (m *Master) watermarkVictim(it PutItem, cfg store.ReplicateConfig) error {
	if cfg.HardPin || cfg.SoftPin || !m.evicting() || (m.space.tiered != nil && m.space.tiered()) {
		return nil
	}
	capacity := m.space.capacity.Load()
	if capacity == 0 || it.Size == 0 {
		return nil
	}
	kept := m.space.keptByWatermark(it.Size, max(cfg.ReplicaNum, 1))
	if kept == 0 {
		return nil // above the watermark on its own: place refuses it
	}
	add := it.Size * uint64(kept)
	used := m.space.used.Load() - min(m.space.used.Load(), uint64(max(m.tiers.inflight.Load(), 0)))
	ratio := float64(used+add) / float64(capacity)
	if ratio < m.cfg.HighWatermark {
		return nil
	}
	// Over capacity, the put fits only once allocation-failure eviction
	// (phases.go) has freed at least the excess, from the same objects
	// the round would take ahead of it: whatever it frees, what is left
	// must still cover the round's target at the lower usage, which
	// comes to the same sum as used+add-(watermark-ratio)*capacity, the
	// target below with ratio over 1.
	target := uint64(max(m.cfg.EvictionRatio, ratio-m.cfg.HighWatermark+m.cfg.EvictionRatio) * float64(capacity))
	var excess uint64
	if used+add > capacity {
		excess = used + add - capacity
	}
	sw := &sweep{now: m.now()}
	// Soft-pinned objects go after the new one in a watermark round, but
	// allocation-failure eviction may take them to make room.
	swSoft := &sweep{now: sw.now, allowSoft: *m.cfg.AllowEvictSoftPinned}
	var evictable, softEvictable uint64
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		for _, o := range sh.objects {
			// An object being written is complete before the next
			// round, and older than this put: it goes first.
			writing := o.state != stateComplete && !o.hardPin && o.softPin <= sw.now
			bytes := o.size * uint64(max(len(o.replicas), 1))
			if writing || sw.take(o) {
				evictable += bytes
				if evictable >= target {
					sh.mu.Unlock()
					return nil
				}
			} else if excess > 0 && swSoft.take(o) {
				softEvictable += bytes
			}
		}
		sh.mu.Unlock()
	}
	if evictable+softEvictable < excess {
		// No eviction makes room for it: allocation-failure eviction
		// refuses it, evicting nothing, and says what is in the way.
		return nil
	}
	var why []string
	add2 := func(n int, what string) {
		if n > 0 {
			why = append(why, fmt.Sprintf("%d %s", n, what))
		}
	}
	add2(sw.blocked.hardPinned, "hard-pinned")
	add2(sw.blocked.softPinned, "soft-pinned")
	add2(sw.blocked.leased, leasedText(sw.blocked.held))
	add2(sw.blocked.writing, "being rewritten")
	rest := "nothing else is stored"
	if len(why) > 0 {
		rest = strings.Join(why, ", ")
	}
	others := fmt.Sprintf("other objects can free only %d of the %d bytes a watermark round frees (the rest cannot go first: %s)", evictable, target, rest)
	if evictable == 0 {
		others = "nothing evictable is left ahead of it: " + rest
	}
	r := &watermarkRefusal{}
	if excess > 0 {
		r.err = store.Errorf(store.NoAvailableHandle,
			"key %q: %d bytes fit only after evicting %d bytes, and would then hold the store over the eviction high watermark (%.2f) while %s: the store would evict this object at once; evicted nothing (remove or unpin objects, or retry once reads end)",
			it.Key, it.Size, excess, m.cfg.HighWatermark, others)
	} else {
		r.err = store.Errorf(store.NoAvailableHandle,
			"key %q: %d bytes would take the store to %d of %d bytes, over the eviction high watermark (%.2f), and %s: the store would evict this object at once; evicted nothing (remove or unpin objects, or retry once reads end)",
			it.Key, it.Size, used+add, capacity, m.cfg.HighWatermark, others)
	}
	if sw.blocked.leased > 0 {
		r.leaseEnd = sw.blocked.leaseEnd
	}
	return r
}

// watermarkWait is watermarkVictim for a put that may wait until
// deadline (unix nanos; mc's gRPC writers, BatchPutStartWait): while the
// put would be the watermark round's victim and a read lease in the way
// ends before deadline, it waits for that lease and looks again, as
// makeRoom does for a put that finds no room (issue 34 item 7: a writer
// that reads what it writes had every put refused here at once while
// the leases of what it had read ran out seconds later).
func (m *Master) watermarkWait(ctx context.Context, it PutItem, cfg store.ReplicateConfig, deadline int64) error {
	for {
		err := m.watermarkVictim(it, cfg)
		var r *watermarkRefusal
		if err == nil || !errors.As(err, &r) || r.leaseEnd == 0 || r.leaseEnd > deadline {
			return err
		}
		// +1ms: a lease ending at t is over after t.
		t := time.NewTimer(max(time.Duration(r.leaseEnd-m.now())+time.Millisecond, time.Millisecond))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return err
		}
		m.m.leaseWaits.Inc()
	}
}

// watermarkRefusal marks watermarkVictim's refusal: no eviction on the
// put's behalf changes it (it is about what a round would take after),
// so evictForPuts leaves it alone.
type watermarkRefusal struct {
	err      error
	leaseEnd int64 // when the first lease in the way ends (0: none)
}

func (w *watermarkRefusal) Error() string { return w.err.Error() }
func (w *watermarkRefusal) Unwrap() error { return w.err }
