package collbench

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/coll"
	"github.com/kvcache-ops/mc/pkg/engine"
	"github.com/kvcache-ops/mc/pkg/engine/meta"
)

// The launcher test re-executes this test binary as the ranks: with
// MC_COLLBENCH_RANK set, TestMain runs one rank instead of the tests.
func TestMain(m *testing.M) {
	if os.Getenv("MC_COLLBENCH_RANK") != "" {
		if err := childRank(os.Args[1:]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func childRank(args []string) error {
	fs := flag.NewFlagSet("rank", flag.ContinueOnError)
	rank := fs.Int("rank", 0, "")
	world := fs.Int("world-size", 0, "")
	store := fs.String("store", "", "")
	group := fs.String("group", "", "")
	collective := fs.String("collective", "all_reduce", "")
	kill := fs.Int("kill-rank", -1, "")
	after := fs.Int("kill-after", 0, "")
	protocol := fs.String("protocol", engine.ProtocolAuto, "")
	iters := fs.Int("iters", 3, "")
	if err := fs.Parse(args); err != nil {
		return err
	}
	// As mc's ranks: SIGINT ends the sweep, but not on the rank
	// MC_COLLBENCH_DEAF_RANK names, which carries on over the ranks that
	// stopped, as a rank does that gets the signal late.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if os.Getenv("MC_COLLBENCH_DEAF_RANK") == strconv.Itoa(*rank) {
		stop()
		signal.Ignore(os.Interrupt)
		ctx = context.Background()
	}
	be, err := meta.Open(ctx, *store, meta.Options{})
	if err != nil {
		return err
	}
	defer be.Close()
	st, err := meta.StoreOf(be)
	if err != nil {
		return err
	}
	eng, err := engine.New(ctx, engine.Config{LocalServerName: *group + "-" + strconv.Itoa(*rank), MetadataServer: *store, BindAddress: "127.0.0.1", Protocol: *protocol})
	if err != nil {
		return err
	}
	defer eng.Close()
	g, err := coll.New(ctx, coll.Config{Group: *group, Rank: *rank, WorldSize: *world, Engine: eng, Store: st, SlotSize: 4096, Timeout: 10 * time.Second})
	if err != nil {
		return err
	}
	defer g.Close()
	cfg := Config{Collective: *collective, MinBytes: 8, MaxBytes: 64 << 10, Factor: 8, Iters: *iters, Warmup: 1, Check: true,
		KillRank: *kill, KillAfter: *after, Exit: func() { os.Exit(0) }}
	return RunRank(ctx, g, eng, cfg, func(r Result) {
		b, _ := json.Marshal(r)
		fmt.Printf("%s\n", b)
	})
}

var rankPrefix = regexp.MustCompile(`^rank [0-2]: `)

// An interrupted launch returns at once with the rows reported so far,
// each of which OnRow got as it came (issue 40.4: mc bench coll was
// silent until the end, and SIGINT lost every row).
func TestLaunchInterrupted(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var seen []Result
	var at time.Time
	rows, err := Launch(ctx, LaunchConfig{
		Exe: exe, Args: []string{"-iters", "2000", "-protocol", "tcp"}, Ranks: 2, Env: []string{"MC_COLLBENCH_RANK=1"},
		RankArgs: func(r int, store, group string) []string {
			return []string{"-rank", strconv.Itoa(r), "-world-size", "2", "-store", store, "-group", group}
		},
		OnRow: func(r Result) {
			seen = append(seen, r)
			if len(seen) == 1 {
				at = time.Now()
				cancel()
			}
		},
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Launch = %d rows, %v; want the rows so far and context.Canceled", len(rows), err)
	}
	if len(seen) == 0 || len(rows) == 0 || len(rows) > 4 || rows[0].SizeBytes != seen[0].SizeBytes {
		t.Fatalf("rows %+v, OnRow saw %+v", rows, seen)
	}
	if d := time.Since(at); d > rankStopGrace+3*time.Second {
		t.Fatalf("returned %s after the interrupt", d)
	}
}

// Ranks stop at different moments after an interrupt; one that stops
// late carries on over the ranks already gone. Its rows (one rank, a
// collective that moves nothing at absurd bandwidth) are neither
// reported nor returned: mc bench coll printed "all_reduce 64M, 1 ranks:
// 0.1 us, algbw 779882 GB/s" after SIGINT.
func TestLaunchInterruptedDropsRowsOfTheBrokenGroup(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var seen []Result
	rows, err := Launch(ctx, LaunchConfig{
		Exe: exe, Args: []string{"-iters", "300", "-protocol", "tcp"}, Ranks: 2,
		Env: []string{"MC_COLLBENCH_RANK=1", "MC_COLLBENCH_DEAF_RANK=1"},
		RankArgs: func(r int, store, group string) []string {
			return []string{"-rank", strconv.Itoa(r), "-world-size", "2", "-store", store, "-group", group}
		},
		OnRow: func(r Result) {
			seen = append(seen, r)
			cancel()
		},
	})
	if !errors.Is(err, context.Canceled) || len(rows) == 0 {
		t.Fatalf("Launch = %d rows, %v; want the rows so far and context.Canceled", len(rows), err)
	}
	for _, r := range append(seen, rows...) {
		if !slices.Equal(r.ActiveRanks, []int{0, 1}) || len(r.Failed) > 0 {
			t.Errorf("row of size %d on ranks %v (failed %v) after the interrupt: %+v", r.SizeBytes, r.ActiveRanks, r.Failed, r)
		}
	}
}

func TestLaunchProcesses(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	launch := func(args ...string) []Result {
		t.Helper()
		rows, err := Launch(context.Background(), LaunchConfig{
			Exe: exe, Args: args, Ranks: 3, Stderr: &stderr, Env: []string{"MC_COLLBENCH_RANK=1"},
			RankArgs: func(r int, store, group string) []string {
				return []string{"-rank", strconv.Itoa(r), "-world-size", "3", "-store", store, "-group", group}
			},
		})
		if err != nil {
			t.Fatalf("launch %v: %v\n%s", args, err, stderr.String())
		}
		return rows
	}
	rows := launch("-collective", "all_gather")
	// 8, 64, 512, 4K, 32K, rounded down to blocks of 3 ranks (at least one
	// element each): 12, 60, 504, 4092, 32760.
	if len(rows) != 5 || rows[0].SizeBytes != 12 || rows[4].SizeBytes != 32760 {
		t.Fatalf("rows: %+v", rows)
	}
	// Ranks in processes of one host under auto: their engines moved
	// every row's bytes through shared memory, none over tcp.
	for _, r := range rows {
		if r.Collective != "all_gather" || r.Ranks != 3 || r.Correct == nil || !*r.Correct || r.TimeUS <= 0 || r.Transport != "shm" {
			t.Fatalf("row %+v", r)
		}
	}
	if u := Unfinished(rows, 3); u != nil {
		t.Fatalf("unfinished after a full run: %v", u)
	}
	for _, r := range launch("-collective", "all_reduce", "-protocol", "tcp") {
		if r.Transport != "tcp" || !*r.Correct {
			t.Fatalf("-protocol tcp: row %+v", r)
		}
	}
	// The drill (over shm): rank 1 exits for real after 6 collectives.
	rows = launch("-kill-rank", "1", "-kill-after", "6")
	last := rows[len(rows)-1]
	if !slices.Equal(last.ActiveRanks, []int{0, 2}) || last.Ranks != 2 || !*last.Correct {
		t.Fatalf("after the drill: %+v", last)
	}
	failed := false
	for _, r := range rows {
		failed = failed || slices.Equal(r.Failed, []int{1})
	}
	if !failed {
		t.Fatalf("no row records rank 1 failing: %+v", rows)
	}
	// mc bench coll fails such a run: rank 1 did not finish.
	if u := Unfinished(rows, 3); !slices.Equal(u, []int{1}) {
		t.Fatalf("unfinished after the drill: %v, want [1]", u)
	}
	// Which survivor notices the failure first (and logs it) is a race;
	// what must hold is that every line says which rank wrote it and that
	// the failed peer is named.
	if !strings.Contains(stderr.String(), "peer=1") {
		t.Fatalf("no survivor logged the failed peer: %q", stderr.String())
	}
	for _, line := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
		if !rankPrefix.MatchString(line) {
			t.Fatalf("rank stderr line not prefixed: %q", line)
		}
	}
}

func TestVerifyCatchesWrongResults(t *testing.T) {
	be := meta.NewMemory()
	st, _ := meta.StoreOf(be)
	ctx := context.Background()
	eng, err := engine.New(ctx, engine.Config{LocalServerName: "verify", Backend: be, BindAddress: "127.0.0.1", HandshakeAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	g, err := coll.New(ctx, coll.Config{Group: "verify", Rank: 0, WorldSize: 1, Engine: eng, Store: st, SlotSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	for _, c := range Collectives {
		r := &runner{cfg: Config{Collective: c}, g: g, size: 1, send: make([]float32, 16), recv: make([]float32, 16)}
		r.fill(16)
		if err := r.once(ctx, 16, 16); err != nil {
			t.Fatal(err)
		}
		if !r.verify([]int{0}, 16, 16) {
			t.Fatalf("%s: a right result fails the check", c)
		}
		r.send[3]++
		r.recv[3]++
		if r.verify([]int{0}, 16, 16) {
			t.Fatalf("%s: a wrong result passes the check", c)
		}
	}
}

func TestConfigAndMerge(t *testing.T) {
	c := Config{Collective: "all_reduce", MinBytes: 8, MaxBytes: 64 << 20, Factor: 2, Iters: 1}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if s := c.Sizes(); len(s) != 24 || s[0] != 8 || s[23] != 64<<20 {
		t.Fatalf("sizes %v", s)
	}
	for _, bad := range []Config{
		{Collective: "all_scatter", MinBytes: 8, MaxBytes: 8, Factor: 2, Iters: 1},
		{Collective: "broadcast", MinBytes: 16, MaxBytes: 8, Factor: 2, Iters: 1},
		{Collective: "broadcast", MinBytes: 8, MaxBytes: 8, Factor: 1, Iters: 1},
		{Collective: "broadcast", MinBytes: 8, MaxBytes: 8, Factor: 2, Iters: 0},
	} {
		if bad.Validate() == nil {
			t.Fatalf("%+v accepted", bad)
		}
	}
	if f := busFactor("all_reduce", 4); f != 1.5 {
		t.Fatalf("all_reduce bus factor %v", f)
	}
	if f := busFactor("all_gather", 4); f != 0.75 {
		t.Fatalf("all_gather bus factor %v", f)
	}
	// Rank 0 died before the second size: rank 1's row stands for it.
	rows := Merge([][]Result{
		{{SizeBytes: 8, ActiveRanks: []int{0, 1}, TimeUS: 1}},
		{{SizeBytes: 8, ActiveRanks: []int{0, 1}, TimeUS: 2}, {SizeBytes: 64, ActiveRanks: []int{1}, TimeUS: 3}},
	})
	if len(rows) != 2 || rows[0].TimeUS != 1 || rows[1].TimeUS != 3 {
		t.Fatalf("merged %+v", rows)
	}
}
