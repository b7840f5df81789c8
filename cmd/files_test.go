package cmd

import (
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// withUmask runs the test under umask m (process-wide; cmd's tests are
// not parallel).
func withUmask(t *testing.T, m int) {
	t.Helper()
	old := syscall.Umask(m)
	t.Cleanup(func() { syscall.Umask(old) })
}

func fileMode(t *testing.T, path string) os.FileMode {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Mode().Perm()
}

// Files mc writes (sim --plot and --load-trace here, store get's output
// in TestStoreCLIWalkthrough, topo discover --write) get 0666 less the
// umask, as any tool's files do; they were 0600.
func TestWrittenFilesHonourUmask(t *testing.T) {
	isolateEnv(t)
	withUmask(t, 0o027)
	dir := t.TempDir()
	tr := filepath.Join(dir, "t.jsonl")
	if err := os.WriteFile(tr, []byte(`{"timestamp": 0, "input_length": 200, "output_length": 2, "hash_ids": [1]}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	csv, svg := filepath.Join(dir, "load.csv"), filepath.Join(dir, "load.svg")
	if _, errs, code := execMC(t, "sim", "conductor", "--trace", tr, "--load-trace", csv, "--plot", svg); code != 0 {
		t.Fatalf("sim conductor: %d %s", code, errs)
	}
	for _, f := range []string{csv, svg} {
		if m := fileMode(t, f); m != 0o640 {
			t.Errorf("%s: mode %o under umask 027, want 640", filepath.Base(f), m)
		}
	}
	// A file that exists keeps its mode.
	if err := os.Chmod(csv, 0o664); err != nil {
		t.Fatal(err)
	}
	if _, errs, code := execMC(t, "sim", "conductor", "--trace", tr, "--load-trace", csv); code != 0 {
		t.Fatalf("sim conductor: %d %s", code, errs)
	}
	if m := fileMode(t, csv); m != 0o664 {
		t.Errorf("rewritten load.csv: mode %o, want its own 664", m)
	}
	matrix := filepath.Join(dir, "matrix.json")
	if _, errs, code := execMC(t, "topo", "discover", "--sysfs-root", fixtureRoot(t, "dgx-h100"), "--write", matrix); code != 0 {
		t.Fatalf("topo discover --write: %d %s", code, errs)
	}
	if m := fileMode(t, matrix); m != 0o640 {
		t.Errorf("matrix.json: mode %o under umask 027, want 640", m)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".*")); len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

// umask reads the process's umask.
func umask() os.FileMode {
	m := syscall.Umask(0)
	syscall.Umask(m)
	return os.FileMode(m)
}

// An output that exists and is no regular file (/dev/null, /dev/stdout, a
// FIFO) is written in place: renaming a new file over it, as over a
// regular file, replaced it, and `mc store get KEY /dev/null` run as root
// left the machine a /dev/null that is a plain file. A FIFO stands in for
// the device here.
func TestWriteFileKeepsSpecialFiles(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "out.fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	got := make(chan []byte, 1)
	go func() {
		f, err := os.Open(fifo) // blocks until the writer opens it
		if err != nil {
			got <- nil
			return
		}
		defer f.Close()
		b, _ := io.ReadAll(f)
		got <- b
	}()
	done := make(chan error, 1)
	go func() { done <- writeFileAtomic(fifo, []byte("value")) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("writeFileAtomic to a FIFO did not return")
	}
	st, err := os.Lstat(fifo)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode()&os.ModeNamedPipe == 0 {
		os.WriteFile(fifo, nil, 0o600) // unblock the reader's open if it never ran
		t.Fatalf("%s is now %v: want it still a FIFO, written in place", fifo, st.Mode())
	}
	select {
	case b := <-got:
		if string(b) != "value" {
			t.Fatalf("the FIFO's reader got %q, want %q", b, "value")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the FIFO's reader got nothing")
	}
	ents, _ := os.ReadDir(filepath.Dir(fifo))
	if len(ents) != 1 {
		t.Fatalf("files beside the FIFO: %v, want none left", ents)
	}
}

// A symlink (/dev/stdout -> /proc/self/fd/1, a config kept elsewhere) is
// written through, and stays a link.
func TestWriteFileKeepsSymlinks(t *testing.T) {
	dir := t.TempDir()
	target, link := filepath.Join(dir, "target"), filepath.Join(dir, "link")
	if err := os.WriteFile(target, []byte("older and longer"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if err := writeFileAtomic(link, []byte("new")); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Lstat(link); err != nil || st.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("%s after the write: %v %v, want still a symlink", link, st, err)
	}
	if b, _ := os.ReadFile(target); string(b) != "new" {
		t.Fatalf("the link's target holds %q, want %q", b, "new")
	}
}
