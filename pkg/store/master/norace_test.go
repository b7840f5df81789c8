//go:build !race

package master

// The attack tests' RSS bounds are as stated without the race detector
// (race_test.go widens them).
const rssScale = 1
