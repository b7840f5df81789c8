package tier

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/kvcache-ops/mc/pkg/diag/glog"
)

// value is the deterministic content of key's value of n bytes, so a
// reader (even another process) can check what it gets: a window of a
// fixed random pattern, starting where key and version say. Copying it is
// fast enough that a child killed "during a write" is in the write.
func value(key string, version uint64, n int) []byte {
	h := fnv.New64a()
	h.Write([]byte(key))
	start := int((h.Sum64() ^ version*0x9e3779b97f4a7c15) % uint64(len(pattern)/2))
	b := make([]byte, n)
	for i := 0; i < n; {
		i += copy(b[i:], pattern[start:])
		start = 0
	}
	return b
}

var pattern = func() []byte {
	r := rand.New(rand.NewPCG(1, 2))
	b := make([]byte, 1<<20+13)
	for i := 0; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	return b
}()

// logBuf collects glog lines.
type logBuf struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func testLogger() (*slog.Logger, *logBuf) {
	lb := &logBuf{}
	return slog.New(glog.NewHandler(lb, nil)), lb
}

func open(t *testing.T, cfg Config) *Tier {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger, _ = testLogger()
	}
	tr, err := Open(cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

func mustWrite(t *testing.T, tr *Tier, key string, version uint64, n int) []byte {
	t.Helper()
	v := value(key, version, n)
	if err := tr.Write(context.Background(), key, version, v); err != nil {
		t.Fatalf("Write %q: %v", key, err)
	}
	return v
}

// mustRead reads key and checks its bytes and version.
func mustRead(t *testing.T, tr *Tier, key string, version uint64, want []byte) {
	t.Helper()
	dst := make([]byte, len(want)+7)
	rec, err := tr.Read(context.Background(), key, 0, dst)
	if err != nil {
		t.Fatalf("Read %q: %v", key, err)
	}
	if rec.Version != version || rec.Size != uint64(len(want)) || !bytes.Equal(dst[:rec.Size], want) {
		t.Fatalf("Read %q: version %d, %d bytes (equal %v); want version %d, %d bytes", key, rec.Version, rec.Size, bytes.Equal(dst[:rec.Size], want), version, len(want))
	}
}

// faults wraps the OS files with injectable failures.
type faults struct {
	mu                         sync.Mutex
	readErr, writeErr, syncErr error
	reads, syncs               int
}

func (fs *faults) set(f func(*faults)) {
	fs.mu.Lock()
	f(fs)
	fs.mu.Unlock()
}

func (fs *faults) open(path string, flag int, direct bool) (file, error) {
	f, err := openOS(path, flag, direct)
	if err != nil {
		return nil, err
	}
	return &faultyFile{file: f, fs: fs}, nil
}

type faultyFile struct {
	file
	fs *faults
}

func (f *faultyFile) ReadAt(p []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	err := f.fs.readErr
	f.fs.reads++
	f.fs.mu.Unlock()
	if err != nil {
		return 0, err
	}
	return f.file.ReadAt(p, off)
}

func (f *faultyFile) WriteAt(p []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	err := f.fs.writeErr
	f.fs.mu.Unlock()
	if err != nil {
		// A failing disk may have written part of it.
		n, _ := f.file.WriteAt(p[:(len(p)/2)&^(BlockSize-1)], off)
		return n, err
	}
	return f.file.WriteAt(p, off)
}

func (f *faultyFile) Sync() error {
	f.fs.mu.Lock()
	err := f.fs.syncErr
	f.fs.syncs++
	f.fs.mu.Unlock()
	if err != nil {
		return err
	}
	return f.file.Sync()
}

var errInjected = errors.New("injected I/O error")
