package providers

import (
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/kvcache-ops/mc/pkg/topo/topotest"
)

func TestOpen(t *testing.T) {
	t.Setenv("MC_SOFT_NICS", "softA:0:16,softB")
	for _, kind := range []string{"soft", "auto", ""} {
		p, err := Open(kind)
		if err != nil {
			t.Fatalf("%q: %v", kind, err)
		}
		// No RDMA hardware here: auto falls back to the soft NICs.
		devs, err := p.Devices()
		if err != nil || len(devs) != 2 || devs[0].Name != "softA" || devs[0].MaxQP != 16 {
			t.Fatalf("%q: %+v %v", kind, devs, err)
		}
		if c, ok := p.(io.Closer); ok {
			c.Close()
		}
	}
	if _, err := Open("verbs"); err == nil {
		t.Fatal("unknown provider accepted")
	}
	t.Setenv("MC_SOFT_NICS", "a:zz")
	for _, kind := range []string{"soft", "auto"} {
		// A failed open is a nil interface, not a nil *soft.Provider in
		// one that a caller's "if p != nil { close }" would call into.
		if p, err := Open(kind); err == nil || p != nil {
			t.Fatalf("%q with bad MC_SOFT_NICS: %#v, %v; want a nil provider and an error", kind, p, err)
		}
	}
}

func TestGIDIndexFromEnv(t *testing.T) {
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == "MC_GID_INDEX" {
				return v
			}
			return ""
		}
	}
	if o, err := ibverbsOptions(env("3")); err != nil || o.GIDIndex != 3 {
		t.Fatalf("MC_GID_INDEX=3: %+v %v", o, err)
	}
	if o, err := ibverbsOptions(env("")); err != nil || o.GIDIndex != 0 {
		t.Fatalf("unset: %+v %v", o, err)
	}
	for _, bad := range []string{"x", "-1", "256"} {
		if _, err := ibverbsOptions(env(bad)); err == nil || !strings.Contains(err.Error(), "MC_GID_INDEX") {
			t.Fatalf("MC_GID_INDEX=%q: %v", bad, err)
		}
	}
	t.Setenv("MC_GID_INDEX", "nope")
	if _, err := Open("soft"); err == nil {
		t.Fatal("Open ignored a malformed MC_GID_INDEX")
	}
}

// Under the default provider a device that is not an RDMA device here is
// an error, not a soft NIC under its name that would report a TCP run as
// RDMA; soft* names and MC_RDMA_PROVIDER=soft ask for the soft NIC on
// purpose (issue 35, item 1).
func TestOpenForRefusesSoftStandIns(t *testing.T) {
	t.Setenv("MC_RDMA_PROVIDER", "")
	t.Setenv("MC_SOFT_NICS", "")
	noNICs := topotest.Tree(t, "../../topo/testdata/no-nics.sysfs")
	fourNICs := topotest.Tree(t, "../../topo/testdata/cpu-2s-4nic.sysfs")
	for _, c := range []struct {
		root    string
		devices []string
		want    []string
	}{
		{noNICs, []string{"mlx5_0"}, []string{`"mlx5_0"`, "not an RDMA device", "/sys/class/infiniband: none", "MC_RDMA_PROVIDER=soft", "soft*"}},
		{fourNICs, []string{"soft0", "mlx5_9"}, []string{`"mlx5_9"`, "mlx5_0, mlx5_1, mlx5_2, mlx5_3", "MC_RDMA_PROVIDER=soft"}},
		// Present, but this build has no ibverbs: still no soft stand-in.
		{fourNICs, []string{"mlx5_0"}, []string{`"mlx5_0" is in /sys/class/infiniband but cannot be used`, "ibverbs", "MC_RDMA_PROVIDER=soft"}},
	} {
		for _, kind := range []string{"", "auto"} {
			p, err := OpenFor(kind, c.devices, c.root)
			if err == nil || p != nil {
				t.Fatalf("%q %v: %v, %v; want an error", kind, c.devices, p, err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q %v: %q lacks %q", kind, c.devices, err, w)
				}
			}
		}
	}
	if _, err := OpenFor("", []string{"mlx5_0"}, noNICs); !errors.Is(err, ErrNoSuchDevice) {
		t.Errorf("want ErrNoSuchDevice, got %v", err)
	}
	open := func(kind string, devices []string) {
		t.Helper()
		p, err := OpenFor(kind, devices, noNICs)
		if err != nil || p.Name() != Soft {
			t.Fatalf("%q %v: %v, %v; want the soft provider", kind, devices, p, err)
		}
		p.(io.Closer).Close()
	}
	open("", []string{"soft0", "soft1"}) // asked for by name
	open("", nil)                        // MC_SOFT_NICS's (default) soft NICs
	open("soft", []string{"mlx5_0"})     // asked for by provider
	t.Setenv("MC_RDMA_PROVIDER", "soft")
	open("", []string{"mlx5_0"})
}
