package tier

import (
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

// BenchmarkRead is Tier.Read (checksummed, copied into an mmap'd buffer,
// as the node's segment is) against the disk's own O_DIRECT reads of the
// same records' bytes, in the same run, rounds interleaved: 512 MiB of
// 1 MiB and of 16 MiB records in $TMPDIR (which must be on the disk to
// measure), read going round the records by 1 and by 4 readers. Run with
// -benchtime 1x.
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
				var disk, tier, ratio []float64
				for range *readRounds {
					d := readLoop(b, conc, size, func(i int, dst []byte) error {
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
					t := readLoop(b, conc, size, func(i int, dst []byte) error {
						_, err := tr.Read(context.Background(), keys[i%n], 1, dst)
						return err
					})
					disk, tier, ratio = append(disk, d), append(tier, t), append(ratio, t/d)
				}
				med := func(x []float64) float64 { slices.Sort(x); return x[len(x)/2] }
				b.ReportMetric(med(disk), "disk-GB/s")
				b.ReportMetric(med(tier), "read-GB/s")
				b.ReportMetric(med(ratio), "read/disk")
			})
		}
		tr.Close()
		os.RemoveAll(dir)
	}
}

// readLoop runs read from conc goroutines for -tier.read-duration, each
// into an mmap'd buffer, and returns GB/s of values of size bytes.
func readLoop(b *testing.B, conc, size int, read func(i int, dst []byte) error) float64 {
	var next, done atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dst, err := unix.Mmap(-1, 0, size+2*BlockSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
			if err != nil {
				b.Error(err)
				return
			}
			defer unix.Munmap(dst)
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
