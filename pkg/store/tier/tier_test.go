package tier

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func TestWriteReadAndReopen(t *testing.T) {
	dir := t.TempDir()
	tr := open(t, Config{Dir: dir, Capacity: 64 << 20})
	sizes := []int{0, 1, 100, BlockSize - headerLen - 2, BlockSize, 3*BlockSize + 5, 1 << 20}
	want := map[string][]byte{}
	for i, n := range sizes {
		k := fmt.Sprintf("key-%d", i)
		want[k] = mustWrite(t, tr, k, uint64(i+1), n)
	}
	long := strings.Repeat("k", MaxKeyLen)
	want[long] = mustWrite(t, tr, long, 99, 5000)
	check := func(tr *Tier) {
		t.Helper()
		for i, n := range sizes {
			k := fmt.Sprintf("key-%d", i)
			mustRead(t, tr, k, uint64(i+1), want[k])
			if r, ok := tr.Lookup(k); !ok || r.Size != uint64(n) {
				t.Fatalf("Lookup %q = %+v, %v", k, r, ok)
			}
		}
		mustRead(t, tr, long, 99, want[long])
		if got := len(tr.Records()); got != len(want) {
			t.Fatalf("Records: %d, want %d", got, len(want))
		}
	}
	check(tr)
	if _, err := tr.Read(context.Background(), "key-1", 7, make([]byte, 10)); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Read of another version: %v, want ErrNotFound", err)
	}
	if _, err := tr.Read(context.Background(), "key-6", 0, make([]byte, 10)); err == nil || errors.Is(err, ErrNotFound) {
		t.Fatalf("Read into a short buffer: %v, want a size error", err)
	}
	used := tr.Stats().Used
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	tr2 := open(t, Config{Dir: dir, Capacity: 64 << 20})
	check(tr2)
	if s := tr2.Stats(); s.Used != used || s.Dropped != 0 {
		t.Fatalf("after reopen: used %d dropped %d, want used %d, none dropped", s.Used, s.Dropped, used)
	}
	if tr2.ID() != tr.ID() || tr.ID() == "" {
		t.Fatalf("tier id %q after reopen, %q before", tr2.ID(), tr.ID())
	}
}

func TestNewerVersionWins(t *testing.T) {
	dir := t.TempDir()
	tr := open(t, Config{Dir: dir, Capacity: 64 << 20, MaxFileRecords: 2})
	mustWrite(t, tr, "a", 5, 100)
	v6 := mustWrite(t, tr, "a", 6, 200)
	// An older version arriving late does not replace the newer.
	mustWrite(t, tr, "a", 4, 300)
	mustRead(t, tr, "a", 6, v6)
	tr.Close()
	tr = open(t, Config{Dir: dir, Capacity: 64 << 20})
	mustRead(t, tr, "a", 6, v6)
	if n := len(tr.Records()); n != 1 {
		t.Fatalf("%d records after reopen, want 1", n)
	}
}

func TestFilesRotateAndEvictOldestFirst(t *testing.T) {
	dir := t.TempDir()
	var mu sync.Mutex
	var evicted []string
	rec := recordLen(len("k00"), 10_000) // 12 KiB
	tr := open(t, Config{Dir: dir, Capacity: 10 * rec, MaxFileRecords: 3, MaxFileBytes: 1 << 30,
		OnEvict: func(rs []Record) {
			mu.Lock()
			for _, r := range rs {
				evicted = append(evicted, r.Key)
			}
			mu.Unlock()
		}})
	vals := map[string][]byte{}
	for i := range 10 {
		k := fmt.Sprintf("k%02d", i)
		vals[k] = mustWrite(t, tr, k, 1, 10_000)
	}
	if s := tr.Stats(); s.Files != 4 || s.Used != 10*rec || len(evicted) != 0 {
		t.Fatalf("after 10 records: %d files, %d used, %d evicted; want 4 files (3 records each), %d used, none evicted", s.Files, s.Used, len(evicted), 10*rec)
	}
	// The 11th needs room: the oldest file (k00..k02) goes whole.
	vals["k10"] = mustWrite(t, tr, "k10", 1, 10_000)
	mu.Lock()
	got := slices.Clone(evicted)
	mu.Unlock()
	if !slices.Equal(got, []string{"k00", "k01", "k02"}) {
		t.Fatalf("evicted %v, want the oldest file's k00 k01 k02", got)
	}
	for k, v := range vals {
		if slices.Contains(got, k) {
			if _, err := tr.Read(context.Background(), k, 0, make([]byte, 10_000)); !errors.Is(err, ErrNotFound) {
				t.Fatalf("evicted %q: Read %v, want ErrNotFound", k, err)
			}
			continue
		}
		mustRead(t, tr, k, 1, v)
	}
	if s := tr.Stats(); s.EvictedFiles != 1 || s.EvictedRecords != 3 || s.Used != 8*rec {
		t.Fatalf("stats %+v: want 1 file / 3 records evicted, %d used", s, 8*rec)
	}
	ents, _ := os.ReadDir(dir)
	var data int
	for _, e := range ents {
		if _, ok := parseDataName(e.Name()); ok {
			data++
		}
	}
	if data != 3 {
		t.Fatalf("%d data files on disk, want 3", data)
	}
}

func TestRemoveFreesEmptiedFiles(t *testing.T) {
	dir := t.TempDir()
	tr := open(t, Config{Dir: dir, Capacity: 1 << 20, MaxFileRecords: 2})
	for i := range 4 {
		mustWrite(t, tr, fmt.Sprint(i), 1, 1000)
	}
	if !tr.Remove("0", 1) || tr.Remove("0", 1) || tr.Remove("1", 2) {
		t.Fatal("Remove: want true once for the right version only")
	}
	if s := tr.Stats(); s.Files != 2 || s.Records != 3 {
		t.Fatalf("after removing one of file 0's two: %d files %d records, want 2 and 3", s.Files, s.Records)
	}
	tr.Remove("1", 0)
	if s := tr.Stats(); s.Files != 1 || s.Used != 2*BlockSize {
		t.Fatalf("after emptying file 0: %d files, %d used; want 1 file, %d bytes", s.Files, s.Used, 2*BlockSize)
	}
}

// Disk full, as the tier sees it: a record larger than the tier, and the
// filesystem running out of space under a write.
func TestDiskFull(t *testing.T) {
	fs := &faults{}
	tr := open(t, Config{Dir: t.TempDir(), Capacity: 64 << 10, openFile: fs.open})
	if err := tr.Write(context.Background(), "big", 1, make([]byte, 64<<10)); !errors.Is(err, ErrFull) {
		t.Fatalf("record larger than the tier: %v, want ErrFull", err)
	}
	keep := mustWrite(t, tr, "keep", 1, 5000)
	fs.set(func(f *faults) { f.writeErr = unix.ENOSPC })
	if err := tr.Write(context.Background(), "x", 1, make([]byte, 5000)); !errors.Is(err, ErrFull) {
		t.Fatalf("ENOSPC: %v, want ErrFull", err)
	}
	fs.set(func(f *faults) { f.writeErr = nil })
	if _, ok := tr.Lookup("x"); ok {
		t.Fatal("a record whose write failed is in the index")
	}
	// The tier goes on: earlier records read, new ones write (to a new
	// file: the failed one takes no more appends).
	mustRead(t, tr, "keep", 1, keep)
	v := mustWrite(t, tr, "y", 1, 5000)
	mustRead(t, tr, "y", 1, v)
	if s := tr.Stats(); s.Full != 2 || s.Files != 2 {
		t.Fatalf("stats: %d full, %d files; want 2 refused as full, 2 files", s.Full, s.Files)
	}
}

func TestSyncFailureIsNotAcknowledged(t *testing.T) {
	fs := &faults{}
	tr := open(t, Config{Dir: t.TempDir(), Capacity: 1 << 20, openFile: fs.open})
	fs.set(func(f *faults) { f.syncErr = errInjected })
	if err := tr.Write(context.Background(), "a", 1, []byte("abc")); !errors.Is(err, errInjected) {
		t.Fatalf("Write with a failing fdatasync: %v, want the injected error", err)
	}
	if _, ok := tr.Lookup("a"); ok {
		t.Fatal("an unsynced record is readable")
	}
	fs.set(func(f *faults) { f.syncErr = nil })
	v := mustWrite(t, tr, "b", 1, 10)
	mustRead(t, tr, "b", 1, v)
}

// An I/O error on a read: the error comes back, not bytes; the record is
// dropped so it is not tried again.
func TestReadIOErrorDropsRecord(t *testing.T) {
	fs := &faults{}
	log, lb := testLogger()
	tr := open(t, Config{Dir: t.TempDir(), Capacity: 1 << 20, openFile: fs.open, Logger: log})
	mustWrite(t, tr, "a", 3, 9000)
	other := mustWrite(t, tr, "b", 1, 100)
	fs.set(func(f *faults) { f.readErr = unix.EIO })
	dst := bytes.Repeat([]byte{0xee}, 9000)
	_, err := tr.Read(context.Background(), "a", 3, dst)
	if !errors.Is(err, unix.EIO) || errors.Is(err, ErrNotFound) {
		t.Fatalf("Read with EIO: %v, want EIO", err)
	}
	if !bytes.Equal(dst, bytes.Repeat([]byte{0xee}, 9000)) {
		t.Fatal("a failed read wrote into the caller's buffer")
	}
	fs.set(func(f *faults) { f.readErr = nil })
	if _, err := tr.Read(context.Background(), "a", 3, dst); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Read after the failure: %v, want ErrNotFound (dropped)", err)
	}
	mustRead(t, tr, "b", 1, other)
	if s := tr.Stats(); s.ReadErrors != 1 || s.Records != 1 {
		t.Fatalf("stats: %d read errors, %d records; want 1 and 1", s.ReadErrors, s.Records)
	}
	if !strings.Contains(lb.String(), `record "a" version 3`) {
		t.Fatalf("no log line for the dropped record:\n%s", lb)
	}
}

// flip flips one byte of a data file at off.
func flip(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := []byte{0}
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x20
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

func onlyDataFile(t *testing.T, dir string) string {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(dir, "*"+dataSuffix))
	if len(m) != 1 {
		t.Fatalf("data files %v, want one", m)
	}
	return m[0]
}

// A flipped byte in a value is caught by the CRC on the read and at the
// next scan.
func TestFlippedByteInValue(t *testing.T) {
	dir := t.TempDir()
	log, lb := testLogger()
	tr := open(t, Config{Dir: dir, Capacity: 1 << 20, Logger: log})
	mustWrite(t, tr, "a", 1, 10_000)
	b := mustWrite(t, tr, "b", 1, 100)
	path := onlyDataFile(t, dir)
	flip(t, path, headerLen+1+5000) // inside a's value
	dst := make([]byte, 10_000)
	if _, err := tr.Read(context.Background(), "a", 1, dst); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Read of a flipped record: %v, want ErrCorrupt", err)
	}
	if _, err := tr.Read(context.Background(), "a", 1, dst); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second Read: %v, want ErrNotFound", err)
	}
	mustRead(t, tr, "b", 1, b)
	if !strings.Contains(lb.String(), "value checksum (CRC32C) mismatch") {
		t.Fatalf("no log line naming the CRC:\n%s", lb)
	}
	tr.Close()

	// The scan drops it too (it is still on disk).
	log, lb = testLogger()
	tr = open(t, Config{Dir: dir, Capacity: 1 << 20, Logger: log})
	if _, ok := tr.Lookup("a"); ok {
		t.Fatal("the scan kept a record that fails its CRC")
	}
	mustRead(t, tr, "b", 1, b)
	if s := tr.Stats(); s.Dropped != 1 || !strings.Contains(lb.String(), `record "a" (version 1) at offset 0`) {
		t.Fatalf("scan: %d dropped, log:\n%s", s.Dropped, lb)
	}
}

// A flipped byte in a header: the scan cannot trust its length, skips to
// the next block with a valid header and keeps what follows.
func TestFlippedByteInHeader(t *testing.T) {
	dir := t.TempDir()
	tr := open(t, Config{Dir: dir, Capacity: 1 << 20})
	mustWrite(t, tr, "a", 1, 3*BlockSize)
	b := mustWrite(t, tr, "b", 1, 100)
	tr.Close()
	flip(t, onlyDataFile(t, dir), 9) // a's size
	log, lb := testLogger()
	tr = open(t, Config{Dir: dir, Capacity: 1 << 20, Logger: log})
	if _, ok := tr.Lookup("a"); ok {
		t.Fatal("a record with a bad header was kept")
	}
	mustRead(t, tr, "b", 1, b)
	if !strings.Contains(lb.String(), "no valid record header in bytes [0, 16384)") {
		t.Fatalf("log:\n%s", lb)
	}
}

// A file cut inside its last record (a crash while appending): the torn
// record is dropped with a log line, the rest served, and the tier
// appends to a new file.
func TestTornTail(t *testing.T) {
	dir := t.TempDir()
	tr := open(t, Config{Dir: dir, Capacity: 1 << 20})
	a := mustWrite(t, tr, "a", 1, 5000)
	mustWrite(t, tr, "b", 1, 20_000)
	tr.Close()
	path := onlyDataFile(t, dir)
	if err := os.Truncate(path, 2*BlockSize+3*BlockSize); err != nil {
		t.Fatal(err)
	}
	log, lb := testLogger()
	tr = open(t, Config{Dir: dir, Capacity: 1 << 20, Logger: log})
	mustRead(t, tr, "a", 1, a)
	if _, ok := tr.Lookup("b"); ok {
		t.Fatal("torn record kept")
	}
	if !strings.Contains(lb.String(), `record "b" (version 1, 20000 bytes) at offset 8192 runs past the end of the file (20480 bytes): torn by a crash, dropped`) {
		t.Fatalf("log:\n%s", lb)
	}
	c := mustWrite(t, tr, "c", 1, 10)
	mustRead(t, tr, "c", 1, c)
	if s := tr.Stats(); s.Files != 2 {
		t.Fatalf("%d files, want the torn one and a new one", s.Files)
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	notDir := filepath.Join(dir, "file")
	os.WriteFile(notDir, nil, 0o644)
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"missing", Config{Dir: filepath.Join(dir, "nope"), Capacity: 1}, "directory does not exist"},
		{"not a directory", Config{Dir: notDir, Capacity: 1}, "not a directory"},
		{"no dir", Config{Capacity: 1}, "no directory given"},
		{"no capacity", Config{Dir: dir}, "capacity 0"},
	} {
		_, err := Open(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}

func TestUnwritableDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ro")
	os.Mkdir(dir, 0o555)
	if os.Geteuid() == 0 {
		// Permissions do not stop root: sysfs does.
		dir = "/sys/kernel"
		if _, err := os.Stat(dir); err != nil {
			t.Skip("no unwritable directory for root here")
		}
	}
	_, err := Open(Config{Dir: dir, Capacity: 1 << 20})
	if err == nil || !strings.Contains(err.Error(), "is not writable") {
		t.Fatalf("Open of an unwritable dir: %v", err)
	}
}

func TestSecondOpenerRefused(t *testing.T) {
	dir := t.TempDir()
	tr := open(t, Config{Dir: dir, Capacity: 1 << 20})
	_, err := Open(Config{Dir: dir, Capacity: 1 << 20})
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), fmt.Sprintf("(pid %d)", os.Getpid())) {
		t.Fatalf("second Open: %v, want ErrLocked naming pid %d", err, os.Getpid())
	}
	tr.Close()
	open(t, Config{Dir: dir, Capacity: 1 << 20})
}

func TestClosed(t *testing.T) {
	tr := open(t, Config{Dir: t.TempDir(), Capacity: 1 << 20})
	mustWrite(t, tr, "a", 1, 10)
	tr.Close()
	if err := tr.Write(context.Background(), "b", 1, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Write after Close: %v", err)
	}
	if _, err := tr.Read(context.Background(), "a", 1, make([]byte, 10)); !errors.Is(err, ErrClosed) {
		t.Fatalf("Read after Close: %v", err)
	}
}

// Writers, readers and removers at once, with eviction: every read that
// succeeds returns exactly what was written under that version.
func TestConcurrent(t *testing.T) {
	tr := open(t, Config{Dir: t.TempDir(), Capacity: 2 << 20, MaxFileRecords: 8, IOConcurrency: 3})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 60 {
				k := fmt.Sprintf("k%d", (w*60+i)%50)
				v := uint64(w*1000 + i + 1)
				if err := tr.Write(context.Background(), k, v, value(k, v, 1000+i*331)); err != nil {
					t.Errorf("Write: %v", err)
					return
				}
				if i%7 == 0 {
					tr.Remove(fmt.Sprintf("k%d", i%50), 0)
				}
			}
		}()
	}
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dst := make([]byte, 64<<10)
			for i := range 300 {
				k := fmt.Sprintf("k%d", i%50)
				rec, err := tr.Read(context.Background(), k, 0, dst)
				if errors.Is(err, ErrNotFound) {
					continue
				}
				if err != nil {
					t.Errorf("Read %q: %v", k, err)
					return
				}
				if !bytes.Equal(dst[:rec.Size], value(k, rec.Version, int(rec.Size))) {
					t.Errorf("Read %q version %d: wrong bytes", k, rec.Version)
					return
				}
			}
		}()
	}
	wg.Wait()
	if s := tr.Stats(); s.Used > s.Capacity || s.Dropped != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// A filesystem that refuses O_DIRECT (tmpfs before Linux 6.6): the tier
// says so in one log line and works buffered.
func TestNoDirectFallsBack(t *testing.T) {
	var directOpens int
	var mu sync.Mutex
	noDirect := func(path string, flag int, direct bool) (file, error) {
		if direct {
			mu.Lock()
			directOpens++
			mu.Unlock()
			return nil, &os.PathError{Op: "open", Path: path, Err: unix.EINVAL}
		}
		return openOS(path, flag, false)
	}
	dir := t.TempDir()
	log, lb := testLogger()
	tr := open(t, Config{Dir: dir, Capacity: 1 << 20, openFile: noDirect, Logger: log})
	if tr.Direct() {
		t.Fatal("Direct() true on a filesystem refusing O_DIRECT")
	}
	if !strings.Contains(lb.String(), "refuses O_DIRECT (tmpfs?); using buffered I/O with fdatasync") {
		t.Fatalf("no fallback log line:\n%s", lb)
	}
	v := mustWrite(t, tr, "a", 1, 7000)
	mustRead(t, tr, "a", 1, v)
	if directOpens != 1 {
		t.Fatalf("%d O_DIRECT opens, want only the probe's", directOpens)
	}
}

// Values larger than one read come back byte-exact across chunk
// boundaries (the header and key in the first chunk, the value's end in
// a short last one), and a flipped byte in a later chunk fails the read
// with ErrCorrupt and drops the record.
func TestChunkedRead(t *testing.T) {
	dir := t.TempDir()
	tr := open(t, Config{Dir: dir, Capacity: 64 << 20})
	sizes := []int{readChunk - headerLen - 2, readChunk - headerLen - 3, readChunk, 2*readChunk + 17, readChunk + 3}
	want := map[string][]byte{}
	for i, n := range sizes {
		k := fmt.Sprintf("k%d", i)
		want[k] = mustWrite(t, tr, k, uint64(i+1), n)
	}
	for i := range sizes {
		k := fmt.Sprintf("k%d", i)
		mustRead(t, tr, k, uint64(i+1), want[k])
	}
	// Flip a byte in the third chunk of k3.
	tr.mu.Lock()
	e := tr.index["k3"]
	off := int64(e.off) + 2*readChunk + 5
	tr.mu.Unlock()
	flip(t, e.file.path, off)
	dst := make([]byte, len(want["k3"]))
	if _, err := tr.Read(context.Background(), "k3", 4, dst); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Read of a record flipped in its third chunk: %v, want ErrCorrupt", err)
	}
	if _, ok := tr.Lookup("k3"); ok {
		t.Fatal("the corrupt record is still in the index")
	}
	mustRead(t, tr, "k4", 5, want["k4"])
}

// The scan checks only the values of the last records appended (all a
// crash can tear): a flipped byte in an older value survives the scan,
// and the first read of it fails with ErrCorrupt and drops it.
func TestOldValueCheckedAtFirstRead(t *testing.T) {
	dir := t.TempDir()
	tr := open(t, Config{Dir: dir, Capacity: 64 << 20})
	for i := range maxBatch + 6 {
		mustWrite(t, tr, fmt.Sprintf("k%03d", i), 1, 5000)
	}
	tr.mu.Lock()
	e := tr.index["k000"]
	path, off := e.file.path, int64(e.off)+headerLen+4+100
	tr.mu.Unlock()
	tr.Close()
	flip(t, path, off)
	log, lb := testLogger()
	tr = open(t, Config{Dir: dir, Capacity: 64 << 20, Logger: log})
	if s := tr.Stats(); s.Dropped != 0 || s.Records != maxBatch+6 {
		t.Fatalf("after the scan: %d records, %d dropped; want %d and 0", s.Records, s.Dropped, maxBatch+6)
	}
	if _, err := tr.Read(context.Background(), "k000", 1, make([]byte, 5000)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("first read of a flipped old record: %v, want ErrCorrupt", err)
	}
	if _, ok := tr.Lookup("k000"); ok || tr.Stats().Dropped != 1 || !strings.Contains(lb.String(), "value checksum (CRC32C) mismatch") {
		t.Fatalf("the flipped record was not dropped with a log line naming the CRC:\n%s", lb)
	}
	mustRead(t, tr, "k001", 1, value("k001", 1, 5000))
}

// Every read gives its bounce buffers back (they are mapped outside the
// Go heap: one kept would never be freed), whether it succeeds, fails on
// I/O or fails its checksum, for records of one chunk and of several,
// with huge pages (every read bounced) and without (the large ones in
// place where the filesystem takes O_DIRECT).
func TestReadBuffersGivenBack(t *testing.T) {
	for _, sysfs := range []string{"testdata/sysfs-thp-madvise", "testdata/sysfs-thp-never"} {
		t.Run(filepath.Base(sysfs), func(t *testing.T) { testReadBuffersGivenBack(t, sysfs) })
	}
}

func testReadBuffersGivenBack(t *testing.T, sysfs string) {
	fs := &faults{}
	dir := t.TempDir()
	tr := open(t, Config{Dir: dir, Capacity: 64 << 20, openFile: fs.open, sysfs: sysfs})
	big := mustWrite(t, tr, "big", 1, 2*readChunk+5)
	small := mustWrite(t, tr, "small", 1, 100)
	mustWrite(t, tr, "doomed", 1, 3*readChunk)
	mustWrite(t, tr, "flipped", 1, readChunk+7)
	for range 5 {
		mustRead(t, tr, "big", 1, big)
		mustRead(t, tr, "small", 1, small)
	}
	tr.mu.Lock()
	e := tr.index["flipped"]
	path, off := e.file.path, int64(e.off)+readChunk+3
	tr.mu.Unlock()
	flip(t, path, off)
	if _, err := tr.Read(context.Background(), "flipped", 1, make([]byte, readChunk+7)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("read of a flipped record: %v, want ErrCorrupt", err)
	}
	fs.set(func(f *faults) { f.readErr = errInjected })
	if _, err := tr.Read(context.Background(), "doomed", 1, make([]byte, 3*readChunk)); !errors.Is(err, errInjected) {
		t.Fatalf("read with an I/O error: %v, want the injected error", err)
	}
	if n := tr.rbufs.inUse.Load(); n != 0 {
		t.Fatalf("%d read buffers not given back", n)
	}
}

// Values of alignedMin bytes or more are written with the value on a block
// (MCT2). With O_DIRECT they are read through the huge-page bounce
// buffers where the kernel gives huge pages, and otherwise straight into
// a block-aligned buffer; into any other buffer through the bounce
// buffers; without O_DIRECT straight into the buffer. Every path returns
// the bytes exactly (partial last blocks and several chunks included),
// reads records an earlier version wrote with the value after the key
// (MCT1), and catches a flipped byte anywhere in the value, the last
// partial block included.
func TestReadPaths(t *testing.T) {
	sizes := []int{alignedMin - 1, alignedMin, alignedMin + 100, 2*readChunk + BlockSize + 3}
	for _, c := range []struct {
		direct bool
		sysfs  string // the kernel's THP setting
		huge   bool
	}{{true, "testdata/sysfs-thp-never", false}, {true, "testdata/sysfs-thp-madvise", true}, {false, "testdata/sysfs-thp-madvise", false}} {
		direct := c.direct
		t.Run(fmt.Sprintf("direct=%v/huge=%v", direct, c.huge), func(t *testing.T) {
			dir := t.TempDir()
			openFile := openOS
			if !direct {
				openFile = func(path string, flag int, d bool) (file, error) {
					if d {
						return nil, &os.PathError{Op: "open", Path: path, Err: unix.EINVAL}
					}
					return openOS(path, flag, false)
				}
			}
			// An MCT1 record of each size, as an earlier version wrote it,
			// in a data file the scan finds.
			var legacy []byte
			for i, n := range sizes {
				k := fmt.Sprintf("old%d", i)
				v := value(k, 1, n)
				b := make([]byte, alignUp(uint64(headerLen+len(k)+n)))
				encodeRecordAs(b, k, 1, v, false)
				legacy = append(legacy, b...)
			}
			if err := os.WriteFile(filepath.Join(dir, dataName(1)), legacy, 0o644); err != nil {
				t.Fatal(err)
			}
			tr := open(t, Config{Dir: dir, Capacity: 256 << 20, openFile: openFile, sysfs: c.sysfs})
			if st := tr.Stats(); st.Direct != direct || st.HugePages != c.huge {
				t.Fatalf("Direct %v, HugePages %v; want %v, %v", st.Direct, st.HugePages, direct, c.huge)
			}
			for i, n := range sizes {
				k := fmt.Sprintf("new%d", i)
				mustWrite(t, tr, k, 2, n)
				tr.mu.Lock()
				aligned := tr.index[k].aligned
				tr.mu.Unlock()
				if aligned != (n >= alignedMin) {
					t.Fatalf("%q of %d bytes written aligned=%v", k, n, aligned)
				}
			}
			for i, n := range sizes {
				for _, k := range []string{fmt.Sprintf("old%d", i), fmt.Sprintf("new%d", i)} {
					ver := uint64(1)
					if k[0] == 'n' {
						ver = 2
					}
					want := value(k, ver, n)
					buf := alignedBuf(n + 2*BlockSize)
					for _, shift := range []int{0, 64, BlockSize - 1} {
						dst := buf[shift : shift+n]
						clear(dst)
						before := tr.Stats().ReadsInPlace
						if rec, err := tr.Read(context.Background(), k, ver, dst); err != nil || rec.Size != uint64(n) || !bytes.Equal(dst, want) {
							t.Fatalf("Read %q (%d bytes) into a buffer %d bytes past a block: %v, equal %v", k, n, shift, err, bytes.Equal(dst, want))
						}
						inPlace := !direct || !c.huge && k[0] == 'n' && n >= alignedMin && shift == 0
						if got := tr.Stats().ReadsInPlace - before; got != map[bool]uint64{false: 0, true: 1}[inPlace] {
							t.Fatalf("Read %q (%d bytes, %d past a block, O_DIRECT %v): %d reads in place, want in place: %v", k, n, shift, direct, got, inPlace)
						}
					}
					putAligned(buf)
				}
			}
			// A flipped byte in the value's first block, in a later chunk
			// and in the last partial block: each read fails with
			// ErrCorrupt and drops the record.
			last := len(sizes) - 1
			for j, at := range []int{0, readChunk + 5, sizes[last] - 1} {
				k := fmt.Sprintf("f%d", j)
				v := mustWrite(t, tr, k, 3, sizes[last])
				tr.mu.Lock()
				e := tr.index[k]
				path, off := e.file.path, int64(e.off+e.valueOff())+int64(at)
				tr.mu.Unlock()
				flip(t, path, off)
				buf := alignedBuf(len(v))
				if _, err := tr.Read(context.Background(), k, 3, buf); !errors.Is(err, ErrCorrupt) {
					t.Fatalf("Read of %q flipped at value byte %d: %v, want ErrCorrupt", k, at, err)
				}
				putAligned(buf)
				if _, ok := tr.Lookup(k); ok {
					t.Fatalf("%q: the corrupt record is still in the index", k)
				}
			}
		})
	}
}

// The kernel's THP setting decides whether O_DIRECT reads bounce through
// huge pages: "always" or "madvise" (ReadBuffer asks with MADV_HUGEPAGE),
// not "never", nor a kernel without THP.
func TestHugePagesOn(t *testing.T) {
	for dir, want := range map[string]bool{
		"testdata/sysfs-thp-always": true, "testdata/sysfs-thp-madvise": true,
		"testdata/sysfs-thp-never": false, "testdata/sysfs-no-thp": false, "testdata/no-such-dir": false,
	} {
		if got := hugePagesOn(dir); got != want {
			t.Errorf("hugePagesOn(%s) = %v, want %v", dir, got, want)
		}
	}
}

// A read buffer is as long as asked, starts on a huge page, spans whole
// huge pages (a smaller mapping can have none), is zeroed and writable,
// and goes back with FreeReadBuffer.
func TestReadBuffer(t *testing.T) {
	for _, n := range []int{1, BlockSize, 1 << 20, 2 << 20, 4<<20 + 3} {
		b, err := ReadBuffer(n)
		if err != nil {
			t.Fatalf("ReadBuffer(%d): %v", n, err)
		}
		addr := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
		if len(b) != n || addr%hugePage != 0 || cap(b)%hugePage != 0 || cap(b) < n {
			t.Fatalf("ReadBuffer(%d): len %d cap %d at 0x%x; want len %d, whole huge pages from a huge-page boundary", n, len(b), cap(b), addr, n)
		}
		if i := slices.IndexFunc(b[:cap(b)], func(c byte) bool { return c != 0 }); i >= 0 {
			t.Fatalf("ReadBuffer(%d): byte %d is 0x%x, want zeroed memory", n, i, b[i])
		}
		b[0], b[n-1] = 1, 2
		if err := FreeReadBuffer(b); err != nil {
			t.Fatalf("FreeReadBuffer: %v", err)
		}
	}
	for _, n := range []int{0, -1} {
		if _, err := ReadBuffer(n); err == nil {
			t.Errorf("ReadBuffer(%d): no error", n)
		}
	}
}

// ReadProgress tells, as a large value is read, how much of dst from its
// start holds the value's bytes: rising, in more than one step, the last
// the whole value, and each prefix told holds the value's bytes when it
// is told (bounced through huge pages, in place, and through the page
// cache). A value flipped in a later chunk gets its earlier chunks told
// and still fails with ErrCorrupt: what was told is never vouched for.
func TestReadProgress(t *testing.T) {
	n := 2*readChunk + BlockSize + 3
	for _, c := range []struct {
		name   string
		direct bool
		sysfs  string
	}{{"bounced", true, "testdata/sysfs-thp-madvise"}, {"inplace", true, "testdata/sysfs-thp-never"}, {"buffered", false, "testdata/sysfs-thp-madvise"}} {
		t.Run(c.name, func(t *testing.T) {
			openFile := openOS
			if !c.direct {
				openFile = func(path string, flag int, d bool) (file, error) {
					if d {
						return nil, &os.PathError{Op: "open", Path: path, Err: unix.EINVAL}
					}
					return openOS(path, flag, false)
				}
			}
			tr := open(t, Config{Dir: t.TempDir(), Capacity: 256 << 20, openFile: openFile, sysfs: c.sysfs})
			// good: the bytes of v that are on disk as written.
			read := func(k string, v []byte, good int) ([]uint64, error) {
				dst := alignedBuf(n)
				defer putAligned(dst)
				clear(dst)
				var told []uint64
				_, err := tr.ReadProgress(context.Background(), k, 1, dst, func(m uint64) {
					g := min(int(m), good)
					if m > uint64(n) || !bytes.Equal(dst[:g], v[:g]) {
						t.Errorf("%s: told %d bytes ready, which do not hold the value", k, m)
					}
					told = append(told, m)
				})
				return told, err
			}
			v := mustWrite(t, tr, "a", 1, n)
			told, err := read("a", v, n)
			if err != nil {
				t.Fatalf("ReadProgress: %v", err)
			}
			if len(told) < 2 || told[len(told)-1] != uint64(n) || !slices.IsSorted(told) {
				t.Fatalf("progress told %v, want rising steps ending at %d", told, n)
			}
			v = mustWrite(t, tr, "b", 1, n)
			tr.mu.Lock()
			e := tr.index["b"]
			path, off := e.file.path, int64(e.off+e.valueOff())+int64(n-BlockSize)
			tr.mu.Unlock()
			flip(t, path, off)
			told, err = read("b", v, n-BlockSize)
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("ReadProgress of a value flipped in its last chunk: %v, want ErrCorrupt", err)
			}
			if len(told) == 0 && c.direct {
				t.Fatalf("nothing told before the flipped chunk: the test shows nothing")
			}
			if _, ok := tr.Lookup("b"); ok {
				t.Fatal("the corrupt record is still in the index")
			}
		})
	}
}

// A read that fails on the record (corrupt) drops it and says so
// (ErrDropped); one that fails otherwise (its context ended waiting for
// a turn) leaves the record and must not say so: a node that reported
// such a record gone made the master forget a record still on disk,
// which a master restarted later re-added over a newer put of the key.
func TestReadErrDropped(t *testing.T) {
	tr := open(t, Config{Dir: t.TempDir(), Capacity: 64 << 20, IOConcurrency: 1})
	mustWrite(t, tr, "k", 1, 10_000)
	for range cap(tr.sem) {
		tr.sem <- struct{}{} // every turn taken
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := tr.Read(ctx, "k", 1, make([]byte, 10_000))
	if err == nil || errors.Is(err, ErrDropped) {
		t.Fatalf("read with no turn before its deadline: %v, want an error that is not ErrDropped", err)
	}
	for range cap(tr.sem) {
		<-tr.sem
	}
	if _, ok := tr.Lookup("k"); !ok {
		t.Fatal("a read that timed out waiting for a turn dropped the record")
	}
	tr.mu.Lock()
	e := tr.index["k"]
	tr.mu.Unlock()
	flip(t, e.file.path, int64(e.off+e.valueOff())+5)
	if _, err := tr.Read(context.Background(), "k", 1, make([]byte, 10_000)); !errors.Is(err, ErrDropped) || !errors.Is(err, ErrCorrupt) {
		t.Fatalf("read of a corrupt record: %v, want ErrCorrupt and ErrDropped", err)
	}
}
