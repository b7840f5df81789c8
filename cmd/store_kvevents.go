package cmd

import (
	"time"

	"github.com/spf13/pflag"

	"github.com/kvcache-ops/mc/pkg/store/kvevents"
)

// kvEventsOptions are serve store's KV events flags, under
// mooncake_master's names (--enable_kv_events, --kv_events_*).
type kvEventsOptions struct {
	Enable        bool
	Endpoint      string
	BackendID     string
	EmitObjectKey bool
	EmitLegacy    bool
	QueueCapacity int
	Pace          time.Duration
	MaxBatch      int
}

func (o *kvEventsOptions) addFlags(f *pflag.FlagSet) {
	f.BoolVar(&o.Enable, "enable-kv-events", false, "publish KV events for cache-aware routers on a ZMQ PUB socket, in mooncake_master's format (RFC #1527)")
	f.StringVar(&o.Endpoint, "kv-events-endpoint", "", "KV events PUB socket: tcp://HOST:PORT (HOST * for every interface) or ipc://PATH")
	f.StringVar(&o.Endpoint, "kv-events-bind-endpoint", "", "mooncake_master's spelling of --kv-events-endpoint")
	f.StringVar(&o.BackendID, "kv-events-backend-id", "", "cache owner named on every KV event (required with --enable-kv-events)")
	f.BoolVar(&o.EmitObjectKey, "kv-events-emit-object-key", true, "put the object key on KV events, and send events of keys that are no decimal or 0x hash")
	f.BoolVar(&o.EmitLegacy, "kv-events-emit-legacy-compat", true, "add vLLM/SGLang aliases to KV events (type, block_hashes, parent_block_hash)")
	f.IntVar(&o.QueueCapacity, "kv-events-queue-capacity", kvevents.DefaultQueueCapacity, "KV events queued before the oldest are dropped (0: unbounded, as mooncake_master)")
	f.IntVar(&o.MaxBatch, "kv-events-max-batch", kvevents.DefaultMaxBatch, "most KV events one message carries (64: mooncake_master's messages; fewer, larger messages cost the publisher and every subscriber less)")
	msDurationVar(f, &o.Pace, "kv-events-pace", kvevents.DefaultPaceInterval, "under a steady stream of events, send KV events at most once per this interval, all queued ones together (up to --kv-events-max-batch to a message); sparse events go at once (0: send every time events are queued, as mooncake_master)")
}

// config checks the flags; nil when events are off.
func (o kvEventsOptions) config(nodeOf string) (*kvevents.Config, error) {
	if !o.Enable {
		return nil, nil
	}
	switch {
	case nodeOf != "":
		return nil, usagef("--enable-kv-events publishes a master's events; --master makes this process a node")
	case o.Endpoint == "":
		return nil, usagef("--enable-kv-events needs --kv-events-endpoint (--kv_events_bind_endpoint), e.g. tcp://0.0.0.0:5557")
	}
	if _, _, err := kvevents.ParseEndpoint(o.Endpoint); err != nil {
		return nil, usagef("invalid --kv-events-endpoint (--kv_events_bind_endpoint): %w", err)
	}
	switch {
	case o.BackendID == "":
		return nil, usagef("--enable-kv-events needs --kv-events-backend-id: every event names its cache owner (mooncake_master publishes nothing without it)")
	case o.QueueCapacity < 0:
		return nil, usagef("invalid --kv-events-queue-capacity %d: want 0 (unbounded) or more", o.QueueCapacity)
	case o.MaxBatch < 1 || o.MaxBatch > kvevents.MaxMaxBatch:
		return nil, usagef("invalid --kv-events-max-batch %d: want 1 to %d events to a message", o.MaxBatch, kvevents.MaxMaxBatch)
	case o.Pace < 0 || o.Pace > time.Second:
		return nil, usagef("invalid --kv-events-pace %v: want 0 (no pacing) to 1s", o.Pace)
	}
	pace := o.Pace
	if pace == 0 {
		pace = -1 // kvevents.Config: negative sends at once
	}
	q := o.QueueCapacity
	if q == 0 {
		q = -1 // kvevents.Config: negative is unbounded
	}
	return &kvevents.Config{
		Endpoint: o.Endpoint, BackendID: o.BackendID, QueueCapacity: q,
		NoObjectKey: !o.EmitObjectKey, NoLegacyFields: !o.EmitLegacy, PaceInterval: pace,
		MaxBatch: o.MaxBatch,
	}, nil
}
