//go:build !race

package master

// rssScale widens the attack tests' RSS bounds under the race detector
// (race_test.go); 1 without it.
const rssScale = 1
