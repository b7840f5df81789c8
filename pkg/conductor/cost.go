// Package conductor is the Mooncake paper's KVCache-centric scheduler
// (Conductor) as plain code, and a discrete-event simulator that replays
// request traces through it.
//
// The scheduling logic is what a real scheduler would call: per prefill
// instance a prefix cache of block hash ids (ordered by a pkg/store/policy
// policy, LRU by default, the same code the store's master evicts with),
// TTFT estimation from queueing, prefill of the uncached part and transfer
// of a remote prefix (CostModel), Algorithm 1 with its
// kvcache_balancing_threshold, decode selection by load, early rejection
// by current or predicted load, and hot-spot migration (a prefix fetched
// from another instance is kept by the instance that fetched it).
//
// Main types: CostModel, Cache, Conductor (the scheduler), Sim (the
// event loop), Config, Result.
package conductor

import (
	"fmt"
	"time"
)

// CostModel turns work into time. Every constant is a field (a flag of
// `mc sim conductor`). The defaults are of the order of a dense 70B model
// (80 layers, 8 KV heads of 128, fp16) on one 8-GPU instance, the setup of
// the Mooncake paper; they are stated here, not measured.
type CostModel struct {
	// Prefill: Base + uncached/TokensPerSec + AttnSecPerToken2 ×
	// uncached × (cached + uncached). The quadratic term is attention
	// over the whole context; cached tokens are not recomputed.
	PrefillBase         time.Duration
	PrefillTokensPerSec float64
	AttnSecPerToken2    float64
	// Decode step: Base + PerSeq × batch + PerCtxToken × the batch's
	// total context (reading each sequence's KV cache).
	DecodeBase        time.Duration
	DecodePerSeq      time.Duration
	DecodePerCtxToken time.Duration
	// DecodeKVTokens is how many tokens of KV cache one decode instance
	// holds (its HBM after weights): a request whose context does not fit
	// is refused at decode admission.
	DecodeKVTokens int
	// Transfer: BlockBytes per 512-token block over LinkGBps, plus
	// TransferLatency per transfer.
	BlockBytes      int64
	LinkGBps        float64
	TransferLatency time.Duration
}

// DefaultCostModel: 70B fp16 with GQA keeps 2 × 80 × 8 × 128 × 2 bytes
// = 320 KiB of KV per token, 160 MiB per 512-token block; prefill of
// about 12k tokens/s on 8 GPUs; a decode step of 25 ms plus reading every
// sequence's KV cache at 8 × 2 TB/s of HBM (320 KiB / 16 TB/s ≈ 20 ns a
// context token); 500 GB of HBM for KV per decode instance (8 × 80 GB
// less 140 GB of weights) ≈ 1.5M tokens; 25 GB/s of RDMA per instance
// (2 × 100 Gb/s NICs).
func DefaultCostModel() CostModel {
	return CostModel{
		PrefillBase:         20 * time.Millisecond,
		PrefillTokensPerSec: 12000,
		AttnSecPerToken2:    2e-10,
		DecodeBase:          25 * time.Millisecond,
		DecodePerSeq:        150 * time.Microsecond,
		DecodePerCtxToken:   20 * time.Nanosecond,
		DecodeKVTokens:      1_500_000,
		BlockBytes:          512 * 320 << 10,
		LinkGBps:            25,
		TransferLatency:     time.Millisecond,
	}
}

// Check rejects a model that would make time stand still or run
// backwards.
func (c CostModel) Check() error {
	switch {
	case c.PrefillTokensPerSec <= 0:
		return fmt.Errorf("prefill tokens/s %g: want > 0", c.PrefillTokensPerSec)
	case c.LinkGBps <= 0:
		return fmt.Errorf("link GB/s %g: want > 0", c.LinkGBps)
	case c.DecodeKVTokens < 0:
		return fmt.Errorf("decode KV tokens %d: want 0 (unbounded) or more", c.DecodeKVTokens)
	case c.PrefillBase < 0 || c.DecodeBase < 0 || c.DecodePerSeq < 0 || c.DecodePerCtxToken < 0 || c.TransferLatency < 0 || c.AttnSecPerToken2 < 0 || c.BlockBytes < 0:
		return fmt.Errorf("cost model constants must not be negative")
	case c.DecodeBase+c.DecodePerSeq <= 0:
		return fmt.Errorf("a decode step must take time")
	}
	return nil
}

// Prefill is the time to prefill uncached tokens on top of cached ones.
func (c CostModel) Prefill(uncached, cached int) time.Duration {
	u, ctx := float64(uncached), float64(cached+uncached)
	s := u/c.PrefillTokensPerSec + c.AttnSecPerToken2*u*ctx
	return c.PrefillBase + time.Duration(s*float64(time.Second))
}

// DecodeStep is one decode iteration of a batch holding ctxTokens of
// context in total.
func (c CostModel) DecodeStep(batch, ctxTokens int) time.Duration {
	return c.DecodeBase + time.Duration(batch)*c.DecodePerSeq + time.Duration(ctxTokens)*c.DecodePerCtxToken
}

// Transfer is the time to move blocks of KV cache between instances.
func (c CostModel) Transfer(blocks int) time.Duration {
	if blocks <= 0 {
		return 0
	}
	s := float64(blocks) * float64(c.BlockBytes) / (c.LinkGBps * 1e9)
	return c.TransferLatency + time.Duration(s*float64(time.Second))
}

// MaxBatchFor is the largest decode batch whose step stays within tbt with
// avgCtx tokens of context per sequence (at least 1).
func (c CostModel) MaxBatchFor(tbt time.Duration, avgCtx int) int {
	per := c.DecodePerSeq + time.Duration(avgCtx)*c.DecodePerCtxToken
	if per <= 0 {
		return 1 << 20
	}
	return max(int((tbt-c.DecodeBase)/per), 1)
}
