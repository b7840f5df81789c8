package topo

import (
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"

	"github.com/Mellanox/rdmamap"
)

// Options select the NICs that enter the matrix.
type Options struct {
	// IncludeInactive keeps NICs without a usable port (ACTIVE with a
	// non-empty GID table). Mooncake drops them.
	IncludeInactive bool
	// Filters, when not empty, keeps only the NICs named (MC_TE_FILTERS).
	Filters []string
}

// Topology is what discovery found and what it decided, with the reasons.
type Topology struct {
	Root      string     `json:"-"`
	NUMANodes []int      `json:"numa_nodes"`
	NICs      []NIC      `json:"nics"`
	GPUs      []GPU      `json:"gpus"`
	Locations []Location `json:"locations"`
	// Notes explain fallbacks taken and NICs left out, one sentence each.
	Notes []string `json:"notes"`
}

// NIC is one RDMA device.
type NIC struct {
	Name       string `json:"name"`
	PCIAddress string `json:"pci_address"` // "" when the device has no PCI function
	NUMANode   int    `json:"numa_node"`   // -1 when unknown
	PCIPath    string `json:"pci_path"`    // realpath of its device dir inside the root
	Ports      []Port `json:"ports"`
	// Used says whether the NIC enters the matrix; UnusedReason says why not.
	Used         bool   `json:"used"`
	UnusedReason string `json:"unused_reason"`

	loc   pciLoc
	locOK bool
}

// Port is one port of a NIC, as sysfs reports it.
type Port struct {
	Port      int    `json:"port"`
	State     string `json:"state"`      // "ACTIVE", "DOWN", ...
	PhysState string `json:"phys_state"` // "LinkUp", "Disabled", ...
	LinkLayer string `json:"link_layer"` // "InfiniBand" or "Ethernet"
	Rate      string `json:"rate"`       // "400 Gb/sec (4X NDR)"
	Netdev    string `json:"netdev"`
	GID       bool   `json:"gid"` // GID 0 is set (not all zeros)
}

// Usable is Mooncake's test for a port it will open: ACTIVE and a GID.
func (p Port) Usable() bool { return p.State == "ACTIVE" && p.GID }

// GPU is an accelerator found by PCI class and vendor.
type GPU struct {
	Key        string `json:"key"` // "cuda:0", "hip:1"
	Vendor     string `json:"vendor"`
	PCIAddress string `json:"pci_address"`
	NUMANode   int    `json:"numa_node"`
	PCIPath    string `json:"pci_path"`

	loc   pciLoc
	locOK bool
}

// Location is one key of the matrix with its relation to every NIC and
// the entry Mooncake will load.
type Location struct {
	Key      string `json:"key"`
	NUMANode int    `json:"numa_node"`
	// Relations holds the class to every discovered NIC, used or not.
	Relations  map[string]Class `json:"relations"`
	Preferred  []string         `json:"preferred"`
	Accessible []string         `json:"accessible"`
	// Why the preferred NICs are preferred.
	Reason string `json:"reason"`
}

// Accelerator vendors and the matrix key prefix their runtime uses.
var gpuVendors = map[uint32]struct{ name, prefix string }{
	0x10de: {"NVIDIA", "cuda"},
	0x1002: {"AMD", "hip"},
}

// isGPUClass: 3D controller (0x0302) and VGA (0x0300), as the spec names;
// also display controller "other" (0x0380), which is how AMD Instinct
// boards enumerate. A BMC's VGA has the class but not the vendor; an
// NVSwitch has the vendor but a bridge class.
func isGPUClass(class uint32) bool {
	switch class >> 8 {
	case 0x0302, 0x0300, 0x0380:
		return true
	}
	return false
}

// Discover reads the NICs, GPUs, NUMA nodes and the PCI tree beneath f and
// computes the relation classes and the priority matrix.
//
// Attribute files that are missing or garbage do not stop discovery: each
// gets a documented fallback (numa_node -> -1, state -> not usable) and a
// note. A missing root or sys/, an unreadable directory listing, or a
// symlink leading outside the root is an error.
func Discover(f FS, o Options) (*Topology, error) {
	if err := checkSys(f); err != nil {
		return nil, err
	}
	t := &Topology{Root: f.root, NUMANodes: []int{}, NICs: []NIC{}, GPUs: []GPU{}, Locations: []Location{}, Notes: []string{}}
	if err := t.readNUMANodes(f); err != nil {
		return nil, err
	}
	if err := t.readNICs(f); err != nil {
		return nil, err
	}
	if err := t.readGPUs(f); err != nil {
		return nil, err
	}
	t.assumeSingleNode()
	t.selectNICs(o)
	t.locate()
	switch {
	case len(t.NICs) == 0:
		t.note("no RDMA devices in /sys/class/infiniband: the matrix is empty")
	case len(t.UsedNICs()) == 0:
		t.note("no RDMA device is in use: the matrix is empty")
	}
	return t, nil
}

func checkSys(f FS) error {
	_, fi, err := f.resolve("sys")
	if err == nil && fi.IsDir() {
		return nil
	}
	_, d, e1 := f.resolve("devices")
	_, c, e2 := f.resolve("class")
	if e1 == nil && e2 == nil && d.IsDir() && c.IsDir() {
		return fmt.Errorf("sysfs root %q has no sys/ directory; it looks like sysfs itself: pass its parent", f.root)
	}
	if err != nil {
		return fmt.Errorf("sysfs root %q: %w", f.root, err)
	}
	return fmt.Errorf("sysfs root %q: sys is not a directory", f.root)
}

func (t *Topology) note(format string, args ...any) {
	t.Notes = append(t.Notes, fmt.Sprintf(format, args...))
}

func (t *Topology) readNUMANodes(f FS) error {
	const dir = "sys/devices/system/node"
	names, err := f.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	for _, n := range names {
		num, ok := strings.CutPrefix(n, "node")
		if !ok {
			continue
		}
		id, err := strconv.Atoi(num)
		if err != nil || id < 0 {
			continue
		}
		if _, fi, err := f.resolve(dir + "/" + n); err != nil || !fi.IsDir() {
			continue
		}
		t.NUMANodes = append(t.NUMANodes, id)
	}
	if len(t.NUMANodes) == 0 {
		t.NUMANodes = []int{0}
		t.note("/%s lists no node<N> (kernel without NUMA?): assuming a single NUMA node 0", dir)
	}
	slices.Sort(t.NUMANodes)
	return nil
}

// nicNames lists RDMA devices. On the host this is rdmamap, as every other
// RDMA tool sees them; under any other root rdmamap cannot look (it
// hard-codes /sys), so the same directory is read through the root.
func nicNames(f FS) ([]string, error) {
	if f.isHost() {
		return rdmamap.GetRdmaDeviceList(), nil
	}
	names, err := f.ReadDir("sys/class/infiniband")
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	return names, err
}

func (t *Topology) readNICs(f FS) error {
	names, err := nicNames(f)
	if err != nil {
		return err
	}
	slices.SortFunc(names, func(a, b string) int { return cmpNatural(a, b) })
	for _, name := range names {
		nic, err := t.readNIC(f, name)
		if err != nil {
			return err
		}
		t.NICs = append(t.NICs, nic)
	}
	return nil
}

func (t *Topology) readNIC(f FS, name string) (NIC, error) {
	base := "sys/class/infiniband/" + name
	nic := NIC{Name: name, NUMANode: -1, Ports: []Port{}}
	dir, err := f.Realpath(base)
	if errors.Is(err, ErrOutsideRoot) {
		return nic, fmt.Errorf("NIC %s: %w", name, err)
	}
	if err != nil {
		t.note("%s: %v: treated as having no usable port", name, err)
		return nic, nil
	}
	dev, _, err := f.resolveAt(dir, "device")
	switch {
	case errors.Is(err, ErrOutsideRoot):
		return nic, fmt.Errorf("NIC %s: %w", name, err)
	case err != nil:
		t.note("%s: no PCI device (%v): it relates to every GPU as SYS", name, err)
	default:
		nic.PCIPath = dev
		nic.loc, nic.locOK = parsePCIPath(dev)
		if nic.locOK {
			nic.PCIAddress = nic.loc.device()
		} else {
			nic.PCIAddress = dev[strings.LastIndexByte(dev, '/')+1:]
			t.note("%s: device %s is not in a PCI tree: it relates to every GPU as SYS", name, dev)
		}
		nic.NUMANode = t.readNUMA(f, name, dev)
	}
	ports, err := f.readDirAt(dir, "ports")
	if err != nil {
		if errors.Is(err, ErrOutsideRoot) {
			return nic, fmt.Errorf("NIC %s: %w", name, err)
		}
		t.note("%s: cannot list ports (%v): treated as having no usable port", name, err)
		return nic, nil
	}
	slices.SortFunc(ports, func(a, b string) int { return cmpNatural(a, b) })
	for _, p := range ports {
		num, err := strconv.Atoi(p)
		if err != nil || num < 1 {
			t.note("%s: ignoring /%s/ports/%s: not a port number", name, base, p)
			continue
		}
		port, err := t.readPort(f, name, dir, "ports/"+p, dev, num)
		if err != nil {
			return nic, err
		}
		nic.Ports = append(nic.Ports, port)
	}
	return nic, nil
}

// readNUMA reads a PCI function's numa_node; -1 means unknown, as the
// kernel itself writes it.
func (t *Topology) readNUMA(f FS, who, dev string) int {
	s, err := f.readText(dev, "numa_node")
	if err != nil {
		t.note("%s: numa_node unreadable (%v): NUMA node unknown (-1)", who, err)
		return -1
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < -1 {
		t.note("%s: numa_node reads %q, not a node number: NUMA node unknown (-1)", who, s)
		return -1
	}
	return n
}

// readPort reads port num of a NIC whose resolved directory is nicDir; rel
// is "ports/<num>".
func (t *Topology) readPort(f FS, nic, nicDir, rel, dev string, num int) (Port, error) {
	p := Port{Port: num}
	// state and phys_state read "4: ACTIVE", "5: LinkUp".
	if s, err := f.readText(nicDir, rel+"/state"); err != nil {
		if errors.Is(err, ErrOutsideRoot) {
			return p, fmt.Errorf("NIC %s port %d: %w", nic, num, err)
		}
		t.note("%s port %d: state unreadable (%v): port not usable", nic, num, err)
	} else if st, ok := stateName(s); ok {
		p.State = st
	} else {
		t.note("%s port %d: state reads %q, want \"<n>: <NAME>\": port not usable", nic, num, s)
	}
	if s, err := f.readText(nicDir, rel+"/phys_state"); err == nil {
		p.PhysState, _ = stateName(s)
	}
	p.LinkLayer, _ = f.readText(nicDir, rel+"/link_layer")
	p.Rate, _ = f.readText(nicDir, rel+"/rate")
	if s, err := f.readText(nicDir, rel+"/gids/0"); err == nil {
		p.GID = gidSet(s)
	}
	p.Netdev = portNetdev(f, nicDir, rel, dev, num)
	return p, nil
}

// stateName takes "4: ACTIVE" to "ACTIVE".
func stateName(s string) (string, bool) {
	code, name, ok := strings.Cut(s, ":")
	if !ok {
		return "", false
	}
	if _, err := strconv.Atoi(strings.TrimSpace(code)); err != nil {
		return "", false
	}
	name = strings.TrimSpace(name)
	return name, name != ""
}

// gidSet reports whether a GID reads as anything but zeros
// ("fe80:0000:...:0001" yes, "0000:...:0000" no, garbage no).
func gidSet(s string) bool {
	groups := strings.Split(s, ":")
	if len(groups) != 8 {
		return false
	}
	set := false
	for _, g := range groups {
		if len(g) != 4 || !isHex(g) {
			return false
		}
		if g != "0000" {
			set = true
		}
	}
	return set
}

// portNetdev finds the network interface of a port: RoCE ports name it in
// gid_attrs/ndevs/0; IPoIB and older kernels leave it to the PCI
// function's net/<if>/dev_port (port - 1).
func portNetdev(f FS, nicDir, rel, dev string, num int) string {
	if s, err := f.readText(nicDir, rel+"/gid_attrs/ndevs/0"); err == nil && s != "" {
		return s
	}
	if dev == "" {
		return ""
	}
	ifs, err := f.readDirAt(dev, "net")
	if err != nil {
		return ""
	}
	for _, ifname := range ifs {
		s, err := f.readText(dev, "net/"+ifname+"/dev_port")
		if err != nil {
			if len(ifs) == 1 && num == 1 {
				return ifname
			}
			continue
		}
		if n, err := strconv.Atoi(s); err == nil && n == num-1 {
			return ifname
		}
	}
	return ""
}

func (t *Topology) readGPUs(f FS) error {
	const dir = "sys/bus/pci/devices"
	names, err := f.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		t.note("/%s is missing: no GPUs can be found", dir)
		return nil
	}
	if err != nil {
		return err
	}
	type found struct {
		addr pciAddr
		gpu  GPU
		vid  uint32
	}
	var gpus []found
	for _, name := range names {
		addr, ok := parsePCIAddr(name)
		if !ok {
			continue
		}
		dev, err := f.Realpath(dir + "/" + name)
		if errors.Is(err, ErrOutsideRoot) {
			return fmt.Errorf("PCI device %s: %w", name, err)
		}
		if err != nil {
			t.note("PCI device %s: %v: skipped", name, err)
			continue
		}
		class, err := readHex(f, dev, "class")
		if err != nil {
			t.note("PCI device %s: %v: skipped", name, err)
			continue
		}
		if !isGPUClass(class) {
			continue
		}
		vid, err := readHex(f, dev, "vendor")
		if err != nil {
			t.note("PCI device %s: %v: skipped", name, err)
			continue
		}
		v, ok := gpuVendors[vid]
		if !ok {
			continue // a BMC's VGA, a server's onboard graphics
		}
		g := GPU{Vendor: v.name, PCIAddress: name, PCIPath: dev}
		g.loc, g.locOK = parsePCIPath(dev)
		g.NUMANode = t.readNUMA(f, name, dev)
		gpus = append(gpus, found{addr: addr, gpu: g, vid: vid})
	}
	// CUDA_DEVICE_ORDER=PCI_BUS_ID numbering, per runtime.
	slices.SortFunc(gpus, func(a, b found) int {
		if a.addr.less(b.addr) {
			return -1
		}
		if b.addr.less(a.addr) {
			return 1
		}
		return 0
	})
	next := map[uint32]int{}
	for _, g := range gpus {
		g.gpu.Key = fmt.Sprintf("%s:%d", gpuVendors[g.vid].prefix, next[g.vid])
		next[g.vid]++
		t.GPUs = append(t.GPUs, g.gpu)
	}
	return nil
}

func readHex(f FS, dir, name string) (uint32, error) {
	s, err := f.readText(dir, name)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseUint(strings.TrimPrefix(s, "0x"), 16, 32)
	if err != nil {
		return 0, fmt.Errorf("%s/%s reads %q, not a hex number", dir, name, s)
	}
	return uint32(v), nil
}

// assumeSingleNode resolves numa_node -1 on a host with one NUMA node:
// there the kernel writes -1 because it has nothing to choose between (VMs,
// firmware without _PXM), and every device is on that node. On a host with
// several nodes -1 stays unknown.
func (t *Topology) assumeSingleNode() {
	if len(t.NUMANodes) != 1 {
		return
	}
	n := t.NUMANodes[0]
	for i := range t.NICs {
		if t.NICs[i].NUMANode == -1 && t.NICs[i].PCIPath != "" {
			t.NICs[i].NUMANode = n
			t.note("%s: numa_node is -1 and the host has one NUMA node: using node %d", t.NICs[i].Name, n)
		}
	}
	for i := range t.GPUs {
		if t.GPUs[i].NUMANode == -1 {
			t.GPUs[i].NUMANode = n
			t.note("%s: numa_node is -1 and the host has one NUMA node: using node %d", t.GPUs[i].Key, n)
		}
	}
}

func (t *Topology) selectNICs(o Options) {
	var filter map[string]bool
	for _, name := range o.Filters {
		if name = strings.TrimSpace(name); name != "" {
			if filter == nil {
				filter = map[string]bool{}
			}
			filter[name] = true
		}
	}
	for i := range t.NICs {
		n := &t.NICs[i]
		if filter != nil && !filter[n.Name] {
			n.UnusedReason = "not in --filter/MC_TE_FILTERS"
			continue
		}
		if !o.IncludeInactive {
			if r := inactiveReason(n.Ports); r != "" {
				n.UnusedReason = r
				continue
			}
		}
		n.Used = true
	}
	if filter != nil {
		var missing []string
		for name := range filter {
			if !slices.ContainsFunc(t.NICs, func(n NIC) bool { return n.Name == name }) {
				missing = append(missing, name)
			}
		}
		slices.SortFunc(missing, cmpNatural)
		for _, name := range missing {
			t.note("filter names %s, which is not an RDMA device here", name)
		}
	}
	for _, n := range t.NICs {
		if !n.Used {
			t.note("%s left out: %s", n.Name, n.UnusedReason)
		}
	}
}

// inactiveReason says why no port of a NIC is usable, or "" if one is.
func inactiveReason(ports []Port) string {
	if len(ports) == 0 {
		return "no ports"
	}
	var parts []string
	for _, p := range ports {
		if p.Usable() {
			return ""
		}
		switch {
		case p.State == "ACTIVE":
			parts = append(parts, fmt.Sprintf("port %d ACTIVE but GID 0 empty", p.Port))
		case p.State == "":
			parts = append(parts, fmt.Sprintf("port %d state unknown", p.Port))
		default:
			parts = append(parts, fmt.Sprintf("port %d %s", p.Port, p.State))
		}
	}
	return "no usable port (" + strings.Join(parts, ", ") + ")"
}

// locate computes the relation of every location to every NIC and the
// matrix entries: Mooncake's algorithm with PCIe classes as the distance.
func (t *Topology) locate() {
	for _, n := range t.NUMANodes {
		l := Location{Key: "cpu:" + strconv.Itoa(n), NUMANode: n, Relations: map[string]Class{}}
		for _, nic := range t.NICs {
			l.Relations[nic.Name] = cpuClass(n, nic.NUMANode)
			if !nic.Used {
				continue
			}
			if nic.NUMANode == n {
				l.Preferred = append(l.Preferred, nic.Name)
			} else {
				l.Accessible = append(l.Accessible, nic.Name)
			}
		}
		if len(l.Preferred) > 0 {
			l.Reason = fmt.Sprintf("NICs on node %d", n)
		} else {
			l.Reason = fmt.Sprintf("no NIC on node %d", n)
		}
		t.Locations = append(t.Locations, l)
	}
	for _, g := range t.GPUs {
		l := Location{Key: g.Key, NUMANode: g.NUMANode, Relations: map[string]Class{}}
		var cands []NIC
		for _, nic := range t.NICs {
			l.Relations[nic.Name] = pciClass(g.loc, nic.loc, g.locOK, nic.locOK, g.NUMANode, nic.NUMANode)
			if nic.Used && g.NUMANode >= 0 && nic.NUMANode == g.NUMANode {
				cands = append(cands, nic)
			}
		}
		scope := fmt.Sprintf("NICs on node %d", g.NUMANode)
		if len(cands) == 0 {
			for _, nic := range t.NICs {
				if nic.Used {
					cands = append(cands, nic)
				}
			}
			if g.NUMANode >= 0 {
				scope = fmt.Sprintf("all NICs (none on node %d)", g.NUMANode)
			} else {
				scope = "all NICs (GPU's NUMA node unknown)"
			}
		}
		best := Class(0)
		for _, nic := range cands {
			if c := l.Relations[nic.Name]; best == 0 || c < best {
				best = c
			}
		}
		for _, nic := range t.NICs {
			if !nic.Used {
				continue
			}
			if best != 0 && l.Relations[nic.Name] == best && slices.ContainsFunc(cands, func(c NIC) bool { return c.Name == nic.Name }) {
				l.Preferred = append(l.Preferred, nic.Name)
			} else {
				l.Accessible = append(l.Accessible, nic.Name)
			}
		}
		if best != 0 {
			l.Reason = fmt.Sprintf("%s, best of %s", best, scope)
		} else {
			l.Reason = "no NIC in use"
		}
		t.Locations = append(t.Locations, l)
	}
	for i := range t.Locations {
		if t.Locations[i].Preferred == nil {
			t.Locations[i].Preferred = []string{}
		}
		if t.Locations[i].Accessible == nil {
			t.Locations[i].Accessible = []string{}
		}
	}
}

// UsedNICs lists the NICs that enter the matrix, in natural name order.
func (t *Topology) UsedNICs() []string {
	var names []string
	for _, n := range t.NICs {
		if n.Used {
			names = append(names, n.Name)
		}
	}
	return names
}

// Matrix is the priority matrix Mooncake loads. With no NIC in use it is
// empty: an entry naming no NIC would only make Mooncake fail later.
func (t *Topology) Matrix() Matrix {
	m := Matrix{}
	if len(t.UsedNICs()) == 0 {
		return m
	}
	for _, l := range t.Locations {
		m[l.Key] = Entry{Preferred: slices.Clone(l.Preferred), Accessible: slices.Clone(l.Accessible)}
	}
	return m
}
