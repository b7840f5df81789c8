package topotest_test

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvcache-ops/mc/pkg/topo"
	"github.com/kvcache-ops/mc/pkg/topo/topotest"
)

// `make fixtures` runs TestFixtureTrees with -fixtures-dir to leave every
// sysfs fixture unpacked there, for trying `mc topo discover --sysfs-root`.
var fixturesDir = flag.String("fixtures-dir", "", "unpack every sysfs fixture of pkg/topo/testdata under this directory")

// Every fixture manifest unpacks into a tree that discovery reads, with
// NICs unless the fixture is the NIC-less host.
func TestFixtureTrees(t *testing.T) {
	manifests, err := filepath.Glob(filepath.Join("..", "testdata", "*.sysfs"))
	if err != nil || len(manifests) == 0 {
		t.Fatalf("no fixture manifests: %v", err)
	}
	out := *fixturesDir
	if out == "" {
		out = t.TempDir()
	}
	for _, m := range manifests {
		name := strings.TrimSuffix(filepath.Base(m), ".sysfs")
		dst := filepath.Join(out, name)
		if err := os.RemoveAll(dst); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(dst, 0o755); err != nil {
			t.Fatal(err)
		}
		fh, err := os.Open(m)
		if err != nil {
			t.Fatal(err)
		}
		err = topotest.Unpack(dst, fh)
		fh.Close()
		if err != nil {
			t.Fatal(err)
		}
		fsys, err := topo.NewFS(dst)
		if err != nil {
			t.Fatal(err)
		}
		tp, err := topo.Discover(fsys, topo.Options{})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if (len(tp.NICs) == 0) != (name == "no-nics") {
			t.Errorf("%s: %d NICs discovered", name, len(tp.NICs))
		}
	}
}
