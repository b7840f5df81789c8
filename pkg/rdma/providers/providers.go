// Package providers picks an rdma.Provider by name, so the engine and the
// CLI need not know which providers a build contains. It exists apart from
// pkg/rdma because the providers import pkg/rdma.
package providers

import (
	"errors"
	"fmt"
	"os"
	"strconv"
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
	opts, err := ibverbsOptions(os.Getenv)
	if err != nil {
		return nil, err
	}
	switch strings.ToLower(strings.TrimSpace(kind)) {
	case "soft":
		return openSoft()
	case "ibverbs":
		return ibverbs.New(opts)
	case "", "auto":
		p, err := ibverbs.New(opts)
		if err == nil {
			if _, err = p.Devices(); err == nil {
				return p, nil
			}
		}
		if err != nil && !errors.Is(err, ibverbs.ErrNotBuilt) && !errors.Is(err, rdma.ErrNoDevices) {
			return nil, err
		}
		return openSoft()
	}
	return nil, fmt.Errorf("rdma provider %q: want soft, ibverbs or auto", kind)
}

// ibverbsOptions reads MC_GID_INDEX, the GID table index RoCE addressing
// uses (Mooncake's default 0; RoCE v2 over IPv4 is often 3).
func ibverbsOptions(getenv func(string) string) (ibverbs.Options, error) {
	var o ibverbs.Options
	if s := strings.TrimSpace(getenv("MC_GID_INDEX")); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 || n > 255 {
			return o, fmt.Errorf("MC_GID_INDEX=%q: want a GID table index, 0-255", s)
		}
		o.GIDIndex = n
	}
	return o, nil
}

// openSoft returns the soft provider as an rdma.Provider, nil on failure:
// returning soft.NewFromEnv's (*soft.Provider)(nil) would make a non-nil
// interface that a caller's cleanup could close.
func openSoft() (rdma.Provider, error) {
	p, err := soft.NewFromEnv()
	if err != nil {
		return nil, err
	}
	return p, nil
}
