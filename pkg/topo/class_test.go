package topo

import (
	"slices"
	"testing"
)

func TestNaturalLess(t *testing.T) {
	in := []string{"mlx5_10", "mlx5_2", "mlx5_1", "mlx4_0", "mlx5_0", "ibp1s0", "mlx5_02", "mlx5_", "a"}
	slices.SortFunc(in, cmpNatural)
	want := []string{"a", "ibp1s0", "mlx4_0", "mlx5_", "mlx5_0", "mlx5_1", "mlx5_2", "mlx5_02", "mlx5_10"}
	if !slices.Equal(in, want) {
		t.Errorf("sorted %v, want %v", in, want)
	}
	for _, s := range want {
		if naturalLess(s, s) {
			t.Errorf("naturalLess(%q, %q) is true", s, s)
		}
	}
}

func loc(t *testing.T, p string) pciLoc {
	t.Helper()
	l, ok := parsePCIPath(p)
	if !ok {
		t.Fatalf("parsePCIPath(%q) failed", p)
	}
	return l
}

func TestPCIClass(t *testing.T) {
	const (
		sw   = "/sys/devices/pci0000:17/0000:17:01.0/0000:18:00.0"
		gpu  = sw + "/0000:19:00.0/0000:1a:00.0"
		nicA = sw + "/0000:19:01.0/0000:1b:00.0"                           // same switch
		nicB = sw + "/0000:19:02.0/0000:1c:00.0/0000:1d:00.0/0000:1e:00.0" // a second switch below
		nicC = "/sys/devices/pci0000:17/0000:17:02.0/0000:30:00.0"         // another root port
		nicD = "/sys/devices/pci0000:1a/0000:1a:01.0/0000:1b:00.0"         // another host bridge
		fn0  = "/sys/devices/pci0000:40/0000:40:01.0/0000:41:00.0"         // two functions
		fn1  = "/sys/devices/pci0000:40/0000:40:01.0/0000:41:00.1"         // of one card
		sf   = "/sys/devices/pci0000:17/0000:17:01.0/0000:18:00.0/0000:19:01.0/0000:1b:00.0/mlx5_core.sf.2"
	)
	cases := []struct {
		a, b      string
		numaA, nB int
		want      Class
	}{
		{gpu, nicA, 0, 0, PIX},
		{gpu, nicB, 0, 0, PXB},
		{gpu, nicC, 0, 0, PHB},
		{gpu, nicD, 0, 0, NODE},
		{gpu, nicD, 0, 1, SYS},
		{gpu, nicD, -1, -1, SYS},
		{fn0, fn1, 0, 0, PIX},
		{gpu, sf, 0, 0, PIX},
	}
	for _, c := range cases {
		if got := pciClass(loc(t, c.a), loc(t, c.b), true, true, c.numaA, c.nB); got != c.want {
			t.Errorf("pciClass(%s, %s) = %v, want %v", c.a, c.b, got, c.want)
		}
		if got := pciClass(loc(t, c.b), loc(t, c.a), true, true, c.nB, c.numaA); got != c.want {
			t.Errorf("pciClass is not symmetric for %s, %s", c.a, c.b)
		}
	}
	if l := loc(t, sf); l.device() != "0000:1b:00.0" {
		t.Errorf("SF device = %s", l.device())
	}
	for _, bad := range []string{"/sys/devices/virtual/infiniband/rxe0", "/sys/devices/pci0000:17", "", "/sys/devices/pcixx:17/0000:17:00.0"} {
		if _, ok := parsePCIPath(bad); ok {
			t.Errorf("parsePCIPath(%q) succeeded", bad)
		}
	}
	if got := pciClass(pciLoc{}, loc(t, gpu), false, true, 0, 0); got != NODE {
		t.Errorf("unknown PCI location, same node = %v", got)
	}
}

func TestParsePCIAddr(t *testing.T) {
	a, ok := parsePCIAddr("0000:1a:1f.7")
	if !ok || a != (pciAddr{0, 0x1a, 0x1f, 7}) {
		t.Errorf("got %v %v", a, ok)
	}
	b, ok := parsePCIAddr("10000:01:00.0") // VMD domain
	if !ok || !a.less(b) {
		t.Errorf("VMD: %v %v", b, ok)
	}
	for _, s := range []string{"0000:1a:20.0", "0000:1a:00.8", "0000:1a:00", "000:1a:00.0", "0000:zz:00.0", "pci0000:17"} {
		if _, ok := parsePCIAddr(s); ok {
			t.Errorf("parsePCIAddr(%q) ok", s)
		}
	}
}

func TestClassText(t *testing.T) {
	for c := PIX; c <= SYS; c++ {
		b, err := c.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		var back Class
		if err := back.UnmarshalText(b); err != nil || back != c {
			t.Errorf("%v round trip: %v %v", c, back, err)
		}
	}
	if _, err := Class(0).MarshalText(); err == nil {
		t.Error("Class(0) marshals")
	}
	var c Class
	if err := c.UnmarshalText([]byte("NV12")); err == nil {
		t.Error("NV12 accepted")
	}
}

func FuzzParsePCIPath(f *testing.F) {
	f.Add("/sys/devices/pci0000:17/0000:17:01.0/0000:18:00.0", "/sys/devices/pci0000:17/0000:17:02.0/0000:19:00.0")
	f.Add("/sys/devices/pci0000:10/0000:10:01.0", "/sys/devices/pci0000:1a/0000:1a:01.0/x/0000:1b:00.0")
	f.Add("pci0000:00/0000:00:00.0/../", "//")
	f.Fuzz(func(t *testing.T, a, b string) {
		la, oka := parsePCIPath(a)
		lb, okb := parsePCIPath(b)
		if oka {
			if _, ok := parsePCIAddr(la.device()); !ok {
				t.Fatalf("device %q of %q is not a PCI address", la.device(), a)
			}
		}
		c1 := pciClass(la, lb, oka, okb, 0, 0)
		c2 := pciClass(lb, la, okb, oka, 0, 0)
		if c1 != c2 || c1 < PIX || c1 > SYS {
			t.Fatalf("pciClass(%q, %q) = %v / %v", a, b, c1, c2)
		}
	})
}
