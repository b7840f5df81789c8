package topo

import (
	"fmt"
	"strconv"
	"strings"
)

// Class is the PCIe relation between a memory location and a NIC, in the
// classes operators know from NCCL and `nvidia-smi topo -m`. Lower is
// closer.
type Class int

// Relation classes, closest first.
const (
	PIX  Class = iota + 1 // same PCIe switch (at most one bridge on each side)
	PXB                   // several bridges, below one root port
	PHB                   // same PCIe host bridge, different root ports
	NODE                  // same NUMA node, different host bridges
	SYS                   // across sockets, or a NUMA node that is unknown
)

var classNames = [...]string{PIX: "PIX", PXB: "PXB", PHB: "PHB", NODE: "NODE", SYS: "SYS"}

func (c Class) String() string {
	if c >= PIX && c <= SYS {
		return classNames[c]
	}
	return "Class(" + strconv.Itoa(int(c)) + ")"
}

// MarshalText writes the class name, so JSON carries "PIX", not 1.
func (c Class) MarshalText() ([]byte, error) {
	if c < PIX || c > SYS {
		return nil, fmt.Errorf("invalid relation class %d", int(c))
	}
	return []byte(classNames[c]), nil
}

// UnmarshalText accepts the names MarshalText writes.
func (c *Class) UnmarshalText(b []byte) error {
	for i := PIX; i <= SYS; i++ {
		if string(b) == classNames[i] {
			*c = i
			return nil
		}
	}
	return fmt.Errorf("invalid relation class %q: want PIX, PXB, PHB, NODE or SYS", b)
}

// pciLoc is where a PCI function sits: its host bridge ("pci0000:17") and
// the chain of PCI functions below it, root port first, the device last.
type pciLoc struct {
	hostBridge string
	chain      []string
}

// parsePCIPath splits a resolved device path. Components after the last
// PCI function (an SR-IOV SF, an auxiliary device) are ignored: the PCIe
// position is that of the function they hang from.
func parsePCIPath(p string) (pciLoc, bool) {
	comps := strings.Split(strings.Trim(p, "/"), "/")
	h := -1
	for i, c := range comps {
		if isHostBridge(c) {
			h = i
			break
		}
	}
	if h < 0 {
		return pciLoc{}, false
	}
	loc := pciLoc{hostBridge: comps[h]}
	for _, c := range comps[h+1:] {
		if _, ok := parsePCIAddr(c); !ok {
			break
		}
		loc.chain = append(loc.chain, c)
	}
	if len(loc.chain) == 0 {
		return pciLoc{}, false
	}
	return loc, true
}

// device is the PCI address of the function itself.
func (l pciLoc) device() string { return l.chain[len(l.chain)-1] }

// isHostBridge matches "pci0000:17" (domain:bus of a root complex).
func isHostBridge(c string) bool {
	rest, ok := strings.CutPrefix(c, "pci")
	if !ok {
		return false
	}
	dom, bus, ok := strings.Cut(rest, ":")
	return ok && len(dom) >= 4 && isHex(dom) && len(bus) == 2 && isHex(bus)
}

// pciAddr is a parsed "DDDD:BB:DD.F", ordered as the bus enumerates.
type pciAddr struct {
	domain      uint32
	bus, dev, f uint8
}

func (a pciAddr) less(b pciAddr) bool {
	if a.domain != b.domain {
		return a.domain < b.domain
	}
	if a.bus != b.bus {
		return a.bus < b.bus
	}
	if a.dev != b.dev {
		return a.dev < b.dev
	}
	return a.f < b.f
}

func parsePCIAddr(s string) (pciAddr, bool) {
	// DDDD:BB:DD.F, the domain possibly wider than 4 digits (VMD).
	i := strings.IndexByte(s, ':')
	if i < 4 || len(s) != i+8 || s[i+3] != ':' || s[i+6] != '.' {
		return pciAddr{}, false
	}
	dom, bus, dev, fn := s[:i], s[i+1:i+3], s[i+4:i+6], s[i+7:]
	if !isHex(dom) || !isHex(bus) || !isHex(dev) || !isHex(fn) {
		return pciAddr{}, false
	}
	d, err := strconv.ParseUint(dom, 16, 32)
	if err != nil {
		return pciAddr{}, false
	}
	b, _ := strconv.ParseUint(bus, 16, 8)
	v, _ := strconv.ParseUint(dev, 16, 8)
	f, _ := strconv.ParseUint(fn, 16, 8)
	if v > 0x1f || f > 7 {
		return pciAddr{}, false
	}
	return pciAddr{domain: uint32(d), bus: uint8(b), dev: uint8(v), f: uint8(f)}, true
}

func isHex(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

// pciClass relates two PCI functions by path components (not characters:
// "pci0000:10" and "pci0000:1a" share a prefix but not a host bridge).
// Functions on different host bridges are NODE when both NUMA nodes are
// known and equal, SYS otherwise.
func pciClass(a, b pciLoc, aok, bok bool, numaA, numaB int) Class {
	if !aok || !bok || a.hostBridge != b.hostBridge {
		if numaA >= 0 && numaA == numaB {
			return NODE
		}
		return SYS
	}
	k := 0
	for k < len(a.chain)-1 && k < len(b.chain)-1 && a.chain[k] == b.chain[k] {
		k++
	}
	if k == 0 {
		// Different root ports of one host bridge.
		return PHB
	}
	// Bridges between the common ancestor and each device. One on each
	// side is a switch's downstream port (or nothing, for two functions of
	// one device): the pair shares one switch.
	if len(a.chain)-k-1 <= 1 && len(b.chain)-k-1 <= 1 {
		return PIX
	}
	return PXB
}

// cpuClass relates the memory of NUMA node n to a NIC: NODE when the NIC
// sits on that node, SYS otherwise (another socket, or unknown).
func cpuClass(n, nicNUMA int) Class {
	if nicNUMA >= 0 && nicNUMA == n {
		return NODE
	}
	return SYS
}
