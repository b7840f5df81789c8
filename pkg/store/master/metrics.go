package master

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/kvcache-ops/mc/pkg/connlimit"
)

// Metrics are the master's Prometheus metrics under Mooncake's names, in a
// registry of their own (several masters can live in one process).
type Metrics struct {
	Registry *prometheus.Registry

	putStart, putStartFail              prometheus.Counter
	getReplicaList, getReplicaListFail  prometheus.Counter
	existKey, existKeyFail              prometheus.Counter
	remove, removeFail                  prometheus.Counter
	allocFailures                       prometheus.Counter
	putDiscards, putReleases            prometheus.Counter
	checksumMismatches                  prometheus.Counter
	droppedReplicas, unreachableReports prometheus.Counter
	leaseWaits                          prometheus.Counter
	evictAttempts, evictSuccess         atomic.Uint64
	evictedKeys, evictedBytes           atomic.Uint64
	// Mooncake's reads of GetReplicaList: every key asked (total_get_nums_)
	// and those answered with a replica (valid_get_nums_).
	totalGets, validGets prometheus.Counter
	valueSize            prometheus.Histogram
	items                map[string]prometheus.Counter
	// per eviction phase (watermark, own_regions, other_regions)
	phaseRounds, phaseKeys, phaseBytes *prometheus.CounterVec
	ops                                map[string][2]prometheus.Counter
}

// rpcOps are the operations counted as master_<op>_requests_total and
// master_<op>_failures_total. Single-item operations count items; batch_*
// count calls.
var rpcOps = []string{
	"put_end", "put_revoke", "upsert_start", "upsert_end", "upsert_revoke",
	"remove_all", "mount_segment", "remount_segment", "unmount_segment", "unregister_client", "ping",
	"batch_put_start", "batch_put_end", "batch_put_revoke", "batch_upsert_start",
	"batch_upsert_end", "batch_upsert_revoke", "batch_get_replica_list",
	"batch_exist_key", "batch_remove", "batch_query",
	"get_replica_list_by_regex", "remove_by_regex",
}

func newMetrics(m *Master) *Metrics {
	r := prometheus.NewRegistry()
	x := &Metrics{Registry: r, ops: make(map[string][2]prometheus.Counter), items: make(map[string]prometheus.Counter)}
	// The process's goroutines, memory and descriptors (go_goroutines,
	// process_resident_memory_bytes, process_open_fds): what shows a
	// client holding connections or calls.
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), connlimit.Default())
	if c, ok := m.cfg.Events.(prometheus.Collector); ok {
		r.MustRegister(c) // the KV events publisher's counters
	}
	if m.tenants != nil {
		r.MustRegister(tenantCollector{m})
	}
	counter := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
		r.MustRegister(c)
		return c
	}
	gauge := func(name, help string, f func() float64) {
		r.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f))
	}
	x.putStart = counter("master_put_start_requests_total", "PutStart items")
	x.putStartFail = counter("master_put_start_failures_total", "PutStart items that failed")
	x.getReplicaList = counter("master_get_replica_list_requests_total", "GetReplicaList items")
	x.getReplicaListFail = counter("master_get_replica_list_failures_total", "GetReplicaList items that failed")
	x.existKey = counter("master_exist_key_requests_total", "ExistKey items")
	x.existKeyFail = counter("master_exist_key_failures_total", "ExistKey items that failed (an invalid key)")
	x.remove = counter("master_remove_requests_total", "Remove items")
	x.removeFail = counter("master_remove_failures_total", "Remove items that failed")
	x.allocFailures = counter("master_put_start_alloc_failures_total", "PutStart items refused for lack of space")
	x.putDiscards = counter("master_put_start_discard_cnt", "puts discarded for want of a PutEnd within the discard timeout")
	x.checksumMismatches = counter("mc_store_checksum_mismatches_total", "replicas whose bytes did not match the writer's checksum, as mc's clients reported them (each such get tried another replica or failed; it never returned the bytes)")
	x.droppedReplicas = counter("mc_store_put_replicas_dropped_total", "replicas granted at PutStart that their writer could not write (a failed transfer): the put completed with the others")
	x.unreachableReports = counter("mc_store_segment_unreachable_total", "times a segment was marked unreachable by a writer's failed transfer (placement avoids it until its node pings)")
	x.leaseWaits = counter("mc_store_put_lease_waits_total", "times a PutStart with no room waited for a read lease to end (mc's gRPC writers) before evicting again")
	x.putReleases = counter("master_put_start_release_cnt", "discarded puts whose space was released after the release timeout")
	counterOf := func(name, help string, v *atomic.Uint64) {
		r.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(v.Load()) }))
	}
	// mc's pool is memory only: Mooncake's _mem series (memory tier) are
	// the same rounds, keys and bytes as the totals.
	for _, sfx := range []string{"_total", "_mem"} {
		counterOf("master_attempted_evictions"+sfx, "eviction rounds started", &x.evictAttempts)
		counterOf("master_successful_evictions"+sfx, "eviction rounds that evicted something", &x.evictSuccess)
	}
	counterOf("master_evicted_key_count_mem", "objects evicted from memory", &x.evictedKeys)
	counterOf("master_evicted_size_bytes_mem", "bytes evicted from memory (replica bytes)", &x.evictedBytes)
	x.totalGets = counter("total_get_nums_", "GetReplicaList keys asked")
	x.validGets = counter("valid_get_nums_", "GetReplicaList keys answered with at least one complete replica")
	// mem_cache_hit_nums_ and mem_cache_hit_bytes_total are the tier's
	// (registerTierMetrics), beside their file_cache_* twins.
	gauge("master_put_start_discarded_staging_size", "bytes of memory replicas of discarded puts not yet released", func() float64 {
		return float64(m.pend.discardedBytes())
	})
	x.valueSize = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "master_value_size_bytes", Help: "sizes of the objects put",
		Buckets: []float64{4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20}})
	r.MustRegister(x.valueSize)
	for _, op := range batchItemOps {
		x.items[op] = counter("master_"+op+"_items_total", "items in "+op+" requests")
	}
	vec := func(name, help string) *prometheus.CounterVec {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"phase"})
		r.MustRegister(v)
		for _, p := range Phases {
			v.WithLabelValues(p)
		}
		return v
	}
	x.phaseRounds = vec("master_eviction_rounds_total", "eviction rounds per phase: watermark (background), own_regions (phase 1, inside a put), other_regions (phase 3, inside a put), policy (older objects anywhere, for a put phases 1 and 3 left short), offload (to a disk tier), stage (room for a disk read on its node), tenant_quota (a tenant's own objects, for its put over quota)")
	x.phaseKeys = vec("master_eviction_keys_total", "objects evicted per phase")
	x.phaseBytes = vec("master_eviction_bytes_total", "replica bytes evicted per phase")
	for _, op := range rpcOps {
		x.ops[op] = [2]prometheus.Counter{
			counter("master_"+op+"_requests_total", op+" requests"),
			counter("master_"+op+"_failures_total", op+" requests that failed"),
		}
	}
	r.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "master_evicted_key_count", Help: "objects evicted"},
		func() float64 { return float64(x.evictedKeys.Load()) }))
	r.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "master_evicted_size_bytes", Help: "bytes evicted (replica bytes)"},
		func() float64 { return float64(x.evictedBytes.Load()) }))
	gauge("master_allocated_bytes", "bytes of object replicas placed", func() float64 { return float64(m.space.used.Load()) })
	gauge("master_total_capacity_bytes", "bytes of mounted segments", func() float64 { return float64(m.space.capacity.Load()) })
	gauge("master_key_count", "complete objects", func() float64 { return float64(m.KeyCount()) })
	gauge("mc_store_unreachable_segments", "segments a writer could not reach whose node has not pinged since (placement avoids them)", func() float64 { return float64(m.space.nunreachable.Load()) })
	gauge("master_active_clients", "clients the master knows", func() float64 { return float64(m.ActiveClients()) })
	gauge("master_soft_pin_key_count", "objects with a soft pin (live or expired)", func() float64 { return float64(m.softPinnedCount()) })
	r.MustRegister(&segmentCollector{m: m})
	registerTierMetrics(m, r)
	return x
}

// batchItemOps are the batch operations whose items are counted as
// master_<op>_items_total, as Mooncake's.
var batchItemOps = []string{"batch_exist_key", "batch_get_replica_list", "batch_put_start", "batch_put_end"}

// Items counts the n items of one batch operation.
func (x *Metrics) Items(op string, n int) {
	if c, ok := x.items[op]; ok {
		c.Add(float64(n))
	}
}

// Op counts one operation and whether it failed.
func (x *Metrics) Op(name string, failed bool) {
	c, ok := x.ops[name]
	if !ok {
		return
	}
	c[0].Inc()
	if failed {
		c[1].Inc()
	}
}

// Metrics returns the master's metrics.
func (m *Master) Metrics() *Metrics { return m.m }

// KeyCount is the number of complete objects, without a scan.
func (m *Master) KeyCount() int { return m.sumShards(func(sh *shard) int { return sh.keys }) }

func (m *Master) softPinnedCount() int {
	return m.sumShards(func(sh *shard) int { return sh.softPinned })
}

// sumShards adds up a per-shard counter, each read under its shard's lock.
func (m *Master) sumShards(f func(*shard) int) int {
	n := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		n += f(sh)
		sh.mu.Unlock()
	}
	return n
}

// segmentCollector exports per-segment gauges for the segments mounted at
// scrape time.
type segmentCollector struct{ m *Master }

var (
	segAllocDesc = prometheus.NewDesc("segment_allocated_bytes", "bytes of object replicas placed in the segment", []string{"segment"}, nil)
	segCapDesc   = prometheus.NewDesc("segment_total_capacity_bytes", "bytes of the segment", []string{"segment"}, nil)
)

func (c *segmentCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- segAllocDesc
	ch <- segCapDesc
}

func (c *segmentCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.m.Segments() {
		ch <- prometheus.MustNewConstMetric(segAllocDesc, prometheus.GaugeValue, float64(s.Used), s.Info.Name)
		ch <- prometheus.MustNewConstMetric(segCapDesc, prometheus.GaugeValue, float64(s.Capacity), s.Info.Name)
	}
}
