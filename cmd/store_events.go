package cmd

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvcache-ops/mc/pkg/store/kvevents"
)

type storeEventsOptions struct {
	Endpoint string
	Prefix   string
	Type     string
	JSON     bool
}

func newStoreEventsCmd(p *printer) *cobra.Command {
	var o storeEventsOptions
	cmd := &cobra.Command{
		Use:   "events --endpoint tcp://HOST:PORT",
		Short: "Follow a master's KV events (mc serve store or mooncake_master --enable_kv_events)",
		Long: `events subscribes to a master's KV events publisher (the ZMQ PUB socket of
--kv-events-endpoint) and prints one line per event: time, type, key, medium
and tenant; -o json prints one JSON object per line (time, timestamp_ms, seq,
event_id, type, key, medium, tenant_id, backend_id, seq_hashes).

On stderr it says when the publisher cannot be reached (it goes on trying, as
a ZMQ subscriber does), when events were lost ("lost 12 events": a full queue
at the master, or this subscriber falling behind), and when the sequence
starts again (the master restarted, or a new HA leader took over). Ctrl-C
ends it with a count, exit 0; exit 1 when it never reached the publisher
(nothing was followed).`,
		Example: `  mc store events --endpoint tcp://master-0:5557
  mc store events --endpoint tcp://master-0:5557 --type removed --prefix 0x -o json | jq .key`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Endpoint == "" {
				return usagef("events needs --endpoint, the master's --kv-events-endpoint (e.g. tcp://127.0.0.1:5557)")
			}
			if _, _, err := kvevents.ParseEndpoint(o.Endpoint); err != nil {
				return usagef("invalid --endpoint: %w", err)
			}
			switch o.Type {
			case "", "stored", "removed":
			default:
				return usagef("invalid --type %q: want stored or removed", o.Type)
			}
			o.JSON = p.JSON()
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return runStoreEvents(ctx, o, p.Out, p.Err)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Endpoint, "endpoint", "", "the master's KV events endpoint: tcp://HOST:PORT or ipc://PATH")
	f.StringVar(&o.Prefix, "prefix", "", "only keys starting with this")
	f.StringVar(&o.Type, "type", "", "only stored or removed events")
	return cmd
}

// eventLine is one event in -o json.
type eventLine struct {
	Time        string   `json:"time"`
	TimestampMS int64    `json:"timestamp_ms"`
	Seq         uint64   `json:"seq"`
	EventID     uint64   `json:"event_id"`
	Type        string   `json:"type"`
	Key         string   `json:"key"`
	Medium      string   `json:"medium"`
	TenantID    string   `json:"tenant_id"`
	BackendID   string   `json:"backend_id"`
	SeqHashes   []uint64 `json:"seq_hashes"`
}

// runStoreEvents follows o.Endpoint until ctx ends, events on out and
// notices on errw.
func runStoreEvents(ctx context.Context, o storeEventsOptions, out, errw io.Writer) error {
	var received, shown, lost uint64
	keyW := 24
	enc := json.NewEncoder(out)
	if !o.JSON {
		fmt.Fprintf(out, "%-23s  %-7s  %-*s  %-6s  %s\n", "TIME", "TYPE", keyW, "KEY", "MEDIUM", "TENANT")
	}
	var werr, waitErr error
	connected := false
	err := kvevents.Follow(ctx, o.Endpoint, kvevents.Follower{
		Waiting: func(err error) {
			waitErr = err
			fmt.Fprintf(errw, "waiting for the publisher at %s (%v)\n", o.Endpoint, err)
		},
		Connected: func() {
			connected = true
			fmt.Fprintf(errw, "connected to %s\n", o.Endpoint)
		},
		Restarted: func(seq uint64) {
			fmt.Fprintf(errw, "sequence restarted at %d: the publisher restarted or another master took over\n", seq)
		},
		Batch: func(b kvevents.Batch, n uint64) {
			if n > 0 {
				lost += n
				fmt.Fprintf(errw, "lost %d events (before sequence %d)\n", n, b.Seq)
			}
			for _, e := range b.Events {
				received++
				key := e.ObjectKey
				if key == "" && len(e.SeqHashes) > 0 {
					key = fmt.Sprint(e.SeqHashes[0]) // published without object keys
				}
				if o.Type != "" && e.Type != o.Type || !strings.HasPrefix(key, o.Prefix) {
					continue
				}
				shown++
				ts := time.UnixMilli(e.Timestamp)
				if o.JSON {
					hs := e.SeqHashes
					if hs == nil {
						hs = []uint64{}
					}
					if err := enc.Encode(eventLine{Time: ts.UTC().Format(time.RFC3339Nano), TimestampMS: e.Timestamp, Seq: b.Seq, EventID: e.ID,
						Type: e.Type, Key: key, Medium: e.Medium, TenantID: e.TenantID, BackendID: e.BackendID, SeqHashes: hs}); err != nil && werr == nil {
						werr = err
					}
					continue
				}
				keyW = max(keyW, len(key))
				if _, err := fmt.Fprintf(out, "%-23s  %-7s  %-*s  %-6s  %s\n", ts.Format("2006-01-02 15:04:05.000"), e.Type, keyW, key, e.Medium, e.TenantID); err != nil && werr == nil {
					werr = err
				}
			}
		},
	})
	fmt.Fprintf(errw, "%d events received, %d shown, %d lost\n", received, shown, lost)
	if err != nil {
		return fmt.Errorf("%s: %w", o.Endpoint, err)
	}
	if werr != nil {
		return fmt.Errorf("write: %w", werr)
	}
	if !connected {
		// Stopped before it ever followed anything: no success.
		if waitErr == nil {
			waitErr = ctx.Err()
		}
		return fmt.Errorf("never reached the publisher at %s (%v): is the master's --kv-events-endpoint this address, and KV events enabled?", o.Endpoint, waitErr)
	}
	return nil
}
