package cmd

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestKVEventsFlagsRefused(t *testing.T) {
	ok := kvEventsOptions{Enable: true, Endpoint: "tcp://127.0.0.1:5557", BackendID: "pool", QueueCapacity: 10, EmitObjectKey: true, EmitLegacy: true, Pace: 5 * time.Millisecond, MaxBatch: 64}
	for _, c := range []struct {
		edit func(*kvEventsOptions)
		node string
		want string
	}{
		{func(o *kvEventsOptions) { o.Endpoint = "127.0.0.1:5557" }, "", "invalid --kv-events-endpoint"},
		{func(o *kvEventsOptions) { o.Endpoint = "tcp://127.0.0.1" }, "", "invalid --kv-events-endpoint"},
		{func(o *kvEventsOptions) { o.Endpoint = "" }, "", "needs --kv-events-endpoint"},
		{func(o *kvEventsOptions) { o.BackendID = "" }, "", "needs --kv-events-backend-id"},
		{func(o *kvEventsOptions) { o.QueueCapacity = -1 }, "", "--kv-events-queue-capacity"},
		{func(o *kvEventsOptions) { o.Pace = -time.Millisecond }, "", "invalid --kv-events-pace -1ms"},
		{func(o *kvEventsOptions) { o.Pace = 2 * time.Second }, "", "invalid --kv-events-pace 2s"},
		{func(o *kvEventsOptions) { o.MaxBatch = 0 }, "", "invalid --kv-events-max-batch 0"},
		{func(o *kvEventsOptions) { o.MaxBatch = 5000 }, "", "invalid --kv-events-max-batch 5000"},
		{func(*kvEventsOptions) {}, "10.0.0.1:50051", "--master makes this process a node"},
	} {
		o := ok
		c.edit(&o)
		_, err := o.config(c.node)
		if err == nil || !strings.Contains(err.Error(), c.want) || !isUsage(err) {
			t.Errorf("%+v: %v, want a usage error containing %q", o, err, c.want)
		}
	}
	cfg, err := ok.config("")
	if err != nil || cfg.BackendID != "pool" || cfg.QueueCapacity != 10 || cfg.NoObjectKey || cfg.NoLegacyFields || cfg.PaceInterval != 5*time.Millisecond || cfg.MaxBatch != 64 {
		t.Errorf("config %+v, %v", cfg, err)
	}
	ok.Pace = 0 // mooncake_master's: every send at once
	if cfg, err := ok.config(""); err != nil || cfg.PaceInterval >= 0 {
		t.Errorf("--kv-events-pace 0: config %+v, %v; want a negative PaceInterval (no pacing)", cfg, err)
	}
}

func isUsage(err error) bool {
	var u *usageErr
	return errors.As(err, &u)
}
