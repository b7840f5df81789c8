package bench

import (
	"context"
	"testing"
	"time"
)

// OnDisk rows: every key read lives only on the disk tier, each get row
// follows its disk-read row and carries the ratio, and every byte read
// is right.
func TestOnDiskRows(t *testing.T) {
	dir := t.TempDir()
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

// Keys that come round fast still read the disk on every get: a staged
// read is handed back when its transfer ends, so the next get of the key
// loads it again rather than finding an earlier read's copy in memory
// (when copies stayed leased for 10 s, such a row measured 5 GB/s "from
// disk", and the bench refused it). The bench's check that at least 99%
// of gets read the disk holds with 4 keys and one caller (concurrent
// readers of one key share its staged copy, which the check still
// refuses a row for).
func TestOnDiskRowKeysComingRoundReadTheDisk(t *testing.T) {
	res, err := Run(context.Background(), Config{ValueSizes: []int64{64 << 10}, Ops: []string{"get"}, Concurrency: []int{1},
		Keys: 4, Duration: 300 * time.Millisecond, SegmentSize: 64 << 20, SSDDir: t.TempDir(), SSDSize: 64 << 20, OnDisk: true, Verify: true, Logger: quietLog()})
	if err != nil {
		t.Fatalf("a row of 4 keys coming round: %v", err)
	}
	g := res[len(res)-1]
	if g.Op != "get" || g.DiskReads == 0 || g.Errors != 0 || g.Corrupt != 0 {
		t.Fatalf("get row %+v: want every get a disk read, none failed", g)
	}
}
