//go:build !ibverbs || !cgo

package ibverbs

import "github.com/kvcache-ops/mc/pkg/rdma"

// New reports ErrNotBuilt: this binary has no libibverbs binding.
func New(Options) (rdma.Provider, error) { return nil, ErrNotBuilt }
