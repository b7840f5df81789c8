package conductor

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// Scheduler names a prefill placement rule.
type Scheduler string

// The four schedulers the paper compares (its Figure 8).
const (
	// Random: a uniformly random prefill instance.
	Random Scheduler = "random"
	// LoadBalancing: the instance with the shortest queue.
	LoadBalancing Scheduler = "load-balancing"
	// CacheAware: the least estimated TTFT from each instance's own
	// cache (queue plus prefill of what it does not hold); no transfer
	// between instances.
	CacheAware Scheduler = "cache-aware"
	// KVCacheCentric: Algorithm 1, minimising estimated TTFT over queue,
	// prefill of the uncached part and transfer of a remote prefix.
	KVCacheCentric Scheduler = "kvcache-centric"
)

// Schedulers lists them in the paper's order.
var Schedulers = []Scheduler{Random, LoadBalancing, CacheAware, KVCacheCentric}

// Rejection names an admission rule.
type Rejection string

const (
	// NoRejection admits every request at arrival; a decode instance
	// still refuses a request whose admission would break the TBT SLO,
	// after its prefill ran (a wasted prefill).
	NoRejection Rejection = "none"
	// EarlyRejection refuses at arrival when the estimated TTFT breaks
	// its SLO or the chosen decode instance's current load would break
	// the TBT SLO (the paper's naive early rejection).
	EarlyRejection Rejection = "early"
	// PredictedRejection refuses at arrival on the decode load predicted
	// for when the request will reach decode (arrival + estimated TTFT).
	PredictedRejection Rejection = "predicted"
)

// Rejections lists the rejection modes.
var Rejections = []Rejection{NoRejection, EarlyRejection, PredictedRejection}

// ParseScheduler and ParseRejection read the names above.
func ParseScheduler(s string) (Scheduler, error) {
	for _, x := range Schedulers {
		if string(x) == s {
			return x, nil
		}
	}
	return "", fmt.Errorf("scheduler %q: want one of %s", s, joinNames(Schedulers))
}

func ParseRejection(s string) (Rejection, error) {
	for _, x := range Rejections {
		if string(x) == s {
			return x, nil
		}
	}
	return "", fmt.Errorf("rejection %q: want one of %s", s, joinNames(Rejections))
}

func joinNames[T ~string](xs []T) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = string(x)
	}
	return strings.Join(s, ", ")
}

// Request is what the scheduler sees of a request.
type Request struct {
	Tokens    int     // prompt tokens
	OutTokens int     // tokens to generate
	Blocks    []int64 // prefix-chained block hash ids
}

// PrefillInstance is one prefill instance's state: its cache and when its
// FIFO queue drains.
type PrefillInstance struct {
	Cache     *Cache
	BusyUntil time.Duration // simulation time its queue is done
}

// DecodeLoad is how busy a decode instance is: sequences and their
// context tokens.
type DecodeLoad struct {
	Batch     int
	CtxTokens int
}

// DecodeView lets the scheduler read decode load now and predicted at a
// later time (the simulator, or a real cluster's telemetry, implements
// it).
type DecodeView interface {
	Decodes() int
	Load(d int) DecodeLoad
	// PredictLoad is instance d's load at time at: sequences still
	// running then plus those assigned to arrive before it.
	PredictLoad(d int, at time.Duration) DecodeLoad
}

// Decision is where a request goes and what the scheduler expects.
type Decision struct {
	Prefill, Decode int
	LocalPrefix     int // blocks the chosen instance holds
	UsedPrefix      int // blocks reused (local, or fetched from Source)
	Source          int // instance the prefix is fetched from, -1 for none
	Queue           time.Duration
	Transfer        time.Duration
	PrefillTime     time.Duration
	TTFT            time.Duration // estimated: queue/transfer + prefill
	Reject          bool
	Why             string
}

// Config of a Conductor.
type Config struct {
	Scheduler Scheduler
	Rejection Rejection
	TTFTSLO   time.Duration
	TBTSLO    time.Duration
	// BalancingThreshold is Algorithm 1's kvcache_balancing_threshold:
	// an instance fetches the best remote prefix only when it is at
	// least this many times longer than its own (and longer at all).
	// Below it, an instance prefills from what it holds, so transfers
	// happen only for prefixes worth moving. The paper gives no value;
	// mc's default is 1.5.
	BalancingThreshold float64
	Cost               CostModel
	Seed               uint64
}

// Conductor schedules requests over prefill instances and a decode view.
type Conductor struct {
	cfg     Config
	Prefill []*PrefillInstance
	decode  DecodeView
	rng     *rand.Rand
}

// New makes a conductor over prefill instances and a decode view.
func New(cfg Config, prefill []*PrefillInstance, decode DecodeView) (*Conductor, error) {
	if len(prefill) == 0 || decode.Decodes() == 0 {
		return nil, fmt.Errorf("need at least one prefill and one decode instance")
	}
	if cfg.BalancingThreshold < 1 {
		return nil, fmt.Errorf("kvcache balancing threshold %g: want at least 1", cfg.BalancingThreshold)
	}
	if err := cfg.Cost.Check(); err != nil {
		return nil, err
	}
	return &Conductor{cfg: cfg, Prefill: prefill, decode: decode, rng: rand.New(rand.NewPCG(cfg.Seed, 0x6d63))}, nil
}

func (c *Conductor) queue(p int, now time.Duration) time.Duration {
	return max(c.Prefill[p].BusyUntil-now, 0)
}

// option is one way to serve a request on instance p.
type option struct {
	p, local, used, src int
	queue, xfer, pre    time.Duration
}

func (o option) ttft() time.Duration { return max(o.queue, o.xfer) + o.pre }

func (c *Conductor) localOption(p int, r Request, now time.Duration) option {
	local := c.Prefill[p].Cache.PrefixLen(r.Blocks)
	cached := min(local*blockTokens, r.Tokens)
	return option{p: p, local: local, used: local, src: -1, queue: c.queue(p, now), pre: c.cfg.Cost.Prefill(r.Tokens-cached, cached)}
}

const blockTokens = 512

// Schedule picks the prefill and decode instances for r arriving at now,
// applies the rejection rule, and on acceptance commits the choice: the
// prefill queue grows, the instance's cache takes the request's blocks
// (a fetched prefix stays there: hot-spot migration) and the source's
// blocks count as used.
func (c *Conductor) Schedule(now time.Duration, r Request) Decision {
	var o option
	switch c.cfg.Scheduler {
	case Random:
		o = c.localOption(c.rng.IntN(len(c.Prefill)), r, now)
	case LoadBalancing:
		o = c.localOption(0, r, now)
		for p := 1; p < len(c.Prefill); p++ {
			if q := c.queue(p, now); q < o.queue {
				o = c.localOption(p, r, now)
			}
		}
	case CacheAware:
		o = c.localOption(0, r, now)
		for p := 1; p < len(c.Prefill); p++ {
			if x := c.localOption(p, r, now); x.ttft() < o.ttft() {
				o = x
			}
		}
	default: // KVCacheCentric
		o = c.algorithm1(r, now)
	}
	d := Decision{Prefill: o.p, LocalPrefix: o.local, UsedPrefix: o.used, Source: o.src,
		Queue: o.queue, Transfer: o.xfer, PrefillTime: o.pre, TTFT: o.ttft()}
	d.Decode = c.pickDecode()
	c.admit(&d, r, now)
	if !d.Reject {
		c.commit(d, r, now)
	}
	return d
}

// algorithm1 is the paper's Algorithm 1: for every prefill instance,
// estimate TTFT with its own prefix, or, when the best prefix anywhere is
// at least BalancingThreshold times longer, with that prefix fetched
// from the instance holding it; take the instance with the least TTFT.
func (c *Conductor) algorithm1(r Request, now time.Duration) option {
	best, bestLen := -1, 0
	for p, inst := range c.Prefill {
		if n := inst.Cache.PrefixLen(r.Blocks); n > bestLen {
			best, bestLen = p, n
		}
	}
	var o option
	for p := range c.Prefill {
		x := c.localOption(p, r, now)
		if bestLen > x.local && float64(bestLen) >= c.cfg.BalancingThreshold*float64(x.local) {
			cached := min(bestLen*blockTokens, r.Tokens)
			y := option{p: p, local: x.local, used: bestLen, src: best, queue: x.queue,
				xfer: c.cfg.Cost.Transfer(bestLen - x.local), pre: c.cfg.Cost.Prefill(r.Tokens-cached, cached)}
			if y.ttft() < x.ttft() {
				x = y
			}
		}
		if p == 0 || x.ttft() < o.ttft() {
			o = x
		}
	}
	return o
}

// pickDecode is the decode instance with the cheapest step now.
func (c *Conductor) pickDecode() int {
	best, bestStep := 0, time.Duration(-1)
	for d := 0; d < c.decode.Decodes(); d++ {
		l := c.decode.Load(d)
		if s := c.cfg.Cost.DecodeStep(l.Batch, l.CtxTokens); bestStep < 0 || s < bestStep {
			best, bestStep = d, s
		}
	}
	return best
}

// admit applies the rejection rule at arrival.
func (c *Conductor) admit(d *Decision, r Request, now time.Duration) {
	if c.cfg.Rejection == NoRejection {
		return
	}
	if d.TTFT > c.cfg.TTFTSLO {
		d.Reject, d.Why = true, fmt.Sprintf("estimated TTFT %s over the %s SLO", d.TTFT.Round(time.Millisecond), c.cfg.TTFTSLO)
		return
	}
	l := c.decode.Load(d.Decode)
	what := "current"
	if c.cfg.Rejection == PredictedRejection {
		l = c.decode.PredictLoad(d.Decode, now+d.TTFT)
		what = "predicted"
	}
	if kv := c.cfg.Cost.DecodeKVTokens; kv > 0 && l.CtxTokens+r.Tokens+r.OutTokens > kv {
		d.Reject, d.Why = true, fmt.Sprintf("%s decode KV cache (%d tokens) has no room for %d more", what, l.CtxTokens, r.Tokens+r.OutTokens)
		return
	}
	if step := c.cfg.Cost.DecodeStep(l.Batch+1, l.CtxTokens+r.Tokens); step > c.cfg.TBTSLO {
		d.Reject, d.Why = true, fmt.Sprintf("%s decode load (%d sequences) gives TBT %s over the %s SLO", what, l.Batch, step.Round(time.Millisecond), c.cfg.TBTSLO)
	}
}

func (c *Conductor) commit(d Decision, r Request, now time.Duration) {
	inst := c.Prefill[d.Prefill]
	start := max(inst.BusyUntil, now+d.Transfer)
	inst.BusyUntil = start + d.PrefillTime
	if d.Source >= 0 && d.Source != d.Prefill {
		c.Prefill[d.Source].Cache.Use(r.Blocks[:d.UsedPrefix])
	}
	inst.Cache.Use(r.Blocks)
}

// Migrated is how many blocks a decision fetched from another instance.
func (d Decision) Migrated() int {
	if d.Source < 0 || d.Source == d.Prefill {
		return 0
	}
	return d.UsedPrefix - d.LocalPrefix
}
