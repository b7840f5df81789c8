package diag

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

type sampleCall struct {
	first, prev, cur *Snapshot
	ev, dev          int
}

// A watch counts lines appended to a followed log while it runs, reports
// growth sample by sample, and a cancelled context ends it early with
// what it has.
func TestWatchFollowsLogAndStopsOnCancel(t *testing.T) {
	s := fakeRDMA(t, "growth")
	dir := t.TempDir()
	logf := filepath.Join(dir, "te.INFO")
	if err := os.WriteFile(logf, []byte("I0307 09:00:00.000001  4101 s.cpp:1] decode-1@mlx5_0 evicted\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	gzLog := filepath.Join(dir, "te.INFO.1.gz")
	if err := os.WriteFile(gzLog, gz([]byte("I0307 08:00:00.000001  4101 s.cpp:1] decode-0@mlx5_1 evicted\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var calls []sampleCall
	var notes []string
	cfg := WatchConfig{
		Logs:     []string{gzLog, logf},
		Interval: 20 * time.Millisecond,
		// Far longer than the test: only the cancel can end it in time.
		Duration: time.Minute,
		Sampler:  s,
		Notef:    func(format string, args ...any) { notes = append(notes, fmt.Sprintf(format, args...)) },
		OnSample: func(first, prev, cur *Snapshot, ev, dev int) {
			calls = append(calls, sampleCall{first, prev, cur, ev, dev})
			switch len(calls) {
			case 1:
				f, err := os.OpenFile(logf, os.O_APPEND|os.O_WRONLY, 0)
				if err != nil {
					t.Error(err)
					return
				}
				f.WriteString("I0307 09:00:01.000001  4101 s.cpp:1] decode-2@mlx5_0 evicted\n")
				f.Close()
			case 3:
				cancel()
			}
		},
	}
	start := time.Now()
	snaps, logs, err := Watch(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Fatalf("watch took %v after cancel", d)
	}
	if len(snaps) != 3 || len(calls) != 3 {
		t.Fatalf("%d snapshots, %d OnSample calls; want 3 each (cancel after the third)", len(snaps), len(calls))
	}
	for i, want := range []int64{9000, 9600, 10200} {
		if got := snaps[i].QPCounts()["mlx5_0"]; got != want {
			t.Errorf("snapshot %d: mlx5_0 = %d, want %d", i, got, want)
		}
	}
	c0 := calls[0]
	if c0.first != snaps[0] || c0.prev != snaps[0] || c0.cur != snaps[0] || c0.ev != 0 || c0.dev != 0 {
		t.Errorf("baseline call %+v, want first==prev==cur and zero counts", c0)
	}
	// Two evictions before the watch (one per file), one appended.
	if c := calls[1]; c.first != snaps[0] || c.prev != snaps[0] || c.cur != snaps[1] || c.ev != 3 || c.dev != 1 {
		t.Errorf("second call %+v, want evictions 3 (+1)", c)
	}
	if c := calls[2]; c.prev != snaps[1] || c.cur != snaps[2] || c.ev != 3 || c.dev != 0 {
		t.Errorf("third call %+v, want evictions 3 (+0)", c)
	}
	if logs == nil || logs.Stats.Evictions != 3 || logs.Stats.Files != 2 {
		t.Fatalf("logs %+v, want 3 evictions from 2 files", logs)
	}
	if len(notes) != 1 || !strings.Contains(notes[0], gzLog) || !strings.Contains(notes[0], "not followed") {
		t.Errorf("notes %q, want one saying the gzip log is not followed", notes)
	}
}

// Without a cancel the duration ends the watch; without logs there is no
// log summary, and a nil OnSample and Notef are allowed.
func TestWatchDuration(t *testing.T) {
	s := fakeRDMA(t, "growth")
	snaps, logs, err := Watch(context.Background(), WatchConfig{Interval: 40 * time.Millisecond, Duration: 150 * time.Millisecond, Sampler: s})
	if err != nil {
		t.Fatal(err)
	}
	if logs != nil {
		t.Errorf("logs = %+v without log files, want nil", logs)
	}
	// The ticker fires about three times; a loaded machine may drop a
	// tick, never add one past the deadline.
	if len(snaps) < 2 || len(snaps) > 5 {
		t.Fatalf("%d snapshots in 150ms at 40ms, want 2..5", len(snaps))
	}
	for i := 1; i < len(snaps); i++ {
		if !snaps[i].At.After(snaps[i-1].At) || snaps[i].QPCounts()["mlx5_0"] != snaps[i-1].QPCounts()["mlx5_0"]+600 {
			t.Errorf("snapshot %d does not follow %d", i, i-1)
		}
	}
}

// A sample slower than the interval leaves a tick and the deadline both
// ready; the watch still stops at its duration. Samples take 60 ms, so in
// 150 ms after the first at most three more start (CI once saw a watch
// go on past its deadline: select picks a ready case at random).
func TestWatchStopsAtDurationWhenSamplesAreSlow(t *testing.T) {
	s := fakeRDMA(t, "growth")
	t.Setenv("FAKE_RDMA_SLEEP", "0.06")
	for range 6 {
		snaps, _, err := Watch(context.Background(), WatchConfig{Interval: 5 * time.Millisecond, Duration: 150 * time.Millisecond, Sampler: s})
		if err != nil {
			t.Fatal(err)
		}
		if len(snaps) > 4 {
			t.Fatalf("%d snapshots of 60 ms each in a 150 ms watch, want at most 4: it sampled past its duration", len(snaps))
		}
	}
}

// Failures before the first sample void the watch (ErrUnreadable); a
// sample that fails later is noted and the watch goes on.
func TestWatchFailures(t *testing.T) {
	dir := t.TempDir()
	ok := fakeRDMA(t, "growth")
	base := WatchConfig{Interval: 20 * time.Millisecond, Duration: time.Second, Sampler: ok}

	bad := base
	bad.Interval = 0
	if _, _, err := Watch(context.Background(), bad); err == nil || !strings.Contains(err.Error(), "interval") {
		t.Errorf("zero interval: err = %v", err)
	}
	bad = base
	bad.Duration = -time.Second
	if _, _, err := Watch(context.Background(), bad); err == nil || !strings.Contains(err.Error(), "duration") {
		t.Errorf("negative duration: err = %v", err)
	}
	bad = base
	bad.Logs = []string{filepath.Join(dir, "nolog")}
	if _, _, err := Watch(context.Background(), bad); !errors.Is(err, ErrUnreadable) || !strings.Contains(err.Error(), "nolog") {
		t.Errorf("missing log: err = %v", err)
	}
	bad = base
	bad.Sampler = Sampler{Bin: filepath.Join(dir, "no-such-rdma")}
	if _, _, err := Watch(context.Background(), bad); !errors.Is(err, ErrUnreadable) || !errors.Is(err, ErrNoRDMATool) {
		t.Errorf("missing rdma: err = %v", err)
	}

	// A tool that works once, then fails: the watch keeps the first
	// sample and notes every later failure.
	script := filepath.Join(dir, "flaky-rdma")
	state := filepath.Join(dir, "flaky-calls")
	os.WriteFile(script, []byte(`#!/bin/sh
if [ -f "`+state+`" ]; then echo "rdma: flaky" >&2; exit 1; fi
touch "`+state+`"
echo '[{"ifindex":0,"ifname":"mlx5_0","qp":100}]'
`), 0o755)
	var notes []string
	flaky := base
	flaky.Duration = 120 * time.Millisecond
	flaky.Interval = 30 * time.Millisecond
	flaky.Sampler = Sampler{Bin: script, Timeout: 2 * time.Second}
	flaky.Notef = func(format string, args ...any) {
		notes = append(notes, fmt.Sprintf(format, args...))
	}
	snaps, _, err := Watch(context.Background(), flaky)
	if err != nil {
		t.Fatal(err)
	}
	if len(snaps) != 1 || len(notes) == 0 || !strings.Contains(notes[0], "sample failed") || !strings.Contains(notes[0], "flaky") {
		t.Errorf("%d snapshots, notes %q; want 1 and 'sample failed' notes", len(snaps), notes)
	}
}
