package replay

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/kvcache-ops/mc/pkg/store"
)

// OnlineConfig configures a replay against a running store.
type OnlineConfig struct {
	// BlockBytes is the value size of one block.
	BlockBytes int
	// KeyPrefix namespaces the block keys (default "replay/").
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
	// GetFailures: hits gone between the existence check and the read.
	PutFailures int `json:"put_failures"`
	GetFailures int `json:"get_failures"`
}

// Online drives a store with t through c: per request (in replay order),
// check every block's key, read the hits, write the misses, with real
// bytes. The store's own eviction decides what stays. A request's reads
// and writes are one batch each, so its hits are refreshed before its
// misses are inserted (offline interleaves them in block order).
func Online(ctx context.Context, c *store.Client, t *Trace, cfg OnlineConfig) (OnlineResult, error) {
	if cfg.BlockBytes <= 0 {
		return OnlineResult{}, fmt.Errorf("block bytes %d: want more than 0", cfg.BlockBytes)
	}
	if cfg.KeyPrefix == "" {
		cfg.KeyPrefix = "replay/"
	}
	val := make([]byte, cfg.BlockBytes)
	for i := range val {
		val[i] = byte(i * 31)
	}
	res := OnlineResult{Result: Result{Policy: cfg.Label, CapacityBlocks: cfg.CapacityBlocks, SSDCapacityBlocks: cfg.SSDCapacityBlocks, PromoteAfter: cfg.PromoteAfter}}
	var dram0, disk0 uint64
	if cfg.TierHits != nil {
		var err error
		if dram0, disk0, err = cfg.TierHits(ctx); err != nil {
			return res, fmt.Errorf("tier hit counts: %w", err)
		}
	}
	start := time.Now()
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
			continue
		}
		exist, errs := c.BatchExist(ctx, keys)
		if err := firstErr(errs); err != nil {
			return res, fmt.Errorf("request %d: exist: %w", ri, err)
		}
		hits = append(hits[:0], exist...)
		res.count(hits)
		var hit, miss []string
		for i, k := range keys {
			if exist[i] {
				hit = append(hit, k)
			} else {
				miss = append(miss, k)
			}
		}
		if len(hit) > 0 {
			vals, errs := c.BatchGet(ctx, hit)
			for i, err := range errs {
				switch {
				case err == nil:
					res.BytesRead += uint64(len(vals[i]))
				case errors.Is(err, store.ErrObjectNotFound):
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

func firstErr(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
