package engine

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"testing"
)

// copyRange is how a batch is cut between goroutines: any set of cut
// points, tasks of any size, must copy every byte exactly once.
func TestCopyRangeAnyCuts(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 200 {
		var jobs []shmCopy
		var srcs [][]byte
		total := 0
		for range 1 + rng.IntN(6) {
			n := 1 + rng.IntN(5000)
			src := make([]byte, n)
			for i := range src {
				src[i] = byte(rng.Uint32())
			}
			write := rng.IntN(2) == 0
			tk := &Task{}
			tk.op.Write = write
			j := shmCopy{t: tk, remote: make([]byte, n)}
			if write {
				tk.op.Buf = src
			} else {
				tk.op.Buf = make([]byte, n)
				copy(j.remote, src)
			}
			jobs = append(jobs, j)
			srcs = append(srcs, src)
			total += n
		}
		cuts := []int{0}
		for range rng.IntN(5) {
			cuts = append(cuts, rng.IntN(total+1))
		}
		cuts = append(cuts, total)
		slices.Sort(cuts)
		for i := 1; i < len(cuts); i++ {
			copyRange(jobs, cuts[i-1], cuts[i])
		}
		for i, j := range jobs {
			dst := j.remote
			if !j.t.op.Write {
				dst = j.t.op.Buf
			}
			if !bytes.Equal(dst, srcs[i]) {
				t.Fatalf("round %d job %d (write %v, cuts %v): bytes differ", round, i, j.t.op.Write, cuts)
			}
		}
	}
}
