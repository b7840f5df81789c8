package bench

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine"
)

// childTargetEnv makes the test binary run a loopback target (for
// BenchmarkAcceptPath), so the target's CPU time is its own process's.
const childTargetEnv = "MC_BENCH_CHILD_TARGET_BYTES"

// childProtocolEnv is the child target's engine protocol (auto for the
// same-host benchmark; tcp when empty).
const childProtocolEnv = "MC_BENCH_CHILD_PROTOCOL"

func TestMain(m *testing.M) {
	if v := os.Getenv(childTargetEnv); v != "" {
		os.Exit(runChildTarget(v))
	}
	os.Exit(m.Run())
}

// runChildTarget serves a loopback target, prints its segment name and
// serves until stdin closes.
func runChildTarget(size string) int {
	n, err := strconv.ParseInt(size, 10, 64)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	t, err := StartLoopbackTarget(context.Background(), engine.Config{Protocol: os.Getenv(childProtocolEnv)}, n)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	// MC_BENCH_CHILD_CPUPROFILE=file profiles the target (how the accept
	// path was tuned).
	if path := os.Getenv("MC_BENCH_CHILD_CPUPROFILE"); path != "" {
		if f, err := os.Create(path); err == nil {
			pprof.StartCPUProfile(f)
			defer pprof.StopCPUProfile()
		}
	}
	fmt.Println(t.Engine.SegmentName())
	bufio.NewReader(os.Stdin).ReadString('\n')
	t.Close()
	return 0
}

// childTarget is a target in another process.
type childTarget struct {
	cmd     *exec.Cmd
	stdin   interface{ Close() error }
	segment string
}

func startChildTarget(tb testing.TB, size int64) *childTarget {
	tb.Helper()
	return startChildTargetProtocol(tb, size, "")
}

func startChildTargetProtocol(tb testing.TB, size int64, protocol string) *childTarget {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childTargetEnv+"="+strconv.FormatInt(size, 10), childProtocolEnv+"="+protocol)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	seg, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		cmd.Process.Kill()
		tb.Fatalf("child target: %v", err)
	}
	c := &childTarget{cmd: cmd, stdin: in, segment: strings.TrimSpace(seg)}
	tb.Cleanup(func() { in.Close(); cmd.Wait() })
	return c
}

// cpu is the child's user+system CPU time so far, from /proc (clock
// ticks of 10 ms: runs of seconds keep the error small).
func (c *childTarget) cpu(tb testing.TB) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.cmd.Process.Pid))
	if err != nil {
		tb.Fatal(err)
	}
	// Fields after the parenthesised command name; utime and stime are
	// fields 14 and 15 of the line.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

var acceptSizes = flag.String("accept.sizes", "4K,64K", "BenchmarkAcceptPath: block sizes")

// BenchmarkAcceptPath (make bench-tcp) measures the CPU a target spends
// per task when the initiator opens a connection per request (Mooncake's
// default client), against the same target driven over persistent lanes
// in the same run: 1 thread, batch 128, read, the target in its own
// process. Each measurement runs -compare.duration; use -benchtime 1x.
func BenchmarkAcceptPath(b *testing.B) {
	sizes, err := ParseSizeList(*acceptSizes)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	var rows []string
	for _, bs := range sizes {
		b.Run(FormatSize(bs), func(b *testing.B) {
			span := bs * 128
			tgt := startChildTarget(b, span)
			perTask := map[bool]float64{}
			iops := map[bool]float64{}
			for _, perRequest := range []bool{false, true} {
				e, err := engine.New(ctx, engine.Config{LocalServerName: "bench", BindAddress: "127.0.0.1",
					HandshakeAddr: "127.0.0.1:0", TCPPerRequest: perRequest})
				if err != nil {
					b.Fatal(err)
				}
				before := tgt.cpu(b)
				res, err := Run(ctx, InitiatorConfig{Engine: e, Segment: tgt.segment, Op: engine.Read,
					BatchSize: 128, BlockSizes: []int64{bs}, BufferSize: span, Duration: *compareDuration, Threads: 1})
				used := tgt.cpu(b) - before
				e.Close()
				if err != nil {
					b.Fatal(err)
				}
				tasks := float64(res[0].BatchCount * 128)
				perTask[perRequest] = float64(used.Microseconds()) / tasks
				iops[perRequest] = res[0].IOPS
			}
			b.ReportMetric(perTask[true], "target-us/task")
			b.ReportMetric(perTask[false], "pooled-us/task")
			rows = append(rows, fmt.Sprintf("| %-5s | %14.1f | %9.0f | %11.1f | %9.0f | %5.2f |", FormatSize(bs),
				perTask[true], iops[true], perTask[false], iops[false], perTask[true]/perTask[false]))
		})
	}
	if len(rows) > 0 {
		fmt.Printf("\ntarget CPU per task, read, 1 thread, batch 128, %s per measurement\n| block | per-request µs | IOPS      | pooled µs   | IOPS      | ratio |\n|-------|----------------|-----------|-------------|-----------|-------|\n%s\n",
			*compareDuration, strings.Join(rows, "\n"))
	}
}
