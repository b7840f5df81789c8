package bench

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine"
	ebench "github.com/kvcache-ops/mc/pkg/engine/bench"
)

var (
	tierDir      = flag.String("tier.dir", "", "BenchmarkTier: directory of the disk tier and the disk-read file (default: a new one under $TMPDIR, which must be on the disk to measure)")
	tierDuration = flag.Duration("tier.duration", 3*time.Second, "BenchmarkTier: time per measurement")
	tierRounds   = flag.Int("tier.rounds", 3, "BenchmarkTier: rounds per case (medians are printed)")
	// auto, as mc bench store's default: the benchmark client is on the
	// node's host, so the engine moves the staged bytes through shared
	// memory; tcp measures loopback TCP instead.
	tierProtocol = flag.String("tier.protocol", "auto", "BenchmarkTier: the transport of the on-disk gets (auto: shared memory with the node on this host, or tcp)")
)

// BenchmarkTier is issue 23's benchmark (make bench-store-tier), in one
// run on loopback:
//   - gets of 1 MiB and 16 MiB objects that live only on a node's disk
//     tier, against the disk's own throughput: O_DIRECT reads of the same
//     size and concurrency from a file in the same directory into huge
//     pages, half just before the gets and half just after (goal 0.7x);
//   - gets of DRAM-resident objects from a store whose node has a disk
//     tier against one without (goal 0.95x);
//   - a writer's puts into DRAM while 4 readers scan objects only on
//     disk, against its puts alone (issue 36, goal 0.8x).
//
// Each case runs -tier.rounds rounds, each ratio taken within its round
// and the median printed. Run with -benchtime 1x.
func BenchmarkTier(b *testing.B) {
	dir := *tierDir
	if dir == "" {
		dir = b.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	type ondisk struct {
		size int64
		conc int
		keys int
	}
	var diskRows []string
	// Keys: the default (2 GiB of values), so that the keys come round
	// slower than a staging copy's lease even when the gets run at the
	// speed of memory (a row where they do not is refused).
	for _, c := range []ondisk{{1 << 20, 1, 0}, {1 << 20, 4, 0}, {16 << 20, 1, 0}, {16 << 20, 4, 0}} {
		b.Run(fmt.Sprintf("ondisk-%s-c%d", ebench.FormatSize(c.size), c.conc), func(b *testing.B) {
			var disk, get, ratio []float64
			for round := range *tierRounds {
				sub := fmt.Sprintf("%s/ondisk-%d-%d-%d", dir, c.size, c.conc, round)
				if err := os.MkdirAll(sub, 0o755); err != nil {
					b.Fatal(err)
				}
				res, err := Run(ctx, Config{ValueSizes: []int64{c.size}, Ops: []string{"get"}, Concurrency: []int{c.conc},
					Keys: c.keys, Duration: *tierDuration, SegmentSize: 1 << 30, SSDDir: sub, SSDSize: 4 << 30, OnDisk: true,
					Engine: engine.Config{Protocol: *tierProtocol}, Logger: quietLog()})
				os.RemoveAll(sub)
				if err != nil {
					b.Fatal(err)
				}
				if len(res) != 2 || res[1].Errors > 0 {
					b.Fatalf("round %d: %+v", round, res)
				}
				disk, get, ratio = append(disk, res[0].GBPerSec), append(get, res[1].GBPerSec), append(ratio, res[1].VsDisk)
			}
			b.ReportMetric(median(get), "get-GB/s")
			b.ReportMetric(median(disk), "disk-GB/s")
			diskRows = append(diskRows, fmt.Sprintf("| %s | %d | %.2f | %.2f | %.2f | %s |", ebench.FormatSize(c.size), c.conc, median(disk), median(get), median(ratio), rounds(ratio)))
		})
	}
	type dram struct {
		size  int64
		conc  int
		batch int
	}
	var dramRows []string
	for _, c := range []dram{{4 << 10, 4, 32}, {1 << 20, 1, 1}, {1 << 20, 4, 1}} {
		b.Run(fmt.Sprintf("dram-%s-c%d-b%d", ebench.FormatSize(c.size), c.conc, c.batch), func(b *testing.B) {
			var off, on, ratio []float64
			for round := range *tierRounds {
				cfg := Config{ValueSizes: []int64{c.size}, Ops: []string{"get"}, Concurrency: []int{c.conc}, Batch: c.batch,
					Keys: c.conc * c.batch, Duration: *tierDuration, SegmentSize: 1 << 30, Logger: quietLog()}
				a, err := Run(ctx, cfg)
				if err != nil {
					b.Fatal(err)
				}
				sub := fmt.Sprintf("%s/dram-%d-%d", dir, c.size, round)
				os.MkdirAll(sub, 0o755)
				cfg.SSDDir, cfg.SSDSize = sub, 1<<30
				t, err := Run(ctx, cfg)
				os.RemoveAll(sub)
				if err != nil {
					b.Fatal(err)
				}
				off, on, ratio = append(off, a[0].GBPerSec), append(on, t[0].GBPerSec), append(ratio, t[0].GBPerSec/a[0].GBPerSec)
			}
			dramRows = append(dramRows, fmt.Sprintf("| %s | %d | %d | %.2f | %.2f | %.2f | %s |", ebench.FormatSize(c.size), c.conc, c.batch, median(off), median(on), median(ratio), rounds(ratio)))
		})
	}
	// Issue 36's mixed row: a writer upserting 1 MiB values into DRAM
	// (64 keys in turn), alone and while 4 readers scan 256 objects of
	// 1 MiB that live only on disk (goal: the writer keeps >= 0.8x its
	// rate alone).
	var scanRows []string
	b.Run("scan-while-put-1M-r4", func(b *testing.B) {
		sub := fmt.Sprintf("%s/scan", dir)
		if err := os.MkdirAll(sub, 0o755); err != nil {
			b.Fatal(err)
		}
		defer os.RemoveAll(sub)
		rs, err := ScanWhilePut(ctx, ScanConfig{Dir: sub, PutSize: 1 << 20, PutKeys: 64, ScanSize: 1 << 20, ScanKeys: 256, Readers: 4,
			Duration: *tierDuration, Rounds: *tierRounds, Engine: engine.Config{Protocol: *tierProtocol}, Logger: quietLog()})
		if err != nil {
			b.Fatal(err)
		}
		var alone, scan, gets, ratio []float64
		errs := 0
		for _, r := range rs {
			alone, scan, gets, ratio = append(alone, r.AlonePuts), append(scan, r.ScanPuts), append(gets, r.ScanGets), append(ratio, r.ScanPuts/r.AlonePuts)
			errs += r.GetErrors
		}
		b.ReportMetric(median(ratio), "put-ratio")
		scanRows = append(scanRows, fmt.Sprintf("| 1M | 4 | %.0f | %.0f | %.0f | %d | %.2f | %s |", median(alone), median(scan), median(gets), errs, median(ratio), rounds(ratio)))
	})
	if len(scanRows) > 0 {
		fmt.Printf("\na writer's 1 MiB upserts into DRAM, alone vs while readers scan objects only on disk; %s per phase, median of %d rounds\n"+
			"| size | readers | puts/s alone | puts/s with scan | scan gets/s | get errors | with/alone | each round |\n|---|---|---|---|---|---|---|---|\n%s\n",
			*tierDuration, *tierRounds, strings.Join(scanRows, "\n"))
	}
	if len(diskRows) > 0 {
		fmt.Printf("\ngets of objects only on disk vs the disk's own O_DIRECT reads (same size, concurrency, directory); %s per measurement, median of %d rounds; GB = 1e9 B\n"+
			"| size | concurrency | disk O_DIRECT GB/s | get from disk GB/s | get/disk | each round |\n|---|---|---|---|---|---|\n%s\n",
			*tierDuration, *tierRounds, strings.Join(diskRows, "\n"))
	}
	if len(dramRows) > 0 {
		fmt.Printf("\nDRAM-resident gets, store without vs with a disk tier; %s per measurement, median of %d rounds\n"+
			"| size | concurrency | batch | no tier GB/s | tier GB/s | tier/no tier | each round |\n|---|---|---|---|---|---|---|\n%s\n",
			*tierDuration, *tierRounds, strings.Join(dramRows, "\n"))
	}
}

// rounds lists each round's ratio, in the order measured.
func rounds(r []float64) string {
	s := make([]string, len(r))
	for i, x := range r {
		s[i] = fmt.Sprintf("%.2f", x)
	}
	return strings.Join(s, ", ")
}
