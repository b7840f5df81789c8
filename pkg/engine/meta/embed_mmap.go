package meta

import (
	"fmt"
	"syscall"

	"github.com/kvcache-ops/mc/pkg/units"
)

// etcdDefaultQuota is etcd's default backend quota (2 GiB); with it (or
// none) etcd maps etcdInitialMmap up front, with any other quota the
// quota plus 10%.
const (
	rlimInfinity     = ^uint64(0) // RLIM_INFINITY as Getrlimit fills it
	etcdDefaultQuota = 2 << 30
	etcdInitialMmap  = 10 << 30
)

// etcdMmapSize is the address space etcd's backend maps at start for a
// quota.
func etcdMmapSize(quota int64) uint64 {
	if quota <= 0 || quota == etcdDefaultQuota {
		return etcdInitialMmap
	}
	return uint64(quota + quota/10)
}

// addressSpaceErr says why etcd cannot start under an address-space limit
// (ulimit -v) of limit bytes, or returns nil. etcd's database open fails
// inside etcd, which then panics with a goroutine dump: refused first,
// with what to change.
func addressSpaceErr(quota int64, limit uint64) error {
	const runtimeShare = 1 << 30 // the Go runtime's and the rest's own mappings
	need := etcdMmapSize(quota)
	if limit == rlimInfinity || limit >= need+runtimeShare {
		return nil
	}
	msg := fmt.Sprintf("etcd maps %s of address space for its database up front (quota %s), and this process may use %s (ulimit -v): raise the limit",
		units.FormatSize(int64(need)), units.FormatSize(quotaOrDefault(quota)), units.FormatSize(int64(limit)))
	if limit > runtimeShare+(64<<20) {
		// quota*1.1 + runtime <= limit (64 MiB steps, and never the
		// default quota, which maps 10 GiB).
		q := int64(float64(limit-runtimeShare)/1.1) &^ (64<<20 - 1)
		if q == etcdDefaultQuota {
			q -= 64 << 20
		}
		if q > 0 {
			msg += fmt.Sprintf(", or give a quota of at most %s (--quota-backend-bytes)", units.FormatSize(q))
		}
	}
	return fmt.Errorf("%s", msg)
}

func quotaOrDefault(q int64) int64 {
	if q <= 0 {
		return etcdDefaultQuota
	}
	return q
}

// addressSpaceLimit is this process's RLIMIT_AS (RLIM_INFINITY when it
// cannot be read).
func addressSpaceLimit() uint64 {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_AS, &rl); err != nil {
		return rlimInfinity
	}
	return rl.Cur
}
