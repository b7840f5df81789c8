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
	f       *dataFile
	entries []*entry
	err     error
}

// scan rebuilds the index from the data files, IOConcurrency files at a
// time. Where one key has several records the highest version wins (the
// newest file among equals): the others are dead space until their file
// goes.
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
	if err := t.checkTail(res); err != nil {
		return err
	}
	for _, r := range res {
		if r.err != nil {
			return r.err
		}
		f := r.f
		t.files = append(t.files, f)
		t.used += f.size
		t.nextSeq = max(t.nextSeq, f.seq+1)
		for _, e := range r.entries {
			f.entries = append(f.entries, e)
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
	t.deleteFiles(dead)
	return nil
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
		rl := recordLen(len(h.key), h.size)
		if off+uint64(headerLen+len(h.key))+h.size > end {
			t.nDropped.Add(1)
			t.log.Warn(fmt.Sprintf("disk tier %s: %s: record %q (version %d, %d bytes) at offset %d runs past the end of the file (%d bytes): torn by a crash, dropped", t.cfg.Dir, f.path, h.key, h.version, h.size, off, end))
			break
		}
		out = append(out, &entry{Record: Record{Key: h.key, Size: h.size, Version: h.version}, file: f, off: off, len: rl})
		f.nrec++
		off += rl
	}
	flushSkip(end)
	return scanned{f: f, entries: out}
}
