package collbench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine/meta"
)

// LaunchConfig starts Ranks local rank processes: Exe with Args, then
// RankArgs(rank, store, group) (the flags that make it one rank of the
// group). Each rank writes its rows to stdout as JSON lines; what ranks
// write to stderr is copied to Stderr, each line prefixed "rank R: ".
type LaunchConfig struct {
	Exe      string
	Args     []string
	RankArgs func(rank int, store, group string) []string
	Ranks    int
	Stderr   io.Writer
	// Env is added to each rank's environment.
	Env []string
	// OnRow, when set, gets each size's row as soon as the first rank
	// active in it reports it (Launch's merged rows are those rows).
	OnRow func(Result)
}

// Launch starts an embedded etcd on a loopback port as the rendezvous,
// runs the ranks to completion and merges their rows: per size, the row of
// the lowest rank that was active in it. A rank that exits with an error
// fails the launch; one that exits 0 early (the failure drill) does not.
// When ctx ends, the ranks get SIGINT (SIGKILL if they are still there
// after rankStopGrace) and Launch returns the rows reported until then
// with ctx's error (and rows that finish after it on the same ranks, but
// none that a rank still running measured over the ranks already gone).
func Launch(ctx context.Context, lc LaunchConfig) ([]Result, error) {
	if lc.Ranks < 1 {
		return nil, fmt.Errorf("ranks %d: want at least 1", lc.Ranks)
	}
	ee, err := meta.StartEtcd(ctx, meta.EtcdConfig{Listen: "127.0.0.1:0", NoFsync: true})
	if err != nil {
		return nil, fmt.Errorf("rendezvous: %w", err)
	}
	defer ee.Close()
	store := "etcd://" + ee.Endpoints()[0]
	group := fmt.Sprintf("bench-%d-%d", os.Getpid(), time.Now().UnixNano())

	var mu sync.Mutex
	reported := map[int64]bool{}
	// whole is the active ranks of the last row reported before ctx
	// ended. Once it has, ranks stop at different moments, and one that
	// stops late carries on over those that are gone: its rows measure
	// the group the interruption broke up (one rank: a collective that
	// moves nothing, at absurd bandwidth), not the sweep. They are
	// dropped: after the interrupt only a row on those same ranks, with
	// none failed during it, is kept.
	whole := make([]int, lc.Ranks)
	for r := range whole {
		whole[r] = r
	}
	rows := make([][]Result, lc.Ranks)
	errs := make([]error, lc.Ranks)
	var wg sync.WaitGroup
	for r := 0; r < lc.Ranks; r++ {
		args := append(slices.Clone(lc.Args), lc.RankArgs(r, store, group)...)
		cmd := exec.CommandContext(ctx, lc.Exe, args...)
		cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
		cmd.WaitDelay = rankStopGrace
		cmd.Env = append(os.Environ(), lc.Env...)
		cmd.Stderr = &prefixWriter{w: lc.Stderr, prefix: "rank " + strconv.Itoa(r) + ": ", mu: &mu}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			return nil, fmt.Errorf("start rank %d: %w", r, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sc := bufio.NewScanner(out)
			sc.Buffer(make([]byte, 64<<10), 1<<20)
			for sc.Scan() {
				var res Result
				if err := json.Unmarshal(sc.Bytes(), &res); err != nil {
					errs[r] = fmt.Errorf("rank %d wrote %q: %w", r, sc.Text(), err)
					continue
				}
				mu.Lock()
				if ctx.Err() != nil && (len(res.Failed) > 0 || !slices.Equal(res.ActiveRanks, whole)) {
					mu.Unlock()
					continue
				}
				rows[r] = append(rows[r], res)
				if slices.Contains(res.ActiveRanks, r) && !reported[res.SizeBytes] {
					reported[res.SizeBytes] = true
					if ctx.Err() == nil {
						whole = slices.Clone(res.ActiveRanks)
					}
					if lc.OnRow != nil {
						lc.OnRow(res)
					}
				}
				mu.Unlock()
			}
			if err := cmd.Wait(); err != nil && errs[r] == nil {
				errs[r] = fmt.Errorf("rank %d: %w", r, err)
			}
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		return Merge(rows), ctx.Err()
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return Merge(rows), nil
}

// rankStopGrace is how long an interrupted rank has to exit before it
// is killed.
const rankStopGrace = 5 * time.Second

// Unfinished lists the ranks of a group of n that were not active in the
// sweep's last row (every rank when there is no row): those that failed
// or exited during the sweep.
func Unfinished(rows []Result, n int) []int {
	var out []int
	for r := range n {
		if len(rows) == 0 || !slices.Contains(rows[len(rows)-1].ActiveRanks, r) {
			out = append(out, r)
		}
	}
	return out
}

// Merge picks, for each size in the order first seen, the row of the
// lowest rank that was active in it.
func Merge(rows [][]Result) []Result {
	var out []Result
	seen := map[int64]int{}
	for r, rs := range rows {
		for _, res := range rs {
			if !slices.Contains(res.ActiveRanks, r) {
				continue
			}
			if _, ok := seen[res.SizeBytes]; ok {
				continue
			}
			seen[res.SizeBytes] = len(out)
			out = append(out, res)
		}
	}
	slices.SortStableFunc(out, func(a, b Result) int { return int(a.SizeBytes - b.SizeBytes) })
	return out
}

// prefixWriter prefixes every line written to w.
type prefixWriter struct {
	w      io.Writer
	prefix string
	mu     *sync.Mutex
	buf    []byte
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.buf = append(p.buf, b...)
	for {
		i := slices.Index(p.buf, '\n')
		if i < 0 {
			break
		}
		if p.w != nil {
			fmt.Fprintf(p.w, "%s%s\n", p.prefix, p.buf[:i])
		}
		p.buf = p.buf[i+1:]
	}
	return len(b), nil
}
