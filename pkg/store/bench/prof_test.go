package bench

import (
	"context"
	"flag"
	"testing"
	"time"

	ebench "github.com/kvcache-ops/mc/pkg/engine/bench"
)

var (
	profCase = flag.String("prof.case", "1M/put/1", "BenchmarkStoreCase: size/op/batch")
	profKeys = flag.Int("prof.keys", 0, "BenchmarkStoreCase: keys gets read from (0: auto)")
)

// BenchmarkStoreCase runs one mc bench store row (for profiling with
// -cpuprofile: master, node and client are all in this process).
func BenchmarkStoreCase(b *testing.B) {
	cs, err := parseCases(*profCase)
	if err != nil {
		b.Fatal(err)
	}
	c := cs[0]
	res, err := Run(context.Background(), Config{ValueSizes: []int64{c.size}, Ops: []string{c.op}, Concurrency: []int{*cmpConcurrency},
		Keys: *profKeys, Batch: c.batch, Duration: *cmpDuration, SegmentSize: 4 << 30, Logger: quietLog()})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(res[0].GBPerSec, "GB/s")
	b.ReportMetric(res[0].OpsPerSec, "ops/s")
	b.Logf("%s: %+v", ebench.FormatSize(c.size), res[0])
	_ = time.Second
}
