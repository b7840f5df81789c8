package tier

import (
	"context"
	"errors"
	"fmt"
	"io"
)

// Read copies the value of key into dst and returns its record. With
// version != 0 only that version is read. The record's checksums are
// checked before a byte reaches dst: a record that fails them (a flipped
// bit, a torn write) or cannot be read (an I/O error) is dropped from the
// tier, so it is never served, and the error says which (ErrCorrupt, or
// the I/O error). A missing record is ErrNotFound. At most
// Config.IOConcurrency reads run at once; ctx bounds the wait for a turn.
func (t *Tier) Read(ctx context.Context, key string, version uint64, dst []byte) (Record, error) {
	if err := t.enter(); err != nil {
		return Record{}, err
	}
	defer t.leave()
	t.mu.Lock()
	e := t.index[key]
	t.mu.Unlock()
	if e == nil || (version != 0 && e.Version != version) {
		return Record{}, fmt.Errorf("%w: %q version %d", ErrNotFound, key, version)
	}
	if uint64(len(dst)) < e.Size {
		return Record{}, fmt.Errorf("disk tier read %q: value of %d bytes does not fit a buffer of %d", key, e.Size, len(dst))
	}
	select {
	case t.sem <- struct{}{}:
	case <-ctx.Done():
		return Record{}, ctx.Err()
	}
	defer func() { <-t.sem }()
	fd, done, ok, err := t.reader(e.file)
	if err != nil {
		return Record{}, t.readFailed(e, fmt.Errorf("open %s: %w", e.file.path, err))
	}
	if !ok {
		// Its file was evicted or emptied since the lookup.
		return Record{}, fmt.Errorf("%w: %q version %d (its file is gone)", ErrNotFound, key, version)
	}
	buf := alignedBuf(int(e.len))
	defer putAligned(buf)
	n, err := fd.ReadAt(buf, int64(e.off))
	done()
	if err != nil && !(errors.Is(err, io.EOF) && uint64(n) == e.len) {
		if errors.Is(err, io.EOF) {
			return Record{}, t.readFailed(e, fmt.Errorf("%w: %s ends inside the record at %d", ErrCorrupt, e.file.path, e.off))
		}
		return Record{}, t.readFailed(e, fmt.Errorf("read %s at %d: %w", e.file.path, e.off, err))
	}
	rec, v, err := decodeRecord(buf[:n])
	if err == nil && rec != e.Record {
		err = fmt.Errorf("%w: found %q version %d (%d bytes) where %q version %d (%d bytes) was written", ErrCorrupt, rec.Key, rec.Version, rec.Size, e.Key, e.Version, e.Size)
	}
	if err != nil {
		return Record{}, t.readFailed(e, fmt.Errorf("%s at %d: %w", e.file.path, e.off, err))
	}
	copy(dst, v)
	t.nReads.Add(1)
	t.nReadBytes.Add(rec.Size)
	return rec, nil
}

// readFailed drops e (unless it was replaced meanwhile) and wraps err.
func (t *Tier) readFailed(e *entry, err error) error {
	if isCorrupt(err) {
		t.nDropped.Add(1)
	} else {
		t.nRdErr.Add(1)
	}
	t.mu.Lock()
	var dead []*dataFile
	if t.index[e.Key] == e {
		delete(t.index, e.Key)
		dead = t.unrefLocked(e)
	}
	t.mu.Unlock()
	t.deleteFiles(dead)
	t.log.Warn(fmt.Sprintf("disk tier %s: record %q version %d: %v: dropped, it will not be served", t.cfg.Dir, e.Key, e.Version, err))
	return fmt.Errorf("disk tier read %q: %w", e.Key, err)
}
