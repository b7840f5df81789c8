package soft

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kvcache-ops/mc/pkg/rdma"
)

// DefaultMaxQP is a soft device's QP pool when the configuration says
// nothing: 2^17, the size of a ConnectX-6 pool, one of the sizes at which
// the production leak was seen.
const DefaultMaxQP = 131072

// DefaultRetryTimeout is how long a request may go unanswered before it
// completes with "transport retry counter exceeded". A real RC QP with
// timeout 14 (67 ms) and retry_cnt 7 gives up after about half a second.
const DefaultRetryTimeout = 500 * time.Millisecond

// DeviceConfig declares one soft NIC.
// In a config file (section soft.devices) the keys are the tags below;
// port_state is "up" or "down".
type DeviceConfig struct {
	Name      string         `json:"name" mapstructure:"name"`
	NUMANode  int            `json:"numa_node" mapstructure:"numa_node"` // -1 when unknown
	MaxQP     int            `json:"max_qp" mapstructure:"max_qp"`       // 0 means DefaultMaxQP
	PortState rdma.PortState `json:"port_state" mapstructure:"port_state"`
	PCIAddr   string         `json:"pci_addr" mapstructure:"pci_addr"` // reported as is; may be empty
}

// Config declares the soft NICs of a process.
type Config struct {
	Devices []DeviceConfig
	// RetryTimeout bounds how long a request waits for its response; 0
	// means DefaultRetryTimeout.
	RetryTimeout time.Duration
	// ListenHost is the loopback address the devices' wires listen on;
	// empty means 127.0.0.1. Its IPv4-mapped form is the ports' GID.
	ListenHost string
}

// ParseDevices parses MC_SOFT_NICS: a comma-separated list of devices,
// each `name[:numa[:maxqp[:state]]]`, for example
// "soft0,soft1" or "soft0:0:64,soft1:1:64:down". Empty fields keep their
// defaults (NUMA -1, DefaultMaxQP, port up).
func ParseDevices(s string) ([]DeviceConfig, error) {
	var out []DeviceConfig
	seen := map[string]bool{}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		f := strings.Split(item, ":")
		if len(f) > 4 {
			return nil, fmt.Errorf("soft NIC %q: want name[:numa[:maxqp[:state]]]", item)
		}
		d := DeviceConfig{Name: f[0], NUMANode: -1, MaxQP: DefaultMaxQP, PortState: rdma.PortActive}
		if d.Name == "" {
			return nil, fmt.Errorf("soft NIC %q: empty name", item)
		}
		if seen[d.Name] {
			return nil, fmt.Errorf("soft NIC %q declared twice", d.Name)
		}
		seen[d.Name] = true
		if len(f) > 1 && f[1] != "" {
			n, err := strconv.Atoi(f[1])
			if err != nil || n < -1 {
				return nil, fmt.Errorf("soft NIC %q: NUMA node %q is not a number >= -1", item, f[1])
			}
			d.NUMANode = n
		}
		if len(f) > 2 && f[2] != "" {
			n, err := strconv.Atoi(f[2])
			if err != nil || n <= 0 {
				return nil, fmt.Errorf("soft NIC %q: max_qp %q is not a positive number", item, f[2])
			}
			d.MaxQP = n
		}
		if len(f) > 3 {
			st, err := rdma.ParsePortState(f[3])
			if err != nil {
				return nil, fmt.Errorf("soft NIC %q: %w", item, err)
			}
			d.PortState = st
		}
		out = append(out, d)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no soft NICs in %q", s)
	}
	return out, nil
}

// ConfigFromEnv reads MC_SOFT_NICS (default "soft0,soft1").
func ConfigFromEnv() (Config, error) {
	s := os.Getenv("MC_SOFT_NICS")
	if s == "" {
		s = "soft0,soft1"
	}
	devs, err := ParseDevices(s)
	if err != nil {
		return Config{}, fmt.Errorf("MC_SOFT_NICS: %w", err)
	}
	return Config{Devices: devs}, nil
}
