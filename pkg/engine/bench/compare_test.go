package bench

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine"
)

var (
	compareDuration = flag.Duration("compare.duration", 3*time.Second, "BenchmarkTCPvsStream: duration of each measurement")
	compareSizes    = flag.String("compare.sizes", "4K,64K,1M", "BenchmarkTCPvsStream: block sizes")
	compareOp       = flag.String("compare.op", "read", "BenchmarkTCPvsStream: read or write")
	compareLanes    = flag.Int("compare.lanes", 0, "BenchmarkTCPvsStream: TCP lanes per peer (0: engine default)")
)

// BenchmarkTCPvsStream is issue 3's performance check (make bench-tcp): on
// loopback, 1 thread, batch 128, the engine's throughput against a plain
// Go stream over one persistent TCP connection at the same block size,
// both measured in this run. Each size runs for -compare.duration
// regardless of b.N; run it with -benchtime 1x.
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
	var rows []string
	for _, bs := range sizes {
		b.Run(FormatSize(bs), func(b *testing.B) {
			ceiling, err := StreamThroughput(ctx, bs, *compareDuration)
			if err != nil {
				b.Fatal(err)
			}
			span := bs * 128
			cfg := engine.Config{LocalServerName: "bench", TCPLanes: *compareLanes}
			tgt, err := StartLoopbackTarget(ctx, cfg, span)
			if err != nil {
				b.Fatal(err)
			}
			defer tgt.Close()
			cfg.BindAddress, cfg.HandshakeAddr = "127.0.0.1", "127.0.0.1:0"
			e, err := engine.New(ctx, cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close()
			res, err := Run(ctx, InitiatorConfig{Engine: e, Segment: tgt.Engine.SegmentName(), Op: op,
				BatchSize: 128, BlockSizes: []int64{bs}, BufferSize: span, Duration: *compareDuration, Threads: 1})
			if err != nil {
				b.Fatal(err)
			}
			r := res[0]
			ratio := r.BytesPerSec / ceiling
			b.ReportMetric(ceiling/1e9, "stream-GB/s")
			b.ReportMetric(r.BytesPerSec/1e9, "mc-GB/s")
			b.ReportMetric(r.IOPS, "mc-IOPS")
			b.ReportMetric(ratio, "ratio")
			rows = append(rows, fmt.Sprintf("| %-6s | %-5s | %11.2f | %7.2f | %8.0f | %5.2f |",
				FormatSize(bs), r.Operation, ceiling/1e9, r.BytesPerSec/1e9, r.IOPS, ratio))
		})
	}
	if len(rows) > 0 {
		fmt.Printf("\nloopback, 1 thread, batch 128, %s per measurement, GB = 1e9 B\n| block  | op    | stream GB/s | mc GB/s |  mc IOPS | ratio |\n|--------|-------|-------------|---------|----------|-------|\n%s\n",
			*compareDuration, strings.Join(rows, "\n"))
	}
}
