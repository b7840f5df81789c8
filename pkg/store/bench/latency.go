package bench

import (
	"math"
	"math/bits"
	"time"
)

// latencies is a histogram of call latencies in a fixed 30 KiB: exact
// below 128 ns, then 64 buckets an octave (under 1.6% apart), so a row
// of any length holds the same memory (a list of every call's latency,
// sorted at the end, grew a long row by 8 B a call and more).
type latencies struct {
	counts [latBuckets]uint64
	n      uint64
}

const (
	latSubBits = 6
	latLinear  = 2 << latSubBits // values below are their own bucket
	latBuckets = latLinear + (64-latSubBits-1)*(1<<latSubBits)
)

func latBucket(v uint64) int {
	if v < latLinear {
		return int(v)
	}
	shift := bits.Len64(v) - latSubBits - 1 // v>>shift is in [64, 128)
	return latLinear + (shift-1)<<latSubBits + int(v>>shift) - 1<<latSubBits
}

// latValue is the middle of bucket i.
func latValue(i int) uint64 {
	if i < latLinear {
		return uint64(i)
	}
	i -= latLinear
	shift := i>>latSubBits + 1
	lo := uint64(i&(1<<latSubBits-1)+1<<latSubBits) << shift
	return lo + (uint64(1)<<shift)/2
}

func (l *latencies) add(d time.Duration) {
	l.counts[latBucket(uint64(max(d, 0)))]++
	l.n++
}

func (l *latencies) merge(o *latencies) {
	for i, c := range o.counts {
		l.counts[i] += c
	}
	l.n += o.n
}

// percentile is the nearest-rank percentile (as ebench.Percentile), to
// the bucket: 0 when empty.
func (l *latencies) percentile(p float64) time.Duration {
	if l.n == 0 {
		return 0
	}
	rank := uint64(max(1, min(float64(l.n), math.Ceil(p*float64(l.n)))))
	var seen uint64
	for i, c := range l.counts {
		if seen += c; seen >= rank {
			return time.Duration(latValue(i))
		}
	}
	return time.Duration(latValue(latBuckets - 1))
}
