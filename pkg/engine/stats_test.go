package engine_test

import (
	"context"
	"testing"

	"github.com/kvcache-ops/mc/pkg/engine"
)

// Stats counts the initiator's finished tasks and bytes by operation,
// failed ones apart; the target, which only serves, counts nothing.
func TestStatsCountTasks(t *testing.T) {
	ctx := context.Background()
	target := newEngine(t)
	tm := register(t, target, 1<<20, true)
	init := newEngine(t)
	lm := register(t, init, 1<<20, false)
	seg, err := init.OpenSegment(ctx, target.SegmentName())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := init.AllocateBatch(4)
	b.Submit(
		engine.Request{Op: engine.Write, Source: lm.Addr(), Segment: seg, Target: tm.Addr(), Length: 4096},
		engine.Request{Op: engine.Write, Source: lm.Addr(), Segment: seg, Target: tm.Addr() + 8192, Length: 100},
		engine.Request{Op: engine.Read, Source: lm.Addr(), Segment: seg, Target: tm.Addr(), Length: 512},
		engine.Request{Op: engine.Read, Source: lm.Addr(), Segment: seg, Target: tm.Addr() + 1<<20 - 10, Length: 11},
	)
	_ = b.Wait(ctx) // the last one fails: out of range
	got := init.Stats()
	want := engine.Stats{Completed: [2]uint64{1, 2}, Failed: [2]uint64{1, 0}, Bytes: [2]uint64{512, 4196}}
	if got != want {
		t.Fatalf("initiator Stats = %+v, want %+v", got, want)
	}
	if s := target.Stats(); s != (engine.Stats{}) {
		t.Fatalf("target Stats = %+v, want none", s)
	}
}
