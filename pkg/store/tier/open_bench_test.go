package tier

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

var scanBytes = flag.Int64("tier.scan-bytes", 2<<30, "BenchmarkOpen: bytes of 1 MiB records on disk")

// BenchmarkOpen is a restart: Open scans -tier.scan-bytes of 1 MiB
// records (in $TMPDIR, which must be on the disk to measure), with the
// files dropped from the page cache before each Open.
func BenchmarkOpen(b *testing.B) {
	dir := b.TempDir()
	quiet, _ := testLogger()
	tr, err := Open(Config{Dir: dir, Capacity: uint64(*scanBytes) * 2, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	v := value("v", 1, 1<<20)
	for i := range *scanBytes >> 20 {
		if err := tr.Write(context.Background(), fmt.Sprintf("key-%d", i), 1, v); err != nil {
			b.Fatal(err)
		}
	}
	tr.Close()
	files, _ := filepath.Glob(filepath.Join(dir, "*"+dataSuffix))
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		for _, p := range files {
			if f, err := os.Open(p); err == nil {
				unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
				f.Close()
			}
		}
		b.StartTimer()
		tr, err := Open(Config{Dir: dir, Capacity: uint64(*scanBytes) * 2, Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		if n := tr.Stats().Records; int64(n) != *scanBytes>>20 {
			b.Fatalf("%d records after the scan, want %d", n, *scanBytes>>20)
		}
		tr.Close()
	}
}
