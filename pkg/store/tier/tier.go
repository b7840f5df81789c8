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
// Main type: Tier (Open, Write, Read, Remove, Records, Stats, Close).
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
	// Full counts writes refused for want of room.
	Full uint64
	// EvictedFiles and EvictedRecords count what eviction deleted.
	EvictedFiles, EvictedRecords uint64
	// Dropped counts records found torn or corrupt (at the scan or on a
	// read) and dropped; ReadErrors reads that failed on I/O.
	Dropped, ReadErrors uint64
}

// Tier is an open disk tier. Its methods are safe for concurrent use.
type Tier struct {
	cfg    Config
	log    *slog.Logger
	open   openFunc
	direct bool
	id     string
	lock   *os.File

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
	nFull, nEvFiles, nEvRecs, nDropped, nRdErr atomic.Uint64
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
	file *dataFile
	off  uint64
	len  uint64 // recordLen
}

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
	t.log.Info(fmt.Sprintf("disk tier %s (id %s): %d records in %d files, %d of %d bytes used, O_DIRECT %v", cfg.Dir, t.id, s.Records, s.Files, s.Used, s.Capacity, t.direct))
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

// Remove drops key's record (only if it has that version, unless version
// is 0) and reports whether it did. Its space comes back when every
// record of its file is gone, or when the file is evicted.
func (t *Tier) Remove(key string, version uint64) bool {
	t.mu.Lock()
	e := t.index[key]
	if e == nil || (version != 0 && e.Version != version) {
		t.mu.Unlock()
		return false
	}
	delete(t.index, key)
	dead := t.unrefLocked(e)
	t.mu.Unlock()
	t.deleteFiles(dead)
	return true
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
// opened one first finishes on its descriptor.
func (t *Tier) deleteFiles(fs []*dataFile) {
	for _, f := range fs {
		f.retire()
		if err := os.Remove(f.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.log.Warn(fmt.Sprintf("disk tier %s: delete %s: %v", t.cfg.Dir, f.path, err))
		}
	}
	if len(fs) > 0 {
		_ = syncDir(t.cfg.Dir)
	}
}

// Stats returns the tier's state and counters.
func (t *Tier) Stats() Stats {
	t.mu.Lock()
	s := Stats{Dir: t.cfg.Dir, ID: t.id, Direct: t.direct, Capacity: t.cfg.Capacity, Used: t.used, Records: len(t.index), Files: len(t.files)}
	t.mu.Unlock()
	s.Writes, s.WriteBytes = t.nWrites.Load(), t.nWriteBytes.Load()
	s.Reads, s.ReadBytes = t.nReads.Load(), t.nReadBytes.Load()
	s.Full, s.EvictedFiles, s.EvictedRecords = t.nFull.Load(), t.nEvFiles.Load(), t.nEvRecs.Load()
	s.Dropped, s.ReadErrors = t.nDropped.Load(), t.nRdErr.Load()
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
