package cmd

import (
	"testing"
	"time"
)

// --request-budget and --request-read-timeout reach the master: 0 is
// unlimited (master.Config's negative), bytes as given otherwise.
func TestServeStoreRequestBudget(t *testing.T) {
	for _, c := range []struct {
		budget, want int64
	}{{0, -1}, {256 << 20, 256 << 20}} {
		o := serveStoreOptions{RPCPort: 50051, RequestBudget: c.budget, RequestReadTimeout: 5 * time.Second,
			RegionSize: 64 << 20, AllocationStrategy: "random", PutDiscardTimeout: 30 * time.Second, PutReleaseTimeout: 600 * time.Second,
			LeaseTTL: 10 * time.Second, SoftPinTTL: time.Minute, MaxSoftPinTTL: time.Hour, ClientTTL: 10 * time.Second,
			EvictionRatio: 0.05, HighWatermark: 0.9}
		o.Data.Protocol = "tcp"
		cfg, err := o.serverConfig()
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Master.RequestBudget != c.want || cfg.Master.RequestReadTimeout != 5*time.Second {
			t.Errorf("--request-budget %d: master budget %d, read timeout %s; want %d, 5s", c.budget, cfg.Master.RequestBudget, cfg.Master.RequestReadTimeout, c.want)
		}
	}
	o := serveStoreOptions{RPCPort: 50051, RequestBudget: -1}
	if _, err := o.serverConfig(); err == nil {
		t.Error("a negative --request-budget was accepted")
	}
}
