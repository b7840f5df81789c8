package server

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
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
// attached and reading every message), in alternating rounds of one run;
// it reports objects/s of each, the median of the per-round ratios and
// the events/s published. Run with -benchtime 1x (the rounds are timed,
// not b.N).
//
// The subscriber reads each message whole and checks its sequence but
// leaves the msgpack undecoded: a router decodes on its own machine, and
// on a small test machine its decoding would compete with the store for
// the same cores, which measures the router, not the publisher. Each
// round starts from an empty store (keys removed, untimed), so eviction,
// which starts at a different moment in each store, never enters one
// side only, and the removed events of that cleanup are sent before the
// next round begins; a first round of each is a warm-up, not counted.
func BenchmarkKVEventsPut(b *testing.B) {
	const (
		rounds  = 5
		round   = 2 * time.Second
		callers = 4
		batch   = 32
		size    = 4 << 10
	)
	ctx := context.Background()
	var gaps, received atomic.Uint64
	var cleanupDrops uint64 // events dropped while a round's cleanup queued its removals
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
		sub, err := kvevents.Subscribe(ctx, s.KVEvents.Endpoint())
		if err != nil {
			b.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			var last uint64
			for {
				seq, _, err := sub.NextRaw()
				if err != nil {
					return
				}
				if last != 0 && seq != last+1 {
					gaps.Add(1)
				}
				last = seq
				received.Add(1)
			}
		}()
		for s.KVEvents.Stats().Subscribers == 0 {
			time.Sleep(5 * time.Millisecond)
		}
		return s, func() { sub.Close(); <-done; s.Close(ctx) }
	}
	var next atomic.Uint64
	val := make([]byte, size)
	run := func(s *Server) float64 {
		var objs atomic.Uint64
		deadline := time.Now().Add(round)
		began := time.Now()
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
		rate := float64(objs.Load()) / time.Since(began).Seconds()
		var drops0 uint64
		if s.KVEvents != nil {
			st := s.KVEvents.Stats()
			drops0 = st.DroppedEvents + st.SubscriberDrops
		}
		if _, err := s.Node.RemoveAll(ctx); err != nil {
			b.Fatal(err)
		}
		if s.KVEvents != nil { // the cleanup's removed events, sent and read
			for wait := time.Now().Add(30 * time.Second); ; {
				st := s.KVEvents.Stats()
				if st.QueueLength == 0 && received.Load()+st.SubscriberDrops >= st.PublishedBatches {
					break
				}
				if time.Now().After(wait) {
					b.Fatalf("cleanup's events not delivered in 30 s: %+v, %d received", st, received.Load())
				}
				time.Sleep(time.Millisecond)
			}
			st := s.KVEvents.Stats()
			cleanupDrops += st.DroppedEvents + st.SubscriberDrops - drops0
		}
		return rate
	}
	off, stopOff := start(false)
	defer stopOff()
	on, stopOn := start(true)
	defer stopOn()
	b.ResetTimer()
	run(off)
	run(on)
	var sumOff, sumOn float64
	var ratios []float64
	for i := range rounds {
		var o, n float64
		if i%2 == 0 {
			o, n = run(off), run(on)
		} else {
			n, o = run(on), run(off)
		}
		sumOff, sumOn = sumOff+o, sumOn+n
		ratios = append(ratios, n/o)
	}
	b.StopTimer()
	st := on.KVEvents.Stats()
	b.ReportMetric(sumOff/rounds, "off_objs/s")
	b.ReportMetric(sumOn/rounds, "on_objs/s")
	sorted := slices.Clone(ratios)
	slices.Sort(sorted)
	b.ReportMetric(sorted[len(sorted)/2], "on/off")
	b.ReportMetric(float64(st.PublishedEvents)/float64(max(st.PublishedBatches, 1)), "events/batch")
	// Drops of the puts' events, and of the untimed remove_all's (its
	// removed events come faster than the puts' and may overflow the
	// queue when the publisher is given little CPU).
	b.ReportMetric(float64(st.DroppedEvents+st.SubscriberDrops-cleanupDrops), "dropped")
	b.ReportMetric(float64(cleanupDrops), "cleanup_dropped")
	b.ReportMetric(float64(gaps.Load()), "gaps")
	b.Logf("on/off per round %.3f", ratios)
}
