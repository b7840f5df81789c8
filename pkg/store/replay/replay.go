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
package replay

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"slices"

	"github.com/kvcache-ops/mc/pkg/store/policy"
)

// Request is one line of a trace.
type Request struct {
	Timestamp    int64    `json:"timestamp"`
	InputLength  int      `json:"input_length"`
	OutputLength int      `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`
}

// Trace is a parsed trace in replay order. Blocks are renumbered densely
// (Blocks[i][j] indexes the trace's distinct hash ids), so a replay needs
// no hashing.
type Trace struct {
	Requests []Request
	Blocks   [][]int32
	Distinct int
}

// maxLine bounds one trace line (a request of 100k blocks is ~1 MB).
const maxLine = 16 << 20

// Read parses a trace: one JSON object per line, blank lines ignored.
func Read(r io.Reader) (*Trace, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	t := &Trace{}
	ids := make(map[uint64]int32)
	for line := 1; sc.Scan(); line++ {
		b := sc.Bytes()
		if len(b) == 0 {
			continue
		}
		var q Request
		if err := json.Unmarshal(b, &q); err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		if q.Timestamp < 0 {
			return nil, fmt.Errorf("line %d: negative timestamp %d", line, q.Timestamp)
		}
		blocks := make([]int32, len(q.HashIDs))
		for i, h := range q.HashIDs {
			id, ok := ids[h]
			if !ok {
				if len(ids) == 1<<31-1 {
					return nil, fmt.Errorf("line %d: more than 2^31 distinct blocks", line)
				}
				id = int32(len(ids))
				ids[h] = id
			}
			blocks[i] = id
		}
		t.Requests = append(t.Requests, q)
		t.Blocks = append(t.Blocks, blocks)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read trace: %w", err)
	}
	if len(t.Requests) == 0 {
		return nil, fmt.Errorf("trace has no request")
	}
	t.Distinct = len(ids)
	// Timestamp order, file order within a timestamp.
	order := make([]int, len(t.Requests))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		return int(min(max(t.Requests[a].Timestamp-t.Requests[b].Timestamp, -1), 1))
	})
	reqs := make([]Request, len(order))
	blocks := make([][]int32, len(order))
	for i, j := range order {
		reqs[i], blocks[i] = t.Requests[j], t.Blocks[j]
	}
	t.Requests, t.Blocks = reqs, blocks
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
	prefixHits     int
}

func (r *Result) finish() {
	if r.Blocks > 0 {
		r.HitRatio = float64(r.HitBlocks) / float64(r.Blocks)
		r.PrefixHitRatio = float64(r.prefixHits) / float64(r.Blocks)
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
