package cmd

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSimConductor(t *testing.T) {
	isolateEnv(t)
	dir := t.TempDir()
	tr := filepath.Join(dir, "t.jsonl")
	os.WriteFile(tr, []byte(`{"timestamp": 0, "input_length": 2000, "output_length": 20, "hash_ids": [1, 2, 3, 4]}
{"timestamp": 100, "input_length": 2000, "output_length": 20, "hash_ids": [1, 2, 3, 5]}
{"timestamp": 200, "input_length": 600, "output_length": 5, "hash_ids": [9, 10]}
`), 0o644)
	csv, svg := filepath.Join(dir, "load.csv"), filepath.Join(dir, "load.svg")
	out, errs, code := execMC(t, "sim", "conductor", "--trace", tr, "--scheduler", "random,kvcache-centric", "--rejection", "none,predicted",
		"--load-trace", csv, "--plot", svg, "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var j struct {
		Results []map[string]any `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &j); err != nil || len(j.Results) != 4 {
		t.Fatalf("json: %v %q", err, out)
	}
	for _, k := range []string{"scheduler", "rejection", "requests", "accepted", "rejected", "wasted_prefills", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s",
		"tbt_p50_s", "tbt_p90_s", "tbt_p99_s", "slo_attainment", "goodput_rps", "cache_hit_ratio", "migrated_blocks"} {
		if _, ok := j.Results[0][k]; !ok {
			t.Errorf("JSON lacks %q", k)
		}
	}
	if j.Results[0]["requests"].(float64) != 3 {
		t.Errorf("requests %v, want 3", j.Results[0]["requests"])
	}
	b, _ := os.ReadFile(csv)
	if !strings.HasPrefix(string(b), "scheduler,rejection,time_s,prefill_load,decode_load\nrandom,none,0.0,") {
		t.Errorf("load trace: %.120q", b)
	}
	if b, _ := os.ReadFile(svg); !strings.Contains(string(b), "<svg") {
		t.Error("plot is not an SVG")
	}
	out, _, code = execMC(t, "sim", "conductor", "--trace", tr)
	if code != 0 || !strings.Contains(out, "kvcache-centric") || !strings.Contains(out, "TTFT p99 (s)") {
		t.Fatalf("table: %d %s", code, out)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "--trace is required"},
		{[]string{"--trace", tr, "--scheduler", "fastest"}, "--scheduler"},
		{[]string{"--trace", tr, "--rejection", "maybe"}, "--rejection"},
		{[]string{"--trace", tr, "--prefill", "0"}, "--prefill"},
		{[]string{"--trace", tr, "--speedup", "-1"}, "--speedup"},
		{[]string{"--trace", tr, "--link-gbps", "0"}, "--link-gbps 0"},
		// Named by flag (it was "cost model constants must not be negative").
		{[]string{"--trace", tr, "--attn-sec-per-token2", "-1"}, "--attn-sec-per-token2 -1"},
		{[]string{"--trace", tr, "--block-bytes", "0"}, "--block-bytes 0"},
		{[]string{"--trace", tr, "--cache-policy", "arc"}, "--cache-policy"},
		{[]string{"--trace", filepath.Join(dir, "none.jsonl")}, "no such file"},
		// Output paths are checked before the simulation (it ran, then
		// failed writing its plot, with no table).
		{[]string{"--trace", tr, "--plot", filepath.Join(dir, "nodir", "x.svg")}, "--plot"},
		{[]string{"--trace", tr, "--load-trace", filepath.Join(dir, "nodir", "x.csv")}, "--load-trace"},
		{[]string{"--trace", tr, "--plot", dir}, "is a directory"},
		// A typo's extra digits ran the host out of memory.
		{[]string{"--trace", tr, "--prefill", "99999999"}, "at most 100000"},
	} {
		_, errs, code := execMC(t, append([]string{"sim", "conductor"}, c.args...)...)
		wantCode := exitUsage // a --trace naming no file too, as --config
		if code != wantCode || !strings.Contains(errs, c.want) || strings.Count(errs, "\n") != 1 {
			t.Errorf("mc sim conductor %v: exit %d %q, want one line about %q", c.args, code, errs, c.want)
		}
	}
	bad := filepath.Join(dir, "bad.jsonl")
	os.WriteFile(bad, []byte("{\"timestamp\": 1, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}\nnot json\n"), 0o644)
	if _, errs, code := execMC(t, "sim", "conductor", "--trace", bad); code != 1 || !strings.Contains(errs, "line 2") {
		t.Errorf("malformed trace: %d %q", code, errs)
	}
	os.WriteFile(bad, nil, 0o644)
	if out, errs, code := execMC(t, "sim", "conductor", "--trace", bad); code != 1 || out != "" || !strings.Contains(errs, "no request") {
		t.Errorf("mc sim conductor on an empty trace: exit %d, stdout %q, stderr %q; want an error, no row", code, out, errs)
	}
	// A line without the fields of a request is not a request at time 0.
	os.WriteFile(bad, []byte("{\"garbage\": 1}\n"), 0o644)
	if out, errs, code := execMC(t, "sim", "conductor", "--trace", bad); code != 1 || out != "" || strings.Count(errs, "\n") != 1 ||
		!strings.HasPrefix(errs, "mc: ") || !strings.Contains(errs, "line 1: missing required field(s) timestamp, input_length, output_length, hash_ids") {
		t.Errorf("mc sim conductor on {\"garbage\": 1}: exit %d, stdout %q, stderr %q; want one line naming line 1 and the missing fields", code, out, errs)
	}
}

// Interrupted, a simulation stops and says so (exit 130). Before, SIGINT
// killed it without a word, and where SIGINT is ignored it ran on for
// minutes.
func TestSimConductorInterrupted(t *testing.T) {
	isolateEnv(t)
	tr := filepath.Join(t.TempDir(), "t.jsonl")
	os.WriteFile(tr, []byte("{\"timestamp\": 0, \"input_length\": 512, \"output_length\": 4, \"hash_ids\": [1]}\n"), 0o644)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var stdout, stderr strings.Builder
	code := Execute(ctx, []string{"sim", "conductor", "--trace", tr}, &stdout, &stderr)
	if code != exitInterrupted || stdout.String() != "" || !strings.Contains(stderr.String(), "interrupted after 0 of 1 simulations") {
		t.Errorf("interrupted simulation: exit %d, stdout %q, stderr %q", code, stdout.String(), stderr.String())
	}
}
