package meta

import (
	"strings"
	"testing"
)

// Under an address-space limit etcd cannot map its database and panics
// (a goroutine dump, not an error): refused first, saying what to change.
func TestAddressSpaceErr(t *testing.T) {
	if err := addressSpaceErr(0, rlimInfinity); err != nil {
		t.Fatalf("no limit: %v", err)
	}
	if err := addressSpaceErr(0, 16<<30); err != nil {
		t.Fatalf("16 GiB for the default quota's 10 GiB map: %v", err)
	}
	err := addressSpaceErr(0, 8<<30)
	if err == nil || !strings.Contains(err.Error(), "etcd maps 10G") || !strings.Contains(err.Error(), "ulimit -v") || !strings.Contains(err.Error(), "--quota-backend-bytes") {
		t.Fatalf("default quota under 8 GiB: %v", err)
	}
	// The quota it suggests fits: its map and the runtime's share.
	if err := addressSpaceErr(6400<<20, 8<<30); err != nil {
		t.Fatalf("a 6400 MiB quota under 8 GiB (maps 7040 MiB): %v", err)
	}
	if err := addressSpaceErr(1<<30, 1<<30); err == nil || strings.Contains(err.Error(), "give a quota") {
		t.Fatalf("1 GiB limit: %v, want refused with no quota that fits", err)
	}
	if got := etcdMmapSize(1 << 30); got != 1<<30+(1<<30)/10 {
		t.Fatalf("map of a 1 GiB quota: %d", got)
	}
}
