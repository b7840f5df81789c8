//go:build race

package master

// rssScale widens the attack tests' RSS bounds under the race detector,
// whose shadow memory grows with the heap and is not returned with it.
const rssScale = 4
