package master

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// registerTierMetrics adds the disk tier's metrics: Mooncake's names where
// Mooncake has the quantity, mc_store_tier_* otherwise.
func registerTierMetrics(m *Master, r *prometheus.Registry) {
	t := &m.tiers
	counter := func(name, help string, f func() uint64) {
		r.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(f()) }))
	}
	gauge := func(name, help string, f func() float64) {
		r.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f))
	}
	sum := func(f func(TierStatus) uint64) func() float64 {
		return func() float64 {
			var n uint64
			for _, s := range m.tierNodes() {
				if s.Online {
					n += f(s)
				}
			}
			return float64(n)
		}
	}
	gauge("master_total_file_capacity_bytes", "capacity of the disk tiers of connected nodes", sum(func(s TierStatus) uint64 { return s.Capacity }))
	gauge("master_allocated_file_size_bytes", "bytes of the data files of connected nodes' disk tiers", sum(func(s TierStatus) uint64 { return s.Used }))
	counter("master_evict_disk_replica_requests_total", "disk replicas dropped because their node's tier evicted them to make room", t.diskEvicted.Load)
	counter("mem_cache_hit_nums_", "GetReplicaList results served from the memory pool", func() uint64 { return m.memHitTotals().hits })
	counter("file_cache_hit_nums_", "GetReplicaList results served from a disk tier (staged into DRAM for the read)", t.diskHits.Load)
	counter("mem_cache_hit_bytes_total", "bytes of GetReplicaList results served from the memory pool", func() uint64 { return m.memHitTotals().bytes })
	counter("file_cache_hit_bytes_total", "bytes of GetReplicaList results served from a disk tier", t.diskHitBytes.Load)
	counter("mc_store_tier_offloads_total", "objects written to a node's disk tier on eviction", t.offloads.Load)
	counter("mc_store_tier_offload_bytes_total", "bytes written to disk tiers on eviction", t.offloadBytes.Load)
	for reason, f := range map[string]func() uint64{"full": t.offloadFull.Load, "error": t.offloadFailed.Load} {
		r.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "mc_store_tier_offload_failures_total", ConstLabels: prometheus.Labels{"reason": reason},
			Help: "offloads that failed, the object dropped from DRAM (full: the disk tier had no room and nothing it could evict; error: an I/O error or the node left)",
		}, func() float64 { return float64(f()) }))
	}
	counter("mc_store_tier_promotions_total", "disk objects promoted back into DRAM", t.promotions.Load)
	counter("mc_store_tier_load_failures_total", "disk reads that failed (the disk replica was dropped)", t.loadFailures.Load)
	counter("mc_store_tier_drop_fence_timeouts_total", "puts and removes whose node had not confirmed dropping the key's old disk record within the drop fence: without HA the node's tier is then fenced in the roster until it confirms", t.fenceTimeouts.Load)
	counter("mc_store_tier_drop_fence_unannounced_total", "puts and removes acknowledged after a drop fence timeout before any node reported holding the roster that fences the slow tier (without HA, a master restarted before a node hears it may serve the old record again)", t.fenceUnannounced.Load)
	counter("mc_store_tier_settle_timeouts_total", "restarts without HA after which a disk tier that returning nodes named did not attach within the settle bound (puts and removes were then acknowledged without it)", m.roster.timeouts.Load)
	counter("mc_store_tier_early_reads_held_total", "reads of disk records re-added from before a restart without HA that waited out the settle bound for nodes that may know them stale (a fence they carry)", m.early.held.Load)
	counter("mc_store_tier_early_reads_timeouts_total", "such reads whose caller's deadline came before the settle bound ended (answered RPC_TIMEOUT)", m.early.timeouts.Load)
	gauge("mc_store_tier_offload_inflight_bytes", "DRAM bytes being written to disk tiers", func() float64 { return float64(max(t.inflight.Load(), 0)) })
	// The staging pools are the nodes': their counts as last reported,
	// with the master's own for the reads it staged.
	counter("mc_store_tier_staged_released_total", "staged reads of disk objects their readers handed back after the transfer", func() uint64 { return m.TierTotals().StagedReleased })
	counter("mc_store_tier_staged_reclaimed_total", "staged reads of disk objects freed by the staging TTL with readers left (readers that died or were slower than the TTL)", func() uint64 { return m.TierTotals().StagedReclaimed })
	counter("mc_store_tier_staging_waits_total", "reads of disk objects that waited for room in their node's staging pool", func() uint64 { return m.TierTotals().StagingWaits })
	counter("mc_store_tier_direct_batches_total", "batches of staged reads readers asked nodes for directly (the master only told them where the records are)", func() uint64 { return m.TierTotals().DirectBatches })
	gauge("mc_store_tier_staging_used_bytes", "bytes of connected nodes' staging pools holding staged reads", sum(func(s TierStatus) uint64 { return s.StagingUsed }))
	gauge("mc_store_tier_staging_capacity_bytes", "capacity of connected nodes' staging pools", sum(func(s TierStatus) uint64 { return s.StagingSize }))
	gauge("mc_store_tier_nodes", "disk tiers known (connected or away)", func() float64 { return float64(len(m.tierNodes())) })
	var counts cachedCounts
	gauge("mem_cache_nums_", "objects with a replica in the memory pool", func() float64 { mem, _ := counts.get(m); return float64(mem) })
	gauge("file_cache_nums_", "objects with a replica on a disk tier", func() float64 { _, disk := counts.get(m); return float64(disk) })
}

// cachedCounts counts objects by tier with a walk over every object, at
// most once a second however often /metrics is scraped (both gauges of a
// scrape share one walk).
type cachedCounts struct {
	mu        sync.Mutex
	at        time.Time
	mem, disk int
}

func (c *cachedCounts) get(m *Master) (mem, disk int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.at) < time.Second {
		return c.mem, c.disk
	}
	c.mem, c.disk = 0, 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		for _, o := range sh.objects {
			if o.state != stateComplete {
				continue
			}
			if len(o.replicas) > 0 {
				c.mem++
			}
			if o.onDisk() {
				c.disk++
			}
		}
		sh.mu.Unlock()
	}
	c.at = time.Now()
	return c.mem, c.disk
}
