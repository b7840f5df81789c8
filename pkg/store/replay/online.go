package replay

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/kvcache-ops/mc/pkg/store"
)

// OnlineConfig configures a replay against a running store.
type OnlineConfig struct {
	// BlockBytes is the value size of one block.
	BlockBytes int
	// KeyPrefix namespaces the block keys (default "replay/<random run
	// id>/": a run of its own, which no earlier run's keys answer).
	// Every key the run wrote is removed when it ends, however it ends.
	KeyPrefix string
	// Label names the run in the result (the store's policy, if known).
	Label string
	// CapacityBlocks is reported as is: the store's size in blocks, as
	// the caller sized it (0: unknown); SSDCapacityBlocks and
	// PromoteAfter likewise for its nodes' disk tiers.
	CapacityBlocks    int
	SSDCapacityBlocks int
	PromoteAfter      int
	// TierHits, when set, reads the store's counts of gets served from
	// DRAM and from disk tiers (the master's mem_cache_hit_nums_ and
	// file_cache_hit_nums_): their change over the replay splits its
	// hits by tier. It assumes the replay is the store's only reader.
	TierHits func(context.Context) (dram, disk uint64, err error)
	// Progress, when set, is called after each request with the
	// requests done and the blocks looked up and found so far.
	Progress func(requests, blocks, hitBlocks int)
}

// OnlineResult is an online replay's outcome: the hit figures of Result
// as the store answered them, and the bytes it moved.
type OnlineResult struct {
	Result
	BytesRead    uint64  `json:"bytes_read"`
	BytesWritten uint64  `json:"bytes_written"`
	Seconds      float64 `json:"seconds"`
	GBPerSec     float64 `json:"gb_per_sec"`
	// PutFailures: misses the store could not take (nothing evictable);
	// GetFailures: hits gone between the existence check and the read,
	// or read past their lease (LEASE_EXPIRED).
	PutFailures int `json:"put_failures"`
	GetFailures int `json:"get_failures"`
	// KeyPrefix is the run's key prefix; KeysRemoved counts the keys it
	// removed at the end (those the store had not evicted by then).
	KeyPrefix   string `json:"key_prefix"`
	KeysRemoved int    `json:"keys_removed"`
}

// Online drives a store with t through c: per request (in replay order),
// check every block's key, read the hits, write the misses, with real
// bytes. The store's own eviction decides what stays. A request's reads
// and writes are one batch each, so its hits are refreshed before its
// misses are inserted (offline interleaves them in block order).
func Online(ctx context.Context, c *store.Client, t *Trace, cfg OnlineConfig) (res OnlineResult, err error) {
	if cfg.BlockBytes <= 0 {
		return OnlineResult{}, fmt.Errorf("block bytes %d: want more than 0", cfg.BlockBytes)
	}
	if cfg.KeyPrefix == "" {
		cfg.KeyPrefix = fmt.Sprintf("replay/%08x/", newRunID())
	}
	val := make([]byte, cfg.BlockBytes)
	for i := range val {
		val[i] = byte(i * 31)
	}
	res = OnlineResult{Result: Result{Policy: cfg.Label, CapacityBlocks: cfg.CapacityBlocks, SSDCapacityBlocks: cfg.SSDCapacityBlocks, PromoteAfter: cfg.PromoteAfter},
		KeyPrefix: cfg.KeyPrefix}
	// written marks the blocks the run put (block numbers are dense), so
	// that it removes them when it ends: a later run would read them as
	// hits, and they would hold the store's memory.
	var written []bool
	defer func() {
		res.KeysRemoved = removeWritten(context.WithoutCancel(ctx), c, cfg.KeyPrefix, written)
		// An interrupt cuts puts short with their ends possibly on the
		// way: a key still being written is not removed, and lands
		// after. Removed again once they have.
		for i := 0; i < settleRounds && ctx.Err() != nil; i++ {
			time.Sleep(settlePause)
			res.KeysRemoved += removeWritten(context.WithoutCancel(ctx), c, cfg.KeyPrefix, written)
		}
	}()
	var dram0, disk0 uint64
	if cfg.TierHits != nil {
		var err error
		if dram0, disk0, err = cfg.TierHits(ctx); err != nil {
			return res, fmt.Errorf("tier hit counts: %w", err)
		}
	}
	start := time.Now()
	defer func() {
		if err == nil || ctx.Err() == nil {
			return
		}
		// Interrupted: the figures of the requests made so far, which
		// the caller prints as a partial row.
		res.Seconds = time.Since(start).Seconds()
		if cfg.TierHits != nil {
			tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			if dram1, disk1, err := cfg.TierHits(tctx); err == nil {
				res.DRAMHitBlocks, res.DiskHitBlocks = int(dram1-dram0), int(disk1-disk0)
			}
			cancel()
		}
		res.finish()
		if res.Seconds > 0 {
			res.GBPerSec = float64(res.BytesRead+res.BytesWritten) / res.Seconds / 1e9
		}
	}()
	var hits []bool
	for ri, blocks := range t.Blocks {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		keys := make([]string, len(blocks))
		for i, b := range blocks {
			keys[i] = cfg.KeyPrefix + strconv.Itoa(int(b))
		}
		if len(keys) == 0 {
			res.count(nil)
			if cfg.Progress != nil {
				cfg.Progress(res.Requests, res.Blocks, res.HitBlocks)
			}
			continue
		}
		exist, errs := c.BatchExist(ctx, keys)
		if err := firstErr(errs); err != nil {
			return res, fmt.Errorf("request %d: exist: %w", ri, err)
		}
		hits = append(hits[:0], exist...)
		res.count(hits)
		var hit, miss []string
		var missBlocks []int32
		for i, k := range keys {
			if exist[i] {
				hit = append(hit, k)
			} else {
				miss = append(miss, k)
				missBlocks = append(missBlocks, blocks[i])
			}
		}
		if len(hit) > 0 {
			vals, errs := c.BatchGet(ctx, hit)
			for i, err := range errs {
				switch {
				case err == nil:
					res.BytesRead += uint64(len(vals[i]))
				case errors.Is(err, store.ErrObjectNotFound), store.CodeOf(err) == store.LeaseExpired:
					// Gone since the existence check, or read past its
					// lease on a slow host: an engine recomputes either.
					res.GetFailures++
				default:
					return res, fmt.Errorf("request %d: get %q: %w", ri, hit[i], err)
				}
			}
		}
		if len(miss) > 0 {
			vals := make([][]byte, len(miss))
			for i := range vals {
				vals[i] = val
			}
			// Marked before the put, whatever its answer: one cut short
			// by an interrupt may still land.
			for _, b := range missBlocks {
				for int(b) >= len(written) {
					written = append(written, false)
				}
				written[b] = true
			}
			for i, err := range c.BatchPut(ctx, miss, vals) {
				switch {
				case err == nil:
					res.BytesWritten += uint64(len(val))
				case errors.Is(err, store.ErrObjectAlreadyExists):
					// a duplicate block inside the request
				case errors.Is(err, store.ErrNoAvailableHandle):
					res.PutFailures++
				default:
					return res, fmt.Errorf("request %d: put %q: %w", ri, miss[i], err)
				}
			}
		}
		if cfg.Progress != nil {
			cfg.Progress(res.Requests, res.Blocks, res.HitBlocks)
		}
	}
	res.Seconds = time.Since(start).Seconds()
	if cfg.TierHits != nil {
		dram1, disk1, err := cfg.TierHits(ctx)
		if err != nil {
			return res, fmt.Errorf("tier hit counts: %w", err)
		}
		res.DRAMHitBlocks, res.DiskHitBlocks = int(dram1-dram0), int(disk1-disk0)
	}
	res.finish()
	if res.Seconds > 0 {
		res.GBPerSec = float64(res.BytesRead+res.BytesWritten) / res.Seconds / 1e9
	}
	return res, nil
}

// After an interrupt, the removal is repeated settleRounds times,
// settlePause apart.
const (
	settleRounds = 3
	settlePause  = 100 * time.Millisecond
)

// newRunID names a run's keys (a variable for tests).
var newRunID = rand.Uint32

// removeWritten removes the run's keys, 1024 a call, and counts those
// removed (the others the store had evicted).
func removeWritten(ctx context.Context, c *store.Client, prefix string, written []bool) int {
	removed := 0
	var keys []string
	flush := func() {
		for _, err := range c.BatchRemove(ctx, keys, true) {
			if err == nil {
				removed++
			}
		}
		keys = keys[:0]
	}
	for b, w := range written {
		if !w {
			continue
		}
		if keys = append(keys, prefix+strconv.Itoa(b)); len(keys) == 1024 {
			flush()
		}
	}
	if len(keys) > 0 {
		flush()
	}
	return removed
}

func firstErr(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
