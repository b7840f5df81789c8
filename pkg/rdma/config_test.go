package rdma_test

import (
	"testing"

	"github.com/kvcache-ops/mc/pkg/rdma"
)

func TestConfigFromEnv(t *testing.T) {
	t.Setenv("MC_ENDPOINT_STORE_TYPE", "fifo")
	t.Setenv("MC_MAX_EP_PER_CTX", "1000")
	t.Setenv("MC_NUM_QP_PER_EP", "4")
	t.Setenv("MC_MAX_WR", "64")
	t.Setenv("MC_WORKERS_PER_CTX", "3")
	c, err := rdma.ConfigFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	if c.StoreType != rdma.FIFO || c.MaxEndpoints != 1000 || c.QPsPerEndpoint != 4 || c.MaxWR != 64 || c.Workers != 3 || c.CQDepth != rdma.DefaultCQDepth {
		t.Fatalf("config %+v", c)
	}
	t.Setenv("MC_ENDPOINT_STORE_TYPE", "")
	if c, _ := rdma.ConfigFromEnv(); c.StoreType != rdma.SIEVE {
		t.Fatalf("default store %v", c.StoreType)
	}
	for k, v := range map[string]string{"MC_ENDPOINT_STORE_TYPE": "LRU", "MC_NUM_QP_PER_EP": "0", "MC_MAX_WR": "many"} {
		t.Run(k, func(t *testing.T) {
			t.Setenv(k, v)
			if _, err := rdma.ConfigFromEnv(); err == nil {
				t.Fatalf("%s=%s accepted", k, v)
			}
		})
	}
}

func TestGIDRoundTrip(t *testing.T) {
	g, err := rdma.ParseGID("00:00:00:00:00:00:00:00:00:00:ff:ff:7f:00:00:01")
	if err != nil {
		t.Fatal(err)
	}
	if g.Addr().String() != "127.0.0.1" || g.String() != "00:00:00:00:00:00:00:00:00:00:ff:ff:7f:00:00:01" {
		t.Fatalf("gid %v addr %v", g, g.Addr())
	}
	for _, bad := range []string{"", "00:11", "zz:00:00:00:00:00:00:00:00:00:ff:ff:7f:00:00:01", "0:00:00:00:00:00:00:00:00:00:ff:ff:7f:00:00:01"} {
		if _, err := rdma.ParseGID(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
