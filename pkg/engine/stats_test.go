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
	want.TransportBytes[2] = 512 + 4196 // StatsTransports[2] is tcp
	if got != want {
		t.Fatalf("initiator Stats = %+v, want %+v", got, want)
	}
	if s := target.Stats(); s != (engine.Stats{}) {
		t.Fatalf("target Stats = %+v, want none", s)
	}
	if got.Transport() != "tcp" {
		t.Fatalf("initiator Stats.Transport() = %q, want tcp", got.Transport())
	}
}

// TransportBytes says which transport moved the bytes: under auto a
// same-host segment's go through shm and none through tcp, the engine's
// own segment's through local; Sub isolates what happened in between.
func TestStatsByTransport(t *testing.T) {
	ctx := context.Background()
	target := newEngine(t, func(c *engine.Config) { c.Protocol = engine.ProtocolAuto })
	tm := register(t, target, 1<<20, true)
	init := newEngine(t, func(c *engine.Config) { c.Protocol = engine.ProtocolAuto })
	lm := register(t, init, 1<<20, true)
	run := func(seg *engine.Segment, target uint64, n uint64) {
		t.Helper()
		b, _ := init.AllocateBatch(2)
		defer b.Free()
		b.Submit(
			engine.Request{Op: engine.Write, Source: lm.Addr(), Segment: seg, Target: target, Length: n},
			engine.Request{Op: engine.Read, Source: lm.Addr(), Segment: seg, Target: target, Length: n},
		)
		if err := b.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	remote, err := init.OpenSegment(ctx, target.SegmentName())
	if err != nil {
		t.Fatal(err)
	}
	defer remote.Close()
	own, err := init.OpenSegment(ctx, init.SegmentName())
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	run(remote, tm.Addr(), 4096)
	before := init.Stats()
	if got := before.Transport(); got != "shm" {
		t.Fatalf("after a same-host batch under auto: Transport() = %q (%v), want shm", got, before.TransportBytes)
	}
	run(own, lm.Addr()+8192, 100)
	d := init.Stats().Sub(before)
	if got := d.Transport(); got != "local" || d.TransportBytes[0] != 200 || d.Bytes != [2]uint64{100, 100} {
		t.Fatalf("own segment's batch: %+v (Transport %q), want 200 bytes through local", d, got)
	}
	if got := init.Stats().Transport(); got != "local+shm" {
		t.Fatalf("Transport() over both = %q, want local+shm", got)
	}
}

// The software NIC's bytes are named as its: "rdma (soft)", never plain
// rdma; a real NIC's stay "rdma".
func TestTransportLabel(t *testing.T) {
	for _, c := range []struct{ via, provider, want string }{
		{"rdma", "soft", "rdma (soft)"},
		{"shm+rdma", "soft", "shm+rdma (soft)"},
		{"rdma", "ibverbs", "rdma"},
		{"tcp", "soft", "tcp"},
		{"rdma", "", "rdma"},
		{"", "soft", ""},
	} {
		if got := engine.TransportLabel(c.via, c.provider); got != c.want {
			t.Errorf("TransportLabel(%q, %q) = %q, want %q", c.via, c.provider, got, c.want)
		}
	}
}
