package diag

import (
	"bufio"
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The log-scan benchmark compares the scanner with `grep -c evicted` on
// the same generated file in the same run (issue 6, item 8: at least half
// of grep's speed on one core). MC_DIAG_BENCH_MB sets the file size: 64 by
// default so `make bench` stays quick; 1024 for the figure in the README.
//
//	MC_DIAG_BENCH_MB=1024 go test ./pkg/diag -run '^$' -bench LogScanVsGrep -benchtime 1x
//
// The file lives in a temporary directory removed when the run ends.

var (
	benchOnce sync.Once
	benchDir  string
	benchPath string
	benchSize int64
	benchEv   int
	benchErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if benchDir != "" {
		os.RemoveAll(benchDir)
	}
	os.Exit(code)
}

func benchFile(b *testing.B) (string, int64, int) {
	benchOnce.Do(func() {
		mb := 64
		if s := os.Getenv("MC_DIAG_BENCH_MB"); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n <= 0 {
				benchErr = fmt.Errorf("MC_DIAG_BENCH_MB=%q: want a positive number of MB", s)
				return
			}
			mb = n
		}
		benchDir, benchErr = os.MkdirTemp("", "mc-diag-bench-")
		if benchErr != nil {
			return
		}
		benchPath = filepath.Join(benchDir, "te.INFO")
		benchSize, benchEv, benchErr = writeBenchLog(benchPath, int64(mb)<<20)
	})
	if benchErr != nil {
		b.Fatal(benchErr)
	}
	return benchPath, benchSize, benchEv
}

// writeBenchLog writes a deterministic log of about size bytes: mostly
// INFO noise of realistic length, with the catalogue mixed in at roughly
// the incident's density (one eviction per ~400 lines). It returns the
// size and how many eviction lines it wrote.
func writeBenchLog(path string, size int64) (int64, int, error) {
	f, err := os.Create(path)
	if err != nil {
		return 0, 0, err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	rng := rand.New(rand.NewPCG(42, 42))
	t := time.Date(2026, 3, 7, 9, 0, 0, 0, time.UTC)
	var n int64
	ev := 0
	var line []byte
	for n < size {
		t = t.Add(time.Duration(rng.IntN(2000)) * time.Microsecond)
		line = line[:0]
		r := rng.IntN(1000)
		sev := byte('I')
		var msg string
		switch {
		case r < 2:
			msg = fmt.Sprintf("decode-%d@mlx5_%d evicted", rng.IntN(16), rng.IntN(8))
			ev++
		case r < 4:
			sev = 'E'
			msg = fmt.Sprintf("Worker: Process failed for slice (opcode: 0, source_addr: 0x7f3a%08x, length: 65536, dest_addr: 0x7e11%08x, local_nic: mlx5_%d, peer_nic: decode-3@mlx5_%d, dest_rkey: 4242, retry_cnt: 0): transport retry counter exceeded",
				rng.Uint32(), rng.Uint32(), rng.IntN(4), rng.IntN(4))
		case r < 5:
			sev = 'W'
			msg = fmt.Sprintf("Rail paused: peer=decode-3@mlx5_%d error_count=5 pause_ms=30000", rng.IntN(4))
		case r < 6:
			sev = 'E'
			msg = fmt.Sprintf("Worker: Timed out waiting for RDMA ready ACK for endpoint: decode-3@mlx5_%d, deleting endpoint", rng.IntN(4))
		case r < 7:
			sev = 'W'
			msg = fmt.Sprintf("Worker: Cannot make connection for endpoint: decode-%d@mlx5_%d, mark it inactive", rng.IntN(16), rng.IntN(8))
		case r < 400:
			msg = fmt.Sprintf("Submitted batch %d with %d requests to segment prefill-%d, total %d bytes in flight", rng.IntN(1<<24), 1+rng.IntN(128), rng.IntN(8), rng.IntN(1<<30))
		case r < 700:
			msg = fmt.Sprintf("Transfer %d completed: %d slices over %d NICs in %d us, throughput %d MB/s", rng.IntN(1<<24), rng.IntN(4096), 1+rng.IntN(8), rng.IntN(100000), rng.IntN(40000))
		case r < 900:
			// Not glog: interleaved application output.
			line = fmt.Appendf(line, "[2026-03-07 %s] INFO: 10.0.%d.%d - \"POST /generate HTTP/1.1\" 200 OK (prefill %d tokens, decode %d tokens)\n",
				t.Format("15:04:05"), rng.IntN(250), rng.IntN(250), rng.IntN(8192), rng.IntN(2048))
		default:
			msg = fmt.Sprintf("Registered memory region cpu:%d addr=0x7f%010x length=%d lkey=%d rkey=%d", rng.IntN(2), rng.Uint64()&0xffffffffff, 1<<(20+rng.IntN(10)), rng.IntN(1<<20), rng.IntN(1<<20))
		}
		if len(line) == 0 {
			line = append(line, sev)
			line = t.AppendFormat(line, "0102 15:04:05.000000")
			line = fmt.Appendf(line, " %5d worker_pool.cpp:%d] ", 4100+rng.IntN(48), 100+rng.IntN(300))
			line = append(line, msg...)
			line = append(line, '\n')
		}
		if _, err := w.Write(line); err != nil {
			f.Close()
			return 0, 0, err
		}
		n += int64(len(line))
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return 0, 0, err
	}
	return n, ev, f.Close()
}

func BenchmarkLogScanVsGrep(b *testing.B) {
	path, size, ev := benchFile(b)
	grep, err := exec.LookPath("grep")
	if err != nil {
		b.Skip("grep not installed: no baseline to compare with")
	}
	runGrep := func() (time.Duration, int) {
		start := time.Now()
		out, err := exec.Command(grep, "-c", "evicted", path).Output()
		d := time.Since(start)
		if err != nil {
			b.Fatalf("grep: %v", err)
		}
		n, _ := strconv.Atoi(strings.TrimSpace(string(out)))
		return d, n
	}
	runGrep() // warm the page cache for both contenders

	// One core for the scanner too, so the ratio compares like with like.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	b.SetBytes(size)
	b.ResetTimer()
	var grepTime, scanTime time.Duration
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		gd, gn := runGrep()
		grepTime += gd
		b.StartTimer()
		start := time.Now()
		sc := NewLogScanner()
		if err := ScanFiles(sc, []string{path}); err != nil {
			b.Fatal(err)
		}
		scanTime += time.Since(start)
		s := sc.Summary()
		if s.Stats.Evictions != ev || gn != ev {
			b.Fatalf("evictions: scanner %d, grep %d, written %d", s.Stats.Evictions, gn, ev)
		}
	}
	b.StopTimer()
	mb := float64(size) / (1 << 20) * float64(b.N)
	scanMBs := mb / scanTime.Seconds()
	grepMBs := mb / grepTime.Seconds()
	b.ReportMetric(scanMBs, "scan-MB/s")
	b.ReportMetric(grepMBs, "grep-MB/s")
	b.ReportMetric(scanMBs/grepMBs, "scan/grep")
	b.Logf("%d MB log: scanner %.0f MB/s, grep -c evicted %.0f MB/s, ratio %.2f", size>>20, scanMBs, grepMBs, scanMBs/grepMBs)
}

// BenchmarkLogLine is the per-line cost without I/O, for profiling.
func BenchmarkLogLine(b *testing.B) {
	lines := [][]byte{
		[]byte("I0307 09:05:03.000042  4101 transfer_engine.cpp:312] Submitted batch 123 with 4 requests to segment prefill-1, total 1048576 bytes in flight"),
		[]byte("I0307 09:05:03.000042  4101 rdma_endpoint_store.cpp:171] decode-3@mlx5_0 evicted"),
		[]byte("[2026-03-07 09:05:03] INFO: 10.0.1.2 - \"POST /generate HTTP/1.1\" 200 OK"),
	}
	var total int
	for _, l := range lines {
		total += len(l) + 1
	}
	sc := NewLogScanner()
	b.SetBytes(int64(total))
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		for _, l := range lines {
			sc.Line(l)
		}
	}
	if !bytes.Contains(lines[1], []byte("evicted")) || sc.st.Evictions != b.N {
		b.Fatalf("evictions %d want %d", sc.st.Evictions, b.N)
	}
}

var (
	benchGzOnce sync.Once
	benchGzPath string
	benchGzErr  error
)

// BenchmarkLogScanGzip reads the same log gzip-compressed, against
// `gzip -dc | grep -c evicted` in the same run. Both are bound by
// decompression; throughput counts uncompressed bytes.
func BenchmarkLogScanGzip(b *testing.B) {
	path, size, ev := benchFile(b)
	sh, err1 := exec.LookPath("sh")
	_, err2 := exec.LookPath("gzip")
	if err1 != nil || err2 != nil {
		b.Skip("sh or gzip not installed: no baseline to compare with")
	}
	benchGzOnce.Do(func() {
		benchGzPath = path + ".gz"
		benchGzErr = exec.Command(sh, "-c", `gzip -1 -c "$1" > "$2"`, "sh", path, benchGzPath).Run()
	})
	if benchGzErr != nil {
		b.Fatal(benchGzErr)
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	b.SetBytes(size)
	b.ResetTimer()
	var base, scan time.Duration
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		start := time.Now()
		out, err := exec.Command(sh, "-c", `gzip -dc "$1" | grep -c evicted`, "sh", benchGzPath).Output()
		base += time.Since(start)
		if n, _ := strconv.Atoi(strings.TrimSpace(string(out))); err != nil || n != ev {
			b.Fatalf("baseline: %v, %d evictions", err, n)
		}
		b.StartTimer()
		start = time.Now()
		sc := NewLogScanner()
		if err := ScanFiles(sc, []string{benchGzPath}); err != nil {
			b.Fatal(err)
		}
		scan += time.Since(start)
		if sc.st.Evictions != ev {
			b.Fatalf("evictions %d want %d", sc.st.Evictions, ev)
		}
	}
	b.StopTimer()
	mb := float64(size) / (1 << 20) * float64(b.N)
	b.ReportMetric(mb/scan.Seconds(), "scan-MB/s")
	b.ReportMetric(mb/base.Seconds(), "gzip|grep-MB/s")
	b.ReportMetric(base.Seconds()/scan.Seconds(), "scan/baseline")
	b.Logf("%d MB log, gzip: scanner %.0f MB/s, gzip -dc | grep -c evicted %.0f MB/s", size>>20, mb/scan.Seconds(), mb/base.Seconds())
}
