// Package replay runs KV-cache request traces (the Mooncake FAST'25
// format) through the store's eviction policies, to measure what a policy
// and a capacity would give before running them: offline through package
// policy, the very code the master orders its objects with (Run), or
// online against a running store (Online).
//
// Semantics, shared by both: requests go in timestamp order (file order
// within a timestamp); a block is a hit when its hash id is cached when
// the request arrives; then the request's blocks are touched in order,
// each inserted when absent (evicting per the policy when the cache is
// full) and refreshed when present, at its position in the request (the
// depth length-aware uses).
//
// RunTiered adds a disk tier under the cache (store.md, "Disk tier"): the
// tiers are exclusive, a block evicted from DRAM moves to the disk tier's
// most recent end (the disk dropping its least recent block when full),
// and a block found on disk is a hit that, on its PromoteAfter-th disk
// read, moves back to DRAM.
package replay

import (
	"fmt"
	"io"

	"github.com/kvcache-ops/mc/pkg/store/policy"
	"github.com/kvcache-ops/mc/pkg/trace"
)

// Request is one line of a trace.
type Request = trace.Request

// Trace is a parsed trace in replay order. Blocks are renumbered densely
// (Blocks[i][j] indexes the trace's distinct hash ids), so a replay needs
// no hashing.
type Trace struct {
	Requests []Request
	Blocks   [][]int32
	Distinct int
}

// Read parses a trace (package trace: timestamp order, file order within
// a timestamp) and numbers its blocks densely.
func Read(r io.Reader) (*Trace, error) {
	reqs, err := trace.Read(r)
	if err != nil {
		return nil, err
	}
	if len(reqs) == 0 {
		return nil, fmt.Errorf("trace has no request")
	}
	t := &Trace{Requests: reqs, Blocks: make([][]int32, len(reqs))}
	ids := make(map[int64]int32)
	for n, q := range reqs {
		blocks := make([]int32, len(q.HashIDs))
		for i, h := range q.HashIDs {
			id, ok := ids[h]
			if !ok {
				if len(ids) == 1<<31-1 {
					return nil, fmt.Errorf("request %d: more than 2^31 distinct blocks", n)
				}
				id = int32(len(ids))
				ids[h] = id
			}
			blocks[i] = id
		}
		t.Blocks[n] = blocks
	}
	t.Distinct = len(ids)
	return t, nil
}

// Result is one replay's outcome.
type Result struct {
	Policy string `json:"policy"`
	// CapacityBlocks is the cache size in blocks; 0 is unbounded.
	CapacityBlocks int     `json:"capacity_blocks"`
	Requests       int     `json:"requests"`
	Blocks         int     `json:"blocks"`
	HitBlocks      int     `json:"hit_blocks"`
	HitRatio       float64 `json:"hit_ratio"`
	// PrefixHitRatio counts only each request's leading run of hits: the
	// prefix an engine can actually reuse.
	PrefixHitRatio float64 `json:"prefix_hit_ratio"`
	// SSDCapacityBlocks is the disk tier under the cache (0: none) and
	// PromoteAfter the disk read that moves a block back (RunTiered).
	SSDCapacityBlocks int `json:"ssd_capacity_blocks"`
	PromoteAfter      int `json:"promote_after"`
	// The hits split by the tier that served them; HitRatio is their sum.
	DRAMHitBlocks int     `json:"dram_hit_blocks"`
	DiskHitBlocks int     `json:"disk_hit_blocks"`
	DRAMHitRatio  float64 `json:"dram_hit_ratio"`
	DiskHitRatio  float64 `json:"disk_hit_ratio"`
	prefixHits    int
}

func (r *Result) finish() {
	if r.DiskHitBlocks == 0 && r.DRAMHitBlocks == 0 {
		r.DRAMHitBlocks = r.HitBlocks // one tier: every hit is DRAM's
	}
	if r.Blocks > 0 {
		r.HitRatio = float64(r.HitBlocks) / float64(r.Blocks)
		r.PrefixHitRatio = float64(r.prefixHits) / float64(r.Blocks)
		r.DRAMHitRatio = float64(r.DRAMHitBlocks) / float64(r.Blocks)
		r.DiskHitRatio = float64(r.DiskHitBlocks) / float64(r.Blocks)
	}
}

// count adds one request whose blocks hit as hits says.
func (r *Result) count(hits []bool) {
	r.Requests++
	r.Blocks += len(hits)
	lead := true
	for _, h := range hits {
		if h {
			r.HitBlocks++
			if lead {
				r.prefixHits++
			}
		} else {
			lead = false
		}
	}
}

// Run replays t through the policy called name with room for capacity
// blocks (0: unbounded).
func Run(t *Trace, name string, capacity int) (Result, error) {
	p, err := policy.New[int32](name)
	if err != nil {
		return Result{}, err
	}
	if capacity < 0 {
		return Result{}, fmt.Errorf("capacity %d blocks: want 0 (unbounded) or more", capacity)
	}
	res := Result{Policy: p.Name(), CapacityBlocks: capacity}
	entries := make([]policy.Entry[int32], t.Distinct)
	var hits []bool
	for _, blocks := range t.Blocks {
		hits = hits[:0]
		for _, b := range blocks {
			hits = append(hits, entries[b].In())
		}
		res.count(hits)
		for depth, b := range blocks {
			e := &entries[b]
			if e.In() {
				p.Touch(e, depth)
				continue
			}
			if capacity > 0 && p.Len() >= capacity {
				p.Remove(p.Victim())
			}
			e.V = b
			p.Add(e, depth)
		}
	}
	res.finish()
	return res, nil
}
