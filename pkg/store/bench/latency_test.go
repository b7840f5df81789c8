package bench

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	ebench "github.com/kvcache-ops/mc/pkg/engine/bench"
)

// TestLatenciesPercentile: the histogram's percentiles are the exact
// nearest-rank ones to within a bucket (under 1%).
func TestLatenciesPercentile(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var all []time.Duration
	var a, b latencies
	for i := range 100000 {
		// Log-uniform from 50 ns to 50 ms, as call latencies spread.
		d := time.Duration(50 * float64(uint64(1)<<rng.IntN(20)) * (1 + rng.Float64()))
		all = append(all, d)
		if i%2 == 0 {
			a.add(d)
		} else {
			b.add(d)
		}
	}
	a.merge(&b)
	slices.Sort(all)
	for _, p := range []float64{0, 0.01, 0.5, 0.9, 0.99, 0.999, 1} {
		want, got := ebench.Percentile(all, p), a.percentile(p)
		if diff := float64(got-want) / float64(want); diff > 0.01 || diff < -0.01 {
			t.Errorf("p%g: %v, want %v (%.2f%% off)", p*100, got, want, diff*100)
		}
	}
	for v := range uint64(100000) {
		if got := latValue(latBucket(v)); v < latLinear && got != v {
			t.Fatalf("%d ns reads back as %d", v, got)
		}
		if lo := latValue(latBucket(v)); float64(lo) < float64(v)*0.99 || float64(lo) > float64(v)*1.01 {
			t.Fatalf("%d ns reads back as %d", v, lo)
		}
	}
	var empty latencies
	if empty.percentile(0.5) != 0 {
		t.Fatal("an empty histogram has a percentile")
	}
}
