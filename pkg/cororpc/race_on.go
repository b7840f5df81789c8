//go:build race

package cororpc

const raceEnabled = true
