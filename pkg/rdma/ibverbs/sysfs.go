package ibverbs

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// placement reads a device's PCI address and NUMA node from sysfs:
// /sys/class/infiniband/<dev>/device is a relative symlink into the PCI
// tree whose last element is the address; numa_node holds the node or -1.
func placement(root, dev string) (pci string, numa int) {
	if root == "" {
		root = "/"
	}
	numa = -1
	base := filepath.Join(root, "sys/class/infiniband", dev, "device")
	if target, err := os.Readlink(base); err == nil {
		pci = filepath.Base(target)
	}
	if b, err := os.ReadFile(filepath.Join(base, "numa_node")); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n >= -1 {
			numa = n
		}
	}
	return pci, numa
}
