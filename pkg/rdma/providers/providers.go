// Package providers picks an rdma.Provider by name, so the engine and the
// CLI need not know which providers a build contains. It exists apart from
// pkg/rdma because the providers import pkg/rdma.
package providers

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/kvcache-ops/mc/pkg/rdma"
	"github.com/kvcache-ops/mc/pkg/rdma/ibverbs"
	"github.com/kvcache-ops/mc/pkg/rdma/soft"
	"github.com/kvcache-ops/mc/pkg/topo"
)

// Soft is the name of the software NIC provider (rdma.Provider.Name): a
// result whose bytes it moved says so ("rdma (soft)"), since they went
// over TCP sockets, not through an RDMA NIC.
const Soft = "soft"

// ErrNoSuchDevice is returned (wrapped) when the default provider would
// have to stand in soft NICs for devices that are not RDMA devices here.
var ErrNoSuchDevice = errors.New("not an RDMA device on this host")

// IsSoftName reports whether a device name asks for a soft NIC by name
// ("soft0", "soft-a"), which the default provider may create.
func IsSoftName(name string) bool { return strings.HasPrefix(name, "soft") }

// OpenFor opens the provider kind names (as Open) for the NICs devices
// (--device_name; empty means all), reading sysfs beneath sysfsRoot ("" is
// "/"). Under the default provider, falling back to the soft NIC is for
// devices named soft* only: any other name is an RDMA device the user
// expects bytes to cross, and standing in a software NIC over TCP under
// its name would report an RDMA result that is not one. Such a name is
// an error (ErrNoSuchDevice) naming the devices under
// /sys/class/infiniband and how to ask for the soft NIC on purpose.
func OpenFor(kind string, devices []string, sysfsRoot string) (rdma.Provider, error) {
	if kind == "" {
		kind = os.Getenv("MC_RDMA_PROVIDER")
	}
	k := strings.ToLower(strings.TrimSpace(kind))
	if k != "" && k != "auto" {
		return Open(k)
	}
	opts, err := ibverbsOptions(os.Getenv)
	if err != nil {
		return nil, err
	}
	p, why, err := openHardware(opts)
	if p != nil || err != nil {
		return p, err
	}
	if err := checkSoftFallback(devices, sysfsRoot, why); err != nil {
		return nil, err
	}
	return openSoft()
}

// openHardware returns the ibverbs provider when it is built in and finds
// devices. When the default provider should fall back instead, it returns
// no provider and no error, and why it cannot use ibverbs.
func openHardware(opts ibverbs.Options) (p rdma.Provider, why, err error) {
	p, err = ibverbs.New(opts)
	if err == nil {
		if _, err = p.Devices(); err == nil {
			return p, nil, nil
		}
		if c, ok := p.(interface{ Close() error }); ok {
			c.Close()
		}
	}
	if !errors.Is(err, ibverbs.ErrNotBuilt) && !errors.Is(err, rdma.ErrNoDevices) {
		return nil, nil, err
	}
	return nil, err, nil
}

// checkSoftFallback refuses a fall back to soft NICs for devices that are
// not named soft*; why is the reason ibverbs is not used.
func checkSoftFallback(devices []string, sysfsRoot string, why error) error {
	var hw []string
	for _, d := range devices {
		if !IsSoftName(d) {
			hw = append(hw, d)
		}
	}
	if len(hw) == 0 {
		return nil
	}
	fsys, err := topo.NewFS(sysfsRoot)
	if err != nil {
		return fmt.Errorf("rdma device %q: %w", hw[0], err)
	}
	have, err := fsys.ReadDir("sys/class/infiniband")
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("rdma device %q: %w", hw[0], err)
	}
	const ask = "for the software NIC (bytes over TCP, reported as \"rdma (soft)\") set MC_RDMA_PROVIDER=soft or name a soft* device (--device-name soft0)"
	for _, d := range hw {
		if slices.Contains(have, d) {
			// There is hardware, but no provider for it in this build.
			return fmt.Errorf("rdma device %q is in /sys/class/infiniband but cannot be used: %v; %s", d, why, ask)
		}
	}
	here := "none"
	if len(have) > 0 {
		here = strings.Join(have, ", ")
	}
	return fmt.Errorf("rdma device %q: %w (devices in /sys/class/infiniband: %s); %s", hw[0], ErrNoSuchDevice, here, ask)
}

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
		p, _, err := openHardware(opts)
		if p != nil || err != nil {
			return p, err
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
