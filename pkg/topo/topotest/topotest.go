// Package topotest unpacks sysfs fixture trees for tests of pkg/topo and
// its commands, the way net/http/httptest serves handlers.
//
// A fixture is a text manifest, one entry a line, paths relative to the
// root the tree is unpacked into:
//
//	# comment
//	d sys/devices/system/node/node0
//	f sys/devices/pci0000:17/0000:17:00.0/numa_node 0
//	f sys/class/infiniband/mlx5_0/ports/1/rate 400 Gb/sec (4X NDR)
//	l sys/bus/pci/devices/0000:17:00.0 ../../../devices/pci0000:17/0000:17:00.0
//
// "f" writes the rest of the line plus a newline, as sysfs attributes read;
// a value in double quotes is a Go string literal written as is (no
// newline added), for garbage and binary content. "l" makes a symlink
// with the target exactly as written (relative, as the kernel makes them).
// Trees are kept as manifests rather than committed directories because
// module zips reject ':' in file names and drop symlinks.
package topotest

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Unpack creates the tree described by manifest under dir.
func Unpack(dir string, manifest io.Reader) error {
	sc := bufio.NewScanner(manifest)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for line := 1; sc.Scan(); line++ {
		text := sc.Text()
		if strings.TrimSpace(text) == "" || strings.HasPrefix(text, "#") {
			continue
		}
		kind, rest, _ := strings.Cut(text, " ")
		path, value, _ := strings.Cut(rest, " ")
		if path == "" || filepath.IsAbs(path) || !filepath.IsLocal(path) {
			return fmt.Errorf("manifest line %d: bad path %q", line, path)
		}
		full := filepath.Join(dir, path)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return fmt.Errorf("manifest line %d: %w", line, err)
		}
		var err error
		switch kind {
		case "d":
			err = os.MkdirAll(full, 0o755)
		case "f":
			content := value + "\n"
			if strings.HasPrefix(value, `"`) {
				if content, err = strconv.Unquote(value); err != nil {
					return fmt.Errorf("manifest line %d: bad quoted value: %w", line, err)
				}
			}
			err = os.WriteFile(full, []byte(content), 0o644)
		case "l":
			if value == "" {
				return fmt.Errorf("manifest line %d: symlink %s without a target", line, path)
			}
			err = os.Symlink(value, full)
		default:
			return fmt.Errorf("manifest line %d: unknown entry kind %q (want d, f or l)", line, kind)
		}
		if err != nil {
			return fmt.Errorf("manifest line %d: %w", line, err)
		}
	}
	return sc.Err()
}

// UnpackFile unpacks the manifest file into a new directory under dir and
// returns that directory.
func UnpackFile(dir, manifest string) (string, error) {
	fh, err := os.Open(manifest)
	if err != nil {
		return "", err
	}
	defer fh.Close()
	root, err := os.MkdirTemp(dir, "sysfs-")
	if err != nil {
		return "", err
	}
	if err := Unpack(root, fh); err != nil {
		return "", fmt.Errorf("%s: %w", manifest, err)
	}
	return root, nil
}

// Tree unpacks a manifest file into a test's temporary directory and
// returns the root to pass to topo.NewFS.
func Tree(t testing.TB, manifest string) string {
	t.Helper()
	root, err := UnpackFile(t.TempDir(), manifest)
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// TreeString is Tree for a manifest held in a string.
func TreeString(t testing.TB, manifest string) string {
	t.Helper()
	root := t.TempDir()
	if err := Unpack(root, strings.NewReader(manifest)); err != nil {
		t.Fatal(err)
	}
	return root
}
