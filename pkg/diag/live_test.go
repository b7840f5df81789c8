package diag

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func fakeRDMA(t *testing.T, mode string) Sampler {
	t.Helper()
	bin, err := filepath.Abs("testdata/fake-rdma.sh")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("FAKE_RDMA_MODE", mode)
	t.Setenv("FAKE_RDMA_STATE", filepath.Join(t.TempDir(), "calls"))
	return Sampler{Bin: bin, Timeout: 2 * time.Second}
}

func TestSamplerGrowth(t *testing.T) {
	s := fakeRDMA(t, "growth")
	var snaps []*Snapshot
	for i := 0; i < 3; i++ {
		snap, err := s.Sample(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		snaps = append(snaps, snap)
	}
	if got := snaps[2].QPCounts()["mlx5_0"]; got != 10200 {
		t.Fatalf("third sample mlx5_0 = %d, want 10200", got)
	}
	if snaps[0].At.IsZero() || snaps[2].At.Before(snaps[0].At) {
		t.Fatalf("sample times %v %v", snaps[0].At, snaps[2].At)
	}
}

func TestSamplerPerQP(t *testing.T) {
	s := fakeRDMA(t, "growth")
	s.PerQP = true
	snap, err := s.Sample(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !snap.PerQP || snap.QPCounts()["mlx5_0"] != 3 || snap.QPByOwner[Owner{PID: 4242, Comm: "python3"}]["ERR"] != 1 ||
		snap.QPByOwner[Owner{PID: -1, Comm: "[ib_core]"}]["RTS"] != 1 {
		t.Fatalf("%+v", snap)
	}
}

func TestSamplerFailures(t *testing.T) {
	cases := []struct {
		mode string
		want error
		text string
	}{
		{"nonetlink", ErrNoRDMANetlink, "NETLINK_RDMA"},
		{"fail", nil, "something else broke"},
		{"hang", context.DeadlineExceeded, "resource show"},
		{"empty", nil, "no RDMA devices"},
	}
	for _, c := range cases {
		s := fakeRDMA(t, c.mode)
		s.Timeout = 300 * time.Millisecond
		_, err := s.Sample(context.Background())
		if err == nil || !strings.Contains(err.Error(), c.text) || (c.want != nil && !errors.Is(err, c.want)) {
			t.Errorf("%s: err = %v, want %v containing %q", c.mode, err, c.want, c.text)
		}
	}
	_, err := Sampler{Bin: filepath.Join(t.TempDir(), "no-such-rdma")}.Sample(context.Background())
	if !errors.Is(err, ErrNoRDMATool) {
		t.Errorf("missing binary: %v", err)
	}
}

func TestTailerFollowsAppends(t *testing.T) {
	p := filepath.Join(t.TempDir(), "te.INFO")
	os.WriteFile(p, []byte("I0307 09:00:00.000001 1 s.cpp:1] old@mlx5_0 evicted\n"), 0o644)
	sc := NewLogScanner()
	tl, err := NewTailer(sc, []string{p})
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	f, _ := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
	defer f.Close()
	f.WriteString("I0307 09:00:01.000001 1 s.cpp:1] new@mlx5_0 evicted\nI0307 09:00:02.000001 1 s.cpp:1] half@mlx5_0 evi")
	if err := tl.Poll(); err != nil {
		t.Fatal(err)
	}
	if sc.st.Evictions != 1 {
		t.Fatalf("after first poll: %d evictions, want 1 (old line skipped, half line waiting)", sc.st.Evictions)
	}
	f.WriteString("cted\n")
	tl.Poll()
	if sc.st.Evictions != 2 || sc.peers["half@mlx5_0"] == nil {
		t.Fatalf("after second poll: %d evictions", sc.st.Evictions)
	}
}

// --watch keeps counting through log rotation: rename and create, a glog
// symlink pointed at a new file, and truncation in place (copytruncate).
func TestTailerFollowsRotation(t *testing.T) {
	dir := t.TempDir()
	line := func(peer string) string { return "I0307 09:00:01.000001 1 s.cpp:1] " + peer + "@mlx5_0 evicted\n" }
	appendTo := func(p, s string) {
		t.Helper()
		f, err := os.OpenFile(p, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteString(s); err != nil {
			t.Fatal(err)
		}
	}
	p := filepath.Join(dir, "te.INFO")
	appendTo(p, line("old"))
	sc := NewLogScanner()
	tl, err := NewTailer(sc, []string{p})
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	poll := func(want int, what string) {
		t.Helper()
		if err := tl.Poll(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if sc.st.Evictions != want {
			t.Fatalf("%s: %d evictions, want %d", what, sc.st.Evictions, want)
		}
	}
	appendTo(p, line("a"))
	poll(1, "append")

	// logrotate's default: rename, then a new file at the path. The last
	// lines of the old file and the whole new one count.
	appendTo(p, line("b"))
	if err := os.Rename(p, p+".1"); err != nil {
		t.Fatal(err)
	}
	poll(2, "renamed, not yet recreated")
	appendTo(p, line("c")+line("d"))
	poll(4, "new file at the path")

	// copytruncate: the same file, emptied and written again.
	if err := os.Truncate(p, 0); err != nil {
		t.Fatal(err)
	}
	appendTo(p, line("e"))
	poll(5, "truncated in place")

	// glog: <prog>.INFO is a symlink to the newest file.
	target1, target2 := filepath.Join(dir, "te.INFO.1"), filepath.Join(dir, "te.INFO.2")
	appendTo(target1, line("f"))
	link := filepath.Join(dir, "glog.INFO")
	if err := os.Symlink(filepath.Base(target1), link); err != nil {
		t.Fatal(err)
	}
	sc2 := NewLogScanner()
	tl2, err := NewTailer(sc2, []string{link})
	if err != nil {
		t.Fatal(err)
	}
	defer tl2.Close()
	appendTo(target1, line("g"))
	appendTo(target2, line("h"))
	os.Remove(link)
	if err := os.Symlink(filepath.Base(target2), link); err != nil {
		t.Fatal(err)
	}
	if err := tl2.Poll(); err != nil || sc2.st.Evictions != 2 || sc2.peers["h@mlx5_0"] == nil {
		t.Fatalf("symlink moved: %v, %d evictions", err, sc2.st.Evictions)
	}
}

// A gzip'd log is read once however it is named; a plain one is followed.
func TestWatchSniffsGzip(t *testing.T) {
	if !isGzip("testdata/leak/prefill-0.INFO.1.gz") || isGzip("testdata/leak/prefill-0.INFO") {
		t.Fatal("isGzip misreads the fixtures")
	}
	b, err := os.ReadFile("testdata/leak/prefill-0.INFO.1.gz")
	if err != nil {
		t.Fatal(err)
	}
	renamed := filepath.Join(t.TempDir(), "prefill-0.INFO.1")
	os.WriteFile(renamed, b, 0o644)
	if !isGzip(renamed) {
		t.Fatal("gzip without .gz taken as plain text")
	}
}
