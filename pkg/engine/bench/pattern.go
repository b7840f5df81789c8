package bench

import (
	"encoding/binary"
	"fmt"
)

// The verification pattern is a cheap function of the offset inside a
// buffer and a seed: 8-byte words of a splitmix64 hash of (word index,
// seed). Every byte of a block is predictable from where it sits, so a
// misplaced, short or torn transfer is caught, not just a missing one.

func patternWord(word, seed uint64) uint64 {
	z := word + seed*0x9E3779B97F4A7C15 + 0x9E3779B97F4A7C15
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

// PatternByte is the byte the pattern holds at offset off.
func PatternByte(off, seed uint64) byte {
	return byte(patternWord(off>>3, seed) >> (8 * (off & 7)))
}

// FillPattern writes the pattern for offsets [off, off+len(b)) into b.
func FillPattern(b []byte, off, seed uint64) {
	i := 0
	for ; i < len(b) && (off+uint64(i))&7 != 0; i++ {
		b[i] = PatternByte(off+uint64(i), seed)
	}
	for ; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], patternWord((off+uint64(i))>>3, seed))
	}
	for ; i < len(b); i++ {
		b[i] = PatternByte(off+uint64(i), seed)
	}
}

// MismatchError names the first byte that differs from the pattern.
type MismatchError struct {
	Segment  string
	Offset   uint64 // from the start of the segment's first buffer
	Addr     uint64 // target virtual address
	Expected byte
	Actual   byte
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("verify: segment %q offset %d (address 0x%x): expected 0x%02x, got 0x%02x",
		e.Segment, e.Offset, e.Addr, e.Expected, e.Actual)
}

// checkPattern compares b with the pattern for [off, off+len(b)) using
// scratch (len >= len(b)) for the expected bytes; it returns the index of
// the first mismatch, or -1.
func checkPattern(b, scratch []byte, off, seed uint64) int {
	exp := scratch[:len(b)]
	FillPattern(exp, off, seed)
	if string(exp) == string(b) { // compiles to memequal, no allocation
		return -1
	}
	for i := range b {
		if b[i] != exp[i] {
			return i
		}
	}
	return -1
}
