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
		Keys: 40, Duration: 300 * time.Millisecond, SegmentSize: 64 << 20, SSDDir: dir, SSDSize: 256 << 20, OnDisk: true, Verify: true, Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
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
