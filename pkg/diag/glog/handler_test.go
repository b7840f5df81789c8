package glog

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

func fixedHandler(buf *bytes.Buffer, level slog.Level) *Handler {
	return NewHandler(buf, &Options{
		Level:    level,
		Now:      func() time.Time { return time.Date(2026, 3, 7, 9, 5, 3, 42_000, time.UTC) },
		ThreadID: func() int { return 812 },
	})
}

func TestHandlerLineFormat(t *testing.T) {
	var buf bytes.Buffer
	l := slog.New(fixedHandler(&buf, slog.LevelDebug))
	l.Info("host-b@mlx5_1 evicted")
	l.Warn("Rail paused", "peer", "host-b@mlx5_1", "pause_ms", 30000)
	l.Error("Failed to create QP: Cannot allocate memory [12]")
	l.Debug("quiet detail")
	l.Log(context.Background(), LevelFatal, "device fatal")
	l.With("dev", "soft0").WithGroup("ep").Info("connected", "peer", "a b")

	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	want := []string{
		"I0307 09:05:03.000042   812 handler_test.go:%] host-b@mlx5_1 evicted",
		"W0307 09:05:03.000042   812 handler_test.go:%] Rail paused peer=host-b@mlx5_1 pause_ms=30000",
		"E0307 09:05:03.000042   812 handler_test.go:%] Failed to create QP: Cannot allocate memory [12]",
		"I0307 09:05:03.000042   812 handler_test.go:%] quiet detail",
		"F0307 09:05:03.000042   812 handler_test.go:%] device fatal",
		`I0307 09:05:03.000042   812 handler_test.go:%] connected dev=soft0 ep.peer="a b"`,
	}
	if len(lines) != len(want) {
		t.Fatalf("got %d lines, want %d:\n%s", len(lines), len(want), buf.String())
	}
	for i, w := range want {
		// The source line number moves with edits; check the rest exactly.
		pre, post, _ := strings.Cut(w, "%")
		if !strings.HasPrefix(lines[i], pre) || !strings.HasSuffix(lines[i], post) {
			t.Errorf("line %d:\n got %q\nwant %q", i, lines[i], w)
		}
		mid := strings.TrimSuffix(strings.TrimPrefix(lines[i], pre), post)
		if mid == "" || strings.Trim(mid, "0123456789") != "" {
			t.Errorf("line %d: source line %q is not a number", i, mid)
		}
	}
}

func TestHandlerLevelFilter(t *testing.T) {
	var buf bytes.Buffer
	l := slog.New(fixedHandler(&buf, slog.LevelWarn))
	l.Info("dropped")
	l.Warn("kept")
	if got := buf.String(); strings.Contains(got, "dropped") || !strings.Contains(got, "] kept\n") {
		t.Fatalf("level filter: %q", got)
	}
}

func TestAppendPrefixPadding(t *testing.T) {
	ts := time.Date(2026, 12, 31, 23, 59, 59, 999_999_000, time.UTC)
	got := string(AppendPrefix(nil, 'W', ts, 1234567, "x.go:1"))
	if want := "W1231 23:59:59.999999 1234567 x.go:1] "; got != want {
		t.Fatalf("got %q want %q", got, want)
	}
	got = string(AppendPrefix(nil, 'I', ts.Add(-999_999_000), 7, "x.go:1"))
	if want := "I1231 23:59:59.000000     7 x.go:1] "; got != want {
		t.Fatalf("got %q want %q", got, want)
	}
}

func TestParseLevel(t *testing.T) {
	cases := map[string]slog.Level{"INFO": slog.LevelInfo, "warning": slog.LevelWarn, "Warn": slog.LevelWarn,
		"1": slog.LevelWarn, "error": slog.LevelError, "3": LevelFatal, "debug": slog.LevelDebug}
	for in, want := range cases {
		got, err := ParseLevel(in)
		if err != nil || got != want {
			t.Errorf("ParseLevel(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := ParseLevel("loud"); err == nil || !strings.Contains(err.Error(), `"loud"`) {
		t.Errorf("ParseLevel(loud) error = %v, want one naming the value", err)
	}
}

// Lines from concurrent goroutines must never interleave.
func TestHandlerConcurrentWholeLines(t *testing.T) {
	var buf bytes.Buffer
	l := slog.New(fixedHandler(&buf, slog.LevelInfo))
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				l.Info("peer@dev evicted", "i", i)
			}
		}()
	}
	wg.Wait()
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if len(lines) != 1600 {
		t.Fatalf("got %d lines, want 1600", len(lines))
	}
	for _, ln := range lines {
		if !strings.HasPrefix(ln, "I0307 ") || !strings.Contains(ln, "] peer@dev evicted i=") {
			t.Fatalf("mangled line %q", ln)
		}
	}
}
