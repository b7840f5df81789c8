//go:build linux

package bench

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvcache-ops/mc/pkg/engine"
)

var (
	shmThreads = flag.String("shm.threads", "1,2", "BenchmarkSHMvsMemcpy: thread counts")
	shmBlock   = flag.String("shm.block", "1M", "BenchmarkSHMvsMemcpy: block size")
)

// BenchmarkSHMvsMemcpy is the same-host transport's performance check
// (make bench-shm): batch 128 of -shm.block, read and write, per thread
// count, from an initiator with --protocol shm to a target in another
// process (this test binary again, --protocol auto), warmed up once
// (warmInitiator), against an
// in-process memcpy of the same blocks by as many goroutines, with the
// same target over loopback TCP beside it, all in the same run. Each
// measurement runs -compare.duration, -compare.rounds times interleaved;
// medians are printed. Use -benchtime 1x.
func BenchmarkSHMvsMemcpy(b *testing.B) {
	bs, err := ParseSize(*shmBlock)
	if err != nil {
		b.Fatal(err)
	}
	var threads []int
	for _, f := range strings.Split(*shmThreads, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			b.Fatalf("-shm.threads %q: want a comma list of positive counts", *shmThreads)
		}
		threads = append(threads, n)
	}
	if *compareRounds < 1 {
		b.Fatalf("-compare.rounds %d: want at least 1", *compareRounds)
	}
	const batch = 128
	ctx := context.Background()
	tgt := startChildTargetProtocol(b, bs*batch*int64(slices.Max(threads)), engine.ProtocolAuto)
	var rows []string
	for _, op := range []engine.Opcode{engine.Read, engine.Write} {
		for _, th := range threads {
			b.Run(fmt.Sprintf("%s/%d-threads", opName(op), th), func(b *testing.B) {
				shmEng := warmInitiator(b, ctx, engine.ProtocolSHM, tgt.segment, op, th, bs, batch)
				tcpEng := warmInitiator(b, ctx, "tcp", tgt.segment, op, th, bs, batch)
				src, dst := memcpyBuffers(b, int(bs)*batch*th)
				var mem, viaSHM, viaTCP []float64
				for range *compareRounds {
					mem = append(mem, memcpyThroughput(src, dst, th, bs, batch, *compareDuration))
					viaSHM = append(viaSHM, engineThroughput(b, ctx, shmEng, engine.ProtocolSHM, tgt.segment, op, th, bs, batch, *compareDuration))
					viaTCP = append(viaTCP, engineThroughput(b, ctx, tcpEng, "tcp", tgt.segment, op, th, bs, batch, *compareDuration))
				}
				m, s, t := median(mem), median(viaSHM), median(viaTCP)
				b.ReportMetric(s/1e9, "shm-GB/s")
				b.ReportMetric(m/1e9, "memcpy-GB/s")
				b.ReportMetric(t/1e9, "tcp-GB/s")
				rows = append(rows, fmt.Sprintf("| %-5s | %7d | %11.2f | %8.2f | %10.2f | %8.2f | %7.1f |",
					opName(op), th, m/1e9, s/1e9, s/m, t/1e9, s/t))
			})
		}
	}
	if len(rows) > 0 {
		fmt.Printf("\n%s blocks, batch 128, target in another process, %s per measurement, median of %d interleaved rounds, GB = 1e9 B\n| op    | threads | memcpy GB/s | shm GB/s | shm/memcpy | tcp GB/s | shm/tcp |\n|-------|---------|-------------|----------|------------|----------|---------|\n%s\n",
			FormatSize(bs), *compareDuration, *compareRounds, strings.Join(rows, "\n"))
	}
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.SortFunc(s, cmp.Compare)
	return s[len(s)/2]
}

// warmInitiator starts an initiator engine of protocol (shm: the
// target's memory mapped; tcp: loopback) for the whole sub-benchmark,
// holds the segment open so that every run shares one mapping (and tcp
// its connections), and runs once unmeasured: the first touch of each
// page of a fresh mapping is a page-table fault, paid once per mapping,
// as the memcpy baseline's buffers are touched before they are timed.
func warmInitiator(b *testing.B, ctx context.Context, protocol, segment string, op engine.Opcode, threads int, bs int64, batch int) *engine.Engine {
	b.Helper()
	e, err := engine.New(ctx, engine.Config{LocalServerName: "bench", BindAddress: "127.0.0.1", HandshakeAddr: "127.0.0.1:0", Protocol: protocol})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { e.Close() })
	seg, err := e.OpenSegment(ctx, segment)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { seg.Close() })
	engineThroughput(b, ctx, e, protocol, segment, op, threads, bs, batch, time.Second)
	return e
}

// engineThroughput is one initiator run of e against segment, checked to
// have moved the bytes over protocol.
func engineThroughput(b *testing.B, ctx context.Context, e *engine.Engine, protocol, segment string, op engine.Opcode, threads int, bs int64, batch int, d time.Duration) float64 {
	b.Helper()
	res, err := Run(ctx, InitiatorConfig{Engine: e, Segment: segment, Op: op, BatchSize: batch, BlockSizes: []int64{bs},
		BufferSize: bs * int64(batch*threads), Duration: d, Threads: threads})
	if err != nil {
		b.Fatal(err)
	}
	if res[0].Transport != protocol {
		b.Fatalf("run with --protocol %s moved bytes over %q", protocol, res[0].Transport)
	}
	return res[0].BytesPerSec
}

// memcpyBuffers are the baseline's two buffers of span bytes: anonymous
// mappings, as the engine registers local memory, touched before use.
func memcpyBuffers(b *testing.B, span int) (src, dst []byte) {
	b.Helper()
	var bufs [2][]byte
	for i := range bufs {
		m, err := unix.Mmap(-1, 0, span, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { unix.Munmap(m) })
		FillPattern(m, 0, uint64(i))
		bufs[i] = m
	}
	return bufs[0], bufs[1]
}

// memcpyThroughput is the baseline: threads goroutines, each copying its
// batch of blocks (the bench loop's layout, block i of thread tid at
// bs*(i*threads+tid)) from src to dst, batch after batch, for d.
func memcpyThroughput(src, dst []byte, threads int, bs int64, batch int, d time.Duration) float64 {
	var stop atomic.Bool
	var batches atomic.Uint64
	var wg sync.WaitGroup
	start := time.Now()
	for tid := range threads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				for i := range batch {
					off := int(bs) * (i*threads + tid)
					copy(dst[off:off+int(bs)], src[off:off+int(bs)])
				}
				batches.Add(1)
			}
		}()
	}
	time.Sleep(d)
	stop.Store(true)
	wg.Wait()
	return float64(batches.Load()) * float64(batch) * float64(bs) / time.Since(start).Seconds()
}
