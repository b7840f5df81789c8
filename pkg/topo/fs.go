package topo

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"unicode"
	"unicode/utf8"
)

// ErrOutsideRoot is returned (wrapped) when a symlink under the root points
// above it. Fixture trees and chroots must never make discovery read the
// host's own /sys.
var ErrOutsideRoot = errors.New("symlink leads outside the sysfs root")

// maxLinks bounds symlink expansion the way the kernel's ELOOP does, so a
// link cycle in a broken tree ends with an error instead of a hang.
const maxLinks = 40

// maxAttr bounds one attribute read. sysfs attributes are at most a page;
// anything larger is not sysfs.
const maxAttr = 64 << 10

// FS reads sysfs facts beneath a root directory: "/" on a host, a fixture
// tree in tests, a container's view of the host elsewhere (the
// node_exporter --path.sysfs model). Every path it takes is relative to the
// root ("sys/class/infiniband"); symlinks are resolved inside the root.
// An FS is a value and safe for concurrent use.
type FS struct {
	root string // absolute and clean
}

// NewFS returns an FS rooted at root ("" means "/"). The root is the
// directory that contains sys/, not the sysfs mount itself.
func NewFS(root string) (FS, error) {
	if root == "" {
		root = "/"
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		return FS{}, fmt.Errorf("sysfs root %q: %w", root, err)
	}
	fi, err := os.Stat(abs)
	if err != nil {
		return FS{}, fmt.Errorf("sysfs root %q: %w", root, err)
	}
	if !fi.IsDir() {
		return FS{}, fmt.Errorf("sysfs root %q: not a directory", root)
	}
	return FS{root: filepath.Clean(abs)}, nil
}

// Root is the directory the FS reads beneath.
func (f FS) Root() string { return f.root }

// isHost reports whether f reads the running host's own /sys.
func (f FS) isHost() bool { return f.root == "/" }

// host turns a resolved root-relative path ("/sys/devices/...") into a
// path the OS can open.
func (f FS) host(p string) string {
	if f.root == "/" {
		return p
	}
	return f.root + p
}

// Realpath resolves every symlink in name, treating the FS root as "/", and
// returns the result as an absolute path inside the root
// ("/sys/devices/pci0000:17/0000:17:00.0/..."). A relative link that climbs
// above the root is ErrOutsideRoot; an absolute link is taken relative to
// the root, as in a chroot, so neither ever reaches the host's files.
func (f FS) Realpath(name string) (string, error) {
	p, _, err := f.resolve(name)
	return p, err
}

func (f FS) resolve(name string) (string, fs.FileInfo, error) {
	return f.resolveAt("", name)
}

// resolveAt resolves name relative to base, a path Realpath returned:
// base holds no symlinks, so only name's components need checking. Reading
// a device's attributes this way is what keeps discovery of a large host
// in the low milliseconds.
func (f FS) resolveAt(base, name string) (string, fs.FileInfo, error) {
	if base == "/" {
		base = ""
	}
	todo := name
	cur := base // resolved so far, "" for the root, else "/a/b"
	if base != "" {
		name = base + "/" + name
	}
	var last fs.FileInfo
	links := 0
	for todo != "" {
		var c string
		todo = strings.TrimLeft(todo, "/")
		if i := strings.IndexByte(todo, '/'); i >= 0 {
			c, todo = todo[:i], todo[i+1:]
		} else {
			c, todo = todo, ""
		}
		switch c {
		case "", ".":
			continue
		case "..":
			if cur == "" {
				return "", nil, fmt.Errorf("resolve %s: %w", name, ErrOutsideRoot)
			}
			cur = cur[:strings.LastIndexByte(cur, '/')]
			last = nil
			continue
		}
		next := cur + "/" + c
		fi, err := os.Lstat(f.host(next))
		if err != nil {
			return "", nil, fmt.Errorf("resolve %s: %w", name, err)
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			if todo != "" && !fi.IsDir() {
				return "", nil, fmt.Errorf("resolve %s: %s is not a directory", name, next)
			}
			cur, last = next, fi
			continue
		}
		links++
		if links > maxLinks {
			return "", nil, fmt.Errorf("resolve %s: too many levels of symbolic links", name)
		}
		target, err := os.Readlink(f.host(next))
		if err != nil {
			return "", nil, fmt.Errorf("resolve %s: %w", name, err)
		}
		if strings.HasPrefix(target, "/") {
			cur = ""
		}
		if todo == "" {
			todo = target
		} else {
			todo = target + "/" + todo
		}
		last = nil
	}
	if last == nil {
		fi, err := os.Lstat(f.host(cur + "/"))
		if err != nil {
			return "", nil, fmt.Errorf("resolve %s: %w", name, err)
		}
		last = fi
	}
	if cur == "" {
		cur = "/"
	}
	return cur, last, nil
}

// ReadFile reads one attribute file and returns its content without the
// trailing newline.
func (f FS) ReadFile(name string) (string, error) {
	return f.readFileAt("", name)
}

func (f FS) readFileAt(base, name string) (string, error) {
	p, fi, err := f.resolveAt(base, name)
	if base != "" {
		name = base + "/" + name
	}
	if err != nil {
		return "", err
	}
	if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("read %s: not a regular file", name)
	}
	fh, err := os.Open(f.host(p))
	if err != nil {
		return "", fmt.Errorf("read %s: %w", name, err)
	}
	defer fh.Close()
	b, err := io.ReadAll(io.LimitReader(fh, maxAttr+1))
	if err != nil {
		return "", fmt.Errorf("read %s: %w", name, err)
	}
	if len(b) > maxAttr {
		return "", fmt.Errorf("read %s: larger than %d bytes, not a sysfs attribute", name, maxAttr)
	}
	return strings.TrimRight(string(b), "\n"), nil
}

// ReadDir lists the entry names of a directory, sorted by name.
func (f FS) ReadDir(name string) ([]string, error) {
	return f.readDirAt("", name)
}

func (f FS) readDirAt(base, name string) ([]string, error) {
	p, fi, err := f.resolveAt(base, name)
	if base != "" {
		name = base + "/" + name
	}
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("list %s: not a directory", name)
	}
	ents, err := os.ReadDir(f.host(p))
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", name, err)
	}
	names := make([]string, len(ents))
	for i, e := range ents {
		names[i] = e.Name()
	}
	return names, nil
}

// readText reads an attribute that is meant to be one line of text. A
// value with control characters or invalid UTF-8 is garbage: it would
// corrupt a table and no kernel writes it.
func (f FS) readText(base, name string) (string, error) {
	s, err := f.readFileAt(base, name)
	if err != nil {
		return "", err
	}
	s = strings.TrimSpace(s)
	if !utf8.ValidString(s) || strings.ContainsFunc(s, unicode.IsControl) {
		return "", fmt.Errorf("read %s: %q is not a line of text", name, s)
	}
	return s, nil
}
