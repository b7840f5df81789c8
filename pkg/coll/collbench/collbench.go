// Package collbench is `mc bench coll`: an nccl-tests style sweep of one
// collective over a pkg/coll group, run by every rank (RunRank), and the
// launcher that starts a group of local rank processes around an
// embedded etcd and merges what they report (Launch).
//
// Sizes, algbw and busbw follow nccl-tests' definitions: the size is the
// largest buffer of the operation (all-gather: the gathered buffer;
// reduce-scatter: the buffer before scattering), algbw = size / time, and
// busbw = algbw x 2(n-1)/n for all_reduce, (n-1)/n for all_gather,
// reduce_scatter and all_to_all, x 1 for broadcast, with n the active
// ranks. The time of a row is the slowest active rank's mean.
package collbench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
	"unsafe"

	"github.com/kvcache-ops/mc/pkg/coll"
	"github.com/kvcache-ops/mc/pkg/engine"
)

// Collectives are the names --collective accepts.
var Collectives = []string{"all_reduce", "all_gather", "broadcast", "reduce_scatter", "all_to_all"}

// Config is one sweep.
type Config struct {
	Collective         string
	MinBytes, MaxBytes int64
	Factor             int64
	Iters, Warmup      int
	Check              bool
	// KillRank exits (Exit) after KillAfter collectives of the sweep
	// (warm-up, timed and check ones); KillRank < 0 disables the drill.
	KillRank, KillAfter int
	// Exit ends the process of the killed rank; it must not return.
	Exit func()
}

// Result is one row.
type Result struct {
	Collective  string  `json:"collective"`
	SizeBytes   int64   `json:"size_bytes"`
	Ranks       int     `json:"ranks"`
	ActiveRanks []int   `json:"active_ranks"`
	TimeUS      float64 `json:"time_us"`
	AlgBW       float64 `json:"algbw_gbps"`
	BusBW       float64 `json:"busbw_gbps"`
	// Correct is null when --check was not asked for.
	Correct *bool `json:"correct"`
	// Failed lists ranks found failed while this row ran.
	Failed []int `json:"failed"`
	// Transport names the transports that moved the row's bytes, over
	// every active rank, as their engines counted them
	// (engine.Stats.Transport: "shm", "tcp", "shm+tcp", ...).
	Transport string `json:"transport"`
}

// Validate checks cfg.
func (c Config) Validate() error {
	switch {
	case !slices.Contains(Collectives, c.Collective):
		return fmt.Errorf("collective %q: want one of %v", c.Collective, Collectives)
	case c.MinBytes <= 0 || c.MaxBytes < c.MinBytes:
		return fmt.Errorf("sizes %d to %d: want 0 < min <= max", c.MinBytes, c.MaxBytes)
	case c.Factor < 2:
		return fmt.Errorf("step factor %d: want at least 2", c.Factor)
	case c.Iters < 1:
		return fmt.Errorf("iterations %d: want at least 1", c.Iters)
	case c.Warmup < 0:
		return fmt.Errorf("warm-up iterations %d: want 0 or more", c.Warmup)
	}
	return nil
}

// Sizes lists the sweep's sizes.
func (c Config) Sizes() []int64 {
	var out []int64
	for s := c.MinBytes; s <= c.MaxBytes; s *= c.Factor {
		out = append(out, s)
	}
	return out
}

// busFactor converts algbw to busbw for n ranks.
func busFactor(coll string, n int) float64 {
	switch coll {
	case "all_reduce":
		return 2 * float64(n-1) / float64(n)
	case "broadcast":
		return 1
	}
	return float64(n-1) / float64(n)
}

// runner holds one rank's buffers and its place in the sweep.
//
// After a failure the survivors need not agree on what completed: a rank
// that finished a collective and died at once may have left some peers
// without its last flag, so they fail the collective the others finished,
// and a plain retry would pair one rank's retry with the others' next
// collective (of another size, at a row's end). So the sweep is a
// sequence of numbered steps and, whenever the active ranks change, every
// rank first runs a sync (an all-reduce of how many steps it completed,
// max) and skips the steps some survivor already completed.
type runner struct {
	cfg    Config
	g      *coll.Group
	eng    *engine.Engine
	size   int // group size (slots) the buffers are laid out for
	send   []float32
	recv   []float32
	calls  int   // collectives run, for the drill
	step   int   // next step number
	done   int   // steps completed by some survivor, as of the last sync
	synced []int // active ranks at the last sync
}

// elems is the float32 count of the operation's per-rank pieces for a
// size: (buffer, block). Sizes round down to whole elements per block
// (nccl-tests does the same), at least one.
func (r *runner) elems(size int64) (total, block int) {
	total = int(size / 4)
	switch r.cfg.Collective {
	case "all_reduce", "broadcast":
		return max(total, 1), max(total, 1)
	}
	block = max(total/r.size, 1)
	return block * r.size, block
}

// RunRank runs the sweep on this rank. emit gets every row, on every
// rank (the caller prints the lowest active rank's).
func RunRank(ctx context.Context, g *coll.Group, eng *engine.Engine, cfg Config, emit func(Result)) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	r := &runner{cfg: cfg, g: g, eng: eng, size: g.Size()}
	// Buffers in registered memory, as tensors would be: the collectives
	// send from them and reduce into them without staging copies.
	total, _ := r.elems(cfg.MaxBytes)
	m, err := eng.RegisterMemory(ctx, 2*4*total, "cpu:0", false)
	if err != nil {
		return fmt.Errorf("benchmark buffers: %w", err)
	}
	defer eng.UnregisterMemory(context.Background(), m)
	all := unsafe.Slice((*float32)(unsafe.Pointer(&m.Bytes()[0])), 2*total)
	r.send, r.recv = all[:total], all[total:]

	r.synced = g.ActiveRanks()
	for _, size := range cfg.Sizes() {
		res, ok, err := r.row(ctx, size)
		if err != nil {
			return fmt.Errorf("%s of %d bytes: %w", cfg.Collective, size, err)
		}
		if ok {
			emit(res)
		}
	}
	return nil
}

// value is rank q's element i: small integers, so sums are exact.
func value(q, i int) float32 { return float32(q+1) + float32(i%13) }

func (r *runner) fill(n int) {
	me := r.g.Rank()
	for i := range r.send[:n] {
		r.send[i] = value(me, i)
	}
}

// once runs the collective on the first n elements; root is the lowest
// active rank.
func (r *runner) once(ctx context.Context, n, block int) error {
	if r.cfg.KillRank == r.g.Rank() && r.calls == r.cfg.KillAfter && r.cfg.Exit != nil {
		r.cfg.Exit()
	}
	r.calls++
	g := r.g
	switch r.cfg.Collective {
	case "all_reduce":
		return coll.AllReduceOf(ctx, g, r.send[:n], coll.Sum)
	case "broadcast":
		return g.Broadcast(ctx, coll.Bytes(r.send[:n]), g.ActiveRanks()[0])
	case "all_gather":
		return g.AllGather(ctx, coll.Bytes(r.send[:block]), coll.Bytes(r.recv[:n]))
	case "reduce_scatter":
		return coll.ReduceScatterOf(ctx, g, r.send[:n], r.recv[:block], coll.Sum)
	default:
		return g.AllToAll(ctx, coll.Bytes(r.send[:n]), coll.Bytes(r.recv[:n]))
	}
}

// do runs step f unless survivors already completed it (ran false), and
// again after each failure of a peer; the failed ranks go to res.
func (r *runner) do(ctx context.Context, res *Result, f func() error) (ran bool, err error) {
	id := r.step
	r.step++
	for attempt := 0; attempt < 16; attempt++ {
		if err := r.resync(ctx, res); err != nil {
			return false, err
		}
		if id < r.done {
			return false, nil
		}
		err := f()
		if err == nil {
			r.done = id + 1
			return true, nil
		}
		if !r.failed(res, err) {
			return false, err
		}
	}
	return false, fmt.Errorf("step %d failed 16 times", id)
}

// failed records the ranks of a RankError and says whether err was one.
func (r *runner) failed(res *Result, err error) bool {
	var re *coll.RankError
	if !errors.As(err, &re) {
		return false
	}
	for _, q := range re.Ranks {
		if !slices.Contains(res.Failed, q) {
			res.Failed = append(res.Failed, q)
		}
	}
	return true
}

// resync runs the sync while the active ranks differ from the last sync's.
func (r *runner) resync(ctx context.Context, res *Result) error {
	for attempt := 0; !slices.Equal(r.g.ActiveRanks(), r.synced); attempt++ {
		if attempt == 16 {
			return errors.New("membership keeps changing")
		}
		act := r.g.ActiveRanks()
		agreed := []float64{float64(r.done)}
		if err := coll.AllReduceOf(ctx, r.g, agreed, coll.Max); err != nil {
			if !r.failed(res, err) {
				return err
			}
			continue
		}
		r.done = max(r.done, int(agreed[0]))
		// Ranks gone since the last sync, however this rank learnt it
		// (a failed collective, or a view read while waiting).
		for _, q := range r.synced {
			if !slices.Contains(act, q) && !slices.Contains(res.Failed, q) {
				res.Failed = append(res.Failed, q)
			}
		}
		r.synced = act
	}
	return nil
}

// row runs one size: warm-up, timed and check steps, then the agreement
// on the row's figures. emit is false when survivors completed the
// agreement without this rank (another rank reports the row).
func (r *runner) row(ctx context.Context, size int64) (res Result, emit bool, err error) {
	n, block := r.elems(size)
	res = Result{Collective: r.cfg.Collective, SizeBytes: int64(n) * 4}
	before := r.eng.Stats()
	op := func() error { return r.once(ctx, n, block) }
	r.fill(n)
	for range r.cfg.Warmup {
		if _, err := r.do(ctx, &res, op); err != nil {
			return res, false, err
		}
	}
	var spent time.Duration
	timed := 0
	for range r.cfg.Iters {
		var took time.Duration
		ran, err := r.do(ctx, &res, func() error {
			start := time.Now()
			err := op()
			took = time.Since(start)
			return err
		})
		if err != nil {
			return res, false, err
		}
		if ran {
			spent += took
			timed++
		}
	}
	wrong := 0.0
	if r.cfg.Check {
		var act []int
		ran, err := r.do(ctx, &res, func() error {
			r.fill(n)
			act = r.g.ActiveRanks()
			return op()
		})
		if err != nil {
			return res, false, err
		}
		if ran && !r.verify(act, n, block) {
			wrong = 1
		}
	}
	// Agree on the row: the slowest rank's mean, whether any rank saw
	// a wrong result, and which transports any rank's engine moved the
	// row's bytes with (a 0/1 per transport: max is "any").
	mean := 0.0
	if timed > 0 {
		mean = spent.Seconds() / float64(timed)
	}
	moved := r.eng.Stats().Sub(before).TransportBytes
	agreed := make([]float64, 2+len(moved))
	ran, err := r.do(ctx, &res, func() error {
		agreed[0], agreed[1] = mean, wrong
		for i, b := range moved {
			agreed[2+i] = 0
			if b > 0 {
				agreed[2+i] = 1
			}
		}
		return coll.AllReduceOf(ctx, r.g, agreed, coll.Max)
	})
	if err != nil || !ran {
		return res, false, err
	}
	res.ActiveRanks = r.g.ActiveRanks()
	res.Ranks = len(res.ActiveRanks)
	res.TimeUS = agreed[0] * 1e6
	var used engine.Stats
	for i := range used.TransportBytes {
		if agreed[2+i] > 0 {
			used.TransportBytes[i] = 1
		}
	}
	res.Transport = used.Transport()
	if agreed[0] > 0 {
		res.AlgBW = float64(res.SizeBytes) / agreed[0] / 1e9
		res.BusBW = res.AlgBW * busFactor(r.cfg.Collective, res.Ranks)
	}
	if r.cfg.Check {
		ok := agreed[1] == 0
		res.Correct = &ok
	}
	slices.Sort(res.Failed)
	return res, true, nil
}

// verify checks the check iteration's output over the active ranks act.
func (r *runner) verify(act []int, n, block int) bool {
	me := r.g.Rank()
	var sumRanks float32
	for _, q := range act {
		sumRanks += float32(q + 1)
	}
	k := float32(len(act))
	switch r.cfg.Collective {
	case "all_reduce":
		for i, v := range r.send[:n] {
			if v != sumRanks+k*float32(i%13) {
				return false
			}
		}
	case "broadcast":
		for i, v := range r.send[:n] {
			if v != value(act[0], i) {
				return false
			}
		}
	case "all_gather":
		for _, q := range act {
			for i, v := range r.recv[q*block : (q+1)*block] {
				if v != value(q, i) {
					return false
				}
			}
		}
	case "reduce_scatter":
		for i, v := range r.recv[:block] {
			if v != sumRanks+k*float32((me*block+i)%13) {
				return false
			}
		}
	default:
		for _, q := range act {
			for i, v := range r.recv[q*block : (q+1)*block] {
				if v != value(q, me*block+i) {
					return false
				}
			}
		}
	}
	return true
}
