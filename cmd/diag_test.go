package cmd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/diag"
)

const diagTD = "../pkg/diag/testdata/"

// execMC runs mc in-process and returns stdout, stderr and the exit status.
func execMC(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	code := Execute(context.Background(), args, &out, &errb)
	return out.String(), errb.String(), code
}

func TestDiagQPLeakVerdictsAndExitCodes(t *testing.T) {
	isolateEnv(t)
	dir := t.TempDir()
	enomem := filepath.Join(dir, "te.INFO")
	os.WriteFile(enomem, []byte("I0307 09:00:00.000001  4101 x.cpp:1] Using SIEVE endpoint store\n"+
		"E0307 09:00:01.000001  4101 rdma_endpoint.cpp:77] Failed to create QP: Cannot allocate memory [12]\n"), 0o644)
	// Four NICs alike at +3,760 QPs an hour, 1.5 h from max_qp 16384.
	var filling []string
	for i, qp := range []int{6984, 10744} {
		var b strings.Builder
		for n := range 4 {
			fmt.Fprintf(&b, "%d: mlx5_%d: pd 99 cq 95 qp %d cm_id 0 mr 848 ctx 98\n", n, n, qp)
		}
		p := filepath.Join(dir, fmt.Sprintf("filling-%d.txt", i))
		os.WriteFile(p, []byte(b.String()), 0o644)
		filling = append(filling, p)
	}
	fillingArgs := []string{"--rdma", filling[0], "--rdma", filling[1], "--at", "2026-03-07T09:00:00Z,2026-03-07T10:00:00Z", "--max-qp", "16384"}
	cases := []struct {
		name string
		args []string
		code int
		out  []string
	}{
		{"leak", []string{"--rdma", diagTD + "leak/rdma.txt", "--log", diagTD + "leak/prefill-0.INFO.1.gz", "--log", diagTD + "leak/prefill-0.INFO"},
			2, []string{"verdict: leak", "QP_EXHAUSTED", "ASYMMETRIC_QP", "decode-3@mlx5_0", "Restart the transfer engine"}},
		{"healthy", []string{"--rdma", diagTD + "healthy/rdma.txt", "--log", diagTD + "healthy/prefill-0.INFO"},
			0, []string{"verdict: healthy", "Nothing to do"}},
		// ENOMEM with QPs that live endpoints explain: exhaustion, not
		// (yet) a leak.
		{"suspect", []string{"--rdma", diagTD + "healthy/rdma.txt", "--log", enomem, "--max-ep-per-ctx", "256"},
			1, []string{"verdict: suspect", "QP_EXHAUSTED"}},
		// Positional files sorted by content, comma lists accepted.
		{"positional", []string{diagTD + "leak-noinfo/prefill-0.WARNING", diagTD + "leak/rdma.json"},
			2, []string{"verdict: leak", "NO_EVICTION_LOGS", "MC_LOG_LEVEL=INFO"}},
		{"growth", []string{"--rdma", diagTD + "growth/rdma-1.json," + diagTD + "growth/rdma-2.json",
			"--at", "2026-03-07T11:30:00Z,2026-03-07 11:40:00", "--max-ep-per-ctx", "256", "--max-qp", "131072"},
			2, []string{"QP_GROWTH", "growth/h", "+3600"}},
		// Due at max_qp within the horizon: a finding, however far below
		// the ceiling; past a shorter horizon, healthy.
		{"filling", fillingArgs,
			1, []string{"verdict: suspect", "QP_GROWTH", "in about 1.5h", "24.0h", "1h30m0s"}},
		{"filling-horizon", append(fillingArgs, "--horizon", "1h"),
			0, []string{"verdict: healthy"}},
		{"perqp", []string{"--rdma", diagTD + "perqp/rdma-qp.txt", "--max_ep_per_ctx", "256"},
			2, []string{"QP_ERROR_STATE_PILE", "QP owners", "python3"}},
		// QP counts alone: a known ceiling from Mooncake's defaults, and
		// the incident's asymmetry is not healthy.
		{"counts-only", []string{"--rdma", diagTD + "leak/rdma.txt"},
			1, []string{"verdict: suspect", "ASYMMETRIC_QP", "131088", "assumed Mooncake defaults: MC_NUM_QP_PER_EP=2, MC_MAX_EP_PER_CTX=65536"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, errs, code := execMC(t, append([]string{"diag", "qp-leak"}, c.args...)...)
			if code != c.code {
				t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, c.code, out, errs)
			}
			for _, w := range c.out {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			if strings.Contains(errs, "mc:") {
				t.Errorf("a verdict is not an error, stderr: %q", errs)
			}
		})
	}
}

// The JSON contract of README: these fields, these types.
func TestDiagQPLeakJSON(t *testing.T) {
	isolateEnv(t)
	out, _, code := execMC(t, "diag", "qp-leak", "-o", "json", "--rdma", diagTD+"leak/rdma.txt",
		"--log", diagTD+"leak/prefill-0.INFO.1.gz", "--log", diagTD+"leak/prefill-0.INFO")
	if code != 2 {
		t.Fatalf("exit %d", code)
	}
	var r map[string]any
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if r["verdict"] != "leak" || r["evictions"] != float64(1118) || r["qp_create_failures"] != float64(37) {
		t.Errorf("top level: verdict %v evictions %v qp_create_failures %v", r["verdict"], r["evictions"], r["qp_create_failures"])
	}
	for _, k := range []string{"nics", "peers", "findings", "snapshots"} {
		if _, ok := r[k].([]any); !ok {
			t.Errorf("%s is not a list: %v", k, r[k])
		}
	}
	nic := r["nics"].([]any)[0].(map[string]any)
	for _, k := range []string{"name", "qp", "expected_max", "excess", "evictions", "deletions", "share"} {
		if _, ok := nic[k]; !ok {
			t.Errorf("nics[0] lacks %s: %v", k, nic)
		}
	}
	if nic["name"] != "mlx5_0" || nic["qp"] != float64(22013) {
		t.Errorf("nics[0] = %v", nic)
	}
	f := r["findings"].([]any)[0].(map[string]any)
	for _, k := range []string{"code", "severity", "message"} {
		if s, ok := f[k].(string); !ok || s == "" {
			t.Errorf("findings[0].%s = %v", k, f[k])
		}
	}
}

func TestDiagQPLeakEnvAndStdin(t *testing.T) {
	isolateEnv(t)
	// Mooncake's own variable sets the store size.
	t.Setenv("MC_MAX_EP_PER_CTX", "256")
	b, err := os.ReadFile(diagTD + "leak/rdma.json")
	if err != nil {
		t.Fatal(err)
	}
	old := diag.Stdin
	diag.Stdin = bytes.NewReader(b)
	defer func() { diag.Stdin = old }()
	out, errs, code := execMC(t, "diag", "qp-leak", "-o", "json", "--rdma", "-")
	if code != 2 {
		t.Fatalf("exit %d: %s %s", code, out, errs)
	}
	var r diag.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	if r.MaxEPPerCtx != 256 || *r.NICs[0].ExpectedMax != 528 {
		t.Errorf("MC_MAX_EP_PER_CTX not applied: %d %d", r.MaxEPPerCtx, *r.NICs[0].ExpectedMax)
	}
}

func fakeRDMAScript(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "rdma")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDiagQPLeakUnknown(t *testing.T) {
	isolateEnv(t)
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.txt")
	os.WriteFile(garbage, []byte("this is not\nrdma output\n"), 0o644)
	nonetlink := fakeRDMAScript(t, "echo 'Failed to open NETLINK_RDMA socket' >&2\nexit 1\n")
	gz, err := os.ReadFile(diagTD + "leak/prefill-0.INFO.1.gz")
	if err != nil {
		t.Fatal(err)
	}
	cutGzip := filepath.Join(dir, "cut.gz")
	os.WriteFile(cutGzip, gz[:len(gz)/2], 0o644)
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--rdma", filepath.Join(dir, "missing.txt")}, "missing.txt"},
		{[]string{"--rdma", garbage}, "no rdma device or QP found"},
		{[]string{"--rdma", diagTD + "leak/rdma.txt", "--log", filepath.Join(dir, "nolog")}, "nolog"},
		{[]string{"--rdma", diagTD + "leak/rdma.txt", "--at", "yesterday"}, `invalid --at "yesterday"`},
		{[]string{"--rdma", diagTD + "leak/rdma.txt", "--at", "1,2"}, "2 --at stamps for 1 --rdma files"},
		{[]string{"--num-qp-per-ep", "-1", "--rdma", diagTD + "leak/rdma.txt"}, "--num-qp-per-ep"},
		{[]string{"--horizon", "0", "--rdma", diagTD + "leak/rdma.txt"}, "invalid --horizon 0s"},
		{[]string{"--top", "-1", "--rdma", diagTD + "leak/rdma.txt"}, "invalid --top -1"}, // was taken as 0
		{[]string{"--rdma", diagTD + "leak/rdma.txt", "--log", dir}, "is a directory"},
		{[]string{"--rdma", diagTD + "leak/rdma.txt", "--log", cutGzip}, "cut.gz: unexpected EOF"},
		{[]string{"--rdma-bin", nonetlink}, "no RDMA netlink"},
		{[]string{"--rdma-bin", filepath.Join(dir, "no-rdma-here")}, "not installed"},
		{[]string{garbage}, "neither rdma output nor a glog log"},
		{[]string{"--rdma", "-", "--log", "-"}, "standard input (-) can be only one"},
		{[]string{"--watch", "1s", "--rdma", diagTD + "leak/rdma.txt"}, "takes no --rdma files"},
	}
	usage := map[string]bool{"invalid --horizon 0s": true, `invalid --at "yesterday"`: true, "2 --at stamps for 1 --rdma files": true,
		"--num-qp-per-ep": true, "standard input (-) can be only one": true, "takes no --rdma files": true, "invalid --top -1": true}
	for _, c := range cases {
		out, errs, code := execMC(t, append([]string{"diag", "qp-leak"}, c.args...)...)
		want := 3
		if usage[c.want] {
			want = exitUsage // the caller's mistake, not unreadable input
		}
		if code != want {
			t.Errorf("%v: exit %d, want %d (stdout %q)", c.args, code, want, out)
		}
		if strings.Count(errs, "mc: ") != 1 || !strings.Contains(errs, c.want) {
			t.Errorf("%v: stderr %q, want one mc: line containing %q", c.args, errs, c.want)
		}
		if strings.Contains(errs, "goroutine") {
			t.Errorf("%v: panic: %s", c.args, errs)
		}
	}
}

// --watch samples the live tool, follows the log and reports growth.
func TestDiagQPLeakWatch(t *testing.T) {
	isolateEnv(t)
	dir := t.TempDir()
	state := filepath.Join(dir, "calls")
	bin := fakeRDMAScript(t, `n=0
[ -f "`+state+`" ] && n=$(cat "`+state+`")
echo $((n + 1)) > "`+state+`"
printf '[{"ifindex":0,"ifname":"mlx5_0","qp":%d}\n,{"ifindex":1,"ifname":"mlx5_1","qp":130}]\n' $((9000 + n * 600))
`)
	logf := filepath.Join(dir, "te.INFO")
	os.WriteFile(logf, []byte("I0307 09:00:00.000001  4101 s.cpp:1] decode-1@mlx5_0 evicted\n"), 0o644)
	done := make(chan struct{})
	go func() {
		// Lines appended during the watch are counted too.
		defer close(done)
		f, err := os.OpenFile(logf, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			return
		}
		defer f.Close()
		f.WriteString("I0307 09:00:01.000001  4101 s.cpp:1] decode-2@mlx5_0 evicted\n")
	}()
	out, errs, code := execMC(t, "diag", "qp-leak", "--rdma-bin", bin, "--log", logf,
		"--watch", "450ms", "--interval", "100ms", "--max-ep-per-ctx", "256", "--max-qp", "131072")
	<-done
	if code != 2 {
		t.Fatalf("exit %d\n%s\n%s", code, out, errs)
	}
	if !strings.Contains(out, "mlx5_0 9600 (+600") || !strings.Contains(out, "QP_GROWTH") || !strings.Contains(out, "verdict: leak") {
		t.Errorf("watch output:\n%s", out)
	}
	out, _, _ = execMC(t, "diag", "qp-leak", "-o", "json", "--rdma-bin", bin, "--log", logf, "--watch", "250ms", "--interval", "100ms")
	var r diag.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("json after watch: %v\n%s", err, out)
	}
	if len(r.Snapshots) < 2 || r.Evictions != 2 {
		t.Errorf("snapshots %d evictions %d", len(r.Snapshots), r.Evictions)
	}
}

// SIGINT ends a --watch early with the report of the samples taken and
// exit 130, in a table and in JSON. Before, the watch installed no
// handler: SIGINT killed it with no report, SIGTERM too.
func TestDiagQPLeakWatchInterrupted(t *testing.T) {
	isolateEnv(t)
	dir := t.TempDir()
	// Each sample appends a line to runs: the test interrupts once three
	// have been taken (a fixed sleep interrupted the first sample on a
	// loaded machine).
	runs := filepath.Join(dir, "runs")
	bin := fakeRDMAScript(t, `echo x >>`+runs+`; printf '[{"ifindex":0,"ifname":"mlx5_0","qp":9000}]\n'`)
	logf := filepath.Join(dir, "te.INFO")
	os.WriteFile(logf, []byte("I0307 09:00:00.000001  4101 s.cpp:1] decode-1@mlx5_0 evicted\n"), 0o644)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, asJSON := range []bool{false, true} {
		os.Remove(runs)
		args := []string{"diag", "qp-leak", "--rdma-bin", bin, "--log", logf, "--watch", "1m", "--interval", "50ms"}
		if asJSON {
			args = append(args, "-o", "json")
		}
		c := exec.Command(self, args...)
		c.Env = append(os.Environ(), "MC_TEST_RUN_MC=1")
		var out, errb bytes.Buffer
		c.Stdout, c.Stderr = &out, &errb
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if b, _ := os.ReadFile(runs); bytes.Count(b, []byte("\n")) >= 3 || time.Now().After(deadline) {
				break
			}
		}
		c.Process.Signal(syscall.SIGINT)
		err := c.Wait()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != exitInterrupted {
			t.Fatalf("json=%v: %v, want exit %d\nstdout %s\nstderr %s", asJSON, err, exitInterrupted, out.String(), errb.String())
		}
		if !strings.Contains(errb.String(), "diag qp-leak: interrupted after ") {
			t.Errorf("json=%v: stderr %q", asJSON, errb.String())
		}
		if asJSON {
			var r diag.Report
			if err := json.Unmarshal(out.Bytes(), &r); err != nil || len(r.Snapshots) < 2 {
				t.Errorf("json report after SIGINT: %v (%d snapshots)\n%s", err, len(r.Snapshots), out.String())
			}
		} else if !strings.Contains(out.String(), "verdict: ") {
			t.Errorf("no report after SIGINT:\n%s", out.String())
		}
	}
}

// SIGINT during the first sample of a --watch ends it with exit 130 and
// says there is nothing to report. Before, the canceled sample was taken
// for unreadable input: exit 3, "rdma -j resource show: context
// canceled" (seen on a loaded CI run of the test above).
func TestDiagQPLeakWatchInterruptedBeforeFirstSample(t *testing.T) {
	isolateEnv(t)
	dir := t.TempDir()
	started := filepath.Join(dir, "started")
	bin := fakeRDMAScript(t, `touch `+started+`; sleep 30; printf '[]\n'`)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	c := exec.Command(self, "diag", "qp-leak", "--rdma-bin", bin, "--watch", "1m", "--interval", "50ms")
	c.Env = append(os.Environ(), "MC_TEST_RUN_MC=1")
	var out, errb bytes.Buffer
	c.Stdout, c.Stderr = &out, &errb
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(started); err == nil {
			break
		}
	}
	c.Process.Signal(syscall.SIGINT)
	err = c.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitInterrupted || !strings.Contains(errb.String(), "interrupted before the first sample") {
		t.Errorf("%v, want exit %d\nstdout %s\nstderr %s", err, exitInterrupted, out.String(), errb.String())
	}
}
