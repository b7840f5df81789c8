// Package ibverbs implements rdma.Provider with libibverbs through cgo,
// for machines with real RDMA NICs (mlx5, irdma, rxe, ...).
//
// The binding is compiled only with the `ibverbs` build tag and cgo
// (`go build -tags ibverbs`, needs libibverbs-dev). Without them New
// returns ErrNotBuilt, so a `!cgo` build of mc still links and uses the
// soft provider.
//
// Memory handed to RegMR is kept by the NIC after the call returns; cgo
// forbids C from retaining Go heap pointers, so register memory that is not
// managed by the Go allocator (mmap'd segments, as the engine uses).
package ibverbs

import "errors"

// ErrNotBuilt is returned by New in builds without the ibverbs tag or cgo.
var ErrNotBuilt = errors.New("ibverbs provider not built in (rebuild with -tags ibverbs and cgo)")

// Options tune the provider.
type Options struct {
	// GIDIndex is the GID table index reported and used for RoCE
	// addressing (MC_GID_INDEX); default 0.
	GIDIndex int
	// SysRoot prefixes /sys when reading a device's PCI address and NUMA
	// node; "" means "/".
	SysRoot string
}
