package tier

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// checkGone fails unless key is neither listed, looked up nor readable.
func checkGone(t *testing.T, tr *Tier, key string) {
	t.Helper()
	for _, r := range tr.Records() {
		if r.Key == key {
			t.Fatalf("removed %q listed by Records: %+v", key, r)
		}
	}
	if r, ok := tr.Lookup(key); ok {
		t.Fatalf("removed %q found by Lookup: %+v", key, r)
	}
	if _, err := tr.Read(context.Background(), key, 0, make([]byte, 1<<20)); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Read of removed %q: %v, want ErrNotFound", key, err)
	}
}

func dropLogSize(t *testing.T, dir string) int64 {
	t.Helper()
	st, err := os.Stat(filepath.Join(dir, dropLogName))
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

// A record removed stays removed across a Close and an Open, in a file
// with other records and in one it emptied; the others read back exact.
// A directory never removed from gets no drop log.
func TestRemoveSurvivesReopen(t *testing.T) {
	dir := t.TempDir()
	tr := open(t, Config{Dir: dir, Capacity: 64 << 20, MaxFileRecords: 2})
	want := map[string][]byte{}
	for i := range 7 {
		k := fmt.Sprintf("k%d", i)
		want[k] = mustWrite(t, tr, k, uint64(10+i), 3000+i*4096)
	}
	tr.Close()
	tr = open(t, Config{Dir: dir, Capacity: 64 << 20, MaxFileRecords: 2})
	if _, err := os.Stat(filepath.Join(dir, dropLogName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a tier nothing was removed from has a drop log: %v", err)
	}
	// k1 shares its file with k0; k2 and k3 fill one file, which goes.
	for _, k := range []string{"k1", "k2", "k3"} {
		if !tr.Remove(k, 0) {
			t.Fatalf("Remove %q: false", k)
		}
		delete(want, k)
	}
	if tr.Remove("k4", 99) {
		t.Fatal("Remove of another version: true")
	}
	s := tr.Stats()
	if s.Removed != 3 || s.DropLogEntries != 3 {
		t.Fatalf("stats: %d removed, %d drop log entries; want 3 and 3", s.Removed, s.DropLogEntries)
	}
	used := s.Used
	tr.Close()
	log, lb := testLogger()
	tr = open(t, Config{Dir: dir, Capacity: 64 << 20, MaxFileRecords: 2, Logger: log})
	for _, k := range []string{"k1", "k2", "k3"} {
		checkGone(t, tr, k)
	}
	for k, v := range want {
		var ver uint64
		fmt.Sscanf(k, "k%d", &ver)
		mustRead(t, tr, k, 10+ver, v)
	}
	s = tr.Stats()
	if s.Records != len(want) || s.Used != used || s.Dropped != 0 {
		t.Fatalf("after reopen: %d records, %d used, %d dropped; want %d records, %d used (the emptied file gone, k1's space dead), none dropped", s.Records, s.Used, s.Dropped, len(want), used)
	}
	// k2 and k3's file is gone, so only k1's drop is still needed.
	if s.DropLogEntries != 1 {
		t.Fatalf("drop log: %d entries after reopen, want 1 (k1's)\n%s", s.DropLogEntries, lb)
	}
	// A record removed then written again is a new record.
	v := mustWrite(t, tr, "k1", 11, 777)
	mustRead(t, tr, "k1", 11, v)
}

// Writes after a drop survive it, whatever their version: a newer one (a
// re-put), the same one (the master writing the object again), an older
// one arriving late. A superseded older record does not come back when
// the newer one is removed.
func TestRemoveThenWriteAgain(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Dir: dir, Capacity: 64 << 20, MaxFileRecords: 3}
	tr := open(t, cfg)
	mustWrite(t, tr, "reput", 1, 5000)
	mustWrite(t, tr, "same", 5, 100)
	mustWrite(t, tr, "late", 5, 100)
	mustWrite(t, tr, "superseded", 1, 6000)
	mustWrite(t, tr, "superseded", 2, 7000)
	for _, r := range []Removal{{"reput", 1}, {"same", 5}, {"late", 5}, {"superseded", 2}} {
		if !tr.Remove(r.Key, r.Version) {
			t.Fatalf("Remove %+v: false", r)
		}
	}
	want := map[string]struct {
		version uint64
		v       []byte
	}{}
	add := func(k string, version uint64, n int) {
		want[k] = struct {
			version uint64
			v       []byte
		}{version, mustWrite(t, tr, k, version, n)}
	}
	add("reput", 2, 9000)
	add("same", 5, 12_000)
	add("late", 3, 300)
	check := func(tr *Tier) {
		t.Helper()
		for k, w := range want {
			mustRead(t, tr, k, w.version, w.v)
		}
		checkGone(t, tr, "superseded")
		if n := len(tr.Records()); n != len(want) {
			t.Fatalf("%d records, want %d", n, len(want))
		}
	}
	check(tr)
	tr.Close()
	tr = open(t, cfg)
	check(tr)
	tr.Close()
	// Twice: the compacted log must say the same.
	check(open(t, cfg))
}

// RemoveAll drops what matches (a version, or any with 0), each record
// once, and makes them all durable with one fdatasync.
func TestRemoveAllOneSync(t *testing.T) {
	fs := &faults{}
	dir := t.TempDir()
	tr := open(t, Config{Dir: dir, Capacity: 1 << 20, openFile: fs.open})
	for _, k := range []string{"a", "b", "c", "d", "e"} {
		mustWrite(t, tr, k, 3, 100)
	}
	var syncs int
	fs.set(func(f *faults) { syncs = f.syncs })
	n := tr.RemoveAll([]Removal{{"a", 3}, {"b", 0}, {"a", 3}, {"missing", 0}, {"c", 2}, {"d", 0}})
	fs.set(func(f *faults) { syncs = f.syncs - syncs })
	if n != 3 || syncs != 1 {
		t.Fatalf("RemoveAll: %d dropped with %d syncs; want 3 (a, b, d) with 1", n, syncs)
	}
	if s := tr.Stats(); s.Removed != 3 || s.DropLogEntries != 3 || s.Records != 2 {
		t.Fatalf("stats: %d removed, %d drop log entries, %d records; want 3, 3, 2", s.Removed, s.DropLogEntries, s.Records)
	}
	tr.Close()
	tr = open(t, Config{Dir: dir, Capacity: 1 << 20})
	for _, k := range []string{"a", "b", "d"} {
		checkGone(t, tr, k)
	}
	mustRead(t, tr, "c", 3, value("c", 3, 100))
	mustRead(t, tr, "e", 3, value("e", 3, 100))
}

// A drop outlives the file it was made in when it still covers an older
// record elsewhere; files created after a restart must be numbered past
// the position it names, or what they hold would be taken for records
// written before the drop and left out at the next Open.
func TestDropOutlivesItsFile(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Dir: dir, Capacity: 64 << 20, MaxFileRecords: 2}
	tr := open(t, cfg)
	mustWrite(t, tr, "k", 1, 100)
	x := mustWrite(t, tr, "x", 1, 100) // keeps the first file, and k's old record, on disk
	mustWrite(t, tr, "k", 2, 100)      // the second file
	if !tr.Remove("k", 2) {
		t.Fatal("Remove: false")
	}
	tr.Close()
	// The second file, emptied, goes at this Open; the drop stays for
	// k's first record. The Open after it finds no file as new as the
	// drop.
	open(t, cfg).Close()
	tr = open(t, cfg)
	if s := tr.Stats(); s.Files != 1 || s.DropLogEntries != 1 {
		t.Fatalf("after reopen: %d files, %d drop log entries; want 1 and 1", s.Files, s.DropLogEntries)
	}
	v := mustWrite(t, tr, "k", 2, 5000)
	tr.Close()
	tr = open(t, cfg)
	mustRead(t, tr, "k", 2, v)
	mustRead(t, tr, "x", 1, x)
}

// Writers (new versions, the same version again, older ones) and
// removers at once: what a reopened tier finds is exactly what the tier
// listed before it closed, byte-exact. (No eviction here: a file evicted
// with a newer record in it can leave an older one of the key, written
// later, to a restart, which is the master's to judge by version.)
func TestConcurrentRemovesAgreeWithRestart(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Dir: dir, Capacity: 1 << 30, MaxFileRecords: 5}
	tr := open(t, cfg)
	var next atomic.Uint64
	var wg, removers sync.WaitGroup
	done := make(chan struct{})
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 120 {
				k := fmt.Sprintf("k%d", (w*7+i)%20)
				v := next.Add(1)
				switch r, ok := tr.Lookup(k); {
				case ok && i%5 == 0:
					v = r.Version // written again
				case ok && i%7 == 0 && r.Version > 1:
					v = r.Version - 1 // an older one, late
				}
				if err := tr.Write(context.Background(), k, v, value(k, v, 100+i*37)); err != nil {
					t.Errorf("Write: %v", err)
					return
				}
			}
		}()
	}
	// Removers until the writers are done, taking turns with them.
	for w := range 2 {
		removers.Add(1)
		go func() {
			defer removers.Done()
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				case <-time.After(200 * time.Microsecond):
				}
				k := fmt.Sprintf("k%d", (w*11+i*3)%20)
				if i%2 == 0 {
					tr.Remove(k, 0)
					continue
				}
				var rs []Removal
				for j := range 3 {
					kj := fmt.Sprintf("k%d", (w+i+j*5)%20)
					if r, ok := tr.Lookup(kj); ok {
						rs = append(rs, Removal{kj, r.Version})
					}
				}
				tr.RemoveAll(rs)
			}
		}()
	}
	wg.Wait()
	close(done)
	removers.Wait()
	sorted := func(rs []Record) []Record {
		slices.SortFunc(rs, func(a, b Record) int { return strings.Compare(a.Key, b.Key) })
		return rs
	}
	before := sorted(tr.Records())
	if s := tr.Stats(); s.Removed == 0 || len(before) == 0 {
		t.Fatalf("%d removed, %d records left: the test exercised nothing", s.Removed, len(before))
	}
	tr.Close()
	tr = open(t, cfg)
	after := sorted(tr.Records())
	if !slices.Equal(before, after) {
		t.Fatalf("records before the restart:\n%v\nafter:\n%v", before, after)
	}
	dst := make([]byte, 1<<20)
	for _, r := range after {
		rec, err := tr.Read(context.Background(), r.Key, r.Version, dst)
		if err != nil || !bytes.Equal(dst[:rec.Size], value(r.Key, r.Version, int(r.Size))) {
			t.Fatalf("Read %+v after the restart: %v", r, err)
		}
	}
}

// dropChildEnv carries the directory to the child of TestRemoveSurvivesSIGKILL.
const dropChildEnv = "MC_TIER_DROP_CHILD_DIR"

// TestDropKillChild is the child process of TestRemoveSurvivesSIGKILL: it
// writes and removes records, says so once each call has returned, and
// waits to be killed without closing the tier.
func TestDropKillChild(t *testing.T) {
	dir := os.Getenv(dropChildEnv)
	if dir == "" {
		t.Skip("the child process of TestRemoveSurvivesSIGKILL")
	}
	tr, err := Open(Config{Dir: dir, Capacity: 64 << 20, MaxFileRecords: 3})
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(2)
	}
	write := func(k string, version uint64, n int) {
		if err := tr.Write(context.Background(), k, version, value(k, version, n)); err != nil {
			fmt.Println("write:", err)
			os.Exit(2)
		}
	}
	for i := range 8 {
		write(fmt.Sprintf("k%d", i), 1, 2000+i*3000)
	}
	if n := tr.RemoveAll([]Removal{{"k2", 1}, {"k5", 0}, {"k6", 1}}); n != 3 {
		fmt.Println("RemoveAll:", n)
		os.Exit(2)
	}
	if !tr.Remove("k7", 1) {
		fmt.Println("Remove k7: false")
		os.Exit(2)
	}
	write("k5", 2, 4321)
	fmt.Println("done")
	time.Sleep(time.Minute)
	os.Exit(3)
}

// A node killed (SIGKILL, no Close) after removing records: the restarted
// tier has none of them, and the rest, and a key written again after its
// removal, byte-exact.
func TestRemoveSurvivesSIGKILL(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestDropKillChild$", "-test.v=false")
	cmd.Env = append(os.Environ(), dropChildEnv+"="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.AfterFunc(60*time.Second, func() { cmd.Process.Kill() })
	line, _ := bufio.NewReader(out).ReadString('\n')
	deadline.Stop()
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	if strings.TrimSpace(line) != "done" {
		t.Fatalf("child: %q\n%s", line, stderr.String())
	}
	tr := open(t, Config{Dir: dir, Capacity: 64 << 20, MaxFileRecords: 3})
	for _, k := range []string{"k2", "k6", "k7"} {
		checkGone(t, tr, k)
	}
	for _, i := range []int{0, 1, 3, 4} {
		k := fmt.Sprintf("k%d", i)
		mustRead(t, tr, k, 1, value(k, 1, 2000+i*3000))
	}
	mustRead(t, tr, "k5", 2, value("k5", 2, 4321))
	if n := len(tr.Records()); n != 5 {
		t.Fatalf("%d records after the kill, want 5", n)
	}
}

// Drops whose records went with their files (evicted, or emptied by
// removals) leave the drop log at the next Open: after many it holds
// only the drops of records still on disk.
func TestDropLogCompactedAtOpen(t *testing.T) {
	dir := t.TempDir()
	rec := recordLen(len("k000"), 3000)
	cfg := Config{Dir: dir, Capacity: 8 * rec, MaxFileRecords: 2}
	tr := open(t, cfg)
	removed := map[string]bool{}
	for i := range 200 {
		k := fmt.Sprintf("k%03d", i)
		mustWrite(t, tr, k, 1, 3000)
		// Every third record is removed at once, every third a little
		// later; the rest go with their file's eviction.
		if i%3 == 0 {
			tr.Remove(k, 1)
			removed[k] = true
		}
		if j := i - 1; j%3 == 1 {
			k := fmt.Sprintf("k%03d", j)
			if tr.Remove(k, 1) {
				removed[k] = true
			}
		}
	}
	grown := dropLogSize(t, dir)
	if s := tr.Stats(); s.Removed < 100 || s.EvictedFiles == 0 || grown < int64(s.Removed)*(dropHeaderLen+4) {
		t.Fatalf("stats %+v, drop log of %d bytes: want over 100 removed, files evicted, an entry per removal", s, grown)
	}
	tr.Close()
	tr = open(t, cfg)
	s := tr.Stats()
	// At most one entry per record on disk: 8 fit.
	if s.DropLogEntries > 8 || dropLogSize(t, dir) != int64(s.DropLogEntries)*(dropHeaderLen+4) {
		t.Fatalf("after reopen: %d drop log entries, %d bytes (was %d); want at most 8, 40 bytes each", s.DropLogEntries, dropLogSize(t, dir), grown)
	}
	for k := range removed {
		checkGone(t, tr, k)
	}
	for _, r := range tr.Records() {
		mustRead(t, tr, r.Key, 1, value(r.Key, 1, 3000))
	}
	tr.Close()
	// Compacted already: the next Open keeps it as it is.
	size := dropLogSize(t, dir)
	tr = open(t, cfg)
	if got := dropLogSize(t, dir); got != size {
		t.Fatalf("drop log %d bytes after a second reopen, %d after the first", got, size)
	}
	for k := range removed {
		checkGone(t, tr, k)
	}
}

// A tier that runs long compacts its drop log itself once it has grown:
// it never holds much more than the drops of records on disk.
func TestDropLogCompactedLive(t *testing.T) {
	dir := t.TempDir()
	rec := recordLen(len("k0000"), 1000)
	log, lb := testLogger()
	cfg := Config{Dir: dir, Capacity: 6 * rec, MaxFileRecords: 2, dropCompactBytes: 1000, Logger: log}
	tr := open(t, cfg)
	peak := int64(0)
	for i := range 400 {
		k := fmt.Sprintf("k%04d", i)
		mustWrite(t, tr, k, 1, 1000)
		if !tr.Remove(k, 1) {
			t.Fatalf("Remove %q: false", k)
		}
		peak = max(peak, dropLogSize(t, dir))
	}
	// Entries of 41 bytes: 1000 bytes of them, doubled, and what the
	// files on disk still hold.
	if peak > 2*1000+6*41 || !strings.Contains(lb.String(), "drop log compacted") {
		t.Fatalf("drop log peaked at %d bytes over 400 removals; log:\n%s", peak, lb)
	}
	for i := range 400 {
		checkGone(t, tr, fmt.Sprintf("k%04d", i))
	}
	tr.Close()
	tr = open(t, cfg)
	if s := tr.Stats(); s.Records != 0 || s.DropLogEntries > 6 {
		t.Fatalf("after reopen: %d records, %d drop log entries; want none, at most 6", s.Records, s.DropLogEntries)
	}
}

// A drop log cut inside its last entry (a crash while appending): the
// whole entries before it hold, the torn bytes are logged and left out
// of the rewritten log. A corrupt entry in the middle is skipped with a
// log line: its drop is lost (its record is back), the entries after it
// hold.
func TestDropLogTornAndCorrupt(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Dir: dir, Capacity: 64 << 20}
	tr := open(t, cfg)
	for _, k := range []string{"a", "b", "c", "d"} {
		mustWrite(t, tr, k, 1, 5000)
	}
	for _, k := range []string{"a", "b", "c"} {
		tr.Remove(k, 1)
	}
	tr.Close()
	path := filepath.Join(dir, dropLogName)
	whole, _ := os.ReadFile(path)
	// A fourth entry, torn.
	torn := appendDrop(nil, dropEntry{key: "d", version: 1, at: pos{0, 1 << 20}})
	os.WriteFile(path, append(slices.Clone(whole), torn[:len(torn)-3]...), 0o644)
	log, lb := testLogger()
	tr = open(t, Config{Dir: dir, Capacity: 64 << 20, Logger: log})
	for _, k := range []string{"a", "b", "c"} {
		checkGone(t, tr, k)
	}
	mustRead(t, tr, "d", 1, value("d", 1, 5000))
	if !strings.Contains(lb.String(), fmt.Sprintf("bytes [%d, %d) at its end hold no whole entry", len(whole), len(whole)+len(torn)-3)) || !strings.Contains(lb.String(), "a torn append, ignored") {
		t.Fatalf("no log line for the torn entry:\n%s", lb)
	}
	tr.Close()
	if got, _ := os.ReadFile(path); !bytes.Equal(got, whole) {
		t.Fatalf("drop log after the torn append: %d bytes, want the %d of its whole entries", len(got), len(whole))
	}

	// Flip a byte of b's entry (the second: each is 37 bytes).
	flip(t, path, dropHeaderLen+1+10)
	log, lb = testLogger()
	tr = open(t, Config{Dir: dir, Capacity: 64 << 20, Logger: log})
	checkGone(t, tr, "a")
	checkGone(t, tr, "c")
	mustRead(t, tr, "b", 1, value("b", 1, 5000))
	if !strings.Contains(lb.String(), "bytes [37, 74) hold no valid entry") || !strings.Contains(lb.String(), "corrupt, skipped") {
		t.Fatalf("no log line for the corrupt entry:\n%s", lb)
	}
	if s := tr.Stats(); s.DropLogEntries != 2 || dropLogSize(t, dir) != 2*37 {
		t.Fatalf("drop log: %d entries, %d bytes; want a's and c's, rewritten", s.DropLogEntries, dropLogSize(t, dir))
	}
}

// A drop log that cannot be rewritten at Open (its compaction fails) is
// kept as it is: the tier opens, its drops hold, and the next removal
// goes over the torn tail instead of after it.
func TestDropLogRewriteFailsAtOpen(t *testing.T) {
	dir := t.TempDir()
	tr := open(t, Config{Dir: dir, Capacity: 1 << 20})
	for _, k := range []string{"a", "b", "c"} {
		mustWrite(t, tr, k, 1, 100)
	}
	tr.Remove("a", 1)
	tr.Close()
	path := filepath.Join(dir, dropLogName)
	whole, _ := os.ReadFile(path)
	torn := appendDrop(nil, dropEntry{key: "c", version: 1, at: pos{0, 1 << 20}})
	os.WriteFile(path, append(slices.Clone(whole), torn[:20]...), 0o644)
	fs := &faults{}
	fs.set(func(f *faults) { f.syncErr = errInjected })
	log, lb := testLogger()
	tr = open(t, Config{Dir: dir, Capacity: 1 << 20, openFile: fs.open, Logger: log})
	checkGone(t, tr, "a")
	if !strings.Contains(lb.String(), "drop log not compacted") {
		t.Fatalf("no log line for the failed rewrite:\n%s", lb)
	}
	fs.set(func(f *faults) { f.syncErr = nil })
	if !tr.Remove("b", 1) {
		t.Fatal("Remove b: false")
	}
	tr.Close()
	log, lb = testLogger()
	tr = open(t, Config{Dir: dir, Capacity: 1 << 20, Logger: log})
	checkGone(t, tr, "a")
	checkGone(t, tr, "b")
	mustRead(t, tr, "c", 1, value("c", 1, 100))
	if strings.Contains(lb.String(), "torn") || strings.Contains(lb.String(), "corrupt") {
		t.Fatalf("the torn tail outlived the next append:\n%s", lb)
	}
}

// A drop log that cannot be written: Remove drops nothing (what the tier
// reports stays what a restart would find), says so, and works again
// once the disk does.
func TestRemoveWhenDropLogFails(t *testing.T) {
	fs := &faults{}
	dir := t.TempDir()
	log, lb := testLogger()
	tr := open(t, Config{Dir: dir, Capacity: 1 << 20, openFile: fs.open, Logger: log})
	v := mustWrite(t, tr, "a", 1, 100)
	fs.set(func(f *faults) { f.syncErr = errInjected })
	if tr.Remove("a", 1) {
		t.Fatal("Remove with a failing drop log: true")
	}
	mustRead(t, tr, "a", 1, v)
	if s := tr.Stats(); s.DropLogErrors != 1 || s.Removed != 0 || !strings.Contains(lb.String(), "records not removed") {
		t.Fatalf("stats %+v; log:\n%s", s, lb)
	}
	fs.set(func(f *faults) { f.syncErr = nil })
	if !tr.Remove("a", 1) {
		t.Fatal("Remove after the disk recovered: false")
	}
	tr.Close()
	checkGone(t, open(t, Config{Dir: dir, Capacity: 1 << 20}), "a")
	if tr.Remove("a", 0) {
		t.Fatal("Remove after Close: true")
	}
}

// The entry layout, byte by byte (droplog.go).
func TestDropEntryEncoding(t *testing.T) {
	d := dropEntry{key: "key", version: 0x0102030405060708, at: pos{seq: 9, off: 0x2000}}
	got := appendDrop(nil, d)
	want := "4d434431" + "03000000" + "0807060504030201" + "0900000000000000" + "0020000000000000"
	if h := hex.EncodeToString(got); len(got) != dropHeaderLen+3 || !strings.HasPrefix(h, want) || !strings.HasSuffix(h, hex.EncodeToString([]byte("key"))) {
		t.Fatalf("encoded %s, want %s + crc + 6b6579", h, want)
	}
	back, n, err := decodeDrop(got)
	if err != nil || n != len(got) || back != d {
		t.Fatalf("decode: %+v %d %v", back, n, err)
	}
	for i := range got {
		b := slices.Clone(got)
		b[i] ^= 0x10
		if _, _, err := decodeDrop(b); err == nil {
			t.Fatalf("a flipped byte %d decodes", i)
		}
	}
	for _, tc := range []struct {
		name string
		b    []byte
		want error
	}{
		{"short", got[:20], errDropShort},
		{"cut key", got[:len(got)-1], errDropShort},
		{"magic", append([]byte("MCT1"), got[4:]...), errDropMagic},
	} {
		if _, _, err := decodeDrop(tc.b); err != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}

// FuzzDecodeDrops feeds arbitrary bytes to the drop log decoder (what
// Open reads back after a crash or a flipped bit): it must not panic,
// must account for every byte (each entry re-encodes to exactly the
// bytes it came from, the spans it skipped cover the rest and wrap
// ErrCorrupt), must read what follows whole entries the same, and what
// it returns must encode and decode back to itself. Seeds
// (testdata/fuzz/FuzzDecodeDrops): whole logs (one entry, three, none),
// a last entry torn in its key and in its header, a flipped middle
// entry, a key length past the end, a bare magic, garbage with magics.
func FuzzDecodeDrops(f *testing.F) {
	valid := appendDrop(appendDrop(nil, dropEntry{key: "k", version: 1, at: pos{0, 4096}}), dropEntry{key: "other", version: 7, at: pos{3, 0}})
	f.Add(valid)
	f.Add(valid[:len(valid)-2])
	f.Fuzz(func(t *testing.T, b []byte) {
		ents, bad := decodeDrops(b)
		off, si := 0, 0
		skip := func() {
			for si < len(bad) && bad[si].from == off {
				s := bad[si]
				if s.to <= s.from || s.to > len(b) || !errors.Is(s.err, ErrCorrupt) {
					t.Fatalf("span %+v of %d bytes", s, len(b))
				}
				if si > 0 && bad[si-1].to == s.from {
					t.Fatalf("adjacent spans %+v %+v", bad[si-1], s)
				}
				off = s.to
				si++
			}
		}
		for _, d := range ents {
			skip()
			enc := appendDrop(nil, d)
			if !bytes.HasPrefix(b[off:], enc) {
				t.Fatalf("entry %+v does not re-encode to the bytes at %d", d, off)
			}
			off += len(enc)
		}
		skip()
		if off != len(b) || si != len(bad) {
			t.Fatalf("entries and spans cover %d of %d bytes (%d of %d spans)", off, len(b), si, len(bad))
		}
		after, bad2 := decodeDrops(append(slices.Clone(valid), b...))
		if len(after) != 2+len(ents) || len(bad2) != len(bad) || !slices.Equal(after[2:], ents) {
			t.Fatalf("behind two whole entries: %d entries, %d spans; alone %d and %d", len(after), len(bad2), len(ents), len(bad))
		}
		var enc []byte
		for _, d := range ents {
			enc = appendDrop(enc, d)
		}
		again, bad3 := decodeDrops(enc)
		if len(bad3) != 0 || !slices.Equal(again, ents) {
			t.Fatalf("re-encoded entries decode to %d entries, %d spans; want %d, none", len(again), len(bad3), len(ents))
		}
	})
}
