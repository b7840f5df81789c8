//go:build race

package master

// Under the race detector, whose shadow memory grows with the heap and is
// not returned with it, the attack tests' RSS bounds are wider: rssScale
// times for a peak, and rssKept more after the attack.
const (
	rssScale = 4
	rssKept  = 256 << 20
)
