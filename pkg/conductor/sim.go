package conductor

import (
	"container/heap"
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/kvcache-ops/mc/pkg/trace"
)

// SimConfig configures one simulation run.
type SimConfig struct {
	Prefill, Decode int
	Scheduler       Scheduler
	Rejection       Rejection
	TTFTSLO         time.Duration
	TBTSLO          time.Duration
	// CacheBlocks per prefill instance (0: unbounded).
	CacheBlocks int
	// CachePolicy is a pkg/store/policy name (default lru).
	CachePolicy        string
	BalancingThreshold float64
	// Speedup divides arrival times (2 replays the trace twice as fast).
	Speedup float64
	Cost    CostModel
	Seed    uint64
	// LoadEvery samples prefill and decode load (default 1 s of
	// simulated time) into Result.Load.
	LoadEvery time.Duration
}

// Result is one run's figures. JSON names are stable.
type Result struct {
	Scheduler      string  `json:"scheduler"`
	Rejection      string  `json:"rejection"`
	Requests       int     `json:"requests"`
	Accepted       int     `json:"accepted"`
	Rejected       int     `json:"rejected"`
	WastedPrefills int     `json:"wasted_prefills"`
	TTFTP50        float64 `json:"ttft_p50_s"`
	TTFTP90        float64 `json:"ttft_p90_s"`
	TTFTP99        float64 `json:"ttft_p99_s"`
	TBTP50         float64 `json:"tbt_p50_s"`
	TBTP90         float64 `json:"tbt_p90_s"`
	TBTP99         float64 `json:"tbt_p99_s"`
	SLOAttainment  float64 `json:"slo_attainment"`
	GoodputRPS     float64 `json:"goodput_rps"`
	CacheHitRatio  float64 `json:"cache_hit_ratio"`
	MigratedBlocks int     `json:"migrated_blocks"`
	// DecodeLoadMean and DecodeLoadSwing (standard deviation over the
	// samples) measure the oscillation the paper's Figures 9 and 10 show.
	DecodeLoadMean  float64 `json:"decode_load_mean"`
	DecodeLoadSwing float64 `json:"decode_load_swing"`
	// Load is the sampled load over time (for --load-trace and --plot).
	Load []LoadSample `json:"-"`
}

// LoadSample is the pools' load at a time. Prefill load is the mean
// queued prefill work per instance over the TTFT SLO (1: a request
// arriving now just meets it); decode load is the mean batch per instance
// over the largest batch that keeps the TBT SLO with the average context
// of the trace (1: saturated).
type LoadSample struct {
	T       time.Duration
	Prefill float64
	Decode  float64
}

type evKind uint8

const (
	evArrive evKind = iota
	evPrefillDone
	evDecodeArrive
	evStepDone
	evSample
)

type event struct {
	at   time.Duration
	seq  uint64 // ties break in creation order: deterministic
	kind evKind
	req  int
	d    int
}

type eventQueue []event

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	return q[i].at < q[j].at || q[i].at == q[j].at && q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(event)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

type reqState struct {
	arrive, prefillDone, join time.Duration
	decode                    int
	remaining                 int
	ttft, tbt                 time.Duration
	state                     uint8 // 0 pending, 1 rejected, 2 wasted, 3 done
	hasTBT                    bool
}

type decodeInst struct {
	batch    []int // request indices
	ctx      int
	stepping bool
	joining  []int
	incoming []incoming // assigned, not arrived yet
	stepLen  time.Duration
}

type incoming struct {
	req int
	eta time.Duration
	ctx int
}

// Sim is one simulation over a trace.
type Sim struct {
	cfg    SimConfig
	reqs   []trace.Request
	st     []reqState
	cond   *Conductor
	dec    []*decodeInst
	q      eventQueue
	seq    uint64
	now    time.Duration
	res    Result
	hit    int
	blocks int
	avgCtx int
}

func (s *Sim) push(at time.Duration, kind evKind, req, d int) {
	s.seq++
	heap.Push(&s.q, event{at: at, seq: s.seq, kind: kind, req: req, d: d})
}

// Decodes, Load and PredictLoad make the simulator the conductor's
// DecodeView.
func (s *Sim) Decodes() int { return len(s.dec) }

func (s *Sim) Load(d int) DecodeLoad {
	x := s.dec[d]
	return DecodeLoad{Batch: len(x.batch) + len(x.joining), CtxTokens: x.ctx}
}

// PredictLoad counts the sequences of d still decoding at time at
// (remaining tokens at the current step length) plus those assigned to
// arrive by then.
func (s *Sim) PredictLoad(d int, at time.Duration) DecodeLoad {
	x := s.dec[d]
	step := x.stepLen
	if step == 0 {
		step = s.cfg.Cost.DecodeStep(max(len(x.batch), 1), x.ctx)
	}
	ahead := at - s.now
	var l DecodeLoad
	for _, r := range append(slices.Clip(x.batch), x.joining...) {
		if time.Duration(s.st[r].remaining)*step > ahead {
			l.Batch++
			l.CtxTokens += s.reqs[r].InputLength + s.reqs[r].OutputLength - s.st[r].remaining
		}
	}
	for _, in := range x.incoming {
		if in.eta <= at {
			l.Batch++
			l.CtxTokens += in.ctx
		}
	}
	return l
}

// Simulate replays reqs (in timestamp order) through the conductor.
func Simulate(cfg SimConfig, reqs []trace.Request) (Result, error) {
	return SimulateContext(context.Background(), cfg, reqs)
}

// SimulateContext is Simulate stopped by ctx (its error then): a
// simulation of a large cluster or trace runs for minutes.
func SimulateContext(ctx context.Context, cfg SimConfig, reqs []trace.Request) (Result, error) {
	if cfg.Prefill <= 0 || cfg.Decode <= 0 {
		return Result{}, fmt.Errorf("need at least one prefill and one decode instance (got %d and %d)", cfg.Prefill, cfg.Decode)
	}
	if cfg.TTFTSLO <= 0 || cfg.TBTSLO <= 0 {
		return Result{}, fmt.Errorf("SLOs must be positive")
	}
	if cfg.Speedup == 0 {
		cfg.Speedup = 1
	}
	if cfg.Speedup < 0 || math.IsInf(cfg.Speedup, 0) || math.IsNaN(cfg.Speedup) {
		return Result{}, fmt.Errorf("speedup %g: want a positive number", cfg.Speedup)
	}
	if cfg.CachePolicy == "" {
		cfg.CachePolicy = "lru"
	}
	if cfg.LoadEvery <= 0 {
		cfg.LoadEvery = time.Second
	}
	if cfg.BalancingThreshold == 0 {
		cfg.BalancingThreshold = 1.5
	}
	s := &Sim{cfg: cfg, reqs: reqs, st: make([]reqState, len(reqs))}
	prefill := make([]*PrefillInstance, cfg.Prefill)
	for i := range prefill {
		c, err := NewCache(cfg.CacheBlocks, cfg.CachePolicy)
		if err != nil {
			return Result{}, err
		}
		prefill[i] = &PrefillInstance{Cache: c}
	}
	for range cfg.Decode {
		s.dec = append(s.dec, &decodeInst{})
	}
	var err error
	s.cond, err = New(Config{Scheduler: cfg.Scheduler, Rejection: cfg.Rejection, TTFTSLO: cfg.TTFTSLO, TBTSLO: cfg.TBTSLO,
		BalancingThreshold: cfg.BalancingThreshold, Cost: cfg.Cost, Seed: cfg.Seed}, prefill, s)
	if err != nil {
		return Result{}, err
	}
	var ctxSum int
	for i, r := range reqs {
		s.push(time.Duration(float64(r.Timestamp)*float64(time.Millisecond)/cfg.Speedup), evArrive, i, 0)
		ctxSum += r.InputLength + r.OutputLength/2
	}
	if len(reqs) > 0 {
		s.avgCtx = ctxSum / len(reqs)
		s.push(0, evSample, 0, 0)
	}
	s.res = Result{Scheduler: string(cfg.Scheduler), Rejection: string(cfg.Rejection), Requests: len(reqs)}
	for n := 0; s.q.Len() > 0; n++ {
		if n%4096 == 0 && ctx.Err() != nil {
			return Result{}, ctx.Err()
		}
		e := heap.Pop(&s.q).(event)
		s.now = e.at
		switch e.kind {
		case evArrive:
			s.arrive(e.req)
		case evPrefillDone:
			s.prefillDone(e.req)
		case evDecodeArrive:
			s.decodeArrive(e.req)
		case evStepDone:
			s.stepDone(e.d)
		case evSample:
			s.sample()
			// Keep sampling while requests are in flight.
			if s.unfinished() > 0 {
				s.push(s.now+cfg.LoadEvery, evSample, 0, 0)
			}
		}
	}
	s.finish()
	return s.res, nil
}

func (s *Sim) unfinished() int {
	n := 0
	for i := range s.st {
		if s.st[i].state == 0 {
			n++
		}
	}
	return n
}

func (s *Sim) arrive(i int) {
	r := s.reqs[i]
	st := &s.st[i]
	st.arrive = s.now
	d := s.cond.Schedule(s.now, Request{Tokens: r.InputLength, OutTokens: r.OutputLength, Blocks: r.HashIDs})
	if d.Reject {
		st.state = 1
		s.res.Rejected++
		return
	}
	s.hit += d.UsedPrefix
	s.blocks += len(r.HashIDs)
	s.res.MigratedBlocks += d.Migrated()
	st.decode = d.Decode
	done := s.cond.Prefill[d.Prefill].BusyUntil
	s.push(done, evPrefillDone, i, 0)
	// The decode instance learns now what will arrive and when (its
	// load prediction uses it).
	eta := done + s.cfg.Cost.Transfer(len(r.HashIDs))
	x := s.dec[d.Decode]
	x.incoming = append(x.incoming, incoming{req: i, eta: eta, ctx: r.InputLength})
}

func (s *Sim) prefillDone(i int) {
	st := &s.st[i]
	st.prefillDone = s.now
	st.ttft = s.now - st.arrive
	r := s.reqs[i]
	if r.OutputLength <= 1 {
		s.dropIncoming(i)
		st.state = 3
		return
	}
	s.push(s.now+s.cfg.Cost.Transfer(len(r.HashIDs)), evDecodeArrive, i, 0)
}

func (s *Sim) dropIncoming(i int) {
	x := s.dec[s.st[i].decode]
	x.incoming = slices.DeleteFunc(x.incoming, func(in incoming) bool { return in.req == i })
}

// decodeArrive admits a prefilled request to its decode instance, unless
// adding it breaks the TBT SLO: then it is rejected and its prefill was
// wasted.
func (s *Sim) decodeArrive(i int) {
	st := &s.st[i]
	s.dropIncoming(i)
	x := s.dec[st.decode]
	r := s.reqs[i]
	kv := s.cfg.Cost.DecodeKVTokens
	if s.cfg.Cost.DecodeStep(len(x.batch)+len(x.joining)+1, x.ctx+r.InputLength) > s.cfg.TBTSLO ||
		kv > 0 && x.ctx+r.InputLength+r.OutputLength > kv {
		st.state = 2
		s.res.Rejected++
		s.res.WastedPrefills++
		return
	}
	st.remaining = r.OutputLength - 1
	x.joining = append(x.joining, i)
	x.ctx += r.InputLength
	if !x.stepping {
		s.step(st.decode)
	}
}

// step starts a decode iteration: the joining sequences enter the batch.
func (s *Sim) step(d int) {
	x := s.dec[d]
	for _, i := range x.joining {
		s.st[i].join = s.now
	}
	x.batch = append(x.batch, x.joining...)
	x.joining = x.joining[:0]
	if len(x.batch) == 0 {
		x.stepping, x.stepLen = false, 0
		return
	}
	x.stepping = true
	x.stepLen = s.cfg.Cost.DecodeStep(len(x.batch), x.ctx)
	s.push(s.now+x.stepLen, evStepDone, 0, d)
}

func (s *Sim) stepDone(d int) {
	x := s.dec[d]
	keep := x.batch[:0]
	for _, i := range x.batch {
		st := &s.st[i]
		st.remaining--
		x.ctx++
		if st.remaining > 0 {
			keep = append(keep, i)
			continue
		}
		r := s.reqs[i]
		st.state = 3
		st.tbt = (s.now - st.join) / time.Duration(r.OutputLength-1)
		st.hasTBT = true
		x.ctx -= r.InputLength + r.OutputLength - 1
	}
	x.batch = keep
	s.step(d)
}

func (s *Sim) sample() {
	var pre, dec float64
	for _, p := range s.cond.Prefill {
		pre += float64(max(p.BusyUntil-s.now, 0))
	}
	pre /= float64(len(s.cond.Prefill)) * float64(s.cfg.TTFTSLO)
	maxBatch := s.cfg.Cost.MaxBatchFor(s.cfg.TBTSLO, s.avgCtx)
	for _, x := range s.dec {
		dec += float64(len(x.batch) + len(x.joining))
	}
	dec /= float64(len(s.dec)) * float64(maxBatch)
	s.res.Load = append(s.res.Load, LoadSample{T: s.now, Prefill: pre, Decode: dec})
}

func (s *Sim) finish() {
	var ttft, tbt []float64
	good := 0
	var first, last time.Duration = -1, 0
	for i := range s.st {
		st := &s.st[i]
		at := time.Duration(float64(s.reqs[i].Timestamp) * float64(time.Millisecond) / s.cfg.Speedup)
		if first < 0 || at < first {
			first = at
		}
		last = max(last, at)
		if st.state != 3 {
			continue
		}
		s.res.Accepted++
		ttft = append(ttft, st.ttft.Seconds())
		if st.hasTBT {
			tbt = append(tbt, st.tbt.Seconds())
		}
		if st.ttft <= s.cfg.TTFTSLO && (!st.hasTBT || st.tbt <= s.cfg.TBTSLO) {
			good++
		}
	}
	slices.Sort(ttft)
	slices.Sort(tbt)
	s.res.TTFTP50, s.res.TTFTP90, s.res.TTFTP99 = pct(ttft, 0.5), pct(ttft, 0.9), pct(ttft, 0.99)
	s.res.TBTP50, s.res.TBTP90, s.res.TBTP99 = pct(tbt, 0.5), pct(tbt, 0.9), pct(tbt, 0.99)
	if s.res.Requests > 0 {
		s.res.SLOAttainment = float64(good) / float64(s.res.Requests)
	}
	if span := (last - first).Seconds(); span > 0 {
		s.res.GoodputRPS = float64(good) / span
	}
	if s.blocks > 0 {
		s.res.CacheHitRatio = float64(s.hit) / float64(s.blocks)
	}
	var sum, sq float64
	for _, l := range s.res.Load {
		sum += l.Decode
	}
	if n := float64(len(s.res.Load)); n > 0 {
		s.res.DecodeLoadMean = sum / n
		for _, l := range s.res.Load {
			sq += (l.Decode - s.res.DecodeLoadMean) * (l.Decode - s.res.DecodeLoadMean)
		}
		s.res.DecodeLoadSwing = math.Sqrt(sq / n)
	}
}

func pct(v []float64, p float64) float64 {
	if len(v) == 0 {
		return 0
	}
	return v[int(p*float64(len(v)-1))]
}
