package cmd

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvcache-ops/mc/pkg/conductor"
	"github.com/kvcache-ops/mc/pkg/store/policy"
	"github.com/kvcache-ops/mc/pkg/trace"
)

func newSimCmd(p *printer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Simulate Mooncake's Conductor and other schedulers on request traces",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(newSimConductorCmd(p))
	return cmd
}

type simConductorOptions struct {
	Trace              string
	Prefill, Decode    int
	Schedulers         string
	Rejections         string
	TTFTSLO, TBTSLO    time.Duration
	CacheBlocks        int
	CachePolicy        string
	BalancingThreshold float64
	Speedup            float64
	Seed               uint64
	LoadTrace          string
	Plot               string
	Cost               conductor.CostModel
}

func newSimConductorCmd(p *printer) *cobra.Command {
	o := simConductorOptions{Cost: conductor.DefaultCostModel()}
	def := o.Cost
	cmd := &cobra.Command{
		Use:   "conductor",
		Short: "Replay a trace through Mooncake's KVCache-centric scheduler and its rivals",
		Long: `conductor replays a FAST'25 request trace through a simulated cluster of
--prefill instances (each with a prefix cache of --cache-blocks-per-instance
blocks, evicting with the store's policies) and --decode instances, under
each --scheduler and --rejection rule, and reports TTFT and TBT percentiles,
SLO attainment, goodput, cache hit ratio and migrated blocks.

Schedulers (the Mooncake paper's Figure 8): random; load-balancing (shortest
prefill queue); cache-aware (least estimated TTFT from each instance's own
cache); kvcache-centric (Algorithm 1: also fetches a remote prefix at least
--balancing-threshold times longer than the local one when that lowers the
estimated TTFT; the fetched blocks stay: hot-spot migration). Decode goes to
the instance with the cheapest step.

Rejection: none (admit all; a decode instance still refuses a request that
would break the TBT SLO or overflow its KV cache, after its prefill: a wasted
prefill), early (refuse at arrival on estimated TTFT or current decode load:
the paper's naive early rejection), predicted (refuse on the decode load
predicted for when the request reaches decode).

The cost model (every constant a flag; defaults of the order of a dense 70B
model, fp16, 8 GPUs per instance, the paper's setup, not measurements):
  prefill = --prefill-base + uncached/--prefill-tokens-per-sec
            + --attn-sec-per-token2 × uncached × (cached + uncached)
  decode step = --decode-base + --decode-per-seq × batch
            + --decode-per-ctx-token × total context tokens in the batch
  transfer = --transfer-latency + blocks × --block-bytes / --link-gbps
  a decode instance holds --decode-kv-tokens tokens of KV cache.
Defaults: 320 KiB of KV per token (2 × 80 layers × 8 KV heads × 128 × 2 B),
160 MiB per 512-token block, ~12k prefill tokens/s, 25 ms decode base plus
~20 ns per context token (320 KiB over 16 TB/s of HBM), 1.5M KV tokens
(500 GB), 25 GB/s of RDMA.

--speedup X divides arrival times to create overload; --load-trace FILE
writes per-second prefill and decode load as CSV and --plot FILE.svg draws it
(the paper's Figures 9 and 10). The same inputs give the same output.

The examples' trace is one of Mooncake's FAST'25 traces, which mc's
repository fetches into testdata/traces with 'make traces'.`,
		Example: `  mc sim conductor --trace testdata/traces/conversation_trace.jsonl --prefill 4 --decode 2
  mc sim conductor --trace testdata/traces/conversation_trace.jsonl --scheduler random,load-balancing,cache-aware,kvcache-centric
  mc sim conductor --trace testdata/traces/conversation_trace.jsonl --prefill 8 --decode 1 --speedup 2 --rejection early,predicted --plot load.svg`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return runSimConductor(ctx, o, p)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Trace, "trace", "", "FAST'25 request trace (JSON lines), required")
	f.IntVar(&o.Prefill, "prefill", 4, "prefill instances")
	f.IntVar(&o.Decode, "decode", 2, "decode instances")
	f.StringVar(&o.Schedulers, "scheduler", "kvcache-centric", "random, load-balancing, cache-aware, kvcache-centric (comma list)")
	f.StringVar(&o.Rejections, "rejection", "none", "none, early, predicted (comma list)")
	durationVar(f, &o.TTFTSLO, "ttft-slo", 10*time.Second, "time-to-first-token SLO")
	durationVar(f, &o.TBTSLO, "tbt-slo", 100*time.Millisecond, "time-between-tokens SLO")
	f.IntVar(&o.CacheBlocks, "cache-blocks-per-instance", 20000, "prefix cache of each prefill instance, in 512-token blocks (0: unbounded)")
	f.StringVar(&o.CachePolicy, "cache-policy", "lru", "eviction policy of the prefix caches: "+strings.Join(policy.Names, ", "))
	f.Float64Var(&o.BalancingThreshold, "balancing-threshold", 1.5, "kvcache_balancing_threshold of Algorithm 1 (at least 1)")
	f.Float64Var(&o.Speedup, "speedup", 1, "divide arrival times by this")
	f.Uint64Var(&o.Seed, "seed", 1, "seed of the random scheduler")
	f.StringVar(&o.LoadTrace, "load-trace", "", "write per-second prefill and decode load as CSV to this file")
	f.StringVar(&o.Plot, "plot", "", "draw the load over time as SVG to this file")
	durationVar(f, &o.Cost.PrefillBase, "prefill-base", def.PrefillBase, "fixed cost of a prefill")
	f.Float64Var(&o.Cost.PrefillTokensPerSec, "prefill-tokens-per-sec", def.PrefillTokensPerSec, "prefill throughput of an instance")
	f.Float64Var(&o.Cost.AttnSecPerToken2, "attn-sec-per-token2", def.AttnSecPerToken2, "attention cost, seconds per uncached × context token")
	durationVar(f, &o.Cost.DecodeBase, "decode-base", def.DecodeBase, "fixed cost of a decode step")
	durationVar(f, &o.Cost.DecodePerSeq, "decode-per-seq", def.DecodePerSeq, "decode step cost per sequence in the batch")
	durationVar(f, &o.Cost.DecodePerCtxToken, "decode-per-ctx-token", def.DecodePerCtxToken, "decode step cost per context token in the batch")
	f.IntVar(&o.Cost.DecodeKVTokens, "decode-kv-tokens", def.DecodeKVTokens, "KV cache of a decode instance, in tokens (0: unbounded)")
	sizeVar(f, &o.Cost.BlockBytes, "block-bytes", def.BlockBytes, "KV cache bytes of one 512-token block")
	f.Float64Var(&o.Cost.LinkGBps, "link-gbps", def.LinkGBps, "KV transfer bandwidth between instances, GB/s")
	durationVar(f, &o.Cost.TransferLatency, "transfer-latency", def.TransferLatency, "fixed cost of a KV transfer")
	_ = cmd.MarkFlagFilename("trace", "jsonl")
	_ = cmd.RegisterFlagCompletionFunc("cache-policy", cobra.FixedCompletions(policy.Names, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

// maxSimInstances bounds --prefill and --decode: a simulated cluster of
// a hundred thousand instances of each still fits in memory and time.
const maxSimInstances = 100_000

func runSimConductor(ctx context.Context, o simConductorOptions, p *printer) error {
	if o.Trace == "" {
		return usagef("--trace is required (a FAST'25 trace, e.g. testdata/traces/conversation_trace.jsonl in mc's repository after 'make traces')")
	}
	var scheds []conductor.Scheduler
	for _, s := range strings.Split(o.Schedulers, ",") {
		x, err := conductor.ParseScheduler(strings.TrimSpace(s))
		if err != nil {
			return usagef("invalid --scheduler: %w", err)
		}
		scheds = append(scheds, x)
	}
	var rejs []conductor.Rejection
	for _, s := range strings.Split(o.Rejections, ",") {
		x, err := conductor.ParseRejection(strings.TrimSpace(s))
		if err != nil {
			return usagef("invalid --rejection: %w", err)
		}
		rejs = append(rejs, x)
	}
	switch {
	case o.Prefill <= 0 || o.Decode <= 0:
		return usagef("invalid --prefill %d / --decode %d: want at least one of each", o.Prefill, o.Decode)
	case o.Prefill > maxSimInstances || o.Decode > maxSimInstances:
		// Each instance is simulated: a typo's extra digits ran a host
		// out of memory (99999999 took 5.8 GB in 19 s).
		return usagef("invalid --prefill %d / --decode %d: at most %d instances of each", o.Prefill, o.Decode, maxSimInstances)
	case o.TTFTSLO <= 0 || o.TBTSLO <= 0:
		return usagef("invalid --ttft-slo %s / --tbt-slo %s: want positive durations", o.TTFTSLO, o.TBTSLO)
	case o.Speedup <= 0:
		return usagef("invalid --speedup %g: want a positive number", o.Speedup)
	case o.BalancingThreshold < 1:
		return usagef("invalid --balancing-threshold %g: want at least 1", o.BalancingThreshold)
	case o.CacheBlocks < 0:
		return usagef("invalid --cache-blocks-per-instance %d", o.CacheBlocks)
	}
	// The cost model's flags by name (its check names its fields).
	c := o.Cost
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"prefill-base", c.PrefillBase}, {"decode-base", c.DecodeBase}, {"decode-per-seq", c.DecodePerSeq},
		{"decode-per-ctx-token", c.DecodePerCtxToken}, {"transfer-latency", c.TransferLatency}} {
		if d.v < 0 {
			return usagef("invalid --%s %s: must not be negative", d.name, d.v)
		}
	}
	switch {
	case !(c.PrefillTokensPerSec > 0):
		return usagef("invalid --prefill-tokens-per-sec %g: want more than 0", c.PrefillTokensPerSec)
	case !(c.LinkGBps > 0):
		return usagef("invalid --link-gbps %g: want more than 0", c.LinkGBps)
	case !(c.AttnSecPerToken2 >= 0):
		return usagef("invalid --attn-sec-per-token2 %g: must not be negative", c.AttnSecPerToken2)
	case c.DecodeKVTokens < 0:
		return usagef("invalid --decode-kv-tokens %d: want 0 (unbounded) or more", c.DecodeKVTokens)
	case c.BlockBytes <= 0:
		return usagef("invalid --block-bytes %d: want more than 0 bytes", c.BlockBytes)
	}
	if err := o.Cost.Check(); err != nil {
		return usagef("cost model: %w", err)
	}
	if _, err := policy.New[int64](o.CachePolicy); err != nil {
		return usagef("invalid --cache-policy: %w", err)
	}
	if err := checkOutput("--load-trace", o.LoadTrace); err != nil {
		return err
	}
	if err := checkOutput("--plot", o.Plot); err != nil {
		return err
	}
	reqs, err := trace.ReadFile(o.Trace)
	if err != nil {
		return inputErr("--trace", err)
	}
	if len(reqs) == 0 {
		// A simulation of nothing would print a row of zeros as if it ran.
		return fmt.Errorf("trace %s: no request", o.Trace)
	}
	var results []conductor.Result
	for _, s := range scheds {
		for _, r := range rejs {
			res, err := conductor.SimulateContext(ctx, conductor.SimConfig{
				Prefill: o.Prefill, Decode: o.Decode, Scheduler: s, Rejection: r, TTFTSLO: o.TTFTSLO, TBTSLO: o.TBTSLO,
				CacheBlocks: o.CacheBlocks, CachePolicy: o.CachePolicy, BalancingThreshold: o.BalancingThreshold,
				Speedup: o.Speedup, Cost: o.Cost, Seed: o.Seed,
			}, reqs)
			if err != nil {
				if ctx.Err() != nil {
					return &exitError{code: exitInterrupted, err: fmt.Errorf("sim conductor: interrupted after %d of %d simulations (scheduler %s, rejection %s under way); nothing printed", len(results), len(scheds)*len(rejs), s, r)}
				}
				return err
			}
			results = append(results, res)
		}
	}
	if o.LoadTrace != "" {
		if err := writeFileWith(o.LoadTrace, func(f *os.File) error { return conductor.WriteLoadCSV(f, results) }); err != nil {
			return fmt.Errorf("--load-trace: %w", err)
		}
	}
	if o.Plot != "" {
		if err := writeFileWith(o.Plot, func(f *os.File) error { return conductor.PlotLoad(f, results) }); err != nil {
			return fmt.Errorf("--plot: %w", err)
		}
	}
	if p.JSON() {
		return p.PrintJSON(map[string]any{"results": results})
	}
	rows := make([][]string, 0, len(results))
	f2 := func(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }
	for _, r := range results {
		rows = append(rows, []string{r.Scheduler, r.Rejection, strconv.Itoa(r.Requests), strconv.Itoa(r.Accepted),
			strconv.Itoa(r.Rejected), strconv.Itoa(r.WastedPrefills),
			f2(r.TTFTP50), f2(r.TTFTP90), f2(r.TTFTP99),
			strconv.FormatFloat(r.TBTP50*1e3, 'f', 1, 64), strconv.FormatFloat(r.TBTP90*1e3, 'f', 1, 64), strconv.FormatFloat(r.TBTP99*1e3, 'f', 1, 64),
			strconv.FormatFloat(r.SLOAttainment, 'f', 3, 64), f2(r.GoodputRPS), strconv.FormatFloat(r.CacheHitRatio, 'f', 3, 64),
			strconv.Itoa(r.MigratedBlocks), fmt.Sprintf("%.2f±%.2f", r.DecodeLoadMean, r.DecodeLoadSwing)})
	}
	p.Table(fmt.Sprintf("%s: %d prefill, %d decode, TTFT SLO %s, TBT SLO %s, speedup %g", o.Trace, o.Prefill, o.Decode, o.TTFTSLO, o.TBTSLO, o.Speedup),
		[]string{"scheduler", "rejection", "requests", "accepted", "rejected", "wasted prefills", "TTFT p50 (s)", "TTFT p90 (s)", "TTFT p99 (s)",
			"TBT p50 (ms)", "TBT p90 (ms)", "TBT p99 (ms)", "SLO", "goodput (req/s)", "cache hit", "migrated blocks", "decode load"}, rows)
	return nil
}
