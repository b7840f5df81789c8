package rdma_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvcache-ops/mc/pkg/rdma"
	"github.com/kvcache-ops/mc/pkg/rdma/soft"
)

func TestCollector(t *testing.T) {
	f := newFabric(t, soft.Config{Devices: []soft.DeviceConfig{{Name: "soft0", MaxQP: 64}, {Name: "soft1"}}})
	a := f.open(t, "init", "soft0", rdma.Config{MaxEndpoints: 1, MonitorInterval: time.Hour})
	f.open(t, "target", "soft1", rdma.Config{})
	f.mu.Lock()
	f.ctxs["other@soft1"] = f.ctxs["target@soft1"]
	f.mu.Unlock()
	if _, err := a.Endpoint(context.Background(), "target@soft1"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Endpoint(context.Background(), "other@soft1"); err != nil {
		t.Fatal(err)
	}
	c := rdma.NewCollector(a)
	want := `
# HELP mc_rdma_context_active 1 when the context carries traffic.
# TYPE mc_rdma_context_active gauge
mc_rdma_context_active{device="soft0"} 1
# HELP mc_rdma_endpoint_evictions_total Endpoints evicted from the store.
# TYPE mc_rdma_endpoint_evictions_total counter
mc_rdma_endpoint_evictions_total{device="soft0"} 1
# HELP mc_rdma_endpoints Endpoints in the context's store.
# TYPE mc_rdma_endpoints gauge
mc_rdma_endpoints{device="soft0"} 1
# HELP mc_rdma_endpoints_waiting Retired endpoints waiting for reclaim.
# TYPE mc_rdma_endpoints_waiting gauge
mc_rdma_endpoints_waiting{device="soft0"} 1
# HELP mc_rdma_qps_allocated Queue pairs allocated by the context.
# TYPE mc_rdma_qps_allocated gauge
mc_rdma_qps_allocated{device="soft0"} 4
# HELP mc_rdma_qps_max The device's QP pool size (max_qp).
# TYPE mc_rdma_qps_max gauge
mc_rdma_qps_max{device="soft0"} 64
`
	err := testutil.CollectAndCompare(c, strings.NewReader(want),
		"mc_rdma_context_active", "mc_rdma_endpoint_evictions_total", "mc_rdma_endpoints", "mc_rdma_endpoints_waiting", "mc_rdma_qps_allocated", "mc_rdma_qps_max")
	if err != nil {
		t.Fatal(err)
	}
	// The evicted endpoint is idle: the next tick reclaims it.
	a.Store().Reclaim()
	if err := testutil.CollectAndCompare(c, strings.NewReader(strings.ReplaceAll(strings.ReplaceAll(want,
		`mc_rdma_endpoints_waiting{device="soft0"} 1`, `mc_rdma_endpoints_waiting{device="soft0"} 0`),
		`mc_rdma_qps_allocated{device="soft0"} 4`, `mc_rdma_qps_allocated{device="soft0"} 2`)),
		"mc_rdma_endpoints_waiting", "mc_rdma_qps_allocated"); err != nil {
		t.Fatal(err)
	}
}
