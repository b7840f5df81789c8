package replay

import (
	"fmt"

	"github.com/kvcache-ops/mc/pkg/store/policy"
)

// Where a block is, per RunTiered.
const (
	inNone uint8 = iota
	inDRAM
	inDisk
)

// RunTiered replays t through a DRAM tier of capacity blocks ordered by
// the policy called name, over a disk tier of ssdCapacity blocks ordered
// by recency (the store's disk tier evicts its oldest files first). The
// tiers are exclusive: a block evicted from DRAM moves to the disk's most
// recent end, and the disk drops its least recent block when full. A
// block found on disk is a hit (a disk hit); on its promoteAfter-th disk
// read since it went to disk it moves back to DRAM, demoting DRAM's
// victim (promoteAfter 0: never; until then a disk hit only refreshes it
// on disk). Otherwise "hit", "touch" and "insert" are Run's. Under LRU
// with promoteAfter 1 the two tiers behave as one LRU of
// capacity+ssdCapacity blocks and DRAM as an LRU of capacity.
//
// With ssdCapacity 0, or an unbounded DRAM (capacity 0), there is no disk
// tier to speak of and RunTiered is Run.
func RunTiered(t *Trace, name string, capacity, ssdCapacity, promoteAfter int) (Result, error) {
	if ssdCapacity < 0 {
		return Result{}, fmt.Errorf("ssd capacity %d blocks: want 0 (none) or more", ssdCapacity)
	}
	if promoteAfter < 0 {
		return Result{}, fmt.Errorf("promote after %d reads: want 0 (never) or more", promoteAfter)
	}
	if ssdCapacity == 0 || capacity == 0 {
		r, err := Run(t, name, capacity)
		r.SSDCapacityBlocks, r.PromoteAfter = ssdCapacity, promoteAfter
		return r, err
	}
	p, err := policy.New[int32](name)
	if err != nil {
		return Result{}, err
	}
	if capacity < 0 {
		return Result{}, fmt.Errorf("capacity %d blocks: want 0 (unbounded) or more", capacity)
	}
	d, _ := policy.New[int32]("lru")
	res := Result{Policy: p.Name(), CapacityBlocks: capacity, SSDCapacityBlocks: ssdCapacity, PromoteAfter: promoteAfter}
	dram := make([]policy.Entry[int32], t.Distinct)
	disk := make([]policy.Entry[int32], t.Distinct)
	reads := make([]int32, t.Distinct) // disk reads since the block went to disk
	demote := func(b int32) {
		if d.Len() >= ssdCapacity {
			v := d.Victim()
			d.Remove(v)
		}
		disk[b].V = b
		reads[b] = 0
		d.Add(&disk[b], 0)
	}
	insert := func(b int32, depth int) {
		if p.Len() >= capacity {
			v := p.Victim()
			p.Remove(v)
			demote(v.V)
		}
		dram[b].V = b
		p.Add(&dram[b], depth)
	}
	var hits []bool
	var where []uint8
	for _, blocks := range t.Blocks {
		hits, where = hits[:0], where[:0]
		for _, b := range blocks {
			w := inNone
			switch {
			case dram[b].In():
				w = inDRAM
			case disk[b].In():
				w = inDisk
			}
			hits = append(hits, w != inNone)
			where = append(where, w)
		}
		res.count(hits)
		for _, w := range where {
			switch w {
			case inDRAM:
				res.DRAMHitBlocks++
			case inDisk:
				res.DiskHitBlocks++
			}
		}
		for depth, b := range blocks {
			switch {
			case dram[b].In():
				p.Touch(&dram[b], depth)
			case disk[b].In():
				reads[b]++
				if promoteAfter > 0 && int(reads[b]) >= promoteAfter {
					d.Remove(&disk[b])
					insert(b, depth)
				} else {
					d.Touch(&disk[b], 0)
				}
			default:
				insert(b, depth)
			}
		}
	}
	res.finish()
	return res, nil
}
