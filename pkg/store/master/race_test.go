//go:build race

package master

// Under the race detector, whose shadow memory grows with the heap and is
// not returned with it, the attack tests' RSS peaks are bounded rssScale
// times wider (what the master keeps after an attack is measured on its
// heap, childHeap, which the shadow does not inflate).
const rssScale = 4
