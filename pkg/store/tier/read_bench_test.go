package tier

import (
	"hash/crc32"
	"testing"
)

// BenchmarkCheckCopy compares the read path's checksum-and-copy of a
// 1 MiB value in one pass (checkCopy) with a checksum pass then a copy
// (the baseline), on sources that are not in the cache, as a value just
// read from disk is not.
func BenchmarkCheckCopy(b *testing.B) {
	const n, ring = 1 << 20, 128 // 128 MiB of sources: more than a cache holds
	srcs := make([][]byte, ring)
	for i := range srcs {
		srcs[i] = value("src", uint64(i), n)
	}
	dst := make([]byte, n)
	var sink uint32
	b.Run("two-pass", func(b *testing.B) {
		b.SetBytes(n)
		for i := range b.N {
			s := srcs[i%ring]
			sink += crc32.Checksum(s, castagnoli)
			copy(dst, s)
		}
	})
	b.Run("one-pass", func(b *testing.B) {
		b.SetBytes(n)
		for i := range b.N {
			sink += checkCopy(0, dst, srcs[i%ring])
		}
	})
	if sink == 1 {
		b.Log(sink)
	}
}
