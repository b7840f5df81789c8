package cmd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine/bench"
	"github.com/kvcache-ops/mc/pkg/engine/meta"
)

func TestBenchInitiatorEmbeddedJSON(t *testing.T) {
	isolateEnv(t)
	out, _, err := runCmd(t, "bench", "initiator", "--duration", "300ms", "--threads", "2", "--batch_size", "16",
		"--block_size", "4K,64K", "--verify", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		SegmentID string `json:"segment_id"`
		Results   []struct {
			BlockSize   int64   `json:"block_size"`
			BatchCount  uint64  `json:"batch_count"`
			Throughput  float64 `json:"throughput"`
			ReportUnit  string  `json:"report_unit"`
			IOPS        float64 `json:"iops"`
			P50         float64 `json:"latency_p50_us"`
			P999        float64 `json:"latency_p999_us"`
			FailedTasks uint64  `json:"failed_tasks"`
			Verified    bool    `json:"verified"`
		} `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(got.Results) != 2 || got.Results[0].BlockSize != 4096 || got.Results[1].BlockSize != 65536 {
		t.Fatalf("results: %+v", got.Results)
	}
	for _, r := range got.Results {
		if r.BatchCount == 0 || r.Throughput <= 0 || r.IOPS <= 0 || r.P50 <= 0 || r.P999 < r.P50 ||
			r.FailedTasks != 0 || !r.Verified || r.ReportUnit != "GB" {
			t.Fatalf("result: %+v", r)
		}
	}
}

func TestBenchInitiatorTableAndMooncakeLine(t *testing.T) {
	isolateEnv(t)
	out, _, err := runCmd(t, "bench", "initiator", "--duration", "200ms", "--threads", "1",
		"--block_size", "8K", "--operation", "write", "--report_unit", "MiB", "--report_precision", "3")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Test completed: duration 0.", "batch count ", " MiB/s\n", "MiB/s", "IOPS", "p99.9", "failed", "│ 8K "} {
		if !strings.Contains(out, want) {
			t.Fatalf("output lacks %q:\n%s", want, out)
		}
	}
}

// startTarget runs `mc bench target` in-process until the test ends.
func startTarget(t *testing.T, opts ...func(*benchTargetOptions)) (segment string, stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	var out bytes.Buffer
	p := &printer{Out: &out, Err: &out, format: "table"}
	o := benchTargetOptions{BufferSize: 64 << 20, Ready: func(tg *bench.Target) { ready <- tg.Engine.SegmentName() }}
	o.Protocol, o.MetadataServer, o.BindAddress = "tcp", "P2PHANDSHAKE", "127.0.0.1"
	o.MinRPCPort, o.MaxRPCPort, o.StatusTimeout, o.TCPLanes = 15000, 17000, 2*time.Second, 4
	for _, f := range opts {
		f(&o)
	}
	go func() { done <- runBenchTarget(ctx, o, p) }()
	select {
	case s := <-ready:
		segment = s
	case err := <-done:
		t.Fatalf("target: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("target not ready")
	}
	if !strings.Contains(out.String(), "segment_id "+segment) {
		t.Fatalf("target output: %s", out.String())
	}
	stopped := false
	stop = func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		return <-done
	}
	t.Cleanup(func() { stop() })
	return segment, stop
}

func TestBenchTargetAndInitiator(t *testing.T) {
	isolateEnv(t)
	seg, stop := startTarget(t)
	out, _, err := runCmd(t, "bench", "initiator", "--segment_id", seg, "--metadata_server", "P2PHANDSHAKE",
		"--bind-address", "127.0.0.1", "--duration", "300ms", "--threads", "2", "--block_size", "64K", "--verify")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(out, "Test completed") || !strings.Contains(out, "yes") {
		t.Fatalf("output:\n%s", out)
	}
	// Writes leave the target's pattern in place: a read verify after a
	// write verify still passes.
	for _, op := range []string{"write", "read"} {
		if _, _, err := runCmd(t, "bench", "initiator", "--segment_id", seg, "--bind-address", "127.0.0.1",
			"--duration", "200ms", "--threads", "1", "--operation", op, "--verify"); err != nil {
			t.Fatalf("%s: %v", op, err)
		}
	}
	if err := stop(); err != nil {
		t.Fatalf("target stop: %v", err)
	}
}

func TestBenchKilledTargetExitsNonZero(t *testing.T) {
	isolateEnv(t)
	t.Setenv("MC_TCP_STATUS_TIMEOUT_SEC", "2")
	seg, stop := startTarget(t)
	var out, errb bytes.Buffer
	code := make(chan int, 1)
	start := time.Now()
	go func() {
		code <- Execute(context.Background(), []string{"bench", "initiator", "--segment_id", seg,
			"--bind-address", "127.0.0.1", "--duration", "30", "--threads", "1", "--block_size", "256K"}, &out, &errb)
	}()
	time.Sleep(500 * time.Millisecond)
	stop()
	select {
	case c := <-code:
		if c == 0 {
			t.Fatalf("exit 0 after the target died:\n%s", out.String())
		}
		if !strings.Contains(errb.String(), "transfer tasks failed") || strings.Count(errb.String(), "\n") != 1 {
			t.Fatalf("stderr: %q", errb.String())
		}
		if !strings.Contains(out.String(), "Test completed") {
			t.Fatalf("no report before the error:\n%s", out.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("initiator still running %v after the target stopped", time.Since(start))
	}
}

// The same-host transport: an embedded target, and `mc bench target
// --protocol auto`, mapped by `--protocol shm`; the output names the
// transport. (A target in another process: pkg/engine's and
// pkg/engine/bench's tests re-exec the test binary as one.)
func TestBenchInitiatorSHM(t *testing.T) {
	isolateEnv(t)
	type result struct {
		Transport string `json:"transport"`
		Verified  bool   `json:"verified"`
		Batches   uint64 `json:"batch_count"`
	}
	var got struct {
		Results []result `json:"results"`
	}
	out, _, err := runCmd(t, "bench", "initiator", "--protocol", "shm", "--duration", "200ms", "--threads", "2",
		"--batch_size", "16", "--block_size", "64K", "--verify", "-o", "json")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil || len(got.Results) != 1 {
		t.Fatalf("%v\n%s", err, out)
	}
	if r := got.Results[0]; r.Transport != "shm" || !r.Verified || r.Batches == 0 {
		t.Fatalf("embedded --protocol shm: %+v", r)
	}

	seg, _ := startTarget(t, func(o *benchTargetOptions) { o.Protocol = "auto" })
	for proto, want := range map[string]string{"shm": "shm", "auto": "shm", "tcp": "tcp"} {
		out, _, err := runCmd(t, "bench", "initiator", "--segment_id", seg, "--bind-address", "127.0.0.1", "--protocol", proto,
			"--duration", "200ms", "--threads", "1", "--batch_size", "8", "--block_size", "1M", "--operation", "write", "--verify")
		if err != nil {
			t.Fatalf("--protocol %s: %v\n%s", proto, err, out)
		}
		if !strings.Contains(out, "│ transport │") || !strings.Contains(out, "│ "+want+" ") {
			t.Fatalf("--protocol %s against an auto target: the transport column does not say %s:\n%s", proto, want, out)
		}
	}
	tcpSeg, _ := startTarget(t)
	_, _, err = runCmd(t, "bench", "initiator", "--segment_id", tcpSeg, "--bind-address", "127.0.0.1", "--protocol", "shm", "--duration", "100ms")
	if err == nil || !strings.Contains(err.Error(), "not reachable through shared memory") || !strings.Contains(err.Error(), "advertises no shared memory") {
		t.Fatalf("--protocol shm against a tcp target: %v", err)
	}
}

func TestBenchBadInput(t *testing.T) {
	isolateEnv(t)
	cases := map[string][]string{
		`--protocol "ib" is not supported: want one of: tcp, rdma, auto, shm`: {"--protocol", "ib"},
		`need --protocol rdma`:                                                                           {"--device-name", "soft0"},
		`--device-name: device "soft0" listed twice`:                                                     {"--protocol", "rdma", "--device-name", "soft0,soft0"},
		`--nic-priority-matrix: read priority matrix`:                                                    {"--protocol", "rdma", "--nic-priority-matrix", "/nonexistent/matrix.json"},
		`--block-size 4K,0: want sizes of more than 0 bytes`:                                             {"--block-size", "4K,0"},
		`--operation "copy": want read or write`:                                                         {"--operation", "copy"},
		`invalid argument "-1" for "--duration" flag: negative; want seconds (10, 0.5) or a Go duration`: {"--duration", "-1"},
		`--duration 0s: want more than 0`:                                                                {"--duration", "0"},
		`--backend "tent" is not supported`:                                                              {"--backend", "tent"},
		`--tcp-lanes -1: want 0 (a connection per request) or more`:                                      {"--tcp-lanes", "-1"},
		`--tcp-event-loops 65: want 0 (the default) to 64`:                                               {"--tcp-event-loops", "65"},
		`--tcp-event-loops -1: want 0 (the default) to 64`:                                               {"--tcp-event-loops", "-1"},
		`peer 127.0.0.1:1 unreachable`:                                                                   {"--segment-id", "127.0.0.1:1", "--bind-address", "127.0.0.1"},
		`--handshake-max-length 200000000: want 1 to`:                                                    {"--handshake-max-length", "200000000"},
		// Frames over the limit are refused, so a 64-byte limit cannot
		// carry a descriptor: proof the limit reaches the handshake.
		`read Metadata reply`: {"--handshake-max-length", "64", "--bind-address", "127.0.0.1"},
	}
	for want, args := range cases {
		var out, errb bytes.Buffer
		code := Execute(context.Background(), append([]string{"bench", "initiator", "--duration", "100ms", "--threads", "1"}, args...), &out, &errb)
		wantCode := exitUsage // refused before any work
		if want == "peer 127.0.0.1:1 unreachable" || want == "read Metadata reply" {
			wantCode = exitFailure
		}
		if code != wantCode || !strings.HasPrefix(errb.String(), "mc: bench initiator: ") || !strings.Contains(errb.String(), want) || strings.Count(errb.String(), "\n") != 1 {
			t.Errorf("%v: exit %d, stderr %q; want %d, %q", args, code, errb.String(), wantCode, want)
		}
	}
}

func TestBenchRDMAEmbeddedVerify(t *testing.T) {
	isolateEnv(t)
	matrix := filepath.Join(t.TempDir(), "matrix.json")
	if err := os.WriteFile(matrix, []byte(`{"cpu:0": [["soft1"], ["soft0"]]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, extra := range [][]string{nil, {"--nic_priority_matrix", matrix}, {"--auto_discovery"}} {
		args := append([]string{"bench", "initiator", "--protocol", "rdma", "--device_name", "soft0,soft1", "--duration", "300ms",
			"--threads", "1", "--batch_size", "16", "--block_size", "4K,200K", "--operation", "write", "--verify", "-o", "json"}, extra...)
		out, _, err := runCmd(t, args...)
		if err != nil {
			t.Fatalf("%v: %v\n%s", extra, err, out)
		}
		var got struct {
			Results []struct {
				BatchCount  uint64 `json:"batch_count"`
				FailedTasks uint64 `json:"failed_tasks"`
				Verified    bool   `json:"verified"`
			} `json:"results"`
		}
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if len(got.Results) != 2 {
			t.Fatalf("%v: results %+v", extra, got.Results)
		}
		for _, r := range got.Results {
			if r.BatchCount == 0 || r.FailedTasks != 0 || !r.Verified {
				t.Fatalf("%v: result %+v", extra, r)
			}
		}
	}
}

func TestBenchRDMATargetAndInitiator(t *testing.T) {
	isolateEnv(t)
	seg, stop := startTarget(t, func(o *benchTargetOptions) {
		o.Protocol, o.DeviceName, o.BufferSize = "rdma", "soft0,soft1", 16<<20
	})
	for _, op := range []string{"write", "read"} {
		out, _, err := runCmd(t, "bench", "initiator", "--protocol", "rdma", "--device_name", "soft0,soft1", "--segment_id", seg,
			"--bind-address", "127.0.0.1", "--duration", "300ms", "--threads", "2", "--batch_size", "16", "--block_size", "128K",
			"--operation", op, "--verify")
		if err != nil {
			t.Fatalf("%s: %v\n%s", op, err, out)
		}
		if !strings.Contains(out, "Test completed") || !strings.Contains(out, "yes") {
			t.Fatalf("output:\n%s", out)
		}
	}
	if err := stop(); err != nil {
		t.Fatalf("target stop: %v", err)
	}
}

func TestBenchInitiatorInterruptedExits130(t *testing.T) {
	isolateEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	var out, errb bytes.Buffer
	code := make(chan int, 1)
	go func() {
		code <- Execute(ctx, []string{"bench", "initiator", "--duration", "30", "--threads", "1",
			"--block_size", "4K,64K"}, &out, &errb)
	}()
	time.Sleep(500 * time.Millisecond)
	cancel() // what SIGINT does through signal.NotifyContext
	select {
	case c := <-code:
		if c != 130 {
			t.Fatalf("exit %d, want 130; stderr %q", c, errb.String())
		}
		if !strings.Contains(errb.String(), "interrupted") || strings.Count(errb.String(), "\n") != 1 {
			t.Fatalf("stderr: %q", errb.String())
		}
		if !strings.Contains(out.String(), "Test completed") {
			t.Fatalf("no partial report:\n%s", out.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("initiator did not stop after the interrupt")
	}
}

// With its metadata server gone, the target stops within a few seconds
// and says why in one line.
func TestBenchTargetStopsWithMetadataServerGone(t *testing.T) {
	isolateEnv(t)
	ee, err := meta.StartEtcd(context.Background(), meta.EtcdConfig{Listen: "127.0.0.1:0", NoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	ms := strings.TrimPrefix(ee.Endpoints()[0], "http://")
	_, stop := startTarget(t, func(o *benchTargetOptions) {
		o.MetadataServer, o.LocalServerName, o.BufferSize = ms, "node1", 1<<20
	})
	ee.Close()
	start := time.Now()
	err = stop()
	if took := time.Since(start); took > 3500*time.Millisecond {
		t.Fatalf("stop took %v", took)
	}
	if err == nil || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "unreachable: no answer within 2s") {
		t.Fatalf("stop: %v", err)
	}
}

func TestSweepErrorNamesTheFailedRow(t *testing.T) {
	cause := bench.ErrFailedTasks
	rs := []bench.Result{{BlockSize: 4096}, {BlockSize: 65536}}
	err := sweepError(rs, []int64{4096, 65536, 1 << 20}, cause)
	want := "sweep stopped at block size 64K (1 of 3 sizes done; not run: 1M): transfer tasks failed"
	if err == nil || err.Error() != want || !errors.Is(err, cause) {
		t.Fatalf("got %v, want %q", err, want)
	}
	if err := sweepError(rs[:1], []int64{4096}, cause); err != cause {
		t.Fatalf("single size: %v", err)
	}
}

func TestGflagsArgs(t *testing.T) {
	root := newRootCmd(&printer{Out: &bytes.Buffer{}, Err: &bytes.Buffer{}})
	cases := []struct{ in, want string }{
		{"bench --mode=target -buffer_size=1G", "bench target --buffer_size=1G"},
		{"-o json bench --mode initiator -block_size=4096 -threads 1", "-o json bench initiator --block_size=4096 --threads 1"},
		{"--log-level debug bench -mode=initiator --noauto_discovery -noverify", "--log-level debug bench initiator --auto_discovery=false --verify=false"},
		{"bench initiator --mode=initiator -verify -o json", "bench initiator --verify -o json"},
		{"bench initiator --report_precision -1 -h", "bench initiator --report_precision -1 -h"},
		{"bench initiator -ojson -nosuchflag --nobatch_size", "bench initiator -ojson -nosuchflag --nobatch_size"},
		{"bench initiator -- -block_size=1", "bench initiator -- -block_size=1"},
		{"topo discover -block_size=4096", "topo discover -block_size=4096"},
		{"bench", "bench"},
	}
	for _, c := range cases {
		got, err := gflagsArgs(root, strings.Fields(c.in))
		if err != nil || strings.Join(got, " ") != c.want {
			t.Errorf("%q -> %q, %v; want %q", c.in, strings.Join(got, " "), err, c.want)
		}
	}
	for in, want := range map[string]string{
		"bench --mode=both":             `--mode "both": want target or initiator`,
		"bench target --mode initiator": "bench target: --mode initiator contradicts the verb",
		"bench --mode":                  "--mode needs a value",
	} {
		if _, err := gflagsArgs(root, strings.Fields(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", in, err, want)
		}
	}
}

// A transfer_engine_bench command line, as a script would run it with mc
// bench in its place, including the cases Mooncake warns about and
// carries on.
func TestBenchMooncakeCommandLine(t *testing.T) {
	isolateEnv(t)
	var out, errb bytes.Buffer
	code := Execute(context.Background(), []string{"bench", "--mode=initiator", "--backend", "classic", "-duration=0.2",
		"-threads=1", "-batch_size", "4", "-block_size=8192", "-buffer_size=4096", "--noauto_discovery", "-report_unit=XB",
		"-protocol=tcp"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "Test completed") || !strings.Contains(out.String(), " GB/s\n") || !strings.Contains(out.String(), "│ 8K ") {
		t.Fatalf("stdout:\n%s", out.String())
	}
	for _, want := range []string{"unknown --report-unit: reporting in GB", "report_unit=XB",
		"--buffer-size too small for batch_size x block_size x threads: raised to fit", "raised_to=32768"} {
		if !strings.Contains(errb.String(), want) {
			t.Fatalf("stderr lacks %q:\n%s", want, errb.String())
		}
	}
	if !strings.HasPrefix(errb.String(), "W") {
		t.Fatalf("warnings are not glog W lines:\n%s", errb.String())
	}
}

func TestBenchInitiatorConnectionPerRequest(t *testing.T) {
	isolateEnv(t)
	seg, _ := startTarget(t)
	out, _, err := runCmd(t, "bench", "initiator", "--segment_id", seg, "--bind-address", "127.0.0.1", "--tcp-lanes", "0",
		"--duration", "200ms", "--threads", "1", "--batch_size", "16", "--block_size", "4K,64K", "--verify", "-o", "json")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var got struct {
		Results []struct {
			BatchCount uint64 `json:"batch_count"`
			Verified   bool   `json:"verified"`
		} `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil || len(got.Results) != 2 {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, r := range got.Results {
		if r.BatchCount == 0 || !r.Verified {
			t.Fatalf("result %+v", r)
		}
	}
}

func TestCustomTopoJSONReplacesDiscovery(t *testing.T) {
	isolateEnv(t)
	matrix := filepath.Join(t.TempDir(), "matrix.json")
	if err := os.WriteFile(matrix, []byte(`{"cpu:0": [["soft1"], ["soft0"]]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("MC_CUSTOM_TOPO_JSON", matrix)
	o := benchEngineOptions{Protocol: "rdma", AutoDiscovery: true}
	rc, err := o.rdmaConfig()
	if err != nil {
		t.Fatal(err)
	}
	if len(rc.Matrix) != 1 || rc.Matrix["cpu:0"].Preferred[0] != "soft1" || len(rc.Devices) != 2 {
		t.Fatalf("matrix %v, devices %v", rc.Matrix, rc.Devices)
	}
	// Unreadable: a warning, then discovery.
	var logs bytes.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logs, nil)))
	defer slog.SetDefault(old)
	t.Setenv("MC_CUSTOM_TOPO_JSON", filepath.Join(t.TempDir(), "missing.json"))
	if _, err := o.rdmaConfig(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "MC_CUSTOM_TOPO_JSON cannot be used") {
		t.Fatalf("no warning: %s", logs.String())
	}
}

func TestBenchInitiatorPlot(t *testing.T) {
	isolateEnv(t)
	svg := filepath.Join(t.TempDir(), "sweep.svg")
	if _, _, err := runCmd(t, "bench", "initiator", "--duration", "100ms", "--threads", "1", "--batch_size", "8",
		"--block_size", "4K,16K,64K", "--plot", svg); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(svg)
	if err != nil || !strings.Contains(string(b), "<svg") || !strings.Contains(string(b), ">16K<") {
		t.Fatalf("plot: %v\n%.200s", err, b)
	}
	_, _, err = runCmd(t, "bench", "initiator", "--duration", "100ms", "--threads", "1", "--plot", filepath.Join(t.TempDir(), "no", "dir.svg"))
	if err == nil || !strings.Contains(err.Error(), "--plot: write ") || !strings.Contains(err.Error(), "no such file or directory") {
		t.Fatalf("unwritable plot: %v", err)
	}
}

// The software NIC moves its bytes over TCP: a run on it says so in the
// banner, the row and the JSON, and the default provider does not stand
// one in for a device that is not there (issue 35, item 1).
func TestBenchRDMASaysSoft(t *testing.T) {
	isolateEnv(t)
	var out, errb bytes.Buffer
	code := Execute(context.Background(), []string{"bench", "initiator", "--protocol", "rdma", "--device_name", "mlx5_0",
		"--threads", "1", "--duration", "100ms"}, &out, &errb)
	if code == 0 || !strings.HasPrefix(errb.String(), "mc: ") || strings.Count(errb.String(), "\n") != 1 ||
		!strings.Contains(errb.String(), `"mlx5_0"`) || !strings.Contains(errb.String(), "MC_RDMA_PROVIDER=soft") {
		t.Fatalf("--device_name mlx5_0 on a host without it: exit %d, stdout %q, stderr %q; want a one-line error", code, out.String(), errb.String())
	}
	if strings.Contains(out.String(), "Test completed") {
		t.Fatalf("a row was printed for a device that does not exist:\n%s", out.String())
	}

	text, _, err := runCmd(t, "bench", "initiator", "--protocol", "rdma", "--device_name", "soft0", "--threads", "1",
		"--duration", "100ms", "--block_size", "64K")
	if err != nil {
		t.Fatalf("soft0: %v\n%s", err, text)
	}
	if !strings.Contains(text, "(loopback rdma (soft), ") || !regexp.MustCompile(`(?m)│ rdma \(soft\) *│\s*$`).MatchString(text) {
		t.Fatalf("a soft-NIC run does not say so in its banner and row:\n%s", text)
	}
	js, _, err := runCmd(t, "bench", "initiator", "--protocol", "rdma", "--device_name", "soft0", "--threads", "1",
		"--duration", "100ms", "--block_size", "64K", "-o", "json")
	var got struct {
		Results []struct {
			Transport string `json:"transport"`
			Provider  string `json:"provider"`
		} `json:"results"`
	}
	if err != nil || json.Unmarshal([]byte(js), &got) != nil || len(got.Results) != 1 ||
		got.Results[0].Transport != "rdma" || got.Results[0].Provider != "soft" {
		t.Fatalf("-o json: %v %+v\n%s", err, got, js)
	}
	// Asked for on purpose, under any name.
	t.Setenv("MC_RDMA_PROVIDER", "soft")
	text, _, err = runCmd(t, "bench", "initiator", "--protocol", "rdma", "--device_name", "mlx5_0", "--threads", "1",
		"--duration", "100ms", "--block_size", "64K")
	if err != nil || !strings.Contains(text, "rdma (soft)") {
		t.Fatalf("MC_RDMA_PROVIDER=soft --device_name mlx5_0: %v\n%s", err, text)
	}
}

// With P2PHANDSHAKE, a --local-server-name with a port is served on that
// port and names the segment so (before, the port was dropped without a
// word and another one advertised).
func TestBenchTargetLocalServerNamePort(t *testing.T) {
	isolateEnv(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	name := fmt.Sprintf("127.0.0.1:%d", port)
	var out syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- Execute(ctx, []string{"bench", "target", "--protocol", "tcp", "--local_server_name", name,
			"--buffer-size", "8M", "--bind-address", "127.0.0.1", "-o", "json"}, &out, io.Discard)
	}()
	waitText(t, &out, "}\n")
	var v struct {
		SegmentID string `json:"segment_id"`
	}
	if err := json.Unmarshal([]byte(out.String()), &v); err != nil || v.SegmentID != name {
		t.Errorf("segment %q (%v), want %q", v.SegmentID, err, name)
	}
	if c, err := net.Dial("tcp", name); err != nil {
		t.Errorf("nothing listens on the port named: %v", err)
	} else {
		c.Close()
	}
	cancel()
	<-done
}
