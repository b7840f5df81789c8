package cmd

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/store/master"
)

const tinyTrace = `{"timestamp": 5, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]}
{"timestamp": 0, "input_length": 1536, "output_length": 1, "hash_ids": [1, 2, 3]}
{"timestamp": 5, "input_length": 1536, "output_length": 1, "hash_ids": [1, 9, 3]}
{"timestamp": 7, "input_length": 512, "output_length": 1, "hash_ids": [3]}
`

func writeTrace(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "trace.jsonl")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

type replayJSON struct {
	Results []struct {
		Policy         string  `json:"policy"`
		CapacityBlocks int     `json:"capacity_blocks"`
		Requests       int     `json:"requests"`
		Blocks         int     `json:"blocks"`
		HitBlocks      int     `json:"hit_blocks"`
		HitRatio       float64 `json:"hit_ratio"`
		PrefixHitRatio float64 `json:"prefix_hit_ratio"`
	} `json:"results"`
	Online *struct {
		Requests     int     `json:"requests"`
		Blocks       int     `json:"blocks"`
		HitBlocks    int     `json:"hit_blocks"`
		BytesWritten uint64  `json:"bytes_written"`
		BytesRead    uint64  `json:"bytes_read"`
		GBPerSec     float64 `json:"gb_per_sec"`
		KeyPrefix    string  `json:"key_prefix"`
		KeysRemoved  int     `json:"keys_removed"`
	} `json:"online"`
}

func TestStoreReplayOffline(t *testing.T) {
	isolateEnv(t)
	tr := writeTrace(t, tinyTrace)
	out, errs, code := execMC(t, "store", "replay", "--trace", tr, "--policy", "lru,fifo", "--capacity-blocks", "inf,2", "-o", "json")
	var j replayJSON
	if err := json.Unmarshal([]byte(out), &j); err != nil || code != 0 {
		t.Fatalf("exit %d, %v: %s %s", code, err, out, errs)
	}
	if len(j.Results) != 4 || j.Online != nil {
		t.Fatalf("results %+v", j)
	}
	// Hand-computed in pkg/store/replay's TestRunTiny.
	r := j.Results[0]
	if r.Policy != "lru" || r.CapacityBlocks != 0 || r.Requests != 4 || r.Blocks != 9 || r.HitBlocks != 5 || fmt.Sprintf("%.4f", r.PrefixHitRatio) != "0.4444" {
		t.Errorf("lru inf: %+v", r)
	}
	if r := j.Results[3]; r.Policy != "fifo" || r.CapacityBlocks != 2 || r.HitBlocks != 3 {
		t.Errorf("fifo 2: %+v", r)
	}
	out, _, _ = execMC(t, "store", "replay", "--trace", tr)
	for _, want := range []string{"prefix hit ratio", "inf", "0.556"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

func TestStoreReplayBadInput(t *testing.T) {
	isolateEnv(t)
	tr := writeTrace(t, tinyTrace)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"store", "replay"}, "trace"},
		{[]string{"store", "replay", "--trace", "/nonexistent/t.jsonl"}, "trace"},
		{[]string{"store", "replay", "--trace", writeTrace(t, "{\"timestamp\": 1, \"input_length\": 0, \"output_length\": 0, \"hash_ids\": []}\nnope\n")}, "line 2"},
		{[]string{"store", "replay", "--trace", writeTrace(t, "{\"garbage\": 1}\n")}, "line 1: missing required field(s) timestamp, input_length, output_length, hash_ids"},
		{[]string{"store", "replay", "--trace", writeTrace(t, tinyTrace+"{\"timestamp\": 9, \"input_length\": 512, \"hash_ids\": [4]}\n")}, "line 5: missing required field(s) output_length"},
		{[]string{"store", "replay", "--trace", tr, "--policy", "mru"}, "--policy"},
		{[]string{"store", "replay", "--trace", tr, "--capacity-blocks", "0"}, "--capacity-blocks"},
		{[]string{"store", "replay", "--trace", tr, "--online", "--capacity-blocks", "1,2"}, "at most one"},
		{[]string{"store", "replay", "--trace", tr, "--online", "--block-bytes", "x"}, "--block-bytes"},
		// A store's flags without --online were ignored without a word.
		{[]string{"store", "replay", "--trace", tr, "--block-bytes", "0"}, "--block-bytes concerns a running store"},
		{[]string{"store", "replay", "--trace", tr, "--tenant", "x"}, "--tenant concerns a running store"},
	} {
		_, errs, code := execMC(t, c.args...)
		if code == 0 || !strings.Contains(errs, c.want) || strings.Count(errs, "\n") != 1 {
			t.Errorf("mc %s: exit %d, stderr %q; want one line naming %q", strings.Join(c.args, " "), code, errs, c.want)
		}
	}
}

// Online replay into a store too small for the trace: the store evicts
// inside the puts, and stat shows it per phase.
func TestStoreReplayOnlineAndStat(t *testing.T) {
	isolateEnv(t)
	var b strings.Builder
	for i := range 60 {
		ids := make([]string, 8)
		for j := range ids {
			ids[j] = fmt.Sprint((i*5 + j*3) % 48)
		}
		fmt.Fprintf(&b, "{\"timestamp\": %d, \"input_length\": 4096, \"output_length\": 1, \"hash_ids\": [%s]}\n", i, strings.Join(ids, ", "))
	}
	tr := writeTrace(t, b.String())
	rpc, admin, _, _ := startServeStore(t, "--segment-size", "1M", "--eviction-policy", "lru")
	m := []string{"--master", rpc, "--admin", admin}
	out, errs, code := execMC(t, append([]string{"store", "replay", "--trace", tr, "--online", "--block-bytes", "64K", "--capacity-blocks", "16", "-o", "json"}, m...)...)
	var j replayJSON
	if err := json.Unmarshal([]byte(out), &j); err != nil || code != 0 || j.Online == nil {
		t.Fatalf("exit %d, %v: %s %s", code, err, out, errs)
	}
	if o := j.Online; o.Requests != 60 || o.Blocks != 480 || o.BytesWritten != uint64(o.Blocks-o.HitBlocks)*64<<10 || o.GBPerSec <= 0 {
		t.Errorf("online: %+v", o)
	}
	if len(j.Results) != 1 || j.Results[0].CapacityBlocks != 16 {
		t.Errorf("offline figures at the store's capacity: %+v", j.Results)
	}
	// The run's keys are its own and gone at the end (issue 35.4).
	if o := j.Online; !strings.HasPrefix(o.KeyPrefix, "replay/") || len(o.KeyPrefix) <= len("replay/") || o.KeysRemoved == 0 {
		t.Errorf("online: prefix %q, %d keys removed", o.KeyPrefix, o.KeysRemoved)
	}
	if errs != "" {
		t.Errorf("-o json wrote progress: %q", errs)
	}
	// Not on a terminal: a progress line at every tenth of the trace
	// (it was silent however long the replay ran).
	_, errs, code = execMC(t, append([]string{"store", "replay", "--trace", tr, "--online", "--block-bytes", "64K"}, m...)...)
	if code != 0 || strings.Count(errs, "replay: ") != 10 || !strings.Contains(errs, "replay: 6/60 requests, block hit ratio ") || !strings.Contains(errs, "replay: 60/60 requests") {
		t.Errorf("online replay's progress: exit %d, stderr:\n%s", code, errs)
	}
	var sj struct {
		Keys        int64            `json:"keys"`
		EvictedKeys int64            `json:"evicted_keys"`
		Attempts    int64            `json:"eviction_attempts"`
		Phases      map[string]int64 `json:"evicted_keys_by_phase"`
	}
	// The watermark loop may still be evicting after the replay, and a
	// scrape reads the total and the phases one counter at a time: the
	// phases add up to the total once the counters stop moving.
	for deadline := time.Now().Add(10 * time.Second); ; {
		out, _, _ = execMC(t, append([]string{"store", "stat", "-o", "json"}, m...)...)
		if err := json.Unmarshal([]byte(out), &sj); err != nil {
			t.Fatal(err)
		}
		sum := sj.Phases["watermark"] + sj.Phases["own_regions"] + sj.Phases["other_regions"]
		if sum == sj.EvictedKeys || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if sj.EvictedKeys == 0 || sj.Attempts == 0 || sj.Phases["own_regions"] == 0 ||
		sj.Phases["watermark"]+sj.Phases["own_regions"]+sj.Phases["other_regions"] != sj.EvictedKeys {
		t.Errorf("stat: %+v", sj)
	}
	if sj.Keys != 0 {
		t.Errorf("the replay left %d keys in the store", sj.Keys)
	}
	// Every phase the master counts is in stat, zeros too (policy,
	// stage and tenant_quota were missing: a put's policy evictions were
	// in the total and in no phase stat showed).
	for _, ph := range master.Phases {
		if _, ok := sj.Phases[ph]; !ok {
			t.Errorf("stat -o json: evicted_keys_by_phase lacks %q: %v", ph, sj.Phases)
		}
	}
	out, _, _ = execMC(t, append([]string{"store", "stat"}, m...)...)
	if !strings.Contains(out, "evicted keys by phase") || !strings.Contains(out, ", policy ") || !strings.Contains(out, "tenant quota ") {
		t.Errorf("stat table lacks the phases:\n%s", out)
	}
}

// An online replay whose trace does not fit below the eviction watermark
// of a store that holds other keys is refused, the keys left alone; with
// --allow-evict it runs. Before, it ran and the store evicted the other
// keys to make room (a CLI sweep: three keys of a shared 64 MiB store
// gone, exit 0, no warning).
func TestStoreReplayOnlineKeepsOtherKeys(t *testing.T) {
	isolateEnv(t)
	var b strings.Builder
	for i := range 40 {
		fmt.Fprintf(&b, "{\"timestamp\": %d, \"input_length\": 2048, \"output_length\": 1, \"hash_ids\": [%d, %d, %d, %d]}\n", i, 4*i, 4*i+1, 4*i+2, 4*i+3)
	}
	tr := writeTrace(t, b.String()) // 160 distinct blocks of 64 KiB: 10 MiB
	rpc, admin, _, _ := startServeStore(t, "--segment-size", "4M")
	m := []string{"--master", rpc, "--admin", admin}
	src := filepath.Join(t.TempDir(), "v")
	if err := os.WriteFile(src, []byte(strings.Repeat("keep me", 1000)), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, errs, code := execMC(t, append([]string{"store", "put", "keep", src}, m...)...); code != 0 {
		t.Fatalf("put: exit %d: %s %s", code, out, errs)
	}
	_, errs, code := execMC(t, append([]string{"store", "replay", "--trace", tr, "--online", "--block-bytes", "64K"}, m...)...)
	if code == 0 || !strings.Contains(errs, "--allow-evict") || !strings.Contains(errs, "160 distinct blocks") {
		t.Errorf("replay over a shared store's room: exit %d, stderr %q; want refused, naming --allow-evict", code, errs)
	}
	if _, errs, code := execMC(t, append([]string{"store", "get", "keep"}, m...)...); code != 0 {
		t.Fatalf("the store's other key is gone after a refused replay: exit %d: %s", code, errs)
	}
	if out, errs, code := execMC(t, append([]string{"store", "replay", "--trace", tr, "--online", "--block-bytes", "64K", "--allow-evict", "-o", "json"}, m...)...); code != 0 {
		t.Fatalf("replay with --allow-evict: exit %d: %s %s", code, out, errs)
	}
	// A trace that fits runs on the shared store without the flag.
	small := writeTrace(t, tinyTrace)
	if out, errs, code := execMC(t, append([]string{"store", "replay", "--trace", small, "--online", "--block-bytes", "64K", "-o", "json"}, m...)...); code != 0 {
		t.Fatalf("replay of a trace that fits: exit %d: %s %s", code, out, errs)
	}
	// The store's watermark is the one given, not mc's default (0.9):
	// below a watermark of 0.001 not even the small trace fits.
	if _, errs, code := execMC(t, append([]string{"store", "replay", "--trace", small, "--online", "--block-bytes", "64K", "--eviction-high-watermark-ratio", "0.001"}, m...)...); code == 0 || !strings.Contains(errs, "eviction watermark (0.001 of") {
		t.Errorf("replay under a watermark of 0.001: exit %d, stderr %q; want refused", code, errs)
	}
}

// An interrupted online replay prints what it did, as the bench verbs
// do: the online row marked partial (JSON: "interrupted": true), then
// exits 130. Before, it printed one stderr line and no figures.
func TestStoreReplayOnlineInterrupted(t *testing.T) {
	isolateEnv(t)
	var b strings.Builder
	const requests = 50_000
	for i := range requests {
		fmt.Fprintf(&b, "{\"timestamp\": %d, \"input_length\": 4096, \"output_length\": 1, \"hash_ids\": [%d, %d]}\n", i, i%97, 100+i%89)
	}
	tr := writeTrace(t, b.String())
	rpc, admin, _, _ := startServeStore(t, "--segment-size", "4M")
	m := []string{"--master", rpc, "--admin", admin}
	// Interrupted once the replay has written keys, so it has figures
	// to print.
	keys := func() int64 {
		out, _, _ := execMC(t, append([]string{"store", "stat", "-o", "json"}, m...)...)
		var st struct {
			Keys int64 `json:"keys"`
		}
		_ = json.Unmarshal([]byte(out), &st)
		return st.Keys
	}
	run := func(extra ...string) (string, string, int) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var out bytes.Buffer
		errb := &syncBuffer{}
		done := make(chan int, 1)
		go func() {
			done <- Execute(ctx, append(append([]string{"store", "replay", "--trace", tr, "--online", "--block-bytes", "4K"}, m...), extra...), &out, errb)
		}()
		for deadline := time.Now().Add(2 * time.Minute); keys() < 20 && time.Now().Before(deadline); {
			select {
			case code := <-done:
				return out.String(), errb.String(), code
			case <-time.After(20 * time.Millisecond):
			}
		}
		cancel()
		code := <-done
		return out.String(), errb.String(), code
	}
	out, errs, code := run("-o", "json")
	var j struct {
		replayJSON
		Interrupted bool `json:"interrupted"`
	}
	if err := json.Unmarshal([]byte(out), &j); err != nil || code != exitInterrupted || !j.Interrupted || j.Online == nil {
		t.Fatalf("exit %d, %v: stdout %q, stderr %q; want 130 and the partial figures", code, err, out, errs)
	}
	if j.Online.Requests >= requests {
		t.Errorf("interrupted after all %d requests: %+v", j.Online.Requests, j.Online)
	}
	if !strings.Contains(errs, "interrupted after") {
		t.Errorf("stderr %q", errs)
	}
	// Before it started (reading the store's room): 130 too, not a
	// failure naming a canceled request.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var eb bytes.Buffer
	if code := Execute(ctx, append([]string{"store", "replay", "--trace", tr, "--online", "--block-bytes", "4K"}, m...), &bytes.Buffer{}, &eb); code != exitInterrupted || !strings.Contains(eb.String(), "interrupted before the online replay started") {
		t.Errorf("interrupted at the start: exit %d, stderr %q", code, eb.String())
	}
	out, errs, code = run()
	if code != exitInterrupted || !strings.Contains(out, "online (partial)") || !strings.Contains(errs, "(the online row covers those)") {
		t.Errorf("table: exit %d, stdout:\n%s\nstderr %q", code, out, errs)
	}
}
