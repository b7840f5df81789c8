package bench

import (
	"context"
	"strings"
	"testing"
	"time"
)

// OnDisk rows: every key read lives only on the disk tier, each get row
// follows its disk-read row and carries the ratio, and every byte read
// is right.
func TestOnDiskRows(t *testing.T) {
	dir := t.TempDir()
	// A short lease so that a small key set comes round slower than a
	// staging copy lives (every get must read the disk, or Run refuses
	// the row).
	defer func(l time.Duration) { onDiskLease = l }(onDiskLease)
	onDiskLease = 20 * time.Millisecond
	res, err := Run(context.Background(), Config{ValueSizes: []int64{256 << 10}, Ops: []string{"get"}, Concurrency: []int{2},
		Keys: 400, Duration: 300 * time.Millisecond, SegmentSize: 128 << 20, SSDDir: dir, SSDSize: 256 << 20, OnDisk: true, Verify: true, Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	if g := res[len(res)-1]; g.DiskReads == 0 {
		t.Fatalf("get row %+v: want a disk read per get", g)
	}
	if len(res) != 2 || res[0].Op != "disk-read" || res[1].Op != "get" {
		t.Fatalf("rows %+v: want disk-read then get", res)
	}
	base, get := res[0], res[1]
	if base.OpsPerSec <= 0 || get.OpsPerSec <= 0 || get.Errors != 0 || get.Corrupt != 0 {
		t.Fatalf("rows %+v", res)
	}
	if want := get.GBPerSec / base.GBPerSec; get.VsDisk != want {
		t.Fatalf("vs disk %g, want %g", get.VsDisk, want)
	}
}

// A get that finds an earlier read's staging copy still leased is served
// from memory; a row where the keys come round that fast is not a row of
// disk reads and is refused, naming why (with a shared-memory client the
// gets of a small key set once measured 5 GB/s "from disk", faster than
// the disk).
func TestOnDiskRowRefusedWhenKeysComeRoundWithinTheLease(t *testing.T) {
	_, err := Run(context.Background(), Config{ValueSizes: []int64{64 << 10}, Ops: []string{"get"}, Concurrency: []int{2},
		Keys: 4, Duration: 300 * time.Millisecond, SegmentSize: 64 << 20, SSDDir: t.TempDir(), SSDSize: 64 << 20, OnDisk: true, Logger: quietLog()})
	if err == nil || !strings.Contains(err.Error(), "staging copy") || !strings.Contains(err.Error(), "--keys") {
		t.Fatalf("err = %v, want the row refused for reading staging copies", err)
	}
}
