package cmd

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
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
