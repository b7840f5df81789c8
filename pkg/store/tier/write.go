package tier

import (
	"context"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

type writeReq struct {
	ctx     context.Context
	key     string
	version uint64
	value   []byte
	done    chan error
	// Set by the writer between the append and the acknowledgement.
	ent *entry
	fd  file
	err error
}

// maxBatch bounds the records one fsync covers: more would only delay
// the first of them.
const maxBatch = 64

// Write appends key's value as the given version and returns once it is
// durable (written and fsynced) and readable. An older record of the key
// is superseded; the record is not readable when a newer version of the
// key already is, nor when a Remove made while it was written covers it
// (the removal counts as after it, as a restart would find). When the tier lacks room it first evicts whole files,
// oldest first, reporting their records to Config.OnEvict; when nothing
// can be evicted it fails with ErrFull. The value is not retained after
// Write returns; while the write is queued a cancelled ctx abandons it.
func (t *Tier) Write(ctx context.Context, key string, version uint64, value []byte) error {
	if len(key) == 0 || len(key) > MaxKeyLen {
		return fmt.Errorf("disk tier write: key of %d bytes: want 1..%d", len(key), MaxKeyLen)
	}
	if rl := recordLen(len(key), uint64(len(value))); rl > t.cfg.Capacity {
		t.nFull.Add(1)
		return fmt.Errorf("%w: record %q of %d bytes exceeds the capacity of %d bytes", ErrFull, key, rl, t.cfg.Capacity)
	}
	if err := t.enter(); err != nil {
		return err
	}
	defer t.leave()
	req := &writeReq{ctx: ctx, key: key, version: version, value: value, done: make(chan error, 1)}
	select {
	case t.writes <- req:
	case <-ctx.Done():
		return ctx.Err()
	}
	// Once queued the writer may be copying value: wait for it, whatever
	// ctx says.
	return <-req.done
}

// writer appends the queued records in batches, one fsync per file per
// batch, until Close.
func (t *Tier) writer() {
	defer close(t.stopped)
	batch := make([]*writeReq, 0, maxBatch)
	for {
		select {
		case <-t.stop:
			return
		case r := <-t.writes:
			batch = append(batch[:0], r)
		}
	more:
		for len(batch) < maxBatch {
			select {
			case r := <-t.writes:
				batch = append(batch, r)
			default:
				break more
			}
		}
		t.writeBatch(batch)
		clear(batch)
	}
}

// batchState is what one batch has done so far.
type batchState struct {
	evicted []Record
	toSync  []file // descriptors appended to, in order
	closing []file // descriptors of files sealed during the batch
	sealed  []*dataFile
	// pending: files holding records of this batch not yet synced, which
	// eviction must leave alone.
	pending map[*dataFile]bool
}

func (b *batchState) seal(f *dataFile, fd file) {
	if f != nil {
		b.sealed = append(b.sealed, f)
		b.closing = append(b.closing, fd)
	}
}

func (t *Tier) writeBatch(batch []*writeReq) {
	b := &batchState{pending: make(map[*dataFile]bool)}
	for _, r := range batch {
		if err := r.ctx.Err(); err != nil {
			r.err = err
			continue
		}
		rl := recordLen(len(r.key), uint64(len(r.value)))
		f, off, err := t.reserve(rl, b)
		if err != nil {
			r.err = err
			continue
		}
		fd := t.curFD
		buf := alignedBuf(int(rl))
		crc := encodeRecord(buf, r.key, r.version, r.value)
		_, err = fd.WriteAt(buf, int64(off))
		putAligned(buf)
		if len(b.toSync) == 0 || b.toSync[len(b.toSync)-1] != fd {
			b.toSync = append(b.toSync, fd)
		}
		if err != nil {
			// The file's tail is unknown now: append no more to it.
			r.err = t.writeFailed(f, err)
			b.seal(t.sealCur())
			continue
		}
		b.pending[f] = true
		r.ent = &entry{Record: Record{Key: r.key, Size: uint64(len(r.value)), Version: r.version}, file: f, off: off, len: rl,
			crc: crc, aligned: alignedValue(uint64(len(r.value)))}
		r.fd = fd
	}
	// One fdatasync per file makes the whole batch durable.
	syncErr := make(map[file]error, len(b.toSync))
	for _, fd := range b.toSync {
		if err := fd.Sync(); err != nil {
			syncErr[fd] = err
			t.log.Warn(fmt.Sprintf("disk tier %s: fdatasync: %v; the records of this batch in that file are not acknowledged", t.cfg.Dir, err))
			if fd == t.curFD {
				b.seal(t.sealCur())
			}
		}
	}
	for _, fd := range b.closing {
		fd.Close()
	}
	var dead []*dataFile
	// The drop log is held while the batch enters the index, so that the
	// index stays what a scan of the files under the log would rebuild: a
	// removal (RemoveAll holds dropMu from its lookup to its last index
	// change) is never half-way when a record comes in, and a record a
	// drop covers (reserved before the drop was made, synced after it)
	// does not enter. Without it a restart could bring back a record the
	// index had dropped, or drop one it held.
	t.dropMu.Lock()
	t.mu.Lock()
	for _, r := range batch {
		if r.ent == nil {
			continue
		}
		if err := syncErr[r.fd]; err != nil {
			r.err = fmt.Errorf("disk tier %s: sync %s: %w", t.cfg.Dir, r.ent.file.path, err)
			continue
		}
		f := r.ent.file
		f.entries = append(f.entries, r.ent)
		if _, dropped := t.drops.covering(r.ent); dropped {
			continue // removed as it was written: the drop was made after its place was
		}
		if old := t.index[r.key]; old != nil {
			if old.Version > r.version {
				continue // a newer version is already here
			}
			dead = append(dead, t.unrefLocked(old)...)
		}
		t.index[r.key] = r.ent
		f.live++
		t.nWrites.Add(1)
		t.nWriteBytes.Add(uint64(len(r.value)))
	}
	for _, f := range b.sealed {
		f.sealed = true
		if f.live == 0 {
			t.dropFileLocked(f)
			dead = append(dead, f)
		}
	}
	t.mu.Unlock()
	t.dropMu.Unlock()
	t.deleteFiles(dead)
	if len(b.evicted) > 0 && t.cfg.OnEvict != nil {
		t.cfg.OnEvict(b.evicted)
	}
	for _, r := range batch {
		if errors.Is(r.err, ErrFull) {
			t.nFull.Add(1)
		}
		r.done <- r.err
	}
}

// reserve makes room for a record of rl bytes, evicting the oldest files
// as needed (never one holding records of this batch), and returns the
// file and offset it goes at; the current file is t.curFD.
func (t *Tier) reserve(rl uint64, b *batchState) (*dataFile, uint64, error) {
	if c := t.cur; c != nil && c.nrec > 0 && (c.size+rl > t.cfg.MaxFileBytes || c.nrec >= t.cfg.MaxFileRecords) {
		b.seal(t.sealCur())
	}
	var dead []*dataFile
	var nev int
	t.mu.Lock()
	for t.used+rl > t.cfg.Capacity {
		var victim *dataFile
		for _, f := range t.files {
			if f != t.cur && !b.pending[f] {
				victim = f
				break
			}
		}
		if victim == nil && t.cur != nil && !b.pending[t.cur] && t.cur.nrec > 0 {
			// Only the open file is left: close it so it can go.
			b.seal(t.sealCur())
			continue
		}
		if victim == nil {
			t.mu.Unlock()
			return nil, 0, fmt.Errorf("%w: %d of %d bytes used and nothing evictable (only records of this batch)", ErrFull, t.used, t.cfg.Capacity)
		}
		for _, e := range victim.entries {
			if t.index[e.Key] == e {
				delete(t.index, e.Key)
				b.evicted = append(b.evicted, e.Record)
				nev++
			}
		}
		t.dropFileLocked(victim)
		dead = append(dead, victim)
	}
	t.mu.Unlock()
	if len(dead) > 0 {
		t.nEvFiles.Add(uint64(len(dead)))
		t.nEvRecs.Add(uint64(nev))
		t.deleteFiles(dead)
		t.log.Info(fmt.Sprintf("disk tier %s: evicted %d files (%d records), oldest first, to make room", t.cfg.Dir, len(dead), nev))
	}
	if t.cur == nil {
		if err := t.newFile(); err != nil {
			return nil, 0, err
		}
	}
	c := t.cur
	t.mu.Lock()
	off := c.size
	c.size += rl
	c.nrec++
	t.used += rl
	t.mu.Unlock()
	return c, off, nil
}

// sealCur stops appending to the current file and hands back it and its
// descriptor (which the batch syncs, if it wrote to it, and closes).
func (t *Tier) sealCur() (*dataFile, file) {
	c, fd := t.cur, t.curFD
	t.cur, t.curFD = nil, nil
	return c, fd
}

// newFile creates the next data file and makes its name durable.
func (t *Tier) newFile() error {
	t.mu.Lock()
	seq := t.nextSeq
	t.nextSeq++
	t.mu.Unlock()
	f := &dataFile{seq: seq, path: t.cfg.Dir + string(os.PathSeparator) + dataName(seq)}
	fd, err := t.open(f.path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, t.direct)
	if err != nil {
		if errors.Is(err, unix.ENOSPC) {
			return fmt.Errorf("%w: create %s: %v", ErrFull, f.path, err)
		}
		return fmt.Errorf("disk tier %s: create %s: %w", t.cfg.Dir, f.path, err)
	}
	if err := syncDir(t.cfg.Dir); err != nil {
		fd.Close()
		os.Remove(f.path)
		return fmt.Errorf("disk tier %s: sync directory: %w", t.cfg.Dir, err)
	}
	t.cur, t.curFD = f, fd
	t.mu.Lock()
	t.files = append(t.files, f)
	t.mu.Unlock()
	return nil
}

// writeFailed handles a failed append: the file is closed to appends (its
// tail is now unknown) and the error says whether the disk is full.
func (t *Tier) writeFailed(f *dataFile, err error) error {
	t.log.Warn(fmt.Sprintf("disk tier %s: write %s: %v", t.cfg.Dir, f.path, err))
	if errors.Is(err, unix.ENOSPC) {
		return fmt.Errorf("%w: write %s: %v", ErrFull, f.path, err)
	}
	return fmt.Errorf("disk tier %s: write %s: %w", t.cfg.Dir, f.path, err)
}
