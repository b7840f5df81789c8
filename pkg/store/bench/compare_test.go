package bench

import (
	"bufio"
	"cmp"
	"context"
	"encoding/csv"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine"
	ebench "github.com/kvcache-ops/mc/pkg/engine/bench"
)

var (
	cmpDuration    = flag.Duration("compare.duration", 4*time.Second, "BenchmarkStoreVsRedisVsEngine: time per measurement")
	cmpConcurrency = flag.Int("compare.concurrency", 16, "BenchmarkStoreVsRedisVsEngine: mc callers and engine threads (16, as many as redis-benchmark's clients)")
	cmpRedisConns  = flag.Int("compare.redis-clients", 16, "BenchmarkStoreVsRedisVsEngine: redis-benchmark clients")
	cmpRounds      = flag.Int("compare.rounds", 3, "BenchmarkStoreVsRedisVsEngine: rounds per case (medians are printed)")
	cmpCases       = flag.String("compare.cases", "4K/get/32,1M/get/1,16M/get/1,1M/put/1", "BenchmarkStoreVsRedisVsEngine: size/op/batch cases")
)

type cmpCase struct {
	size  int64
	op    string
	batch int
}

func parseCases(s string) ([]cmpCase, error) {
	var out []cmpCase
	for _, c := range strings.Split(s, ",") {
		f := strings.Split(c, "/")
		if len(f) != 3 {
			return nil, fmt.Errorf("case %q: want size/op/batch", c)
		}
		size, err := ebench.ParseSize(f[0])
		if err != nil {
			return nil, err
		}
		b, err := strconv.Atoi(f[2])
		if err != nil || b < 1 || (f[1] != "get" && f[1] != "put") {
			return nil, fmt.Errorf("case %q: want size/get|put/batch", c)
		}
		out = append(out, cmpCase{size, f[1], b})
	}
	return out, nil
}

// BenchmarkStoreVsRedisVsEngine is issue 11's comparison (make
// bench-store): on loopback, in one run, mc's store (embedded master and
// node, a separate client engine, --concurrency callers) against the
// transfer engine alone (mc bench initiator's loop, as many threads, same
// block size and batch) and against Redis (redis-server on a free
// loopback port, redis-benchmark -t set,get with the same value size,
// 16 clients, pipelining equal to the batch). Each measurement runs for
// -compare.duration; run with -benchtime 1x.
func BenchmarkStoreVsRedisVsEngine(b *testing.B) {
	cases, err := parseCases(*cmpCases)
	if err != nil {
		b.Fatal(err)
	}
	if *cmpRounds < 1 {
		b.Fatalf("-compare.rounds %d: want at least 1", *cmpRounds)
	}
	ctx := context.Background()
	redis, err := startRedis(b)
	if err != nil {
		b.Fatalf("redis baseline: %v (make bench-store installs redis-server)", err)
	}
	var rows []string
	for _, c := range cases {
		name := fmt.Sprintf("%s-%s-b%d", ebench.FormatSize(c.size), c.op, c.batch)
		b.Run(name, func(b *testing.B) {
			// The same working set as the engine's loop (each thread
			// reads its own batch of blocks over and over; redis-benchmark
			// without -r reads one key): otherwise mc alone would pay
			// for cache misses over 256 MiB and the ratio would measure
			// DRAM rather than the store.
			// Rounds of mc, engine and redis in turn, each ratio taken
			// within its round and the median reported: the speed of a
			// shared machine drifts more between minutes than within one.
			var ms []Result
			var engs, rpss, toEng, toRedis []float64
			for range *cmpRounds {
				mc, err := Run(ctx, Config{ValueSizes: []int64{c.size}, Ops: []string{c.op}, Concurrency: []int{*cmpConcurrency},
					Keys: *cmpConcurrency * c.batch, Batch: c.batch, Duration: *cmpDuration, SegmentSize: 4 << 30, Logger: quietLog()})
				if err != nil {
					b.Fatal(err)
				}
				eng, err := engineBaseline(ctx, c)
				if err != nil {
					b.Fatal(err)
				}
				rps, err := redis.bench(c)
				if err != nil {
					b.Fatal(err)
				}
				ms, engs, rpss = append(ms, mc[0]), append(engs, eng), append(rpss, rps)
				toEng = append(toEng, mc[0].GBPerSec/eng)
				toRedis = append(toRedis, mc[0].GBPerSec/(rps*float64(c.size)/1e9))
			}
			slices.SortFunc(ms, func(x, y Result) int { return cmp.Compare(x.GBPerSec, y.GBPerSec) })
			m, eng, rps := ms[len(ms)/2], median(engs), median(rpss)
			redisGB := rps * float64(c.size) / 1e9
			b.ReportMetric(m.GBPerSec, "mc-GB/s")
			b.ReportMetric(eng, "engine-GB/s")
			b.ReportMetric(redisGB, "redis-GB/s")
			rows = append(rows, fmt.Sprintf("| %-4s | %-3s | %5d | %9.0f | %7.2f | %11.2f | %9.0f | %10.2f | %9.2f | %8.2f |",
				ebench.FormatSize(c.size), c.op, c.batch, m.OpsPerSec, m.GBPerSec, eng, rps, redisGB, median(toEng), median(toRedis)))
		})
	}
	if len(rows) > 0 {
		fmt.Printf("\nloopback; mc: %d callers, engine: %d threads, redis: %d clients; batch = redis pipeline depth; %s per measurement, median of %d rounds (ratios taken within each round); GB = 1e9 B\n"+
			"working set: mc gets read callers x batch keys, the engine's threads x batch blocks, redis one key\n"+
			"| size | op  | batch |  mc ops/s | mc GB/s | engine GB/s | redis ops/s | redis GB/s | mc/engine | mc/redis |\n"+
			"|------|-----|-------|-----------|---------|-------------|-------------|------------|-----------|----------|\n%s\n",
			*cmpConcurrency, *cmpConcurrency, *cmpRedisConns, *cmpDuration, *cmpRounds, strings.Join(rows, "\n"))
	}
}

// engineBaseline is mc bench initiator's loop against an embedded
// loopback target: same block size, batch and parallelism, read for gets
// and write for puts.
func engineBaseline(ctx context.Context, c cmpCase) (float64, error) {
	threads := *cmpConcurrency
	op := engine.Read
	if c.op == "put" {
		op = engine.Write
	}
	res, err := ebench.RunLoopback(ctx, engine.Config{LocalServerName: "bench"}, ebench.InitiatorConfig{Op: op, BatchSize: c.batch,
		BlockSizes: []int64{c.size}, BufferSize: c.size * int64(c.batch) * int64(threads), Duration: *cmpDuration, Threads: threads})
	if err != nil {
		return 0, err
	}
	return res[0].BytesPerSec / 1e9, nil
}

type redisServer struct{ port int }

// startRedis runs redis-server on a free loopback port, without
// persistence, until the benchmark ends.
func startRedis(b *testing.B) (*redisServer, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, err
	}
	if _, err := exec.LookPath("redis-benchmark"); err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir := b.TempDir()
	cmd := exec.Command(bin, "--bind", "127.0.0.1", "--port", strconv.Itoa(port), "--save", "", "--appendonly", "no",
		"--dir", dir, "--protected-mode", "yes", "--daemonize", "no", "--loglevel", "warning")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	for i := 0; i < 100; i++ {
		if c, err := net.Dial("tcp", l.Addr().String()); err == nil {
			fmt.Fprintf(c, "PING\r\n")
			line, _ := bufio.NewReader(c).ReadString('\n')
			c.Close()
			if strings.HasPrefix(line, "+PONG") {
				return &redisServer{port: port}, nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil, fmt.Errorf("redis-server on 127.0.0.1:%d did not answer PING", port)
}

// bench runs redis-benchmark -t set,get and returns the requests per
// second of the GET (or SET, for puts) test. The request count is sized
// so the test runs about -compare.duration.
func (r *redisServer) bench(c cmpCase) (float64, error) {
	// A calibration run of 1 s worth at a guessed rate, then the real one.
	guess := max(2e9/float64(c.size), 100)
	n := int(guess * cmpDuration.Seconds())
	rps, err := r.run(c, max(n/4, 50))
	if err != nil {
		return 0, err
	}
	return r.run(c, max(int(rps*cmpDuration.Seconds()), 50))
}

func (r *redisServer) run(c cmpCase, n int) (float64, error) {
	args := []string{"-h", "127.0.0.1", "-p", strconv.Itoa(r.port), "-t", "set,get", "-d", strconv.FormatInt(c.size, 10),
		"-c", strconv.Itoa(*cmpRedisConns), "-P", strconv.Itoa(c.batch), "-n", strconv.Itoa(n), "--csv"}
	out, err := exec.Command("redis-benchmark", args...).Output()
	if err != nil {
		return 0, fmt.Errorf("redis-benchmark %s: %w", strings.Join(args, " "), err)
	}
	want := "GET"
	if c.op == "put" {
		want = "SET"
	}
	recs, err := csv.NewReader(strings.NewReader(string(out))).ReadAll()
	if err != nil {
		return 0, fmt.Errorf("redis-benchmark output: %w", err)
	}
	for _, rec := range recs {
		if len(rec) >= 2 && rec[0] == want {
			return strconv.ParseFloat(rec[1], 64)
		}
	}
	return 0, fmt.Errorf("redis-benchmark printed no %s line: %q", want, out)
}

func quietLog() *slog.Logger {
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func engineLoopback() engine.Config {
	return engine.Config{BindAddress: "127.0.0.1", HandshakeAddr: "127.0.0.1:0"}
}

func median(v []float64) float64 {
	v = slices.Clone(v)
	slices.Sort(v)
	return v[len(v)/2]
}
