package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine"
	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/master"
)

// BenchmarkDrainVsEngine measures a drain of 1 MiB objects from node A to
// node B against the engine's own throughput between the same two
// engines in the same iteration: A's engine writing the same number of
// 1 MiB blocks from A's segment into B's, in batches as deep as the
// drain's concurrency. Both nodes are in this process, over loopback
// TCP. It reports engine_MB/s, drain_MB/s and drain/engine (the issue's
// goal: >= 0.7).
//
//	go test ./pkg/store -run '^$' -bench DrainVsEngine -benchtime 3x
func BenchmarkDrainVsEngine(b *testing.B) {
	const (
		objSize = 1 << 20
		objects = 1024
		conc    = 16
	)
	ctx := context.Background()
	var engSec, drainSec float64
	for range b.N {
		b.StopTimer()
		c := startMaster(b, master.Config{})
		engA, err := engine.New(ctx, engineConfig())
		if err != nil {
			b.Fatal(err)
		}
		a, err := store.New(ctx, store.Config{Master: c.addr, Engine: engA, SegmentSize: 2 * objects * objSize, PingInterval: 100 * time.Millisecond})
		if err != nil {
			b.Fatal(err)
		}
		bn := c.client(2 * objects * objSize)
		cl := c.client(0, func(cfg *store.Config) { cfg.StagingSize = 64 << 20 })
		a.WaitPopulated(ctx)
		bn.WaitPopulated(ctx)
		segA, _ := a.Segment()
		segB, _ := bn.Segment()
		val := value(objSize, 7)
		for i := range objects {
			if err := cl.Put(ctx, fmt.Sprintf("obj/%04d", i), val, onSegment(segA.Name)); err != nil {
				b.Fatal(err)
			}
		}
		// The engine alone: A's segment into B's, conc blocks a batch.
		seg, err := engA.OpenSegment(ctx, segB.Endpoint)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		t0 := time.Now()
		for i := 0; i < objects; i += conc {
			reqs := make([]engine.Request, 0, conc)
			for k := i; k < min(i+conc, objects); k++ {
				reqs = append(reqs, engine.Request{Op: engine.Write, Source: segA.Base + uint64(k)*objSize, Segment: seg, Target: segB.Base + uint64(k)*objSize, Length: objSize})
			}
			bt, err := engA.AllocateBatch(len(reqs))
			if err != nil {
				b.Fatal(err)
			}
			if _, err := bt.Submit(reqs...); err != nil {
				b.Fatal(err)
			}
			if err := bt.Wait(ctx); err != nil {
				b.Fatal(err)
			}
			bt.Free()
		}
		engSec += time.Since(t0).Seconds()
		// The drain of the same bytes between the same engines.
		t0 = time.Now()
		id, err := c.m.CreateDrainJob(master.DrainRequest{Segments: []string{segA.Name}, MaxConcurrency: conc})
		if err != nil {
			b.Fatal(err)
		}
		var j master.DrainJob
		for {
			if j, err = c.m.QueryDrainJob(id); err != nil {
				b.Fatal(err)
			}
			if j.Status.Done() {
				break
			}
			time.Sleep(time.Millisecond)
		}
		drainSec += time.Since(t0).Seconds()
		b.StopTimer()
		if j.Status != master.DrainSucceeded || j.Succeeded != objects {
			b.Fatalf("drain: %+v", j)
		}
		seg.Close()
		cl.Close(ctx)
		bn.Close(ctx)
		a.Close(ctx)
		engA.Close()
		c.stop()
	}
	mb := float64(b.N*objects*objSize) / 1e6
	b.ReportMetric(mb/engSec, "engine_MB/s")
	b.ReportMetric(mb/drainSec, "drain_MB/s")
	b.ReportMetric(engSec/drainSec, "drain/engine")
}
