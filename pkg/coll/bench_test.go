package coll

import (
	"context"
	"flag"
	"fmt"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine"
	"github.com/kvcache-ops/mc/pkg/engine/bench"
	"github.com/kvcache-ops/mc/pkg/engine/meta"
)

var (
	benchRanks    = flag.Int("coll.ranks", 4, "ranks of BenchmarkAllReduceVsInitiator")
	benchSize     = flag.String("coll.size", "64M", "all-reduce size of BenchmarkAllReduceVsInitiator")
	benchIters    = flag.Int("coll.iters", 5, "timed all-reduces per run")
	benchSlotSize = flag.String("coll.slot-size", "4M", "mailbox slot size")
	benchSlots    = flag.Int("coll.slots", 2, "mailbox slots per peer")
	benchDuration = flag.Duration("coll.baseline-duration", 3*time.Second, "duration of the initiator baseline")
	benchProtocol = flag.String("coll.protocol", "tcp", "the ranks' engine protocol (tcp; auto: shared memory between them)")
)

// BenchmarkAllReduceVsInitiator measures the all-reduce bus bandwidth of
// ranks on loopback TCP (each its own engine, in this process; with
// -coll.protocol auto through shared memory instead) against
// the transfer engine's own ceiling measured in the same run: `mc bench
// initiator` with one thread and 1 MiB blocks (its defaults otherwise:
// batches of 128) against an embedded loopback target, reads and writes.
//
//	make bench-coll
func BenchmarkAllReduceVsInitiator(b *testing.B) {
	ctx := context.Background()
	size, err := bench.ParseSize(*benchSize)
	if err != nil {
		b.Fatal(err)
	}
	slot, err := bench.ParseSize(*benchSlotSize)
	if err != nil {
		b.Fatal(err)
	}
	baseline := map[engine.Opcode]float64{}
	for _, op := range []engine.Opcode{engine.Read, engine.Write} {
		baseline[op] = initiatorBaseline(b, op, 1)
	}
	// What the host's loopback carries at most (every core busy): C. A
	// ring all-reduce of n ranks on one host pushes 2(n-1)/n x S per rank,
	// 2(n-1) x S in all, through it, so t >= 2(n-1)S/C and busbw =
	// S/t x 2(n-1)/n <= C/n: ranks sharing a host share its copy budget.
	ceiling := initiatorBaseline(b, engine.Write, 4)

	n := *benchRanks
	cfg := Config{Slots: *benchSlots, SlotSize: int(slot), Timeout: time.Minute}
	protos := make([]string, n)
	for r := range protos {
		protos[r] = *benchProtocol
	}
	c := newClusterOver(b, meta.NewMemory(), n, n, cfg, protos)
	// The data lives in registered memory, as tensors do: collectives
	// send from it and reduce into it without staging copies.
	data := make([][]float32, n)
	for r := range data {
		m, err := c.engines[r].RegisterMemory(ctx, int(size), "cpu:0", false)
		if err != nil {
			b.Fatal(err)
		}
		data[r] = typed[float32](m.Bytes())
		for i := range data[r] {
			data[r][i] = float32(r + i%7)
		}
	}
	// Warm up: lanes dialled, staging buffers registered and faulted in.
	c.each(func(r int, g *Group) error { return AllReduceOf(ctx, g, data[r], Sum) })
	var best time.Duration
	for b.Loop() {
		start := time.Now()
		for range *benchIters {
			c.each(func(r int, g *Group) error { return AllReduceOf(ctx, g, data[r], Sum) })
		}
		if d := time.Since(start) / time.Duration(*benchIters); best == 0 || d < best {
			best = d
		}
	}
	algbw := float64(size) / best.Seconds()
	busbw := algbw * 2 * float64(n-1) / float64(n)
	b.ReportMetric(busbw/1e9, "busbw_GB/s")
	b.ReportMetric(busbw/baseline[engine.Read], "x_initiator_read")
	b.ReportMetric(busbw/baseline[engine.Write], "x_initiator_write")
	fmt.Printf("\n| measure (same run, loopback TCP) | GB/s | ratio |\n|---|---|---|\n")
	fmt.Printf("| mc bench initiator, 1 thread, 1 MiB, read | %.2f | 1 |\n", baseline[engine.Read]/1e9)
	fmt.Printf("| mc bench initiator, 1 thread, 1 MiB, write | %.2f | |\n", baseline[engine.Write]/1e9)
	fmt.Printf("| all_reduce %d ranks %s float32 sum, engines under %s: algbw (%.1f ms) | %.2f | |\n", n, bench.FormatSize(size), *benchProtocol, best.Seconds()*1e3, algbw/1e9)
	fmt.Printf("| all_reduce busbw | %.2f | %.2fx read, %.2fx write |\n", busbw/1e9, busbw/baseline[engine.Read], busbw/baseline[engine.Write])
	fmt.Printf("| host loopback ceiling: initiator, 4 threads, write | %.2f | |\n", ceiling/1e9)
	fmt.Printf("| busbw bound on one host (ceiling / %d ranks) | %.2f | %.2fx read |\n\n", n, ceiling/float64(n)/1e9, ceiling/float64(n)/baseline[engine.Read])
}

func initiatorBaseline(b *testing.B, op engine.Opcode, threads int) float64 {
	ctx := context.Background()
	const bs, batch = 1 << 20, 128
	res, err := bench.RunLoopback(ctx, engine.Config{LocalServerName: "coll-bench"}, bench.InitiatorConfig{Op: op,
		BatchSize: batch, BlockSizes: []int64{bs}, BufferSize: int64(bs * batch * threads), Duration: *benchDuration, Threads: threads})
	if err != nil {
		b.Fatal(err)
	}
	return res[0].BytesPerSec
}

// BenchmarkAllReduceSmall is the latency of an 8-byte all-reduce of 4
// ranks (the direct algorithm: one message to every peer).
func BenchmarkAllReduceSmall(b *testing.B) {
	ctx := context.Background()
	c := newCluster(b, meta.NewMemory(), 4, 4, Config{Timeout: time.Minute})
	c.each(func(r int, g *Group) error { return AllReduceOf(ctx, g, []float32{1, 2}, Sum) })
	for b.Loop() {
		c.each(func(r int, g *Group) error { return AllReduceOf(ctx, g, []float32{1, 2}, Sum) })
	}
}

// BenchmarkPingPong is a round trip of 8-byte Send/Recv between two ranks.
func BenchmarkPingPong(b *testing.B) {
	ctx := context.Background()
	c := newCluster(b, meta.NewMemory(), 2, 2, Config{Timeout: time.Minute})
	buf := [][]byte{make([]byte, 8), make([]byte, 8)}
	done := make(chan error, 1) // the responder ends when the cluster closes
	go func() {
		for {
			if err := c.groups[1].Recv(ctx, buf[1], 0); err != nil {
				done <- err
				return
			}
			if err := c.groups[1].Send(ctx, buf[1], 0); err != nil {
				done <- err
				return
			}
		}
	}()
	for b.Loop() {
		if err := c.groups[0].Send(ctx, buf[0], 1); err != nil {
			b.Fatal(err)
		}
		if err := c.groups[0].Recv(ctx, buf[0], 1); err != nil {
			b.Fatal(err)
		}
	}
}
