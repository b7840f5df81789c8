// Package providers picks an rdma.Provider by name, so the engine and the
// CLI need not know which providers a build contains. It exists apart from
// pkg/rdma because the providers import pkg/rdma.
package providers

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/kvcache-ops/mc/pkg/rdma"
	"github.com/kvcache-ops/mc/pkg/rdma/ibverbs"
	"github.com/kvcache-ops/mc/pkg/rdma/soft"
)

// Open returns the provider named kind:
//   - "soft": the software NIC, devices from MC_SOFT_NICS (default
//     "soft0,soft1");
//   - "ibverbs": libibverbs (needs a build with -tags ibverbs and cgo);
//   - "auto" or "": ibverbs when built in and it finds devices, else soft.
//
// MC_RDMA_PROVIDER supplies kind when it is empty.
func Open(kind string) (rdma.Provider, error) {
	if kind == "" {
		kind = os.Getenv("MC_RDMA_PROVIDER")
	}
	switch strings.ToLower(strings.TrimSpace(kind)) {
	case "soft":
		return soft.NewFromEnv()
	case "ibverbs":
		return ibverbs.New(ibverbs.Options{})
	case "", "auto":
		p, err := ibverbs.New(ibverbs.Options{})
		if err == nil {
			if _, err = p.Devices(); err == nil {
				return p, nil
			}
		}
		if err != nil && !errors.Is(err, ibverbs.ErrNotBuilt) && !errors.Is(err, rdma.ErrNoDevices) {
			return nil, err
		}
		return soft.NewFromEnv()
	}
	return nil, fmt.Errorf("rdma provider %q: want soft, ibverbs or auto", kind)
}
