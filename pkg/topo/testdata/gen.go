//go:build ignore

// Command gen writes the sysfs fixture manifests in this directory (format:
// pkg/topo/topotest). The hosts are described here, in code, so a reviewer
// reads topology rather than thousands of files; the manifests are
// committed so a test never depends on running this. From pkg/topo/testdata:
//
//	go run gen.go
//
// TestFixturesMatchGenerator fails when a manifest and this file disagree.
package main

import (
	"flag"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

const (
	intel    = "0x8086"
	broadcom = "0x1000" // PEX PCIe switches
	nvidia   = "0x10de"
	amd      = "0x1002"
	mellanox = "0x15b3"
	aspeed   = "0x1a03"
	samsung  = "0x144d"
	qemu     = "0x1b36"

	hostBridgeClass = "0x060000"
	bridgeClass     = "0x060400" // PCI-to-PCI: root and switch ports
	otherBridge     = "0x068000" // NVSwitch
	gpu3D           = "0x030200"
	vga             = "0x030000"
	displayOther    = "0x038000" // AMD Instinct
	ibClass         = "0x020700"
	ethClass        = "0x020000"
	nvmeClass       = "0x010802"

	zeroGID = "0000:0000:0000:0000:0000:0000:0000:0000"
)

type tree struct {
	name, doc string
	lines     map[string]string
}

func newTree(name, doc string) *tree { return &tree{name: name, doc: doc, lines: map[string]string{}} }

func (t *tree) f(p, v string) { t.lines[p] = "f " + p + " " + v }
func (t *tree) l(p, target string) {
	t.lines[p] = "l " + p + " " + target
}
func (t *tree) d(p string) { t.lines[p] = "d " + p }

func (t *tree) nodes(n int) {
	for i := 0; i < n; i++ {
		t.d(fmt.Sprintf("sys/devices/system/node/node%d", i))
	}
	t.f("sys/devices/system/node/online", fmt.Sprintf("0-%d", n-1))
	if n == 1 {
		t.f("sys/devices/system/node/online", "0")
	}
}

func (t *tree) hostBridge(bus int) string {
	hb := fmt.Sprintf("pci0000:%02x", bus)
	t.d("sys/devices/" + hb)
	return hb
}

// pci adds a PCI function below parent (a path under sys/devices) and its
// /sys/bus/pci/devices link, and returns its path under sys/devices.
func (t *tree) pci(parent string, bus, dev, fn int, class, vendor, device string, numa int) string {
	addr := fmt.Sprintf("0000:%02x:%02x.%x", bus, dev, fn)
	p := parent + "/" + addr
	dir := "sys/devices/" + p
	t.f(dir+"/class", class)
	t.f(dir+"/vendor", vendor)
	t.f(dir+"/device", device)
	t.f(dir+"/numa_node", fmt.Sprint(numa))
	t.l("sys/bus/pci/devices/"+addr, rel("sys/bus/pci/devices", dir))
	return p
}

func rel(from, to string) string {
	r, err := filepath.Rel(from, to)
	if err != nil {
		panic(err)
	}
	return r
}

type port struct {
	state, phys, linkLayer, rate, gid, ndev string
}

var (
	ndr400 = "400 Gb/sec (4X NDR)"
	hdr200 = "200 Gb/sec (4X HDR)"
	edr100 = "100 Gb/sec (4X EDR)"
)

func ibUp(gid string) port {
	return port{"4: ACTIVE", "5: LinkUp", "InfiniBand", ndr400, gid, ""}
}

func roceUp(rate, gid, ndev string) port {
	return port{"4: ACTIVE", "5: LinkUp", "Ethernet", rate, gid, ndev}
}

func down(linkLayer, rate string) port {
	return port{"1: DOWN", "3: Disabled", linkLayer, rate, zeroGID, ""}
}

// ib adds an RDMA device on the PCI function at pciPath, laid out as the
// kernel does: the class link into the PCI tree, device pointing back up.
func (t *tree) ib(pciPath, name string, ports ...port) {
	dir := "sys/devices/" + pciPath + "/infiniband/" + name
	t.l("sys/class/infiniband/"+name, rel("sys/class/infiniband", dir))
	t.l(dir+"/device", "../../../"+path.Base(pciPath))
	t.f(dir+"/node_type", "1: CA")
	for i, p := range ports {
		pd := fmt.Sprintf("%s/ports/%d", dir, i+1)
		t.f(pd+"/state", p.state)
		t.f(pd+"/phys_state", p.phys)
		t.f(pd+"/link_layer", p.linkLayer)
		t.f(pd+"/rate", p.rate)
		t.f(pd+"/gids/0", p.gid)
		if p.ndev != "" {
			t.f(pd+"/gid_attrs/ndevs/0", p.ndev)
		}
	}
}

// netdev adds an interface of a PCI function (IPoIB names its port by
// dev_port, counted from 0).
func (t *tree) netdev(pciPath, ifname string, devPort int) {
	t.f("sys/devices/"+pciPath+"/net/"+ifname+"/dev_port", fmt.Sprint(devPort))
}

func ibGID(n int) string { return fmt.Sprintf("fe80:0000:0000:0000:a088:c203:00%02x:e1f0", n) }

func roceGID(n int) string { return fmt.Sprintf("fe80:0000:0000:0000:0e42:a1ff:fe%02x:5b10", n) }

// dgx is a DGX H100-class host: two sockets; per socket four PCIe
// switches, each carrying one H100 and one 400G InfiniBand NIC (GPU i and
// mlx5_i share switch i); a dual-port storage NIC per socket; the four
// NVSwitches (NVIDIA, but bridges); the BMC's VGA (a display controller,
// but ASPEED). Host bridges pci0000:10 and pci0000:1a share leading
// characters on purpose: distance is by component, not character.
func dgx() *tree {
	t := newTree("dgx-h100", "DGX H100-class host: 2 sockets, 8 GPUs, 8 compute NICs (GPU i shares a PCIe switch with mlx5_i), 2 dual-port storage NICs, NVSwitch bridges, BMC VGA")
	t.nodes(2)

	hb := t.hostBridge(0x00)
	t.pci(hb, 0x00, 0x00, 0, hostBridgeClass, intel, "0x09a2", 0)
	rp := t.pci(hb, 0x00, 0x1c, 0, bridgeClass, intel, "0x1bb8", 0)
	ab := t.pci(rp, 0x01, 0x00, 0, bridgeClass, aspeed, "0x1150", 0)
	t.pci(ab, 0x02, 0x00, 0, vga, aspeed, "0x2000", 0)

	buses := []int{0x10, 0x1a, 0x38, 0x48, 0x97, 0xa8, 0xc2, 0xd2}
	for i, b := range buses {
		numa := i / 4
		hb := t.hostBridge(b)
		rp := t.pci(hb, b, 0x01, 0, bridgeClass, intel, "0x352a", numa)
		up := t.pci(rp, b+1, 0x00, 0, bridgeClass, broadcom, "0xc030", numa)
		dn0 := t.pci(up, b+2, 0x00, 0, bridgeClass, broadcom, "0xc030", numa)
		dn1 := t.pci(up, b+2, 0x01, 0, bridgeClass, broadcom, "0xc030", numa)
		t.pci(dn0, b+3, 0x00, 0, gpu3D, nvidia, "0x2330", numa)
		nic := t.pci(dn1, b+4, 0x00, 0, ibClass, mellanox, "0x1021", numa)
		name := fmt.Sprintf("mlx5_%d", i)
		t.ib(nic, name, ibUp(ibGID(i)))
		t.netdev(nic, fmt.Sprintf("ibp%ds0", b+4), 0)
		if i%4 == 0 {
			dn2 := t.pci(up, b+2, 0x02, 0, bridgeClass, broadcom, "0xc030", numa)
			t.pci(dn2, b+5, 0x00, 0, nvmeClass, samsung, "0xa824", numa)
		}
	}

	// Storage NICs: one dual-port ConnectX-7 (two functions) per socket,
	// RoCE, directly on a root port.
	for s, b := range []int{0x29, 0xb9} {
		hb := t.hostBridge(b)
		rp := t.pci(hb, b, 0x01, 0, bridgeClass, intel, "0x352a", s)
		for fn := 0; fn < 2; fn++ {
			nic := t.pci(rp, b+1, 0x00, fn, ethClass, mellanox, "0x1021", s)
			n := 8 + 2*s + fn
			t.ib(nic, fmt.Sprintf("mlx5_%d", n), roceUp(hdr200, roceGID(n), fmt.Sprintf("enp%ds0f%dnp%d", b+1, fn, fn)))
		}
	}

	// NVSwitches: NVIDIA vendor, bridge class, not GPUs.
	hb = t.hostBridge(0x5b)
	rp = t.pci(hb, 0x5b, 0x01, 0, bridgeClass, intel, "0x352a", 0)
	up := t.pci(rp, 0x5c, 0x00, 0, bridgeClass, broadcom, "0xc030", 0)
	for i := 0; i < 4; i++ {
		dn := t.pci(up, 0x5d, i, 0, bridgeClass, broadcom, "0xc030", 0)
		t.pci(dn, 0x5e+i, 0x00, 0, otherBridge, nvidia, "0x22a3", 0)
	}
	return t
}

// cpu2s is a dual-socket CPU-only host with a dual-port RoCE NIC per
// socket: the example of topology.md.
func cpu2s() *tree {
	t := newTree("cpu-2s-4nic", "dual-socket CPU-only host, 4 RoCE NICs (two dual-port cards, one per socket)")
	t.nodes(2)
	for s, b := range []int{0x17, 0x85} {
		hb := t.hostBridge(b)
		t.pci(hb, b, 0x00, 0, hostBridgeClass, intel, "0x09a2", s)
		rp := t.pci(hb, b, 0x02, 0, bridgeClass, intel, "0x347a", s)
		for fn := 0; fn < 2; fn++ {
			nic := t.pci(rp, b+1, 0x00, fn, ethClass, mellanox, "0x101d", s)
			n := 2*s + fn
			t.ib(nic, fmt.Sprintf("mlx5_%d", n), roceUp(edr100, roceGID(n), fmt.Sprintf("ens%df%dnp%d", 1+s, fn, fn)))
		}
	}
	return t
}

// portDown has two GPU+NIC switch pairs; mlx5_0 is dual-port with port 2
// down (still used: one ACTIVE port is enough), mlx5_1's only port is down
// (left out, so cuda:1 falls back to mlx5_0).
func portDown() *tree {
	t := newTree("port-down", "single socket, 2 GPUs each sharing a switch with a NIC; mlx5_0 port 2 down, mlx5_1's only port down")
	t.nodes(1)
	for i, b := range []int{0x40, 0x50} {
		hb := t.hostBridge(b)
		rp := t.pci(hb, b, 0x01, 0, bridgeClass, intel, "0x352a", 0)
		up := t.pci(rp, b+1, 0x00, 0, bridgeClass, broadcom, "0xc030", 0)
		dn0 := t.pci(up, b+2, 0x00, 0, bridgeClass, broadcom, "0xc030", 0)
		dn1 := t.pci(up, b+2, 0x01, 0, bridgeClass, broadcom, "0xc030", 0)
		t.pci(dn0, b+3, 0x00, 0, gpu3D, nvidia, "0x2330", 0)
		nic := t.pci(dn1, b+4, 0x00, 0, ibClass, mellanox, "0x1021", 0)
		if i == 0 {
			t.ib(nic, "mlx5_0", ibUp(ibGID(0)), down("InfiniBand", "10 Gb/sec (4X SDR)"))
			t.netdev(nic, "ib0", 0)
			t.netdev(nic, "ib1", 1)
		} else {
			t.ib(nic, "mlx5_1", down("InfiniBand", "10 Gb/sec (4X SDR)"))
			t.netdev(nic, "ib2", 0)
		}
	}
	return t
}

// numaUnknown is a VM (one NUMA node; every device's numa_node reads -1)
// with two AMD Instinct GPUs and two RoCE NICs passed through, each on its
// own root port.
func numaUnknown() *tree {
	t := newTree("numa-unknown", "VM with one NUMA node whose devices all read numa_node -1: 2 AMD Instinct GPUs, 2 RoCE NICs, one per root port")
	t.nodes(1)
	hb := t.hostBridge(0x00)
	t.pci(hb, 0x00, 0x00, 0, hostBridgeClass, intel, "0x29c0", -1)
	for i := 0; i < 4; i++ {
		rp := t.pci(hb, 0x00, 0x02, i, bridgeClass, qemu, "0x000c", -1)
		if i%2 == 0 {
			t.pci(rp, i+1, 0x00, 0, displayOther, amd, "0x740f", -1)
			continue
		}
		nic := t.pci(rp, i+1, 0x00, 0, ethClass, mellanox, "0x101e", -1)
		n := i / 2
		t.ib(nic, fmt.Sprintf("mlx5_%d", n), roceUp(hdr200, roceGID(n), fmt.Sprintf("enp%ds0np0", i+1)))
	}
	return t
}

// noNICs has a GPU (VGA class) and the BMC's VGA, and no RDMA at all.
func noNICs() *tree {
	t := newTree("no-nics", "single socket, one NVIDIA GPU (VGA class), a BMC VGA, no RDMA devices")
	t.nodes(1)
	hb := t.hostBridge(0x00)
	t.pci(hb, 0x00, 0x00, 0, hostBridgeClass, intel, "0x09a2", 0)
	rp := t.pci(hb, 0x00, 0x01, 0, bridgeClass, intel, "0x09a4", 0)
	t.pci(rp, 0x01, 0x00, 0, vga, nvidia, "0x26b9", 0)
	rp = t.pci(hb, 0x00, 0x1c, 0, bridgeClass, intel, "0x1bb8", 0)
	ab := t.pci(rp, 0x02, 0x00, 0, bridgeClass, aspeed, "0x1150", 0)
	t.pci(ab, 0x03, 0x00, 0, vga, aspeed, "0x2000", 0)
	return t
}

func (t *tree) write(dir string) error {
	paths := make([]string, 0, len(t.lines))
	for p := range t.lines {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	var b strings.Builder
	fmt.Fprintf(&b, "# %s\n# Generated by gen.go; do not edit. Format: ../topotest.\n", t.doc)
	for _, p := range paths {
		b.WriteString(t.lines[p])
		b.WriteByte('\n')
	}
	return os.WriteFile(filepath.Join(dir, t.name+".sysfs"), []byte(b.String()), 0o644)
}

func main() {
	dir := flag.String("dir", ".", "directory to write the manifests to")
	flag.Parse()
	for _, t := range []*tree{dgx(), cpu2s(), portDown(), numaUnknown(), noNICs()} {
		if err := t.write(*dir); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}
