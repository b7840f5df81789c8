package tier

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
)

// scanned is what scanning one file found.
type scanned struct {
	f *dataFile
	// all is every record whose header checked out; entries those of
	// them the index may take (not dropped by the drop log, not torn).
	all     []*entry
	entries []*entry
	err     error
}

// scan rebuilds the index from the data files, IOConcurrency files at a
// time, less the records the drop log says were removed. Where one key
// has several records the highest version wins (the newest file among
// equals): the others are dead space until their file goes. Then the drop
// log is compacted.
//
// Every header is checked; only the last maxBatch records appended have
// their values checksummed here: a crash can tear only records not yet
// synced, and the writer syncs each batch (at most maxBatch records)
// before it writes the next. Older values are checked by their first
// read (Read checks every read): reading every byte of a large disk at
// each start would make a restart as slow as reading the whole disk.
func (t *Tier) scan() error {
	des, err := os.ReadDir(t.cfg.Dir)
	if err != nil {
		return fmt.Errorf("disk tier %q: %w", t.cfg.Dir, err)
	}
	var files []*dataFile
	for _, de := range des {
		if seq, ok := parseDataName(de.Name()); ok && de.Type().IsRegular() {
			files = append(files, &dataFile{seq: seq, path: filepath.Join(t.cfg.Dir, de.Name()), sealed: true})
		}
	}
	slices.SortFunc(files, func(a, b *dataFile) int { return cmp.Compare(a.seq, b.seq) })
	res := make([]scanned, len(files))
	var wg sync.WaitGroup
	for i, f := range files {
		wg.Add(1)
		t.sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-t.sem }()
			res[i] = t.scanFile(f)
		}()
	}
	wg.Wait()
	for _, r := range res {
		if r.err != nil {
			return r.err
		}
	}
	drops, rewrite, err := t.readDropLog()
	if err != nil {
		return err
	}
	t.drops = drops
	removed := 0
	for i := range res {
		r := &res[i]
		r.entries = slices.DeleteFunc(slices.Clone(r.all), func(e *entry) bool {
			_, ok := drops.covering(e)
			if ok {
				removed++
			}
			return ok
		})
	}
	if err := t.checkTail(res); err != nil {
		return err
	}
	for _, r := range res {
		f := r.f
		t.files = append(t.files, f)
		t.used += f.size
		t.nextSeq = max(t.nextSeq, f.seq+1)
		// Every record stays in the file's list, indexed or not: the
		// drop log's compaction asks which records are on disk.
		f.entries = r.all
		for _, e := range r.entries {
			old := t.index[e.Key]
			if old != nil && old.Version > e.Version {
				continue
			}
			if old != nil {
				old.file.live--
			}
			t.index[e.Key] = e
			f.live++
		}
	}
	// Files left with no live record hold nothing worth their space.
	var dead []*dataFile
	for _, f := range slices.Clone(t.files) {
		if f.live == 0 {
			t.dropFileLocked(f)
			dead = append(dead, f)
		}
	}
	left := t.deleteFiles(dead)
	t.compactDropsAtOpen(append(slices.Clone(t.files), left...), rewrite, removed)
	return nil
}

// compactDropsAtOpen keeps the drop log's entries that still cover a
// record in files (those on disk), rewriting the log when that drops any
// or when it had bad bytes. The drops of records whose files are gone are
// forgotten here, so the log holds at most what the data files do.
func (t *Tier) compactDropsAtOpen(files []*dataFile, rewrite bool, removed int) {
	l := t.drops
	_ = os.Remove(l.path + ".tmp") // a compaction's, cut short by a crash
	ents := selectDrops(l, keepCovering(l, files))
	if before := len(l.list); rewrite || len(ents) != before {
		if err := t.rewriteDrops(l, ents); err != nil {
			// The old log is still right, only longer.
			t.log.Warn(fmt.Sprintf("disk tier %s: drop log not compacted: %v", t.cfg.Dir, err))
		} else if before > 0 {
			t.log.Info(fmt.Sprintf("disk tier %s: drop log: %d records removed before the restart left out, %d of %d entries kept", t.cfg.Dir, removed, len(ents), before))
		}
	}
	l.compactAt = max(t.cfg.dropCompactBytes, 2*l.size)
	t.nDropLog.Store(int64(len(l.list)))
	// Data files are numbered on from the drops' positions too: a new
	// file numbered below one a drop names would have its records taken
	// for records written before that drop.
	for _, d := range l.list {
		t.nextSeq = max(t.nextSeq, d.at.seq+1)
	}
}

// checkTail checksums the values of the last maxBatch records found
// (the only ones a crash may have torn), dropping those that fail.
func (t *Tier) checkTail(res []scanned) error {
	left := maxBatch
	for i := len(res) - 1; i >= 0 && left > 0; i-- {
		r := &res[i]
		if r.err != nil {
			return r.err
		}
		fd, err := t.open(r.f.path, os.O_RDONLY, false)
		if err != nil {
			return fmt.Errorf("disk tier %q: open %s: %w", t.cfg.Dir, r.f.path, err)
		}
		for j := len(r.entries) - 1; j >= 0 && left > 0; j-- {
			left--
			e := r.entries[j]
			buf := alignedBuf(int(e.len))
			n, err := fd.ReadAt(buf, int64(e.off))
			if err != nil && !errors.Is(err, io.EOF) {
				putAligned(buf)
				fd.Close()
				return fmt.Errorf("disk tier %q: read %s at %d: %w", t.cfg.Dir, r.f.path, e.off, err)
			}
			_, _, derr := decodeRecord(buf[:n])
			putAligned(buf)
			if derr != nil {
				t.nDropped.Add(1)
				t.log.Warn(fmt.Sprintf("disk tier %s: %s: record %q (version %d) at offset %d: %v: dropped", t.cfg.Dir, r.f.path, e.Key, e.Version, e.off, derr))
				r.entries = slices.Delete(r.entries, j, j+1)
			}
		}
		fd.Close()
	}
	return nil
}

// scanFile reads the record headers of f, checking their checksums. A record whose header is bad cannot say
// how long it is, so the scan looks for the next header at each
// following block; a record that runs past the end of the file was torn
// by a crash.
func (t *Tier) scanFile(f *dataFile) scanned {
	fd, err := t.open(f.path, os.O_RDONLY, false)
	if err != nil {
		return scanned{err: fmt.Errorf("disk tier %q: open %s: %w", t.cfg.Dir, f.path, err)}
	}
	defer fd.Close()
	st, err := os.Stat(f.path)
	if err != nil {
		return scanned{err: fmt.Errorf("disk tier %q: %w", t.cfg.Dir, err)}
	}
	end := uint64(st.Size())
	f.size = alignUp(end)
	var out []*entry
	head := make([]byte, headerLen+MaxKeyLen)
	var skipFrom int64 = -1 // start of a run of blocks with no header
	flushSkip := func(at uint64) {
		if skipFrom >= 0 {
			t.nDropped.Add(1)
			t.log.Warn(fmt.Sprintf("disk tier %s: %s: no valid record header in bytes [%d, %d): skipped (torn or corrupt)", t.cfg.Dir, f.path, skipFrom, at))
			skipFrom = -1
		}
	}
	for off := uint64(0); off < end; {
		n, err := fd.ReadAt(head[:min(uint64(len(head)), end-off)], int64(off))
		if err != nil && !errors.Is(err, io.EOF) {
			return scanned{err: fmt.Errorf("disk tier %q: read %s at %d: %w", t.cfg.Dir, f.path, off, err)}
		}
		h, err := decodeHeader(head[:n])
		if err != nil {
			if skipFrom < 0 {
				skipFrom = int64(off)
			}
			off += BlockSize
			continue
		}
		flushSkip(off)
		rl := h.recordLen()
		if off+h.valueOff()+h.size > end {
			t.nDropped.Add(1)
			t.log.Warn(fmt.Sprintf("disk tier %s: %s: record %q (version %d, %d bytes) at offset %d runs past the end of the file (%d bytes): torn by a crash, dropped", t.cfg.Dir, f.path, h.key, h.version, h.size, off, end))
			break
		}
		out = append(out, &entry{Record: Record{Key: h.key, Size: h.size, Version: h.version}, file: f, off: off, len: rl, crc: h.dataCRC, aligned: h.aligned})
		f.nrec++
		off += rl
	}
	flushSkip(end)
	return scanned{f: f, all: out}
}
