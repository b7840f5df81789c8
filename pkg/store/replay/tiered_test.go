package replay

import (
	"math/rand/v2"
	"testing"
)

// randomTrace makes n requests over a skewed key space with shared
// prefixes, enough to exercise eviction at small capacities.
func randomTrace(n int, seed uint64) *Trace {
	r := rand.New(rand.NewPCG(seed, 7))
	t := &Trace{Blocks: make([][]int32, n)}
	max := int32(0)
	for i := range t.Blocks {
		prefix := int32(r.IntN(40)) * 100
		blocks := make([]int32, 1+r.IntN(12))
		for j := range blocks {
			if j < 4 {
				blocks[j] = prefix + int32(j)
			} else {
				blocks[j] = 4000 + int32(r.ExpFloat64()*300)
			}
			max = blocksMax(max, blocks[j])
		}
		t.Blocks[i] = blocks
	}
	t.Distinct = int(max) + 1
	t.Requests = make([]Request, n)
	return t
}

func blocksMax(a, b int32) int32 {
	if b > a {
		return b
	}
	return a
}

// store.md: under LRU with promote-after 1 the two tiers together behave
// as one LRU of C+S blocks, and DRAM as an LRU of C.
func TestTieredLRUIsOneBigLRU(t *testing.T) {
	tr := randomTrace(3000, 1)
	for _, c := range [][2]int{{10, 50}, {100, 300}, {300, 30}, {1, 1}} {
		got, err := RunTiered(tr, "lru", c[0], c[1], 1)
		if err != nil {
			t.Fatal(err)
		}
		big, _ := Run(tr, "lru", c[0]+c[1])
		dram, _ := Run(tr, "lru", c[0])
		if got.HitBlocks != big.HitBlocks || got.DRAMHitBlocks != dram.HitBlocks || got.DRAMHitBlocks+got.DiskHitBlocks != got.HitBlocks {
			t.Fatalf("C=%d S=%d: %d hits (%d DRAM + %d disk); one LRU of C+S has %d, of C %d", c[0], c[1], got.HitBlocks, got.DRAMHitBlocks, got.DiskHitBlocks, big.HitBlocks, dram.HitBlocks)
		}
		if got.DiskHitBlocks == 0 {
			t.Fatalf("C=%d S=%d: no disk hit at all", c[0], c[1])
		}
		if got.HitRatio != got.DRAMHitRatio+got.DiskHitRatio && abs(got.HitRatio-got.DRAMHitRatio-got.DiskHitRatio) > 1e-12 {
			t.Fatalf("ratios do not add up: %+v", got)
		}
	}
}

func abs(f float64) float64 {
	if f < 0 {
		return -f
	}
	return f
}

// A hand-worked trace, C=1 S=1: what moves where, and what promote-after
// changes.
func TestTieredByHand(t *testing.T) {
	tr := &Trace{Blocks: [][]int32{{0}, {1}, {0}, {0}, {1}}, Distinct: 2, Requests: make([]Request, 5)}
	// promote-after 2: 0 DRAM; 1 DRAM, 0 to disk; 0 disk hit (read 1,
	// stays); 0 disk hit (read 2: promoted, 1 to disk); 1 disk hit.
	r, _ := RunTiered(tr, "lru", 1, 1, 2)
	if r.HitBlocks != 3 || r.DRAMHitBlocks != 0 || r.DiskHitBlocks != 3 {
		t.Fatalf("promote-after 2: %+v", r)
	}
	// promote-after 1: 0 disk hit promoted at once (1 to disk); 0 DRAM
	// hit; 1 disk hit.
	r, _ = RunTiered(tr, "lru", 1, 1, 1)
	if r.HitBlocks != 3 || r.DRAMHitBlocks != 1 || r.DiskHitBlocks != 2 {
		t.Fatalf("promote-after 1: %+v", r)
	}
	// never promoted, and a disk of 0: as DRAM alone.
	r, _ = RunTiered(tr, "lru", 1, 0, 0)
	one, _ := Run(tr, "lru", 1)
	if r.HitBlocks != one.HitBlocks || r.DiskHitBlocks != 0 || r.DRAMHitBlocks != one.HitBlocks || r.SSDCapacityBlocks != 0 {
		t.Fatalf("no disk: %+v vs %+v", r, one)
	}
	// A full disk drops its least recent block: C=1 S=1 over 0,1,2,0.
	tr = &Trace{Blocks: [][]int32{{0}, {1}, {2}, {0}}, Distinct: 3, Requests: make([]Request, 4)}
	if r, _ = RunTiered(tr, "lru", 1, 1, 1); r.HitBlocks != 0 {
		t.Fatalf("block 0 should have been dropped by the full disk: %+v", r)
	}
}

func TestTieredBadInput(t *testing.T) {
	tr := randomTrace(10, 2)
	for _, c := range [][3]int{{10, -1, 1}, {10, 5, -1}, {-1, 5, 1}} {
		if _, err := RunTiered(tr, "lru", c[0], c[1], c[2]); err == nil {
			t.Errorf("RunTiered(C=%d, S=%d, promote %d): no error", c[0], c[1], c[2])
		}
	}
	if _, err := RunTiered(tr, "nope", 10, 5, 1); err == nil {
		t.Error("unknown policy: no error")
	}
}

// Any policy, any promotion: a disk under DRAM never costs a hit under
// LRU, and the split adds up.
func TestTieredSplitAddsUp(t *testing.T) {
	tr := randomTrace(2000, 3)
	for _, name := range []string{"lru", "lfu", "fifo", "length-aware"} {
		for _, promote := range []int{0, 1, 2, 5} {
			r, err := RunTiered(tr, name, 50, 200, promote)
			if err != nil {
				t.Fatal(err)
			}
			if r.DRAMHitBlocks+r.DiskHitBlocks != r.HitBlocks || r.PromoteAfter != promote || r.SSDCapacityBlocks != 200 {
				t.Fatalf("%s promote %d: %+v", name, promote, r)
			}
			if name == "lru" {
				alone, _ := Run(tr, name, 50)
				if r.HitBlocks < alone.HitBlocks {
					t.Fatalf("lru promote %d: %d hits with a disk, %d without", promote, r.HitBlocks, alone.HitBlocks)
				}
			}
		}
	}
}
