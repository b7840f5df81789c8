package server

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvcache-ops/mc/pkg/store"
)

// registerTierGauges adds a node's disk tier to its /metrics.
func registerTierGauges(reg *prometheus.Registry, segment string, t *store.TierNode) {
	labels := prometheus.Labels{"segment": segment}
	gauge := func(name, help string, f func(store.TierStats) float64) {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels}, func() float64 { return f(t.Stats()) }))
	}
	counter := func(name, help string, f func(store.TierStats) uint64) {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels}, func() float64 { return float64(f(t.Stats())) }))
	}
	gauge("mc_store_tier_capacity_bytes", "capacity of this node's disk tier", func(s store.TierStats) float64 { return float64(s.Capacity) })
	gauge("mc_store_tier_used_bytes", "bytes of this node's disk tier's data files", func(s store.TierStats) float64 { return float64(s.Used) })
	gauge("mc_store_tier_records", "records on this node's disk", func(s store.TierStats) float64 { return float64(s.Records) })
	gauge("mc_store_tier_files", "data files on this node's disk", func(s store.TierStats) float64 { return float64(s.Files) })
	gauge("mc_store_tier_attached", "1 while the tier's stream to the master is up", func(s store.TierStats) float64 {
		if s.Attached {
			return 1
		}
		return 0
	})
	counter("mc_store_tier_node_offloads_total", "objects this node wrote to disk for the master", func(s store.TierStats) uint64 { return s.Offloads })
	counter("mc_store_tier_node_loads_total", "records this node read back into its segment", func(s store.TierStats) uint64 { return s.Loads })
	counter("mc_store_tier_node_direct_reads_total", "records this node read into its staging pool for readers that asked it directly", func(s store.TierStats) uint64 { return s.DirectReads })
	gauge("mc_store_tier_node_staging_used_bytes", "bytes of this node's staging pool holding staged reads", func(s store.TierStats) float64 { return float64(s.StagingUsed) })
	counter("mc_store_tier_node_failures_total", "offloads and loads that failed (full, not found, I/O)", func(s store.TierStats) uint64 { return s.Failures })
	counter("mc_store_tier_write_bytes_total", "value bytes written to disk", func(s store.TierStats) uint64 { return s.WriteBytes })
	counter("mc_store_tier_read_bytes_total", "value bytes read from disk", func(s store.TierStats) uint64 { return s.ReadBytes })
	counter("mc_store_tier_evicted_records_total", "records the tier evicted (whole files, oldest first) to make room", func(s store.TierStats) uint64 { return s.EvictedRecords })
	counter("mc_store_tier_dropped_records_total", "records found torn or corrupt and dropped", func(s store.TierStats) uint64 { return s.Dropped })
}

func tierHealth(t *store.TierNode) map[string]any {
	s := t.Stats()
	return map[string]any{
		"dir": s.Dir, "id": s.ID, "attached": s.Attached, "o_direct": s.Direct,
		"capacity_bytes": s.Capacity, "used_bytes": s.Used, "records": s.Records, "files": s.Files,
	}
}
