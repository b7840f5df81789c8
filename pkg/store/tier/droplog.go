package tier

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
)

// The drop log (file DROPS) makes Remove durable. A removed record's
// bytes stay in its data file until the file goes, so without it the scan
// at the next Open would find the record again and the node would report
// it to a master that may have forgotten the removal (one restarted
// without HA): the removed key would come back.
//
// An entry says "key's records of version <= version appended before
// position at are gone", 36 bytes and the key:
//
//	off  0  magic    u32  "MCD1"
//	off  4  key_len  u32  1..MaxKeyLen
//	off  8  version  u64  the removed record's version
//	off 16  seq      u64  the tier's append position when the drop was
//	off 24  off      u64  made: data file sequence number and offset
//	off 32  crc      u32  CRC32C of bytes 0..31 and the key
//	off 36  key
//
// Integers are little-endian. The older versions go too because a
// superseded record of the key, dead while the removed one was indexed,
// would otherwise win the next scan. The position keeps the drop off
// what the tier appends after it: the master may write the key again,
// even at the same version (an object still in DRAM whose disk record it
// had dropped), and that record must survive a restart.
//
// Entries are not aligned: the log is read whole at Open, and a bad entry
// (its checksum fails) is skipped by looking for the next magic whose
// entry checks out; bytes at the end that never do are a torn append.
const (
	dropHeaderLen = 36
	dropMagic     = 0x3144434d // "MCD1" as little-endian bytes
	dropLogName   = "DROPS"
)

var dropMagicBytes = binary.LittleEndian.AppendUint32(nil, dropMagic)

// pos is a place in the tier's append order: data files in sequence
// order, offsets in a file in order.
type pos struct{ seq, off uint64 }

func (p pos) before(q pos) bool { return p.seq < q.seq || p.seq == q.seq && p.off < q.off }

// dropEntry is one entry of the drop log.
type dropEntry struct {
	key     string
	version uint64
	at      pos // the append position when the drop was made
}

// covers reports whether d drops the record e.
func (d dropEntry) covers(e *entry) bool {
	return e.Key == d.key && e.Version <= d.version && (pos{e.file.seq, e.off}).before(d.at)
}

// dominates reports whether d covers every record o covers.
func (d dropEntry) dominates(o dropEntry) bool {
	return d.key == o.key && d.version >= o.version && !d.at.before(o.at)
}

// appendDrop appends the encoding of d to b.
func appendDrop(b []byte, d dropEntry) []byte {
	start := len(b)
	le := binary.LittleEndian
	b = le.AppendUint32(b, dropMagic)
	b = le.AppendUint32(b, uint32(len(d.key)))
	b = le.AppendUint64(b, d.version)
	b = le.AppendUint64(b, d.at.seq)
	b = le.AppendUint64(b, d.at.off)
	crc := crc32.Update(crc32.Checksum(b[start:], castagnoli), castagnoli, []byte(d.key))
	b = le.AppendUint32(b, crc)
	return append(b, d.key...)
}

// Drop log decoding errors; each wraps ErrCorrupt.
var (
	errDropShort = fmt.Errorf("%w: shorter than a drop entry", ErrCorrupt)
	errDropMagic = fmt.Errorf("%w: no drop entry magic", ErrCorrupt)
	errDropCRC   = fmt.Errorf("%w: drop entry checksum mismatch", ErrCorrupt)
)

// decodeDrop checks and decodes the entry at the start of b and returns
// it with its length.
func decodeDrop(b []byte) (dropEntry, int, error) {
	if len(b) < dropHeaderLen {
		return dropEntry{}, 0, errDropShort
	}
	le := binary.LittleEndian
	if le.Uint32(b) != dropMagic {
		return dropEntry{}, 0, errDropMagic
	}
	k := le.Uint32(b[4:])
	if k == 0 || k > MaxKeyLen {
		return dropEntry{}, 0, fmt.Errorf("%w: drop entry key length %d outside 1..%d", ErrCorrupt, k, MaxKeyLen)
	}
	n := dropHeaderLen + int(k)
	if len(b) < n {
		return dropEntry{}, 0, errDropShort
	}
	key := b[dropHeaderLen:n]
	if le.Uint32(b[32:]) != crc32.Update(crc32.Checksum(b[:32], castagnoli), castagnoli, key) {
		return dropEntry{}, 0, errDropCRC
	}
	return dropEntry{key: string(key), version: le.Uint64(b[8:]), at: pos{le.Uint64(b[16:]), le.Uint64(b[24:])}}, n, nil
}

// dropSpan is a run of bytes of the log that held no valid entry; a span
// that reaches the end of the log is a torn last append (or a corrupt
// tail: the two look alike).
type dropSpan struct {
	from, to int
	err      error // why the first entry of the span failed
}

// decodeDrops decodes a whole drop log: its valid entries in order, and
// the spans of bytes skipped between and after them. It never fails:
// what cannot be decoded is a span.
func decodeDrops(b []byte) ([]dropEntry, []dropSpan) {
	var ents []dropEntry
	var bad []dropSpan
	for off := 0; off < len(b); {
		d, n, err := decodeDrop(b[off:])
		if err == nil {
			ents = append(ents, d)
			off += n
			continue
		}
		next := resyncDrop(b, off+1)
		bad = append(bad, dropSpan{from: off, to: next, err: err})
		off = next
	}
	return ents, bad
}

// resyncDrop returns the offset of the first valid entry at or after
// from, or len(b).
func resyncDrop(b []byte, from int) int {
	for from < len(b) {
		i := bytes.Index(b[from:], dropMagicBytes)
		if i < 0 {
			return len(b)
		}
		if _, _, err := decodeDrop(b[from+i:]); err == nil {
			return from + i
		}
		from += i + 1
	}
	return len(b)
}

// dropLog is the open drop log; Tier.dropMu guards it.
type dropLog struct {
	path  string
	fd    file // opened at the first append
	size  int64
	list  []dropEntry // the file's entries, in order
	byKey map[string][]dropEntry
	// compactAt is the size past which a Remove compacts the log.
	compactAt int64
}

// defaultDropCompactBytes is the least size of a drop log worth
// compacting while the tier runs (at Open it is compacted whatever its
// size); past it a log is compacted when it has doubled since the last
// compaction, so the work stays proportional to the removals.
const defaultDropCompactBytes = 1 << 20

func (l *dropLog) add(d dropEntry) {
	if l.byKey == nil {
		l.byKey = make(map[string][]dropEntry)
	}
	l.list = append(l.list, d)
	l.byKey[d.key] = append(l.byKey[d.key], d)
}

// covering returns the entry that drops e, if any.
func (l *dropLog) covering(e *entry) (dropEntry, bool) {
	for _, d := range l.byKey[e.Key] {
		if d.covers(e) {
			return d, true
		}
	}
	return dropEntry{}, false
}

// readDropLog reads and decodes the drop log, logging what it skips, and
// reports whether the file needs rewriting (it had bad bytes).
func (t *Tier) readDropLog() (*dropLog, bool, error) {
	l := &dropLog{path: filepath.Join(t.cfg.Dir, dropLogName)}
	b, err := os.ReadFile(l.path)
	if errors.Is(err, os.ErrNotExist) {
		return l, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("disk tier %q: read drop log: %w", t.cfg.Dir, err)
	}
	ents, bad := decodeDrops(b)
	for _, s := range bad {
		if s.to == len(b) {
			t.log.Warn(fmt.Sprintf("disk tier %s: %s: bytes [%d, %d) at its end hold no whole entry (%v): a torn append, ignored", t.cfg.Dir, l.path, s.from, s.to, s.err))
		} else {
			t.log.Warn(fmt.Sprintf("disk tier %s: %s: bytes [%d, %d) hold no valid entry (%v): corrupt, skipped", t.cfg.Dir, l.path, s.from, s.to, s.err))
		}
	}
	for _, d := range ents {
		l.add(d)
	}
	// Appends (should the rewrite at Open fail) overwrite a torn tail.
	l.size = int64(len(b))
	if n := len(bad); n > 0 && bad[n-1].to == len(b) {
		l.size = int64(bad[n-1].from)
	}
	return l, len(bad) > 0, nil
}

// selectDrops returns, in order, the entries of l that keep says are
// needed, less those another entry covers the records of. keep must hold
// for an entry that dominates one it holds for (covering a record on
// disk does).
func selectDrops(l *dropLog, keep func(dropEntry) bool) []dropEntry {
	seen := make(map[string]int, len(l.byKey))
	var kept []dropEntry
	for _, d := range l.list {
		i := seen[d.key]
		seen[d.key]++
		if keep(d) && !dominated(l.byKey[d.key], i) {
			kept = append(kept, d)
		}
	}
	return kept
}

// dominated reports whether another of ds (one key's entries, in order)
// covers every record ds[i] does: one after it that dominates it, or one
// before it that does strictly (of equal entries the last stays).
func dominated(ds []dropEntry, i int) bool {
	for j, o := range ds {
		if j != i && o.dominates(ds[i]) && (j > i || !ds[i].dominates(o)) {
			return true
		}
	}
	return false
}

// rewriteDrops replaces the drop log with ents, atomically (written and
// synced aside, renamed, the directory synced): a crash leaves the old
// log or the new one, never a mix.
func (t *Tier) rewriteDrops(l *dropLog, ents []dropEntry) error {
	var buf []byte
	for _, d := range ents {
		buf = appendDrop(buf, d)
	}
	tmp := l.path + ".tmp"
	fd, err := t.open(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, false)
	if err != nil {
		return fmt.Errorf("create %s: %w", tmp, err)
	}
	if _, err := fd.WriteAt(buf, 0); err != nil {
		fd.Close()
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := fd.Sync(); err != nil {
		fd.Close()
		return fmt.Errorf("sync %s: %w", tmp, err)
	}
	if err := fd.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, l.path); err != nil {
		return fmt.Errorf("rename %s to %s: %w", tmp, l.path, err)
	}
	if err := syncDir(t.cfg.Dir); err != nil {
		return fmt.Errorf("sync directory after renaming %s: %w", tmp, err)
	}
	if l.fd != nil {
		l.fd.Close()
		l.fd = nil
	}
	l.list, l.byKey, l.size = nil, nil, int64(len(buf))
	for _, d := range ents {
		l.add(d)
	}
	return nil
}

// keepCovering returns a keep function for selectDrops: an entry is
// needed while it covers a record in one of files (records whose file is
// gone cannot come back).
func keepCovering(l *dropLog, files []*dataFile) func(dropEntry) bool {
	onDisk := make(map[string][]*entry)
	for _, f := range files {
		for _, e := range f.entries {
			if _, ok := l.byKey[e.Key]; ok {
				onDisk[e.Key] = append(onDisk[e.Key], e)
			}
		}
	}
	return func(d dropEntry) bool {
		return slices.ContainsFunc(onDisk[d.key], d.covers)
	}
}

// compactDropsLive compacts the drop log while the tier runs (dropMu
// held). Its entries are checked against the records of the tier's files;
// a data file on disk that the tier has let go (being deleted, or its
// delete failed) has records the next scan would find that this cannot
// see, so the compaction waits for another time.
func (t *Tier) compactDropsLive() {
	l := t.drops
	l.compactAt = l.size + max(t.cfg.dropCompactBytes, l.size)
	t.mu.Lock()
	files := slices.Clone(t.files)
	t.mu.Unlock()
	known := make(map[uint64]bool, len(files))
	for _, f := range files {
		known[f.seq] = true
	}
	des, err := os.ReadDir(t.cfg.Dir)
	if err != nil {
		t.log.Warn(fmt.Sprintf("disk tier %s: drop log not compacted: %v", t.cfg.Dir, err))
		return
	}
	for _, de := range des {
		if seq, ok := parseDataName(de.Name()); ok && !known[seq] {
			return
		}
	}
	t.mu.Lock()
	keep := keepCovering(l, files)
	t.mu.Unlock()
	before, size := len(l.list), l.size
	ents := selectDrops(l, keep)
	if err := t.rewriteDrops(l, ents); err != nil {
		t.log.Warn(fmt.Sprintf("disk tier %s: drop log not compacted: %v", t.cfg.Dir, err))
		return
	}
	l.compactAt = max(t.cfg.dropCompactBytes, 2*l.size)
	t.nDropLog.Store(int64(len(l.list)))
	t.log.Info(fmt.Sprintf("disk tier %s: drop log compacted: %d of %d entries kept (%d -> %d bytes)", t.cfg.Dir, len(ents), before, size, l.size))
}

// openDropLogForAppend opens the log file for appends, creating it: its
// name is made durable too, or a crash could lose the file with the
// entries an fdatasync had made durable.
func (t *Tier) openDropLogForAppend(l *dropLog) error {
	if l.fd != nil {
		return nil
	}
	fd, err := t.open(l.path, os.O_CREATE|os.O_WRONLY, false)
	if err != nil {
		return err
	}
	if err := syncDir(t.cfg.Dir); err != nil {
		fd.Close()
		return fmt.Errorf("sync directory: %w", err)
	}
	l.fd = fd
	return nil
}

// appendDrops makes ds durable at the end of the log: one write and one
// fdatasync for them all. On a failure nothing is taken as logged; the
// next append overwrites what this one may have left.
func (t *Tier) appendDrops(ds []dropEntry) error {
	l := t.drops
	if err := t.openDropLogForAppend(l); err != nil {
		return fmt.Errorf("open %s: %w", l.path, err)
	}
	var buf []byte
	for _, d := range ds {
		buf = appendDrop(buf, d)
	}
	if _, err := l.fd.WriteAt(buf, l.size); err != nil {
		return fmt.Errorf("write %s: %w", l.path, err)
	}
	if err := l.fd.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", l.path, err)
	}
	l.size += int64(len(buf))
	for _, d := range ds {
		l.add(d)
	}
	return nil
}
