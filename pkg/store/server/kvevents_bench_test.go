package server

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine"
	"github.com/kvcache-ops/mc/pkg/store/kvevents"
)

// BenchmarkKVEventsPut: what `mc bench store --op put --value-size 4K
// --batch 32` measures (an embedded master and node, batched puts of
// 4 KiB values from 4 callers), with KV events off and on (a subscriber
// attached and reading), in alternating rounds of one run; it reports
// objects/s of each, their ratio and the events/s published. Run with
// -benchtime 1x (the rounds are timed, not b.N).
func BenchmarkKVEventsPut(b *testing.B) {
	const (
		rounds  = 3
		round   = 2 * time.Second
		callers = 4
		batch   = 32
		size    = 4 << 10
	)
	ctx := context.Background()
	start := func(events bool) (*Server, func()) {
		cfg := Config{RPCAddress: "127.0.0.1:0", SegmentSize: 512 << 20, Engine: engine.Config{BindAddress: "127.0.0.1", HandshakeAddr: "127.0.0.1:0"}, Logger: slog.New(slog.DiscardHandler)}
		if events {
			cfg.KVEvents = &kvevents.Config{Endpoint: "tcp://127.0.0.1:0", BackendID: "bench"}
		}
		s, err := Start(ctx, cfg)
		if err != nil {
			b.Fatal(err)
		}
		if !events {
			return s, func() { s.Close(ctx) }
		}
		sctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			kvevents.Follow(sctx, s.KVEvents.Endpoint(), kvevents.Follower{})
		}()
		for s.KVEvents.Stats().Subscribers == 0 {
			time.Sleep(5 * time.Millisecond)
		}
		return s, func() { cancel(); <-done; s.Close(ctx) }
	}
	var next atomic.Uint64
	val := make([]byte, size)
	run := func(s *Server) float64 {
		var objs atomic.Uint64
		deadline := time.Now().Add(round)
		var wg sync.WaitGroup
		for range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				keys, vals := make([]string, batch), make([][]byte, batch)
				for time.Now().Before(deadline) {
					for i := range keys {
						keys[i], vals[i] = fmt.Sprintf("0x%x", next.Add(1)), val
					}
					for _, err := range s.Node.BatchPut(ctx, keys, vals) {
						if err == nil {
							objs.Add(1)
						}
					}
				}
			}()
		}
		wg.Wait()
		return float64(objs.Load()) / round.Seconds()
	}
	off, stopOff := start(false)
	defer stopOff()
	on, stopOn := start(true)
	defer stopOn()
	b.ResetTimer()
	var sumOff, sumOn float64
	var ratios []float64
	for range rounds {
		o := run(off)
		n := run(on)
		sumOff, sumOn = sumOff+o, sumOn+n
		ratios = append(ratios, n/o)
	}
	b.StopTimer()
	st := on.KVEvents.Stats()
	b.ReportMetric(sumOff/rounds, "off_objs/s")
	b.ReportMetric(sumOn/rounds, "on_objs/s")
	b.ReportMetric(sumOn/sumOff, "on/off")
	b.ReportMetric(float64(st.PublishedEvents)/(rounds*round.Seconds()), "events/s")
	b.ReportMetric(float64(st.DroppedEvents+st.SubscriberDrops), "dropped")
	b.Logf("on/off per round %.3f", ratios)
}
