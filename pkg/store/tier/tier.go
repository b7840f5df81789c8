// Package tier is a store node's disk tier: values offloaded from DRAM,
// kept in append-only data files under one directory (Mooncake's bucket
// backend is the model: files of up to 256 MiB or 500 records, rescanned
// after a restart). It knows nothing of the master: it stores, reads and
// drops records named by key and version, and says which ones it dropped
// to make room.
//
// Each record carries its key, size, object version and a CRC32C of the
// value (record.go); the index is in memory only and is rebuilt by
// scanning the files at Open, where a torn or corrupt record fails its
// checksum and is dropped with a log line. Reads verify the checksum again
// before a byte reaches the caller's buffer. Writes and reads use O_DIRECT
// with aligned buffers where the filesystem allows (not tmpfs, say): the
// page cache would otherwise hold a second copy of what the node evicted
// from DRAM. Writes go through one writer that appends and fsyncs in
// groups (a Write returns once its record is durable); reads run at most
// Config.IOConcurrency at a time. When a write needs room the tier evicts
// whole files, oldest first, and reports their records through
// Config.OnEvict. A lock file (flock) keeps a second node off the same
// directory.
//
// A removed record's bytes stay in its file until the file goes, so
// Remove first appends the drop to a small drop log (file DROPS,
// droplog.go: key, version, the append position at the time, CRC32C;
// fdatasync'd before Remove returns), which the scan at Open applies: a
// record removed is never found again, restart or crash, while one
// written after the drop is kept. Without it a node would report removed
// records after a restart, and a master that has forgotten the removal
// (restarted without HA) would bring the key back. The log holds only
// drops of records still on disk: Open rewrites it without the others
// (atomically: a temporary file, fsync, rename, directory fsync), as
// does a Remove that finds it doubled since its last compaction.
//
// Main type: Tier (Open, Write, Read, Remove, RemoveAll, Records, Stats,
// Close).
package tier

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Defaults for Config.
const (
	DefaultMaxFileBytes   = 256 << 20
	DefaultMaxFileRecords = 500
	DefaultIOConcurrency  = 4
)

// Errors callers branch on (wrapped with details).
var (
	// ErrNotFound: no record of that key (and version) is on disk.
	ErrNotFound = errors.New("not in the disk tier")
	// ErrFull: no room for the record even after evicting what could be
	// evicted (or the filesystem itself ran out of space).
	ErrFull = errors.New("disk tier full")
	// ErrCorrupt: the bytes on disk are not the record written (a
	// checksum failed); the record has been dropped.
	ErrCorrupt = errors.New("corrupt record")
	// ErrLocked: another process holds the directory.
	ErrLocked = errors.New("directory in use by another node")
	// ErrClosed: the tier was closed.
	ErrClosed = errors.New("disk tier closed")
	// ErrDropped: a read failed on the record itself (corrupt, an I/O
	// error) and the record has been dropped from the tier. A read that
	// failed otherwise (its context ended waiting for a turn, the tier
	// closed) left the record as it was.
	ErrDropped = errors.New("record dropped")
)

// Config configures a Tier.
type Config struct {
	// Dir holds the data files; it must exist and be writable.
	Dir string
	// Capacity bounds the bytes of the data files (records are padded
	// to BlockSize, dead records count until their file goes).
	Capacity uint64
	// MaxFileBytes and MaxFileRecords close a data file and start the
	// next (256 MiB, 500 records). A larger record gets a file of its own.
	MaxFileBytes   uint64
	MaxFileRecords int
	// IOConcurrency bounds the reads in flight and the files scanned at
	// once at Open (4).
	IOConcurrency int
	// OnEvict receives the records of files the tier deleted to make
	// room, before the Write that needed the room returns. It runs on
	// the writer: it must not call Write.
	OnEvict func([]Record)
	Logger  *slog.Logger

	openFile openFunc // tests inject faults here
	// sysfs is where the kernel's settings are read ("/sys"; tests give
	// fixture trees).
	sysfs string
	// dropCompactBytes: defaultDropCompactBytes (tests make it small).
	dropCompactBytes int64
}

// Stats is a snapshot of a Tier's state and counters.
type Stats struct {
	Dir      string
	ID       string
	Direct   bool // O_DIRECT in use
	Capacity uint64
	Used     uint64 // bytes of the data files
	Records  int
	Files    int
	// Counters since Open.
	Writes, WriteBytes uint64
	Reads, ReadBytes   uint64
	// ReadsInPlace counts the reads whose value went straight into the
	// caller's buffer (no bounce buffer, no copy): all of them without
	// O_DIRECT, and with it, where the kernel gives no huge pages (the
	// bounce buffers' are faster: readRecord), those of values on a
	// block (64 KiB and up) into block-aligned memory, as staging ranges
	// are.
	ReadsInPlace uint64
	// HugePages: O_DIRECT reads go through bounce buffers on huge pages.
	HugePages bool
	// Full counts writes refused for want of room.
	Full uint64
	// EvictedFiles and EvictedRecords count what eviction deleted.
	EvictedFiles, EvictedRecords uint64
	// Dropped counts records found torn or corrupt (at the scan or on a
	// read) and dropped; ReadErrors reads that failed on I/O.
	Dropped, ReadErrors uint64
	// Removed counts records Remove dropped (each made durable in the
	// drop log first); DropLogErrors the Remove calls that dropped
	// nothing because the drop log could not be written.
	Removed, DropLogErrors uint64
	// DropLogEntries is the drop log's length in entries now.
	DropLogEntries int
}

// Tier is an open disk tier. Its methods are safe for concurrent use.
type Tier struct {
	cfg    Config
	log    *slog.Logger
	open   openFunc
	direct bool
	// hugeBounce: O_DIRECT reads bounce through huge pages (readRecord).
	hugeBounce bool
	id         string
	lock       *os.File

	mu      sync.Mutex
	index   map[string]*entry
	files   []*dataFile // oldest first
	used    uint64
	nextSeq uint64

	// The writer goroutine's own: the file being appended to.
	cur   *dataFile
	curFD file

	writes chan *writeReq
	sem    chan struct{}
	rbufs  *readBufs

	ops     sync.RWMutex // held shared by calls, exclusively by Close
	closed  atomic.Bool
	stop    chan struct{}
	stopped chan struct{}

	nWrites, nWriteBytes, nReads, nReadBytes   atomic.Uint64
	nInPlace                                   atomic.Uint64
	nFull, nEvFiles, nEvRecs, nDropped, nRdErr atomic.Uint64

	// The drop log (droplog.go). dropMu orders removals: taken before mu,
	// and held across the log's fdatasync so that mu is not.
	dropMu                   sync.Mutex
	drops                    *dropLog
	nRemoved, nDropLogErrors atomic.Uint64
	nDropLog                 atomic.Int64
}

// dataFile is one append-only file, named by its sequence number (which
// orders files oldest first, across restarts too).
type dataFile struct {
	seq     uint64
	path    string
	size    uint64 // bytes written or reserved, a multiple of BlockSize
	nrec    int
	live    int // index entries that point here
	entries []*entry
	sealed  bool // no more appends: may be evicted or deleted

	// The file's read descriptor, opened on the first read and shared by
	// the reads after it (an open per read cost as much as a tenth of a
	// 1 MiB read); closed when the file is gone and no read holds it.
	rmu  sync.Mutex
	rfd  file
	refs int
	gone bool
}

// reader returns f's read descriptor, holding it until done; ok is false
// when the file has been deleted.
func (t *Tier) reader(f *dataFile) (fd file, done func(), ok bool, err error) {
	f.rmu.Lock()
	defer f.rmu.Unlock()
	if f.gone {
		return nil, nil, false, nil
	}
	if f.rfd == nil {
		if f.rfd, err = t.open(f.path, os.O_RDONLY, t.direct); err != nil {
			f.rfd = nil
			if errors.Is(err, os.ErrNotExist) {
				return nil, nil, false, nil
			}
			return nil, nil, false, err
		}
	}
	f.refs++
	return f.rfd, func() {
		f.rmu.Lock()
		defer f.rmu.Unlock()
		if f.refs--; f.refs == 0 && f.gone && f.rfd != nil {
			f.rfd.Close()
			f.rfd = nil
		}
	}, true, nil
}

// retire marks f deleted: its read descriptor closes once no read holds
// it (a read under way finishes on it; the data stays until then).
func (f *dataFile) retire() {
	f.rmu.Lock()
	defer f.rmu.Unlock()
	f.gone = true
	if f.refs == 0 && f.rfd != nil {
		f.rfd.Close()
		f.rfd = nil
	}
}

// entry is the index's record of where a value is.
type entry struct {
	Record
	file    *dataFile
	off     uint64
	len     uint64 // recordLen
	crc     uint32 // the value's CRC32C, as its header says
	aligned bool   // MCT2: the value starts on a block
}

// valueOff is where e's value starts, from the record's start.
func (e *entry) valueOff() uint64 { return valueOff(len(e.Key), e.aligned) }

const (
	dataSuffix = ".mct"
	lockName   = "LOCK"
	idName     = "TIER_ID"
)

func dataName(seq uint64) string { return fmt.Sprintf("%016x%s", seq, dataSuffix) }

func parseDataName(name string) (uint64, bool) {
	s, ok := strings.CutSuffix(name, dataSuffix)
	if !ok || len(s) != 16 {
		return 0, false
	}
	seq, err := strconv.ParseUint(s, 16, 64)
	return seq, err == nil
}

// Open locks dir, scans its data files into the index (dropping torn and
// corrupt records) and starts the writer.
func Open(cfg Config) (*Tier, error) {
	if cfg.Dir == "" {
		return nil, errors.New("disk tier: no directory given")
	}
	if cfg.MaxFileBytes == 0 {
		cfg.MaxFileBytes = DefaultMaxFileBytes
	}
	if cfg.MaxFileRecords <= 0 {
		cfg.MaxFileRecords = DefaultMaxFileRecords
	}
	if cfg.IOConcurrency <= 0 {
		cfg.IOConcurrency = DefaultIOConcurrency
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.sysfs == "" {
		cfg.sysfs = "/sys"
	}
	if cfg.dropCompactBytes <= 0 {
		cfg.dropCompactBytes = defaultDropCompactBytes
	}
	t := &Tier{
		cfg: cfg, log: cfg.Logger, open: cfg.openFile, index: make(map[string]*entry),
		writes: make(chan *writeReq, 256), sem: make(chan struct{}, cfg.IOConcurrency),
		rbufs: newReadBufs(cfg.IOConcurrency * chunksInFlight),
		stop:  make(chan struct{}), stopped: make(chan struct{}),
	}
	if t.open == nil {
		t.open = openOS
	}
	st, err := os.Stat(cfg.Dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("disk tier %q: directory does not exist", cfg.Dir)
	case err != nil:
		return nil, fmt.Errorf("disk tier %q: %w", cfg.Dir, err)
	case !st.IsDir():
		return nil, fmt.Errorf("disk tier %q: not a directory", cfg.Dir)
	case cfg.Capacity == 0:
		return nil, fmt.Errorf("disk tier %q: capacity 0", cfg.Dir)
	}
	if err := t.takeLock(); err != nil {
		return nil, err
	}
	fail := func(err error) (*Tier, error) {
		t.lock.Close()
		return nil, err
	}
	t.hugeBounce = hugePagesOn(cfg.sysfs)
	if t.direct, err = probeDirect(cfg.Dir, t.open); err != nil {
		return fail(fmt.Errorf("disk tier %q is not writable: %w", cfg.Dir, err))
	}
	if !t.direct {
		t.log.Info(fmt.Sprintf("disk tier %s: the filesystem refuses O_DIRECT (tmpfs?); using buffered I/O with fdatasync", cfg.Dir))
	}
	if t.id, err = loadID(cfg.Dir); err != nil {
		return fail(fmt.Errorf("disk tier %q: %w", cfg.Dir, err))
	}
	if err := t.scan(); err != nil {
		return fail(err)
	}
	go t.writer()
	s := t.Stats()
	t.log.Info(fmt.Sprintf("disk tier %s (id %s): %d records in %d files, %d of %d bytes used, O_DIRECT %v, reads through huge pages %v", cfg.Dir, t.id, s.Records, s.Files, s.Used, s.Capacity, s.Direct, s.HugePages))
	return t, nil
}

// takeLock holds an exclusive flock on dir/LOCK for the tier's life; the
// file names the holder's pid for the refusal message.
func (t *Tier) takeLock() error {
	path := filepath.Join(t.cfg.Dir, lockName)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return fmt.Errorf("disk tier %q is not writable: %w", t.cfg.Dir, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		holder := ""
		if b, rerr := os.ReadFile(path); rerr == nil && len(b) > 0 {
			holder = " (pid " + strings.TrimSpace(string(b)) + ")"
		}
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return fmt.Errorf("disk tier %q: %w%s", t.cfg.Dir, ErrLocked, holder)
		}
		return fmt.Errorf("disk tier %q: lock %s: %w", t.cfg.Dir, path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	t.lock = f
	return nil
}

// loadID reads the tier's id, creating it on first use: it names this
// directory's records to the master across restarts of the node.
func loadID(dir string) (string, error) {
	path := filepath.Join(dir, idName)
	b, err := os.ReadFile(path)
	if err == nil {
		if id := strings.TrimSpace(string(b)); id != "" {
			return id, nil
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	var raw [16]byte
	_, _ = rand.Read(raw[:])
	id := hex.EncodeToString(raw[:])
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(id+"\n"), 0o644); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", err
	}
	return id, syncDir(dir)
}

// ID is the directory's id, stable across restarts.
func (t *Tier) ID() string { return t.id }

// Direct reports whether O_DIRECT is in use.
func (t *Tier) Direct() bool { return t.direct }

// Capacity is the configured capacity in bytes.
func (t *Tier) Capacity() uint64 { return t.cfg.Capacity }

// SpaceFor is the bytes a record of key and a value of n bytes takes.
func SpaceFor(key string, n uint64) uint64 { return recordLen(len(key), n) }

func (t *Tier) enter() error {
	if t.closed.Load() {
		return ErrClosed
	}
	t.ops.RLock()
	if t.closed.Load() {
		t.ops.RUnlock()
		return ErrClosed
	}
	return nil
}

func (t *Tier) leave() { t.ops.RUnlock() }

// Lookup returns the record of key on disk, if any.
func (t *Tier) Lookup(key string) (Record, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.index[key]; e != nil {
		return e.Record, true
	}
	return Record{}, false
}

// Records lists what is on disk, oldest first.
func (t *Tier) Records() []Record {
	t.mu.Lock()
	out := make([]Record, 0, len(t.index))
	for _, f := range t.files {
		for _, e := range f.entries {
			if t.index[e.Key] == e {
				out = append(out, e.Record)
			}
		}
	}
	t.mu.Unlock()
	return out
}

// Removal names a record to remove: Version 0 matches any version.
type Removal struct {
	Key     string
	Version uint64
}

// Remove drops key's record (only if it has that version, unless version
// is 0) and reports whether it did. The drop is durable when Remove
// returns true: the record is not found again after a restart, crash or
// not (RemoveAll). Its space comes back when every record of its file is
// gone, or when the file is evicted.
func (t *Tier) Remove(key string, version uint64) bool {
	return t.RemoveAll([]Removal{{Key: key, Version: version}}) == 1
}

// RemoveAll drops the records named, as Remove does, and returns how many
// it dropped. The drops are written to the drop log (one write, one
// fdatasync for them all) before any leaves the index: a record dropped
// here is never found again by a later Open, while a record of the key
// written after the drop is kept, whatever its version. When the log
// cannot be written no record is dropped (the error is logged), so what
// the tier reports is still what it would find after a restart.
func (t *Tier) RemoveAll(rs []Removal) int {
	if err := t.enter(); err != nil {
		return 0
	}
	defer t.leave()
	t.dropMu.Lock()
	defer t.dropMu.Unlock()
	var found []*entry // to log each once
	var ds []dropEntry
	t.mu.Lock()
	at := t.frontierLocked()
	for _, r := range rs {
		e := t.index[r.Key]
		if e == nil || (r.Version != 0 && e.Version != r.Version) || slices.Contains(found, e) {
			continue
		}
		found = append(found, e)
		ds = append(ds, dropEntry{key: e.Key, version: e.Version, at: at})
	}
	t.mu.Unlock()
	if len(ds) == 0 {
		return 0
	}
	if err := t.appendDrops(ds); err != nil {
		t.nDropLogErrors.Add(1)
		t.log.Warn(fmt.Sprintf("disk tier %s: drop log: %v; %d records not removed (a drop not made durable would be undone by a restart)", t.cfg.Dir, err, len(ds)))
		return 0
	}
	t.nRemoved.Add(uint64(len(ds)))
	t.nDropLog.Store(int64(len(t.drops.list)))
	var dead []*dataFile
	t.mu.Lock()
	for _, d := range ds {
		// What the next scan will leave out, whatever happened since the
		// lookup (a write racing the drop, an eviction).
		if e := t.index[d.key]; e != nil && d.covers(e) {
			delete(t.index, d.key)
			dead = append(dead, t.unrefLocked(e)...)
		}
	}
	t.mu.Unlock()
	t.deleteFiles(dead)
	if t.drops.size >= t.drops.compactAt {
		t.compactDropsLive()
	}
	return len(ds)
}

// frontierLocked is the position the next record appended will be at or
// after: the end of the newest file (records reserved but not yet
// written included).
func (t *Tier) frontierLocked() pos {
	if n := len(t.files); n > 0 {
		return pos{t.files[n-1].seq, t.files[n-1].size}
	}
	return pos{t.nextSeq, 0}
}

// unrefLocked accounts for an entry leaving the index and returns its file
// when that emptied a sealed file, taken out of the tier for deletion.
func (t *Tier) unrefLocked(e *entry) []*dataFile {
	f := e.file
	f.live--
	if f.live > 0 || !f.sealed {
		return nil
	}
	t.dropFileLocked(f)
	return []*dataFile{f}
}

// dropFileLocked takes f out of the tier's files and space.
func (t *Tier) dropFileLocked(f *dataFile) {
	if i := slices.Index(t.files, f); i >= 0 {
		t.files = slices.Delete(t.files, i, i+1)
		t.used -= f.size
	}
}

// deleteFiles unlinks files already taken out of the tier. A read that
// opened one first finishes on its descriptor. It returns the files that
// may still be on disk after a crash (their unlink, or the directory's
// sync, failed).
func (t *Tier) deleteFiles(fs []*dataFile) (left []*dataFile) {
	for _, f := range fs {
		f.retire()
		if err := os.Remove(f.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.log.Warn(fmt.Sprintf("disk tier %s: delete %s: %v", t.cfg.Dir, f.path, err))
			left = append(left, f)
		}
	}
	if len(fs) > 0 {
		if err := syncDir(t.cfg.Dir); err != nil {
			t.log.Warn(fmt.Sprintf("disk tier %s: sync directory: %v", t.cfg.Dir, err))
			return fs
		}
	}
	return left
}

// Stats returns the tier's state and counters.
func (t *Tier) Stats() Stats {
	t.mu.Lock()
	s := Stats{Dir: t.cfg.Dir, ID: t.id, Direct: t.direct, HugePages: t.direct && t.hugeBounce, Capacity: t.cfg.Capacity, Used: t.used, Records: len(t.index), Files: len(t.files)}
	t.mu.Unlock()
	s.Writes, s.WriteBytes = t.nWrites.Load(), t.nWriteBytes.Load()
	s.Reads, s.ReadBytes, s.ReadsInPlace = t.nReads.Load(), t.nReadBytes.Load(), t.nInPlace.Load()
	s.Full, s.EvictedFiles, s.EvictedRecords = t.nFull.Load(), t.nEvFiles.Load(), t.nEvRecs.Load()
	s.Dropped, s.ReadErrors = t.nDropped.Load(), t.nRdErr.Load()
	s.Removed, s.DropLogErrors, s.DropLogEntries = t.nRemoved.Load(), t.nDropLogErrors.Load(), int(t.nDropLog.Load())
	return s
}

// Close waits for calls under way, syncs and closes the open data file
// and releases the directory lock. Records on disk stay for the next Open.
func (t *Tier) Close() error {
	if t.closed.Swap(true) {
		return nil
	}
	t.ops.Lock()
	close(t.stop)
	<-t.stopped
	t.ops.Unlock()
	t.rbufs.close()
	var err error
	if t.curFD != nil {
		err = t.curFD.Sync()
		if cerr := t.curFD.Close(); err == nil {
			err = cerr
		}
		t.curFD = nil
	}
	t.mu.Lock()
	for _, f := range t.files {
		f.retire()
	}
	t.mu.Unlock()
	if fd := t.drops.fd; fd != nil {
		if cerr := fd.Close(); err == nil {
			err = cerr
		}
		t.drops.fd = nil
	}
	if cerr := t.lock.Close(); err == nil {
		err = cerr
	}
	return err
}

// DefaultCapacity is the capacity for a tier in dir when none is given:
// 90% of what its filesystem has available now, leaving room for the
// filesystem's own needs and whatever else lives there.
func DefaultCapacity(dir string) (uint64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("disk tier %q: %w", dir, err)
	}
	return uint64(st.Bavail) * uint64(st.Bsize) / 10 * 9, nil
}

// rosterName holds the pool's disk tiers as the node last heard them
// from its master, one tier id per line, a fenced one (its records from
// before are stale) after a "!" (store's tierRoster): a node restarted
// together with its master names them to the new one.
const rosterName = "POOL_TIERS"

// Roster returns the tier ids kept by SetRoster (none when the file is
// missing or unreadable: a roster only makes a restarted master wait, or
// drop a fenced tier's old records).
func (t *Tier) Roster() (ids, fenced []string) {
	b, err := os.ReadFile(filepath.Join(t.cfg.Dir, rosterName))
	if err != nil {
		return nil, nil
	}
	for _, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSpace(l)
		id, isFenced := strings.CutPrefix(l, "!")
		if id == "" || len(id) > 256 || len(ids)+len(fenced) >= 4096 {
			continue
		}
		if isFenced {
			fenced = append(fenced, id)
		} else {
			ids = append(ids, id)
		}
	}
	return ids, fenced
}

// SetRoster keeps ids and fenced for Roster, replacing the file whole.
func (t *Tier) SetRoster(ids, fenced []string) error {
	path := filepath.Join(t.cfg.Dir, rosterName)
	var b strings.Builder
	for _, id := range ids {
		b.WriteString(id)
		b.WriteByte('\n')
	}
	for _, id := range fenced {
		b.WriteString("!")
		b.WriteString(id)
		b.WriteByte('\n')
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("disk tier %q: keep the pool's roster: %w", t.cfg.Dir, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("disk tier %q: keep the pool's roster: %w", t.cfg.Dir, err)
	}
	return nil
}
