package glog

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestCreateLogFileNamesAndLink(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "logs")
	now := time.Date(2026, 11, 22, 9, 8, 7, 0, time.UTC)
	f, err := CreateLogFile(dir, "mc", now)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	base := filepath.Base(f.Name())
	if !regexp.MustCompile(`^mc\.[^.]+\.[^.]+\.log\.INFO\.20261122-090807\.\d+$`).MatchString(base) {
		t.Fatalf("file name %q is not glog's", base)
	}
	if target, err := os.Readlink(filepath.Join(dir, "mc.INFO")); err != nil || target != base {
		t.Fatalf("mc.INFO -> %q, %v; want %q", target, err, base)
	}
	// A second run re-points the link instead of failing.
	f2, err := CreateLogFile(dir, "mc", now.Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer f2.Close()
	if target, _ := os.Readlink(filepath.Join(dir, "mc.INFO")); target != filepath.Base(f2.Name()) {
		t.Fatalf("link not moved to the new file: %q", target)
	}
}

func TestCreateLogFileBadDir(t *testing.T) {
	file := filepath.Join(t.TempDir(), "plain")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := CreateLogFile(file, "mc", time.Now()); err == nil || !strings.Contains(err.Error(), file) {
		t.Fatalf("err = %v, want one naming %s", err, file)
	}
}

// Everything reaches the file; only errors reach stderr.
func TestTeeByLevel(t *testing.T) {
	var file, stderr bytes.Buffer
	l := slog.New(Tee(
		NewHandler(&file, &Options{Level: slog.LevelInfo}),
		NewHandler(&stderr, &Options{Level: slog.LevelError}),
	)).With("dev", "soft0")
	l.Info("peer@soft1 evicted")
	l.Error("Failed to create QP: Cannot allocate memory [12]")
	l.Debug("hidden")
	if got := strings.Count(file.String(), "\n"); got != 2 || !strings.Contains(file.String(), "evicted dev=soft0") {
		t.Fatalf("file got %d lines:\n%s", got, file.String())
	}
	if strings.Contains(stderr.String(), "evicted") || !strings.Contains(stderr.String(), "] Failed to create QP") {
		t.Fatalf("stderr:\n%s", stderr.String())
	}
}
