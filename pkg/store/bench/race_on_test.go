//go:build race

package bench

// raceOn: the race detector slows puts about tenfold.
const raceOn = true
