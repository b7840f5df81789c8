package rdma

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Collector exports every registered context's endpoint and QP counts,
// the numbers that would have shown the production leak early: a waiting
// list that grows, and allocated QPs that approach max_qp.
type Collector struct {
	mu   sync.Mutex
	ctxs []*Context

	endpoints, waiting, qps, maxQP, active, evictions, reclaimed, createFails *prometheus.Desc
}

// NewCollector returns a Collector for ctxs; Add registers more.
func NewCollector(ctxs ...*Context) *Collector { return newCollector(nil, ctxs) }

// NewProviderCollector is NewCollector with every series labelled
// provider="<provider>" ("soft": the software NIC, whose queue pairs are
// sockets, not a NIC's).
func NewProviderCollector(provider string, ctxs ...*Context) *Collector {
	return newCollector(prometheus.Labels{"provider": provider}, ctxs)
}

func newCollector(cl prometheus.Labels, ctxs []*Context) *Collector {
	l := []string{"device"}
	return &Collector{
		ctxs:        ctxs,
		endpoints:   prometheus.NewDesc("mc_rdma_endpoints", "Endpoints in the context's store.", l, cl),
		waiting:     prometheus.NewDesc("mc_rdma_endpoints_waiting", "Retired endpoints waiting for reclaim.", l, cl),
		qps:         prometheus.NewDesc("mc_rdma_qps_allocated", "Queue pairs allocated by the context.", l, cl),
		maxQP:       prometheus.NewDesc("mc_rdma_qps_max", "The device's QP pool size (max_qp).", l, cl),
		active:      prometheus.NewDesc("mc_rdma_context_active", "1 when the context carries traffic.", l, cl),
		evictions:   prometheus.NewDesc("mc_rdma_endpoint_evictions_total", "Endpoints evicted from the store.", l, cl),
		reclaimed:   prometheus.NewDesc("mc_rdma_endpoints_reclaimed_total", "Retired endpoints destroyed.", l, cl),
		createFails: prometheus.NewDesc("mc_rdma_qp_create_failures_total", "QP creations that failed.", l, cl),
	}
}

// Add registers a context.
func (c *Collector) Add(ctx *Context) {
	c.mu.Lock()
	c.ctxs = append(c.ctxs, ctx)
	c.mu.Unlock()
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.endpoints, c.waiting, c.qps, c.maxQP, c.active, c.evictions, c.reclaimed, c.createFails} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	ctxs := append([]*Context(nil), c.ctxs...)
	c.mu.Unlock()
	for _, x := range ctxs {
		s := x.Stats()
		g := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, s.Device)
		}
		k := func(d *prometheus.Desc, v uint64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), s.Device)
		}
		active := 0.0
		if s.Active {
			active = 1
		}
		g(c.endpoints, float64(s.LiveEndpoints))
		g(c.waiting, float64(s.Waiting))
		g(c.qps, float64(s.AllocatedQPs))
		g(c.maxQP, float64(x.dev.Info().MaxQP))
		g(c.active, active)
		k(c.evictions, s.Evictions)
		k(c.reclaimed, s.Reclaimed)
		k(c.createFails, s.QPCreateFails)
	}
}
