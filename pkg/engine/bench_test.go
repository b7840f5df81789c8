package engine_test

import (
	"context"
	"testing"

	"github.com/kvcache-ops/mc/pkg/engine"
)

// BenchmarkBatch measures one batch of 128 requests over loopback TCP and
// the local transport, with allocations per batch (the per-request path
// is meant to allocate nothing).
func BenchmarkBatch(b *testing.B) {
	for _, bc := range []struct {
		name  string
		local bool
		size  uint64
	}{{"tcp/4K", false, 4 << 10}, {"tcp/64K", false, 64 << 10}, {"local/4K", true, 4 << 10}} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			target := newEngine(b)
			tm := register(b, target, int(bc.size*128), true)
			init := target
			if !bc.local {
				init = newEngine(b)
			}
			lm := register(b, init, int(bc.size*128), false)
			name := target.SegmentName()
			seg, err := init.OpenSegment(ctx, name)
			if err != nil {
				b.Fatal(err)
			}
			reqs := make([]engine.Request, 128)
			for i := range reqs {
				off := uint64(i) * bc.size
				reqs[i] = engine.Request{Op: engine.Read, Source: lm.Addr() + off, Segment: seg, Target: tm.Addr() + off, Length: bc.size}
			}
			batch, _ := init.AllocateBatch(128)
			b.SetBytes(int64(bc.size * 128))
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				batch.Reset()
				batch.Submit(reqs...)
				if err := batch.Wait(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
