package bench

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"
)

// TestPutRowMemoryIsBounded: a long put row holds no memory per put (1.07
// M puts took mc bench store from 51 to 181 MB). A row kept every key it
// wrote (for its cleanup) and every call's latency, and the master it
// embeds kept every put it started, with its object, for the discard
// timeout (30 s), and the keys evicted for the writer to learn (1 Mi of
// them). The live heap is read (after a GC) once what is bounded is full
// (the master's objects: it evicts; the notices: 64 Ki keys) and again
// many puts later: what grows in between is held per put.
func TestPutRowMemoryIsBounded(t *testing.T) {
	first, last, samples := uint64(160_000), uint64(480_000), 3
	if raceOn {
		// Slower puts: the store fills (16 Ki objects) but the notices
		// never pile up (pings drain 10,000 a second).
		first, last = 30_000, 120_000
	}
	srv := startStore(t, 4<<20)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The least of a few live-heap readings (a GC each, one per progress
	// report), so an eviction round or a ping's notices in flight at one
	// reading do not count.
	var h1, h2 uint64
	var n1, n2 uint64
	var k1, k2 int
	live := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	_, err := Run(ctx, Config{Master: srv.RPCAddr, AllowEvict: true, SegmentSize: 4 << 20, ValueSizes: []int64{256}, Ops: []string{"put"},
		Concurrency: []int{2}, Batch: 32, Duration: 2 * time.Minute, Engine: engineLoopback(), Logger: quietLog(),
		Progress: func(p Progress) {
			switch {
			case k1 < samples && p.Ops >= first:
				if h := live(); k1 == 0 || h < h1 {
					h1, n1 = h, p.Ops
				}
				k1++
			case k1 == samples && p.Ops >= last:
				if h := live(); k2 == 0 || h < h2 {
					h2, n2 = h, p.Ops
				}
				if k2++; k2 == samples {
					cancel()
				}
			}
		}})
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if k2 < samples {
		t.Fatalf("the row did not reach %d puts in 2 minutes (heap at %d puts: %d B)", last, n1, h1)
	}
	per := (float64(h2) - float64(h1)) / float64(n2-n1)
	t.Logf("live heap %d B after %d puts, %d B after %d puts: %.1f B per put", h1, n1, h2, n2, per)
	if raceOn {
		// Under -race on a loaded machine pings can fall behind the
		// evictions, so the master's notices (bounded: 64 Ki keys, about
		// 5 MB) may still be filling between the readings: bound the
		// growth by that, well below what 90,000 puts held per put
		// before (12 MB at 140 B each).
		if grew := int64(h2) - int64(h1); grew > 8<<20 {
			t.Fatalf("the client's heap grew %d B over %d puts (%.1f B per put): a put row must not hold memory per put", grew, n2-n1, per)
		}
		return
	}
	if per > 16 {
		t.Fatalf("the client's heap grows %.1f B per put (from %d B at %d puts to %d B at %d): a put row must not hold memory per put", per, h1, n1, h2, n2)
	}
}
