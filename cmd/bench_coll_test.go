package cmd

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine/meta"
)

// Two ranks, each one invocation of `mc bench coll --rank`, meeting in an
// HTTP metadata server: rank 0 prints the table, rank 1 nothing. Both are
// on this host: under --protocol auto (the default) their engines move
// the bytes through shared memory, under tcp over loopback, and the
// transport column says so from the engines' counts.
func TestBenchCollRanksAcrossInvocations(t *testing.T) {
	isolateEnv(t)
	srv := httptest.NewServer(meta.NewHTTPHandler())
	defer srv.Close()
	for _, c := range []struct{ protocol, want string }{{"auto", "shm"}, {"tcp", "tcp"}} {
		group := "cmdtest-" + c.protocol
		outs := make([]string, 2)
		errs := make([]error, 2)
		var wg sync.WaitGroup
		wg.Add(1)
		// Rank 1 through its run function (the command tree is not built
		// twice at once), rank 0 through the command line.
		go func() {
			defer wg.Done()
			var out, stderr bytes.Buffer
			o := benchCollOptions{Collective: "all_to_all", MinBytes: 8, MaxBytes: 8 << 10, Factor: 32, Iters: 2, Warmup: 1,
				Check: true, KillRank: -1, SlotSize: 4 << 10, Slots: 2, Timeout: 10 * time.Second, Protocol: c.protocol,
				Rank: 1, WorldSize: 2, Store: srv.URL + "/metadata", Group: group, BindAddress: "127.0.0.1"}
			errs[1] = runBenchCollRank(context.Background(), o, &printer{Out: &out, Err: &stderr, format: "table"})
			outs[1] = out.String()
		}()
		args := []string{"bench", "coll", "--collective", "all_to_all", "--rank", "0",
			"--world-size", "2", "--store", srv.URL + "/metadata", "--group", group,
			"-b", "8", "-e", "8K", "-f", "32", "--iters", "2", "--warmup", "1", "--check", "--slot-size", "4K"}
		if c.protocol != "auto" {
			args = append(args, "--protocol", c.protocol)
		}
		outs[0], _, errs[0] = runCmd(t, args...)
		wg.Wait()
		for r, err := range errs {
			if err != nil {
				t.Fatalf("%s: rank %d: %v", c.protocol, r, err)
			}
		}
		for _, want := range []string{"all_to_all", "busbw (GB/s)", "│ 8K ", "│ 0,1 ", "yes", "│ " + c.want + " "} {
			if !strings.Contains(outs[0], want) {
				t.Fatalf("%s: rank 0 output lacks %q:\n%s", c.protocol, want, outs[0])
			}
		}
		if strings.Count(outs[0], "│ "+c.want+" ") != 3 {
			t.Fatalf("%s: want all three rows moved by %s:\n%s", c.protocol, c.want, outs[0])
		}
		if outs[1] != "" {
			t.Fatalf("%s: rank 1 printed:\n%s", c.protocol, outs[1])
		}
	}
}

func TestBenchCollJSONRows(t *testing.T) {
	isolateEnv(t)
	srv := httptest.NewServer(meta.NewHTTPHandler())
	defer srv.Close()
	out, _, err := runCmd(t, "bench", "coll", "--rank", "0", "--world-size", "1", "--store", srv.URL+"/metadata",
		"-b", "1K", "-e", "4K", "-f", "4", "--iters", "1", "--check", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Results []map[string]any `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(got.Results) != 2 {
		t.Fatalf("rows: %s", out)
	}
	for _, k := range []string{"collective", "size_bytes", "ranks", "time_us", "algbw_gbps", "busbw_gbps", "correct", "active_ranks", "transport"} {
		if _, ok := got.Results[0][k]; !ok {
			t.Fatalf("row lacks %q: %v", k, got.Results[0])
		}
	}
	if got.Results[1]["size_bytes"] != float64(4096) || got.Results[1]["correct"] != true {
		t.Fatalf("row: %v", got.Results[1])
	}
}

func TestBenchCollBadFlags(t *testing.T) {
	isolateEnv(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--collective", "all_scatter"}, `collective "all_scatter"`},
		{[]string{"-b", "lots"}, "--min-bytes"},
		{[]string{"-b", "1M", "-e", "1K"}, "want 0 < min <= max"},
		{[]string{"-f", "1"}, "step factor"},
		{[]string{"--ranks", "0"}, "--ranks 0"},
		{[]string{"--kill-rank", "4"}, "--kill-rank 4"},
		{[]string{"--slot-size", "100"}, "--slot-size"},
		{[]string{"--protocol", "rdma"}, `--protocol "rdma"`},
		{[]string{"--rank", "0", "--world-size", "1", "--store", "127.0.0.1:1", "--protocol", "udp"}, `--protocol "udp"`},
		{[]string{"--rank", "0"}, "--world-size 0"},
		{[]string{"--rank", "2", "--world-size", "2", "--store", "127.0.0.1:1"}, "--rank 2"},
		{[]string{"--rank", "0", "--world-size", "2"}, "--store"},
	} {
		_, _, err := runCmd(t, append([]string{"bench", "coll"}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%v: %v, want an error naming %q", c.args, err, c.want)
		}
	}
}
