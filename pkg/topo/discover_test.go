package topo

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvcache-ops/mc/pkg/topo/topotest"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

func discoverFixture(t testing.TB, name string, o Options) *Topology {
	t.Helper()
	root := topotest.Tree(t, filepath.Join("testdata", name+".sysfs"))
	f, err := NewFS(root)
	if err != nil {
		t.Fatal(err)
	}
	top, err := Discover(f, o)
	if err != nil {
		t.Fatalf("Discover(%s): %v", name, err)
	}
	return top
}

func golden(t *testing.T, file string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", file)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./pkg/topo -run TestDiscover -update)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from golden (rerun with -update and review the diff)\ngot:\n%s\nwant:\n%s", file, got, want)
	}
}

// TestDiscover runs discovery on every fixture tree and compares the
// matrix (exactly the --nic_priority_matrix file) and the whole topology
// (classes, ports, reasons, notes) with the golden files.
func TestDiscover(t *testing.T) {
	cases := []struct {
		golden, fixture string
		o               Options
	}{
		{"dgx-h100", "dgx-h100", Options{}},
		{"cpu-2s-4nic", "cpu-2s-4nic", Options{}},
		{"port-down", "port-down", Options{}},
		{"port-down.include-inactive", "port-down", Options{IncludeInactive: true}},
		{"numa-unknown", "numa-unknown", Options{}},
		{"no-nics", "no-nics", Options{}},
	}
	for _, c := range cases {
		t.Run(c.golden, func(t *testing.T) {
			top := discoverFixture(t, c.fixture, c.o)
			m, err := top.Matrix().MarshalFile()
			if err != nil {
				t.Fatal(err)
			}
			golden(t, c.golden+".matrix.golden", m)
			tj, err := json.MarshalIndent(top, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			golden(t, c.golden+".topology.golden", append(tj, '\n'))

			// The file must load back to the same matrix.
			back, err := ParseMatrix(m)
			if err != nil {
				t.Fatalf("golden matrix does not parse: %v", err)
			}
			if !matrixEqual(back, top.Matrix()) {
				t.Errorf("matrix round trip changed it: %v vs %v", back, top.Matrix())
			}
		})
	}
}

func matrixEqual(a, b Matrix) bool {
	if len(a) != len(b) {
		return false
	}
	for k, ea := range a {
		eb, ok := b[k]
		if !ok || !slices.Equal(ea.Preferred, eb.Preferred) || !slices.Equal(ea.Accessible, eb.Accessible) {
			return false
		}
	}
	return true
}

func location(t *testing.T, top *Topology, key string) Location {
	t.Helper()
	for _, l := range top.Locations {
		if l.Key == key {
			return l
		}
	}
	t.Fatalf("no location %s", key)
	return Location{}
}

// The DGX facts the issue names, asserted directly so a wrong golden
// cannot be blessed by -update unnoticed.
func TestDiscoverDGXFacts(t *testing.T) {
	top := discoverFixture(t, "dgx-h100", Options{})
	if !slices.Equal(top.NUMANodes, []int{0, 1}) {
		t.Errorf("numa nodes = %v", top.NUMANodes)
	}
	var keys, addrs []string
	for _, g := range top.GPUs {
		keys = append(keys, g.Key)
		addrs = append(addrs, g.PCIAddress)
		if g.Vendor != "NVIDIA" {
			t.Errorf("%s vendor %s", g.Key, g.Vendor)
		}
	}
	// 8 GPUs in bus order; the ASPEED VGA and the 4 NVSwitches are not GPUs.
	wantAddrs := []string{"0000:13:00.0", "0000:1d:00.0", "0000:3b:00.0", "0000:4b:00.0", "0000:9a:00.0", "0000:ab:00.0", "0000:c5:00.0", "0000:d5:00.0"}
	if !slices.Equal(addrs, wantAddrs) {
		t.Errorf("GPU addresses = %v, want %v", addrs, wantAddrs)
	}
	if keys[0] != "cuda:0" || keys[7] != "cuda:7" {
		t.Errorf("GPU keys = %v", keys)
	}
	wantNICs := []string{"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9", "mlx5_10", "mlx5_11"}
	if got := top.UsedNICs(); !slices.Equal(got, wantNICs) {
		t.Errorf("used NICs = %v, want natural order %v", got, wantNICs)
	}
	for i := 0; i < 8; i++ {
		l := location(t, top, "cuda:"+string(rune('0'+i)))
		nic := "mlx5_" + string(rune('0'+i))
		if l.Relations[nic] != PIX {
			t.Errorf("%s-%s = %v, want PIX", l.Key, nic, l.Relations[nic])
		}
		if !slices.Equal(l.Preferred, []string{nic}) {
			t.Errorf("%s preferred %v, want [%s]", l.Key, l.Preferred, nic)
		}
		if len(l.Accessible) != 11 {
			t.Errorf("%s accessible %v, want the 11 others", l.Key, l.Accessible)
		}
	}
	c0 := location(t, top, "cuda:0")
	// pci0000:10 vs pci0000:1a: same leading characters, different host
	// bridges, same socket.
	if c0.Relations["mlx5_1"] != NODE || c0.Relations["mlx5_4"] != SYS || c0.Relations["mlx5_8"] != NODE {
		t.Errorf("cuda:0 relations = %v", c0.Relations)
	}
	cpu1 := location(t, top, "cpu:1")
	if want := []string{"mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_10", "mlx5_11"}; !slices.Equal(cpu1.Preferred, want) {
		t.Errorf("cpu:1 preferred %v, want %v", cpu1.Preferred, want)
	}
	n := top.NICs[0]
	if n.PCIAddress != "0000:14:00.0" || n.NUMANode != 0 || len(n.Ports) != 1 {
		t.Fatalf("mlx5_0 = %+v", n)
	}
	p := n.Ports[0]
	if p.State != "ACTIVE" || p.LinkLayer != "InfiniBand" || p.Rate != "400 Gb/sec (4X NDR)" || p.Netdev != "ibp20s0" || !p.GID {
		t.Errorf("mlx5_0 port 1 = %+v", p)
	}
	if got := top.NICs[8].Ports[0].Netdev; got != "enp42s0f0np0" {
		t.Errorf("mlx5_8 netdev (RoCE, gid_attrs) = %q", got)
	}
}

func TestDiscoverFilter(t *testing.T) {
	top := discoverFixture(t, "dgx-h100", Options{Filters: []string{"mlx5_0", " mlx5_5", "mlx5_99", ""}})
	if got := top.UsedNICs(); !slices.Equal(got, []string{"mlx5_0", "mlx5_5"}) {
		t.Fatalf("used = %v", got)
	}
	m := top.Matrix()
	if e := m["cuda:1"]; !slices.Equal(e.Preferred, []string{"mlx5_0"}) || !slices.Equal(e.Accessible, []string{"mlx5_5"}) {
		t.Errorf("cuda:1 = %+v: the same-node NIC at the best class should be preferred", e)
	}
	if e := m["cuda:5"]; !slices.Equal(e.Preferred, []string{"mlx5_5"}) {
		t.Errorf("cuda:5 = %+v", e)
	}
	if !slices.ContainsFunc(top.Notes, func(s string) bool { return strings.Contains(s, "mlx5_99") }) {
		t.Errorf("no note about the unknown filter name: %v", top.Notes)
	}
}

func TestDiscoverPortDown(t *testing.T) {
	top := discoverFixture(t, "port-down", Options{})
	if got := top.UsedNICs(); !slices.Equal(got, []string{"mlx5_0"}) {
		t.Fatalf("used = %v: a NIC with one ACTIVE port counts, one with none does not", got)
	}
	if r := top.NICs[1].UnusedReason; !strings.Contains(r, "port 1 DOWN") {
		t.Errorf("mlx5_1 reason %q", r)
	}
	if e := top.Matrix()["cuda:1"]; !slices.Equal(e.Preferred, []string{"mlx5_0"}) {
		t.Errorf("cuda:1 = %+v", e)
	}
	if got := top.NICs[0].Ports[1]; got.State != "DOWN" || got.PhysState != "Disabled" || got.Netdev != "ib1" {
		t.Errorf("mlx5_0 port 2 = %+v", got)
	}
	all := discoverFixture(t, "port-down", Options{IncludeInactive: true})
	if e := all.Matrix()["cuda:1"]; !slices.Equal(e.Preferred, []string{"mlx5_1"}) || !slices.Equal(e.Accessible, []string{"mlx5_0"}) {
		t.Errorf("with IncludeInactive cuda:1 = %+v", e)
	}
}

func TestDiscoverNUMAUnknown(t *testing.T) {
	top := discoverFixture(t, "numa-unknown", Options{})
	m := top.Matrix()
	// One NUMA node: -1 means node 0. Each GPU has its own root port, so
	// both NICs are PHB and both are preferred (ties are kept).
	for _, k := range []string{"cpu:0", "hip:0", "hip:1"} {
		if e := m[k]; !slices.Equal(e.Preferred, []string{"mlx5_0", "mlx5_1"}) || len(e.Accessible) != 0 {
			t.Errorf("%s = %+v", k, e)
		}
	}
	if len(top.GPUs) != 2 || top.GPUs[0].Vendor != "AMD" {
		t.Errorf("GPUs = %+v", top.GPUs)
	}
	if c := location(t, top, "hip:0").Relations["mlx5_0"]; c != PHB {
		t.Errorf("hip:0-mlx5_0 = %v", c)
	}
}

func TestDiscoverNoNICs(t *testing.T) {
	top := discoverFixture(t, "no-nics", Options{})
	if len(top.Matrix()) != 0 || top.Matrix() == nil {
		t.Errorf("matrix = %#v, want empty and non-nil", top.Matrix())
	}
	if len(top.GPUs) != 1 || top.GPUs[0].Key != "cuda:0" || top.GPUs[0].PCIAddress != "0000:01:00.0" {
		t.Errorf("GPUs = %+v (the NVIDIA VGA is a GPU, the ASPEED one is not)", top.GPUs)
	}
}

// A host with two NUMA nodes and a NIC whose numa_node is -1: no CPU
// prefers it, and a GPU on a known node whose only same-node NIC is down
// considers every NIC.
func TestDiscoverMultiNodeUnknownNUMA(t *testing.T) {
	root := topotest.TreeString(t, `
d sys/devices/system/node/node0
d sys/devices/system/node/node1
f sys/devices/pci0000:10/0000:10:01.0/class 0x060400
f sys/devices/pci0000:10/0000:10:01.0/0000:11:00.0/class 0x030200
f sys/devices/pci0000:10/0000:10:01.0/0000:11:00.0/vendor 0x10de
f sys/devices/pci0000:10/0000:10:01.0/0000:11:00.0/numa_node 1
l sys/bus/pci/devices/0000:11:00.0 ../../../devices/pci0000:10/0000:10:01.0/0000:11:00.0
f sys/devices/pci0000:10/0000:10:02.0/0000:12:00.0/numa_node -1
l sys/devices/pci0000:10/0000:10:02.0/0000:12:00.0/infiniband/mlx5_0/device ../../../0000:12:00.0
f sys/devices/pci0000:10/0000:10:02.0/0000:12:00.0/infiniband/mlx5_0/ports/1/state 4: ACTIVE
f sys/devices/pci0000:10/0000:10:02.0/0000:12:00.0/infiniband/mlx5_0/ports/1/gids/0 fe80:0000:0000:0000:0000:0000:0000:0001
l sys/class/infiniband/mlx5_0 ../../devices/pci0000:10/0000:10:02.0/0000:12:00.0/infiniband/mlx5_0
f sys/devices/pci0000:20/0000:20:01.0/0000:21:00.0/numa_node 0
l sys/devices/pci0000:20/0000:20:01.0/0000:21:00.0/infiniband/mlx5_1/device ../../../0000:21:00.0
f sys/devices/pci0000:20/0000:20:01.0/0000:21:00.0/infiniband/mlx5_1/ports/1/state 4: ACTIVE
f sys/devices/pci0000:20/0000:20:01.0/0000:21:00.0/infiniband/mlx5_1/ports/1/gids/0 fe80:0000:0000:0000:0000:0000:0000:0002
l sys/class/infiniband/mlx5_1 ../../devices/pci0000:20/0000:20:01.0/0000:21:00.0/infiniband/mlx5_1
`)
	f, err := NewFS(root)
	if err != nil {
		t.Fatal(err)
	}
	top, err := Discover(f, Options{})
	if err != nil {
		t.Fatal(err)
	}
	m := top.Matrix()
	if e := m["cpu:0"]; !slices.Equal(e.Preferred, []string{"mlx5_1"}) || !slices.Equal(e.Accessible, []string{"mlx5_0"}) {
		t.Errorf("cpu:0 = %+v", e)
	}
	if e := m["cpu:1"]; len(e.Preferred) != 0 || len(e.Accessible) != 2 {
		t.Errorf("cpu:1 = %+v: a NIC of unknown node is preferred by no CPU", e)
	}
	// cuda:0 is on node 1, no NIC is: all NICs are candidates; mlx5_0
	// shares its host bridge (PHB), mlx5_1 does not (SYS, nodes differ).
	l := location(t, top, "cuda:0")
	if l.Relations["mlx5_0"] != PHB || l.Relations["mlx5_1"] != SYS {
		t.Errorf("relations = %v", l.Relations)
	}
	if !slices.Equal(l.Preferred, []string{"mlx5_0"}) || !strings.Contains(l.Reason, "none on node 1") {
		t.Errorf("cuda:0 = %+v", l)
	}
	if top.NICs[0].Ports[0].LinkLayer != "" || top.NICs[0].Ports[0].Netdev != "" {
		t.Errorf("missing optional attributes should read empty: %+v", top.NICs[0].Ports[0])
	}
}

func TestDiscoverBadInput(t *testing.T) {
	base := `
d sys/devices/system/node/node0
f sys/devices/pci0000:10/0000:10:01.0/0000:11:00.0/numa_node 0
l sys/devices/pci0000:10/0000:10:01.0/0000:11:00.0/infiniband/mlx5_0/device ../../../0000:11:00.0
l sys/class/infiniband/mlx5_0 ../../devices/pci0000:10/0000:10:01.0/0000:11:00.0/infiniband/mlx5_0
f sys/devices/pci0000:10/0000:10:01.0/0000:11:00.0/infiniband/mlx5_0/ports/1/gids/0 fe80:0000:0000:0000:0000:0000:0000:0001
`
	dev := "sys/devices/pci0000:10/0000:10:01.0/0000:11:00.0"
	port := dev + "/infiniband/mlx5_0/ports/1"
	cases := []struct {
		name     string
		manifest string
		wantErr  string // "" means discovery succeeds
		check    func(t *testing.T, top *Topology)
	}{
		{
			name:     "garbage state",
			manifest: base + "f " + port + "/state \"\\x00\\xff\\x01garbage\"\n",
			check: func(t *testing.T, top *Topology) {
				if top.NICs[0].Used || !hasNote(top, "state unreadable") {
					t.Errorf("NIC used=%v notes=%v", top.NICs[0].Used, top.Notes)
				}
			},
		},
		{
			name:     "state without code",
			manifest: base + "f " + port + "/state ACTIVE\n",
			check: func(t *testing.T, top *Topology) {
				if top.NICs[0].Used || !hasNote(top, `state reads "ACTIVE"`) {
					t.Errorf("NIC used=%v notes=%v", top.NICs[0].Used, top.Notes)
				}
			},
		},
		{
			name:     "garbage numa_node",
			manifest: strings.Replace(base, "numa_node 0", "numa_node zero", 1) + "f " + port + "/state 4: ACTIVE\n",
			check: func(t *testing.T, top *Topology) {
				// Falls back to unknown, then to the only node.
				if top.NICs[0].NUMANode != 0 || !hasNote(top, `numa_node reads "zero"`) || !hasNote(top, "one NUMA node") {
					t.Errorf("numa=%d notes=%v", top.NICs[0].NUMANode, top.Notes)
				}
			},
		},
		{
			name:     "ACTIVE with empty GID",
			manifest: strings.Replace(base, "fe80:0000:0000:0000:0000:0000:0000:0001", zeroGIDForTest, 1) + "f " + port + "/state 4: ACTIVE\n",
			check: func(t *testing.T, top *Topology) {
				if top.NICs[0].Used || !strings.Contains(top.NICs[0].UnusedReason, "GID 0 empty") {
					t.Errorf("NIC = %+v", top.NICs[0])
				}
			},
		},
		{
			name:     "dangling device link",
			manifest: strings.Replace(base, "f "+dev+"/numa_node 0\n", "", 1) + "f " + port + "/state 4: ACTIVE\n" + "d " + dev + "/infiniband/mlx5_0/ports\n",
			check: func(t *testing.T, top *Topology) {
				// The device dir exists (ports live under it) but has no
				// numa_node: unknown, then the single node.
				if !top.NICs[0].Used || top.NICs[0].NUMANode != 0 {
					t.Errorf("NIC = %+v notes %v", top.NICs[0], top.Notes)
				}
			},
		},
		{
			name:     "link escaping the root",
			manifest: "d sys/devices/system/node/node0\nl sys/class/infiniband/evil ../../../..\n",
			wantErr:  "outside the sysfs root",
		},
		{
			name:     "device link escaping the root",
			manifest: "d sys/devices/system/node/node0\nd sys/class/infiniband/mlx5_0/ports\nl sys/class/infiniband/mlx5_0/device ../../../../../etc\n",
			wantErr:  "outside the sysfs root",
		},
		{
			name:     "link loop",
			manifest: "d sys/devices/system/node/node0\nl sys/class/infiniband/mlx5_0/device ../mlx5_0/device\nd sys/class/infiniband/mlx5_0/ports\n",
			check: func(t *testing.T, top *Topology) {
				if !hasNote(top, "too many levels of symbolic links") {
					t.Errorf("notes = %v", top.Notes)
				}
			},
		},
		{
			name:     "infiniband is a file",
			manifest: "d sys/devices/system/node/node0\nf sys/class/infiniband x\n",
			wantErr:  "not a directory",
		},
		{
			name:     "huge attribute",
			manifest: base + "f " + port + "/state " + strings.Repeat("x", maxAttr+10) + "\n",
			check: func(t *testing.T, top *Topology) {
				if top.NICs[0].Used || !hasNote(top, "not a sysfs attribute") {
					t.Errorf("notes = %v", top.Notes)
				}
			},
		},
		{
			name:     "no node directory",
			manifest: "d sys/class\n",
			check: func(t *testing.T, top *Topology) {
				if !slices.Equal(top.NUMANodes, []int{0}) || !hasNote(top, "assuming a single NUMA node 0") {
					t.Errorf("nodes %v notes %v", top.NUMANodes, top.Notes)
				}
			},
		},
		{
			name:     "garbage PCI class",
			manifest: "d sys/devices/system/node/node0\nf sys/devices/pci0000:00/0000:00:01.0/class banana\nl sys/bus/pci/devices/0000:00:01.0 ../../../devices/pci0000:00/0000:00:01.0\n",
			check: func(t *testing.T, top *Topology) {
				if len(top.GPUs) != 0 || !hasNote(top, `"banana", not a hex number`) {
					t.Errorf("GPUs %v notes %v", top.GPUs, top.Notes)
				}
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			root := topotest.TreeString(t, c.manifest)
			f, err := NewFS(root)
			if err != nil {
				t.Fatal(err)
			}
			top, err := Discover(f, Options{})
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err = %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			c.check(t, top)
		})
	}
}

func hasNote(top *Topology, sub string) bool {
	return slices.ContainsFunc(top.Notes, func(n string) bool { return strings.Contains(n, sub) })
}

func TestNewFSErrors(t *testing.T) {
	if _, err := NewFS(filepath.Join(t.TempDir(), "missing")); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("missing root: err = %v", err)
	}
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := NewFS(file); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("file root: err = %v", err)
	}
	// A root without sys/ is an error; one that looks like sysfs itself
	// gets a hint.
	f, err := NewFS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Discover(f, Options{}); err == nil || !strings.Contains(err.Error(), "sys") {
		t.Errorf("empty root: err = %v", err)
	}
	sysfs := topotest.TreeString(t, "d class/net\nd devices/system\n")
	f, _ = NewFS(sysfs)
	if _, err := Discover(f, Options{}); err == nil || !strings.Contains(err.Error(), "pass its parent") {
		t.Errorf("sysfs as root: err = %v", err)
	}
}

func TestRealpath(t *testing.T) {
	root := topotest.TreeString(t, `
d a/b/c
l a/up ../a/b
l a/abs /a/b/c
l a/out ../../x
l a/chain a/up
l link-to-file a/b/c/file
f a/b/c/file hello
`)
	f, err := NewFS(root)
	if err != nil {
		t.Fatal(err)
	}
	for in, want := range map[string]string{
		"a/up/c":               "/a/b/c",
		"a/abs":                "/a/b/c", // absolute links resolve inside the root
		"/a/up/../up/./c/":     "/a/b/c",
		"a/b/c/../../b/c/file": "/a/b/c/file",
		"link-to-file":         "/a/b/c/file",
		".":                    "/",
	} {
		got, err := f.Realpath(in)
		if err != nil || got != want {
			t.Errorf("Realpath(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := f.Realpath("a/out"); !errors.Is(err, ErrOutsideRoot) {
		t.Errorf("escaping link: err = %v", err)
	}
	if _, err := f.Realpath("../etc"); !errors.Is(err, ErrOutsideRoot) {
		t.Errorf("../etc: err = %v", err)
	}
	if _, err := f.Realpath("link-to-file/x"); err == nil {
		t.Error("a file used as a directory resolved")
	}
	if s, err := f.ReadFile("a/up/c/file"); err != nil || s != "hello" {
		t.Errorf("ReadFile = %q, %v", s, err)
	}
	if _, err := f.ReadFile("a/b"); err == nil {
		t.Error("ReadFile of a directory succeeded")
	}
}

// On the real host the NIC list comes from rdmamap; it must agree with
// what the root-injected reader sees in the same directory.
func TestDiscoverHostAgreesWithFS(t *testing.T) {
	f, err := NewFS("/")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("/sys/devices"); err != nil {
		t.Fatalf("this test needs a Linux host with sysfs: %v", err)
	}
	top, err := Discover(f, Options{IncludeInactive: true})
	if err != nil {
		t.Fatal(err)
	}
	want, err := f.ReadDir("sys/class/infiniband")
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var got []string
	for _, n := range top.NICs {
		got = append(got, n.Name)
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("host NICs via rdmamap %v, via sysfs %v", got, want)
	}
}

func BenchmarkDiscoverDGX(b *testing.B) {
	root := topotest.Tree(b, filepath.Join("testdata", "dgx-h100.sysfs"))
	f, err := NewFS(root)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		top, err := Discover(f, Options{})
		if err != nil {
			b.Fatal(err)
		}
		if len(top.Matrix()) != 10 {
			b.Fatal("wrong matrix")
		}
	}
}

const zeroGIDForTest = "0000:0000:0000:0000:0000:0000:0000:0000"

// FuzzDiscoverAttributes feeds arbitrary bytes into the attribute files
// discovery parses: it must never fail or panic on them, only note them.
func FuzzDiscoverAttributes(f *testing.F) {
	f.Add([]byte("0\n"), []byte("4: ACTIVE\n"), []byte("0x030200\n"), []byte("fe80:0000:0000:0000:0000:0000:0000:0001\n"))
	f.Add([]byte("-1"), []byte("1: DOWN"), []byte("0x10de"), []byte(zeroGIDForTest))
	f.Add([]byte("\xff\x00"), []byte(":"), []byte("0x"), []byte(""))
	dir := f.TempDir()
	root := filepath.Join(dir, "root")
	manifest := `
d sys/devices/system/node/node0
d sys/devices/system/node/node1
f sys/devices/pci0000:10/0000:10:01.0/0000:11:00.0/vendor 0x10de
l sys/bus/pci/devices/0000:11:00.0 ../../../devices/pci0000:10/0000:10:01.0/0000:11:00.0
l sys/devices/pci0000:10/0000:10:01.0/0000:12:00.0/infiniband/mlx5_0/device ../../../0000:12:00.0
l sys/class/infiniband/mlx5_0 ../../devices/pci0000:10/0000:10:01.0/0000:12:00.0/infiniband/mlx5_0
`
	if err := topotest.Unpack(root, strings.NewReader(manifest)); err != nil {
		f.Fatal(err)
	}
	gpu := filepath.Join(root, "sys/devices/pci0000:10/0000:10:01.0/0000:11:00.0")
	nic := filepath.Join(root, "sys/devices/pci0000:10/0000:10:01.0/0000:12:00.0")
	port := filepath.Join(nic, "infiniband/mlx5_0/ports/1")
	if err := os.MkdirAll(filepath.Join(port, "gids"), 0o755); err != nil {
		f.Fatal(err)
	}
	fsys, err := NewFS(root)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, numa, state, class, gid []byte) {
		for p, b := range map[string][]byte{
			filepath.Join(nic, "numa_node"):   numa,
			filepath.Join(gpu, "numa_node"):   numa,
			filepath.Join(port, "state"):      state,
			filepath.Join(port, "link_layer"): state,
			filepath.Join(gpu, "class"):       class,
			filepath.Join(port, "gids/0"):     gid,
		} {
			if err := os.WriteFile(p, b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		top, err := Discover(fsys, Options{})
		if err != nil {
			t.Fatalf("Discover: %v", err)
		}
		if len(top.NICs) != 1 {
			t.Fatalf("NICs = %v", top.NICs)
		}
		if _, err := top.Matrix().MarshalFile(); err != nil {
			t.Fatal(err)
		}
		if _, err := json.Marshal(top); err != nil {
			t.Fatal(err)
		}
	})
}

var fixtures = []string{"dgx-h100", "cpu-2s-4nic", "port-down", "numa-unknown", "no-nics"}

// The committed manifests are what gen.go writes, and every symlink in
// them is relative, as the kernel makes them.
func TestFixturesMatchGenerator(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go toolchain not on PATH: %v", err)
	}
	dir := t.TempDir()
	cmd := exec.Command(goBin, "run", "gen.go", "-dir", dir)
	cmd.Dir = "testdata"
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go run gen.go: %v\n%s", err, out)
	}
	for _, name := range fixtures {
		want, err := os.ReadFile(filepath.Join(dir, name+".sysfs"))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join("testdata", name+".sysfs"))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("testdata/%s.sysfs differs from gen.go's output: regenerate with: cd pkg/topo/testdata && go run gen.go", name)
		}
		for i, line := range strings.Split(string(got), "\n") {
			if f := strings.Fields(line); len(f) == 3 && f[0] == "l" && strings.HasPrefix(f[2], "/") {
				t.Errorf("%s.sysfs:%d: absolute symlink %s", name, i+1, line)
			}
		}
	}
}
