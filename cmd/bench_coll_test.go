package cmd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"runtime"
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
		// Each names its flag, as a usage error (exit 64): they were
		// the package's messages (step factor 1, iterations 0), exit 1.
		{[]string{"--collective", "all_scatter"}, `--collective "all_scatter"`},
		{[]string{"-b", "lots"}, "--min-bytes"},
		{[]string{"-b", "0"}, "--min-bytes (-b) 0"},
		{[]string{"-b", "1M", "-e", "1K"}, "--max-bytes (-e) 1K"},
		{[]string{"-f", "1"}, "--step-factor (-f) 1"},
		{[]string{"--iters", "0"}, "--iters 0"},
		{[]string{"--warmup", "-1"}, "--warmup -1"},
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
		if _, errs, code := execMC(t, append([]string{"bench", "coll"}, c.args...)...); strings.HasPrefix(c.want, "--") && !strings.HasPrefix(c.want, "--store") && code != exitUsage {
			t.Errorf("mc bench coll %v: exit %d (%q), want %d", c.args, code, errs, exitUsage)
		}
	}
}

// A group name is free again once a run finished: the same --group twice
// runs both times over both ranks, and the store keeps none of its
// records. Records an unfinished run left (a rank's record, its engine
// gone) fail the next run naming the missing rank instead of a sweep
// over the rest. A rank that leaves mid-sweep (the drill) fails the run
// after the rows are printed, and the survivors still clear the records.
func TestBenchCollGroupRunsAndMissingRanks(t *testing.T) {
	isolateEnv(t)
	srv := httptest.NewServer(meta.NewHTTPHandler())
	defer srv.Close()
	store := srv.URL + "/metadata"
	opts := func(rank, world int, group string) benchCollOptions {
		return benchCollOptions{Collective: "all_reduce", MinBytes: 1 << 10, MaxBytes: 16 << 10, Factor: 4, Iters: 2, Warmup: 1,
			Check: true, KillRank: -1, SlotSize: 4 << 10, Slots: 2, Timeout: 10 * time.Second, Protocol: "tcp",
			Rank: rank, WorldSize: world, Store: store, Group: group, BindAddress: "127.0.0.1"}
	}
	pair := func(group string) (string, [2]error) {
		var errs [2]error
		var out0 bytes.Buffer
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := opts(1, 2, group)
			o.EmitRows = true
			errs[1] = runBenchCollRank(context.Background(), o, &printer{Out: io.Discard, Err: io.Discard, format: "table"})
		}()
		errs[0] = runBenchCollRank(context.Background(), opts(0, 2, group), &printer{Out: &out0, Err: io.Discard, format: "table"})
		wg.Wait()
		return out0.String(), errs
	}
	be, err := meta.Open(context.Background(), store, meta.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	st, err := meta.StoreOf(be)
	if err != nil {
		t.Fatal(err)
	}
	for run := 1; run <= 2; run++ {
		out, errs := pair("again")
		if errs[0] != nil || errs[1] != nil {
			t.Fatalf("run %d of --group again: %v", run, errs)
		}
		if strings.Count(out, "│ 0,1 ") != 3 || strings.Count(out, "│ yes ") != 3 {
			t.Fatalf("run %d: want three rows over ranks 0,1:\n%s", run, out)
		}
		if _, found, err := st.ReadKey(context.Background(), "mc-coll/again/size"); err != nil || found {
			t.Fatalf("run %d left the group's records (%v)", run, err)
		}
	}

	// An earlier run's records for a group of two, rank 1's engine gone.
	st.WriteKey(context.Background(), "mc-coll/left/size", []byte(`{"initial":2,"size":2}`))
	st.WriteKey(context.Background(), "mc-coll/left/rank/1", []byte(`{"segment":"left-rank1","inbox":4096,"inbox_len":65536,"capacity":2,"slots":2,"slot_size":4096,"epoch":0}`))
	var out bytes.Buffer
	err = runBenchCollRank(context.Background(), opts(0, 2, "left"), &printer{Out: &out, Err: io.Discard, format: "table"})
	if err == nil || !strings.Contains(err.Error(), "1 of 2 ranks active, rank 1 missing") || out.Len() > 0 {
		t.Fatalf("rank 0 over a left-behind rank 1: err %v, output:\n%s", err, out.String())
	}

	// The drill's rank 1 leaves after 3 collectives (its goroutine ends
	// as its process would, closing its engine): rank 0 goes on alone,
	// prints what it measured, and fails the run naming rank 1.
	var out0 bytes.Buffer
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		o := opts(1, 2, "drill")
		o.KillRank, o.KillAfter, o.EmitRows, o.exit = 1, 3, true, runtime.Goexit
		runBenchCollRank(context.Background(), o, &printer{Out: io.Discard, Err: io.Discard, format: "table"})
		t.Error("rank 1 did not leave")
	}()
	o := opts(0, 2, "drill")
	o.KillRank, o.KillAfter = 1, 3
	err = runBenchCollRank(context.Background(), o, &printer{Out: &out0, Err: io.Discard, format: "table"})
	wg.Wait()
	if err == nil || !strings.Contains(err.Error(), "rank 1 did not finish") || !strings.Contains(out0.String(), "│ 0 ") {
		t.Fatalf("rank 0 after rank 1 left: err %v, output:\n%s", err, out0.String())
	}
	if _, found, err := st.ReadKey(context.Background(), "mc-coll/drill/size"); err != nil || found {
		t.Fatalf("the drill left the group's records (%v)", err)
	}
}

// cancelOnWrite cancels when something is written to it: the first
// progress line.
type cancelOnWrite struct {
	bytes.Buffer
	cancel context.CancelFunc
}

func (c *cancelOnWrite) Write(b []byte) (int, error) {
	c.cancel()
	return c.Buffer.Write(b)
}

// A rank reports each finished row as a line on stderr when stdout is not
// a terminal; interrupted, it prints the rows done and exits 130; alone in
// a group whose other ranks never start, it fails after --join-timeout,
// naming them and the flag, instead of waiting forever (issue 40.4).
func TestBenchCollProgressInterruptAndJoinTimeout(t *testing.T) {
	isolateEnv(t)
	srv := httptest.NewServer(meta.NewHTTPHandler())
	defer srv.Close()
	_, errs, err := runCmd(t, "bench", "coll", "--rank", "0", "--world-size", "1", "--store", srv.URL+"/metadata",
		"-b", "1K", "-e", "4K", "-f", "4", "--iters", "1", "--check", "--protocol", "tcp")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(errs, "row 1/2: all_reduce 1K, 1 ranks: ") || !strings.Contains(errs, "row 2/2: all_reduce 4K, 1 ranks: ") || !strings.Contains(errs, "correct yes") {
		t.Fatalf("stderr has no line per row:\n%s", errs)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out bytes.Buffer
	stderr := &cancelOnWrite{cancel: cancel}
	o := benchCollOptions{Collective: "all_reduce", MinBytes: 8, MaxBytes: 8 << 20, Factor: 2, Iters: 200, Warmup: 1,
		KillRank: -1, SlotSize: 4 << 10, Slots: 2, Timeout: 10 * time.Second, JoinTimeout: time.Minute, Protocol: "tcp",
		Rank: 0, WorldSize: 1, Store: srv.URL + "/metadata", Group: "interrupted", BindAddress: "127.0.0.1"}
	err = runBenchCollRank(ctx, o, &printer{Out: &out, Err: stderr, format: "table"})
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != exitInterrupted || !strings.Contains(err.Error(), "bench coll: interrupted after ") || !strings.Contains(err.Error(), " of 21 sizes") {
		t.Fatalf("interrupted rank: %v, want exit 130 naming the sizes done", err)
	}
	if !strings.Contains(out.String(), "│ 8 ") {
		t.Fatalf("the rows done were not printed:\n%s", out.String())
	}

	t0 := time.Now()
	_, _, err = runCmd(t, "bench", "coll", "--rank", "0", "--world-size", "3", "--store", srv.URL+"/metadata", "--group", "lonely",
		"--join-timeout", "300ms", "-b", "1K", "-e", "1K")
	if err == nil || !strings.Contains(err.Error(), "ranks 1,2 of 3 not there after 300ms") || !strings.Contains(err.Error(), "--join-timeout 300ms") {
		t.Fatalf("lone rank: %v, want a join timeout naming ranks 1,2 and the flag", err)
	}
	if d := time.Since(t0); d > 10*time.Second {
		t.Fatalf("lone rank gave up after %s", d)
	}
}

// cancelOnLine cancels once a line containing at is written to it.
type cancelOnLine struct {
	mu     sync.Mutex
	b      bytes.Buffer
	at     string
	cancel context.CancelFunc
}

func (c *cancelOnLine) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.b.Write(p)
	if strings.Contains(c.b.String(), c.at) {
		c.cancel()
	}
	return len(p), nil
}

// mc bench coll's launcher interrupted after the rows the drill's
// survivor measured alone: it prints the rows done (it printed none,
// "interrupted after 0 of 24 sizes", taking rank 0 for the printing rank
// as a rank does, while rank 0 was the one the drill stopped).
func TestBenchCollLauncherInterruptedKeepsItsRows(t *testing.T) {
	isolateEnv(t)
	t.Setenv("MC_TEST_RUN_MC", "1")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out bytes.Buffer
	errw := &cancelOnLine{at: "row 4/", cancel: cancel}
	o := benchCollOptions{Collective: "all_reduce", Ranks: 2, MinBytes: 8, MaxBytes: 64 << 20, Factor: 2, Iters: 3, Warmup: 1,
		KillRank: 0, KillAfter: 4, SlotSize: 4 << 10, Slots: 2, Timeout: 10 * time.Second, JoinTimeout: time.Minute, Protocol: "tcp"}
	err := runBenchColl(ctx, o, &printer{Out: &out, Err: errw, format: "table"})
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != exitInterrupted {
		t.Fatalf("interrupted launch: %v, want exit 130\n%s\n%s", err, out.String(), errw.b.String())
	}
	var n int
	if _, serr := fmt.Sscanf(err.Error()[strings.Index(err.Error(), "after "):], "after %d of 24 sizes", &n); serr != nil || n < 4 {
		t.Fatalf("interrupted launch: %v, want at least the 4 rows reported\n%s", err, errw.b.String())
	}
	if rows := strings.Count(out.String(), "│ all_reduce "); rows != n {
		t.Fatalf("%d rows printed, the error says %d:\n%s", rows, n, out.String())
	}
}

// A rank given by the environment (MC_BENCH_RANK, as a pod's index is
// handed to it) runs this process as that rank, as --rank does. Before,
// only the command line's --rank counted: it started local ranks.
func TestBenchCollRankFromEnvironment(t *testing.T) {
	isolateEnv(t)
	t.Setenv("MC_BENCH_RANK", "1")
	t.Setenv("MC_BENCH_WORLD_SIZE", "2")
	_, errs, code := execMC(t, "bench", "coll", "-b", "8", "-e", "8")
	if code != exitUsage || !strings.Contains(errs, "--store: want the rendezvous") {
		t.Fatalf("MC_BENCH_RANK=1 without a store: exit %d, stderr %q; want the rank's usage error", code, errs)
	}
}
