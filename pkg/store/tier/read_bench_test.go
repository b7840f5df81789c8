package tier

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"hash/crc32"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

var (
	readDuration = flag.Duration("tier.read-duration", 2*time.Second, "BenchmarkRead: time per measurement")
	readRounds   = flag.Int("tier.read-rounds", 3, "BenchmarkRead: rounds (medians are reported)")
)

// BenchmarkRead is Tier.Read (checksummed, into an mmap'd buffer on small
// pages, as the node's segment is) against the disk's own O_DIRECT reads
// of the same records' bytes into huge pages, in the same run, rounds
// interleaved: 512 MiB of 1 MiB and of 16 MiB records in $TMPDIR (which
// must be on the disk to measure), read going round the records by 1 and
// by 4 readers. Where the tier reads through huge-page bounce buffers it
// is measured a second time reading in place, as it does without huge
// pages (bounced/inplace). Run with -benchtime 1x.
func BenchmarkRead(b *testing.B) {
	for _, size := range []int{1 << 20, 16 << 20} {
		dir := b.TempDir()
		quiet, _ := testLogger()
		tr, err := Open(Config{Dir: dir, Capacity: 1 << 30, Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		n := (512 << 20) / size
		keys := make([]string, n)
		for i := range keys {
			keys[i] = fmt.Sprintf("key-%d", i)
			if err := tr.Write(context.Background(), keys[i], 1, value(keys[i], 1, size)); err != nil {
				b.Fatal(err)
			}
		}
		for _, conc := range []int{1, 4} {
			b.Run(fmt.Sprintf("%dM-c%d", size>>20, conc), func(b *testing.B) {
				var disk, tier, ratio, inPlace, gain []float64
				for range *readRounds {
					d := readLoop(b, conc, size, true, func(i int, dst []byte) error {
						tr.mu.Lock()
						e := tr.index[keys[i%n]]
						tr.mu.Unlock()
						fd, done, _, err := tr.reader(e.file)
						if err != nil {
							return err
						}
						defer done()
						_, err = fd.ReadAt(dst[:e.len], int64(e.off))
						return err
					})
					t := readLoop(b, conc, size, false, func(i int, dst []byte) error {
						_, err := tr.Read(context.Background(), keys[i%n], 1, dst)
						return err
					})
					disk, tier, ratio = append(disk, d), append(tier, t), append(ratio, t/d)
					if tr.direct && tr.hugeBounce {
						tr.hugeBounce = false
						p := readLoop(b, conc, size, false, func(i int, dst []byte) error {
							_, err := tr.Read(context.Background(), keys[i%n], 1, dst)
							return err
						})
						tr.hugeBounce = true
						inPlace, gain = append(inPlace, p), append(gain, t/p)
					}
				}
				med := func(x []float64) float64 { slices.Sort(x); return x[len(x)/2] }
				b.ReportMetric(med(disk), "disk-GB/s")
				b.ReportMetric(med(tier), "read-GB/s")
				b.ReportMetric(med(ratio), "read/disk")
				if len(inPlace) > 0 {
					b.ReportMetric(med(inPlace), "inplace-GB/s")
					b.ReportMetric(med(gain), "bounced/inplace")
				}
			})
		}
		tr.Close()
		os.RemoveAll(dir)
	}
}

// readLoop runs read from conc goroutines for -tier.read-duration, each
// into a buffer of its own, and returns GB/s of values of size bytes. The
// buffer is a ReadBuffer with huge (the disk at its best), otherwise
// mmap'd small pages, as a node's segment is.
func readLoop(b *testing.B, conc, size int, huge bool, read func(i int, dst []byte) error) float64 {
	var next, done atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var dst []byte
			var err error
			if huge {
				dst, err = ReadBuffer(size + 2*BlockSize)
				defer FreeReadBuffer(dst)
			} else {
				dst, err = unix.Mmap(-1, 0, size+2*BlockSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
				defer unix.Munmap(dst)
			}
			if err != nil {
				b.Error(err)
				return
			}
			for time.Since(start) < *readDuration {
				if err := read(int(next.Add(1)), dst); err != nil {
					b.Error(err)
					return
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	return float64(done.Load()) * float64(size) / time.Since(start).Seconds() / 1e9
}

// coldSources returns ring values of n bytes: more than a cache holds,
// so each is read from DRAM, as a value just read from disk is.
func coldSources(n, ring int) [][]byte {
	srcs := make([][]byte, ring)
	for i := range srcs {
		srcs[i] = value("src", uint64(i), n)
	}
	return srcs
}

// BenchmarkCheckCopy compares the bounce path's checksum-and-copy of a
// 1 MiB value (checkCopy: copy each 4 KiB piece, checksum it in the
// destination) with a checksum pass then a copy, and with checksumming
// each 16 KiB piece of the source before copying it (the earlier one-pass
// form), on sources that are not in the cache.
func BenchmarkCheckCopy(b *testing.B) {
	const n = 1 << 20
	srcs := coldSources(n, 128)
	dst := make([]byte, n)
	var sink uint32
	b.Run("two-pass", func(b *testing.B) {
		b.SetBytes(n)
		for i := range b.N {
			s := srcs[i%len(srcs)]
			sink += crc32.Checksum(s, castagnoli)
			copy(dst, s)
		}
	})
	b.Run("checksum-then-copy-16K", func(b *testing.B) {
		b.SetBytes(n)
		for i := range b.N {
			var crc uint32
			d, s := dst, srcs[i%len(srcs)]
			for len(s) > 0 {
				p := s[:min(16<<10, len(s))]
				crc = crc32.Update(crc, castagnoli, p)
				copy(d, p)
				d, s = d[len(p):], s[len(p):]
			}
			sink += crc
		}
	})
	b.Run("checkCopy", func(b *testing.B) {
		b.SetBytes(n)
		for i := range b.N {
			sink += checkCopy(0, dst, srcs[i%len(srcs)])
		}
	})
	if sink == 1 {
		b.Log(sink)
	}
}

// BenchmarkChecksum compares the in-place path's checksum of a 1 MiB
// value not in the cache (checksum: each 4 KiB piece copied into L1 and
// checksummed there) with CRC32C straight over it.
func BenchmarkChecksum(b *testing.B) {
	const n = 1 << 20
	srcs := coldSources(n, 128)
	var sink uint32
	b.Run("direct", func(b *testing.B) {
		b.SetBytes(n)
		for i := range b.N {
			sink += crc32.Checksum(srcs[i%len(srcs)], castagnoli)
		}
	})
	b.Run("checksum", func(b *testing.B) {
		b.SetBytes(n)
		for i := range b.N {
			sink += checksum(0, srcs[i%len(srcs)])
		}
	})
	if sink == 1 {
		b.Log(sink)
	}
}

// The piecewise checksums agree with CRC32C over the whole value, for
// lengths on and off the piece size.
func TestChecksumPieces(t *testing.T) {
	for _, n := range []int{0, 1, checkPiece - 1, checkPiece, checkPiece + 1, 5*checkPiece + 77} {
		v := value("k", uint64(n), n)
		want := crc32.Update(7, castagnoli, v)
		if got := checksum(7, v); got != want {
			t.Fatalf("checksum of %d bytes: %08x, want %08x", n, got, want)
		}
		dst := make([]byte, n)
		if got := checkCopy(7, dst, v); got != want || !bytes.Equal(dst, v) {
			t.Fatalf("checkCopy of %d bytes: %08x (copy equal %v), want %08x", n, got, bytes.Equal(dst, v), want)
		}
	}
}
