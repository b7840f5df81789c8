package cmd

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine/bench"
)

// A sweep's latency columns each use one unit, named in the header, so
// that 3065 µs and 95.0 ms never sit in the same column.
func TestBenchTableOneLatencyUnitPerColumn(t *testing.T) {
	var out bytes.Buffer
	p := &printer{Out: &out, Err: &bytes.Buffer{}, format: "table"}
	unit, err := bench.ParseUnit("GB")
	if err != nil {
		t.Fatal(err)
	}
	rs := []bench.Result{
		{Operation: "read", BlockSize: 4 << 10, LatencyP50: 182 * time.Microsecond, LatencyP99: 318 * time.Microsecond, LatencyP999: 454 * time.Microsecond},
		{Operation: "read", BlockSize: 64 << 10, LatencyP50: 3065 * time.Microsecond, LatencyP99: 95 * time.Millisecond, LatencyP999: 119800 * time.Microsecond},
		{Operation: "read", BlockSize: 1 << 20, LatencyP50: 27500 * time.Microsecond, LatencyP99: 34200 * time.Microsecond, LatencyP999: 34200 * time.Microsecond},
	}
	if err := printBenchResults(p, "seg", unit, 2, rs); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for _, h := range []string{"p50 (ms)", "p99 (ms)", "p99.9 (ms)"} {
		if !strings.Contains(s, h) {
			t.Errorf("header %q missing:\n%s", h, s)
		}
	}
	for _, cell := range []string{" 0.18 ", " 3.06 ", " 27.50 ", " 0.32 ", " 95.00 ", " 119.80 "} {
		if !strings.Contains(s, cell) {
			t.Errorf("cell %q missing:\n%s", cell, s)
		}
	}
	if strings.Contains(s, "µs") {
		t.Errorf("µs and ms mixed:\n%s", s)
	}
	out.Reset()
	if err := printBenchResults(p, "seg", unit, 2, rs[:1]); err != nil {
		t.Fatal(err)
	}
	if s := out.String(); !strings.Contains(s, "p50 (µs)") || !strings.Contains(s, " 182 ") {
		t.Errorf("short latencies not in µs:\n%s", s)
	}
}

// Help lists booleans as flags that take no value: "-h, --help", not
// "--help[=true|false]".
func TestHelpBooleanFlags(t *testing.T) {
	isolateEnv(t)
	for _, args := range [][]string{{"version", "--help"}, {"bench", "initiator", "-h"}, {"diag", "qp-leak", "--help"}, {"--help"}} {
		out, _, err := runCmd(t, args...)
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if strings.Contains(out, "[=true|false]") || !strings.Contains(out, "  -h, --help   ") {
			t.Errorf("%v: help renders booleans wrongly:\n%s", args, out)
		}
	}
	out, _, _ := runCmd(t, "bench", "initiator", "--help")
	if !strings.Contains(out, "      --verify   ") {
		t.Errorf("--verify not shown plainly:\n%s", out)
	}
}

// Completions offer the words an enum flag takes.
func TestEnumFlagCompletions(t *testing.T) {
	isolateEnv(t)
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"bench", "initiator", "--protocol", ""}, []string{"tcp", "rdma"}},
		{[]string{"bench", "target", "--protocol", ""}, []string{"tcp", "rdma"}},
		{[]string{"bench", "initiator", "--operation", ""}, []string{"read", "write"}},
		{[]string{"bench", "initiator", "--report_unit", ""}, []string{"GB", "MiB", "Kb"}},
		{[]string{"serve", "metadata", "--backend", ""}, []string{"etcd", "http"}},
		{[]string{"--output", ""}, []string{"table", "json"}},
	} {
		out, _, err := runCmd(t, append([]string{"__complete"}, c.args...)...)
		if err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		lines := strings.Split(out, "\n")
		for _, w := range c.want {
			found := false
			for _, l := range lines {
				found = found || l == w
			}
			if !found {
				t.Errorf("%v: %q not offered: %q", c.args, w, out)
			}
		}
	}
}
