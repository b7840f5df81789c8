package bench

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine"
)

var (
	compareDuration = flag.Duration("compare.duration", 3*time.Second, "BenchmarkTCPvsStream: duration of each measurement")
	compareSizes    = flag.String("compare.sizes", "4K,64K,1M", "BenchmarkTCPvsStream: block sizes")
	compareOp       = flag.String("compare.op", "read", "BenchmarkTCPvsStream: read or write")
	compareLanes    = flag.Int("compare.lanes", 0, "BenchmarkTCPvsStream: TCP lanes per peer (0: engine default)")
	ceilingSizes    = flag.String("compare.ceiling-sizes", "64K,256K,1M", "BenchmarkTCPvsStream: write sizes of the plain stream; the best is the ceiling")
	compareRounds   = flag.Int("compare.rounds", 5, "BenchmarkTCPvsStream: rounds per block size, each a stream and an engine run (the median engine run is printed)")
)

// streamCeiling is the most one loopback connection carries: the best
// plain stream over the write sizes tried. Comparing a 4 KiB engine run
// with a stream writing 4 KiB per call would measure syscalls, not the
// connection.
func streamCeiling(b *testing.B, d time.Duration) (best float64, at int64) {
	sizes, err := ParseSizeList(*ceilingSizes)
	if err != nil {
		b.Fatal(err)
	}
	for _, s := range sizes {
		bps, err := StreamThroughput(context.Background(), s, d)
		if err != nil {
			b.Fatal(err)
		}
		if bps > best {
			best, at = bps, s
		}
	}
	return best, at
}

// BenchmarkTCPvsStream is the transport's performance check (make
// bench-tcp): on loopback, 1 thread, batch 128, the engine's throughput at
// each block size against the ceiling of one loopback connection (the
// best plain Go stream at any write size, streamCeiling), measured in the
// same run. Each measurement runs for -compare.duration regardless of
// b.N; run it with -benchtime 1x.
func BenchmarkTCPvsStream(b *testing.B) {
	sizes, err := ParseSizeList(*compareSizes)
	if err != nil {
		b.Fatal(err)
	}
	op := engine.Read
	if *compareOp == "write" {
		op = engine.Write
	}
	ctx := context.Background()
	ceiling, ceilingAt := streamCeiling(b, *compareDuration)
	var rows []row
	if *compareRounds < 1 {
		b.Fatalf("-compare.rounds %d: want at least 1", *compareRounds)
	}
	for _, bs := range sizes {
		b.Run(FormatSize(bs), func(b *testing.B) {
			var runs []row
			for range *compareRounds {
				// The ceiling again next to each engine run, so that a
				// change in the machine's load during the run cannot
				// flatter a row: every ratio is against the best stream
				// seen in the whole run.
				again, err := StreamThroughput(ctx, ceilingAt, *compareDuration)
				if err != nil {
					b.Fatal(err)
				}
				ceiling = max(ceiling, again)
				runs = append(runs, engineRun(b, ctx, op, bs))
			}
			slices.SortFunc(runs, func(x, y row) int { return cmp.Compare(x.res.BytesPerSec, y.res.BytesPerSec) })
			r := runs[len(runs)/2]
			b.ReportMetric(r.res.BytesPerSec/1e9, "mc-GB/s")
			b.ReportMetric(r.res.IOPS, "mc-IOPS")
			b.ReportMetric(r.cpuPerGB, "cpu-s/GB")
			rows = append(rows, r)
		})
	}
	if len(rows) == 0 {
		return
	}
	var lines []string
	for _, r := range rows {
		lines = append(lines, fmt.Sprintf("| %-6s | %-5s | %12.2f | %7.2f | %8.0f | %5.2f | %11.2f |",
			FormatSize(r.bs), r.res.Operation, ceiling/1e9, r.res.BytesPerSec/1e9, r.res.IOPS, r.res.BytesPerSec/ceiling, r.cpuPerGB))
	}
	fmt.Printf("\nloopback, 1 thread, batch 128, %s per measurement, median of %d rounds, GB = 1e9 B; ceiling: the best plain stream of the run (write sizes %s, best at %s, measured again before each engine run); cpu: both ends\n| block  | op    | ceiling GB/s | mc GB/s |  mc IOPS | ratio | mc cpu-s/GB |\n|--------|-------|--------------|---------|----------|-------|-------------|\n%s\n",
		*compareDuration, *compareRounds, *ceilingSizes, FormatSize(ceilingAt), strings.Join(lines, "\n"))
}

type row struct {
	bs       int64
	res      Result
	cpuPerGB float64 // both ends, this process: robust to a busy machine
}

// engineRun is one engine measurement for BenchmarkTCPvsStream: a fresh
// loopback target and initiator, 1 thread, batch 128.
func engineRun(b *testing.B, ctx context.Context, op engine.Opcode, bs int64) row {
	cpu0 := processCPU()
	res, err := RunLoopback(ctx, engine.Config{LocalServerName: "bench", TCPLanes: *compareLanes}, InitiatorConfig{Op: op,
		BatchSize: 128, BlockSizes: []int64{bs}, BufferSize: bs * 128, Duration: *compareDuration, Threads: 1})
	if err != nil {
		b.Fatal(err)
	}
	return row{bs, res[0], (processCPU() - cpu0).Seconds() / (float64(res[0].Bytes) / 1e9)}
}

// processCPU is the user+system CPU time this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
