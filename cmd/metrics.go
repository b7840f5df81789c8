package cmd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvcache-ops/mc/pkg/connlimit"
	"github.com/kvcache-ops/mc/pkg/engine"
	"github.com/kvcache-ops/mc/pkg/store/master"
)

// serveMetrics serves /metrics (Prometheus text) and /health on addr until
// ctx ends. It returns the address it listens on, so ":0" can be used.
func serveMetrics(ctx context.Context, addr string, cs ...prometheus.Collector) (string, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), connlimit.Default())
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return "", fmt.Errorf("metrics: %w", err)
		}
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/health", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "OK") })
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("metrics listener %s: %w", addr, err)
	}
	ln = connlimit.Default().Listener(ln, "metrics http")
	srv := master.NewAdminServer(mux, nil)
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			slog.Warn("metrics server stopped", "addr", ln.Addr().String(), "err", err)
		}
	}()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	return ln.Addr().String(), nil
}

// engineCollector exports an engine's task counts (engine.Stats): the
// transfer engine's throughput and failed tasks, by operation.
type engineCollector struct {
	e                   *engine.Engine
	tasks, bytes, byVia *prometheus.Desc
}

func newEngineCollector(e *engine.Engine) *engineCollector {
	return &engineCollector{e: e,
		tasks: prometheus.NewDesc("mc_engine_tasks_total", "Transfer tasks this engine initiated that finished, by operation and status (completed, failed).", []string{"operation", "status"}, nil),
		bytes: prometheus.NewDesc("mc_engine_transferred_bytes_total", "Bytes this engine's tasks moved, by operation (a failed task's partial bytes too).", []string{"operation"}, nil),
		byVia: prometheus.NewDesc("mc_engine_transport_bytes_total", "Bytes this engine's tasks moved, by the transport that moved them (local, shm, tcp, rdma; \"rdma (soft)\" for the software NIC, over TCP sockets).", []string{"transport"}, nil),
	}
}

func (c *engineCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.tasks
	ch <- c.bytes
	ch <- c.byVia
}

func (c *engineCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.e.Stats()
	for op, name := range map[engine.Opcode]string{engine.Read: "read", engine.Write: "write"} {
		ch <- prometheus.MustNewConstMetric(c.tasks, prometheus.CounterValue, float64(s.Completed[op]), name, "completed")
		ch <- prometheus.MustNewConstMetric(c.tasks, prometheus.CounterValue, float64(s.Failed[op]), name, "failed")
		ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.CounterValue, float64(s.Bytes[op]), name)
	}
	for i, name := range engine.StatsTransports {
		// "rdma (soft)" when the software NIC moves rdma's bytes.
		ch <- prometheus.MustNewConstMetric(c.byVia, prometheus.CounterValue, float64(s.TransportBytes[i]), c.e.TransportLabel(name))
	}
}
