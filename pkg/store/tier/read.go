package tier

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"sync"
	"unsafe"
)

// readChunk is the most of a record one read into a bounce buffer
// fetches (a buffer is one huge page). A larger record is read in chunks,
// chunksInFlight at once, so the checksum and copy of one overlap the
// reads of the next instead of following the whole read, and the bounce
// buffers stay at a few chunks however large the value. A 1 MiB value
// with its header block is one read. Smaller chunks cost more than they
// hide: on a virtio disk 256 KiB reads of a 1 MiB record ran at less than
// half the throughput of one 1 MiB read.
const readChunk = 2 << 20

// Read copies the value of key into dst and returns its record. With
// version != 0 only that version is read. The record's checksums are
// checked before Read returns: a record that fails them (a flipped bit, a
// torn write) or cannot be read (an I/O error) is dropped from the tier,
// so it is never served, and the error says which (ErrCorrupt, or the I/O
// error). The value is checksummed as it is copied out, so after an
// error dst holds bytes that must not be used. A missing record is
// ErrNotFound. At most Config.IOConcurrency reads run at once; ctx bounds
// the wait for a turn.
func (t *Tier) Read(ctx context.Context, key string, version uint64, dst []byte) (Record, error) {
	return t.ReadProgress(ctx, key, version, dst, nil)
}

// ReadProgress is Read telling progress, when not nil, how many bytes
// from dst's start hold the value's bytes as the read goes (in order,
// rising, the last time e.Size): a reader may move them on while the
// rest is read, but they are the value only if ReadProgress then returns
// no error, the checksum covering the whole value being checked last.
func (t *Tier) ReadProgress(ctx context.Context, key string, version uint64, dst []byte, progress func(n uint64)) (Record, error) {
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
	defer done()
	if progress == nil {
		progress = func(uint64) {}
	}
	if err := t.readRecord(fd, e, dst, progress); err != nil {
		return Record{}, t.readFailed(e, err)
	}
	t.nReads.Add(1)
	t.nReadBytes.Add(e.Size)
	return e.Record, nil
}

// chunk is one read of a record's bytes [off, off+len(buf)) (offsets
// from the record's start).
type chunk struct {
	off    uint64
	buf    []byte
	mapped bool // buf is one of readBufs'
	n      int
	err    error
}

// readRecord reads e's value from fd into dst and checks its CRC32C:
// straight into dst when the file is read through the page cache; with
// O_DIRECT through bounce buffers on huge pages (ReadBuffer), checking
// the header against e on the way, when the kernel gives huge pages;
// without them, straight into dst when the value starts on a block (MCT2)
// and so does dst (a staging range: the master places them on a page),
// and through the bounce buffers otherwise.
//
// Huge pages beat reading in place: the caller's memory (a node's
// segment) is on small pages, scattered, and a DMA into scattered pages
// can cost several times one into contiguous memory (ReadBuffer), while
// the bounce costs a copy fused with the checksum every read pays anyway
// (checkCopy ran as fast as the checksum alone on one of this workplace's
// VMs, 6.5 against 6.4 GB/s, and at 12 against 17.5 on another). There
// Tier.Read ran at 2.8-3.8x its in-place throughput (BenchmarkRead,
// bounced/inplace).
func (t *Tier) readRecord(fd file, e *entry, dst []byte, progress func(uint64)) error {
	if e.Size > 0 && (!t.direct || !t.hugeBounce && e.aligned && uintptr(unsafe.Pointer(&dst[0]))%BlockSize == 0) {
		err := t.readInto(fd, e, dst[:e.Size], progress)
		if err == nil {
			t.nInPlace.Add(1)
		}
		return err
	}
	return t.readBounced(fd, e, dst, progress)
}

// inPlaceChunk is the most of a value one read straight into the
// caller's memory fetches. Smaller than readChunk: nothing is bounced, so
// a chunk costs no buffer, and the checksum left after the last read is
// of a smaller piece. With inPlaceInFlight at once, 1 MiB chunks of a
// 16 MiB value read as fast as one 16 MiB read on this VM's virtio disk,
// and 4 MiB ones 5-15% slower (with the checksum pass of each chunk).
const inPlaceChunk = 1 << 20

// inPlaceInFlight bounds the chunk reads of one in-place Read under way
// at once: as many as the block layer would have made of one read of
// 16 MiB, so a large value keeps the device as busy as one big read did.
const inPlaceInFlight = 4

// readInto reads e's value into dst (len(dst) == e.Size) in chunks of
// inPlaceChunk, inPlaceInFlight at once, checksumming each chunk once it
// and those before it are in, while the next ones are read. Under O_DIRECT
// the last partial block comes through a bounce block. The value's bytes
// are checked against the CRC32C its header gave, which the index keeps:
// bytes from anywhere else (another record, a torn or flipped block)
// fail it, so the header itself need not be read again.
func (t *Tier) readInto(fd file, e *entry, dst []byte, progress func(uint64)) error {
	vo := e.off + e.valueOff()
	body := e.Size
	var tail []byte
	if t.direct {
		if r := e.Size % BlockSize; r != 0 {
			body -= r
			tail = alignedBuf(BlockSize)
			defer putAligned(tail)
		}
	}
	readAt := func(b []byte, off uint64) error {
		n, err := fd.ReadAt(b, int64(off))
		switch {
		case n == len(b):
			return nil
		case err == nil || errors.Is(err, io.EOF):
			return fmt.Errorf("%w: %s ends inside the record at %d", ErrCorrupt, e.file.path, e.off)
		default:
			return fmt.Errorf("read %s at %d: %w", e.file.path, off, err)
		}
	}
	n := int((body + inPlaceChunk - 1) / inPlaceChunk)
	done := make([]chan error, n)
	for i := range done {
		done[i] = make(chan error, 1)
	}
	chunk := func(i int) []byte { return dst[uint64(i)*inPlaceChunk : min(uint64(i+1)*inPlaceChunk, body)] }
	// Every read started writes into dst, which is the caller's once this
	// returns: wait for them all, whatever happens.
	var wg sync.WaitGroup
	defer wg.Wait()
	tokens, quit := make(chan struct{}, inPlaceInFlight), make(chan struct{})
	defer close(quit)
	if n > 1 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range n {
				select {
				case tokens <- struct{}{}:
				case <-quit:
					return
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					done[i] <- readAt(chunk(i), vo+uint64(i)*inPlaceChunk)
				}()
			}
		}()
	} else if n == 1 {
		tokens <- struct{}{}
		done[0] <- readAt(chunk(0), vo)
	}
	var tailErr error
	if tail != nil {
		tailErr = readAt(tail, vo+body)
	}
	var crc uint32
	for i := range n {
		if err := <-done[i]; err != nil {
			return err
		}
		crc = checksum(crc, chunk(i))
		<-tokens
		progress(uint64(i)*inPlaceChunk + uint64(len(chunk(i))))
	}
	if tail != nil {
		if tailErr != nil {
			return tailErr
		}
		crc = checkCopy(crc, dst[body:], tail[:e.Size-body])
		progress(e.Size)
	}
	if crc != e.crc {
		return fmt.Errorf("%s at %d: %w", e.file.path, e.off, errDataCRC)
	}
	return nil
}

// readBounced reads e's record from fd through bounce buffers, checks its
// header against e and its value's CRC32C, and copies the value into dst.
func (t *Tier) readBounced(fd file, e *entry, dst []byte, progress func(uint64)) error {
	r := t.readChunks(fd, e)
	defer r.stop()
	valStart := e.valueOff()
	valEnd := valStart + e.Size
	var h header
	var crc uint32
	var got uint64
	take := func(c *chunk) error {
		b := c.buf[:c.n]
		if c.err != nil {
			if errors.Is(c.err, io.EOF) {
				return fmt.Errorf("%w: %s ends inside the record at %d", ErrCorrupt, e.file.path, e.off)
			}
			return fmt.Errorf("read %s at %d: %w", e.file.path, e.off+c.off, c.err)
		}
		if c.off == 0 {
			var err error
			if h, err = decodeHeader(b); err != nil {
				return fmt.Errorf("%s at %d: %w", e.file.path, e.off, err)
			}
			if h.key != e.Key || h.size != e.Size || h.version != e.Version {
				return fmt.Errorf("%s at %d: %w: found %q version %d (%d bytes) where %q version %d (%d bytes) was written", e.file.path, e.off, ErrCorrupt, h.key, h.version, h.size, e.Key, e.Version, e.Size)
			}
		}
		if lo, hi := max(c.off, valStart), min(c.off+uint64(c.n), valEnd); lo < hi {
			crc = checkCopy(crc, dst[lo-valStart:], b[lo-c.off:hi-c.off])
			got += hi - lo
		}
		return nil
	}
	for c := r.get(); c != nil; c = r.get() {
		err := take(c)
		r.put(c)
		if err != nil {
			return err
		}
		if got > 0 {
			progress(got)
		}
	}
	switch {
	case got != e.Size:
		return fmt.Errorf("%s at %d: %w", e.file.path, e.off, errTruncated)
	case crc != h.dataCRC:
		return fmt.Errorf("%s at %d: %w", e.file.path, e.off, errDataCRC)
	}
	return nil
}

// checkPiece is the piece of a value the checksum reads at a time from
// memory the CPU has just pulled into its L1 cache.
const checkPiece = 4 << 10

// checksum returns crc updated with b, a value a disk's DMA just wrote
// (so none of it is in the CPU's caches). CRC32C over such memory runs at
// the speed of its loads, not of the instruction: on two of this
// workplace's VMs 7.5 and 4.9 GB/s straight over b, 18 and 6.4 GB/s when
// each 4 KiB piece is first copied into a buffer in L1 and checksummed
// there (BenchmarkChecksum). On a value of 1 MiB that is 55-164 us
// instead of 135-213.
func checksum(crc uint32, b []byte) uint32 {
	var piece [checkPiece]byte
	for len(b) > 0 {
		n := copy(piece[:], b)
		crc = crc32.Update(crc, castagnoli, piece[:n])
		b = b[n:]
	}
	return crc
}

// checkCopy copies src into dst and returns crc updated with src: each
// piece is copied first and checksummed in dst, where the copy left it in
// the cache (src, just written by the disk's DMA, is not): 12 and 6.5
// GB/s on two of this workplace's VMs, against 6.9 and 4.3 checksumming
// src then copying each 16 KiB piece and 6.2 and 3.7 in two passes
// (BenchmarkCheckCopy).
func checkCopy(crc uint32, dst, src []byte) uint32 {
	for len(src) > 0 {
		n := copy(dst, src[:min(checkPiece, len(src))])
		crc = crc32.Update(crc, castagnoli, dst[:n])
		dst, src = dst[n:], src[n:]
	}
	return crc
}

// chunksInFlight bounds the chunk reads of one bounced Read under way at
// once. Two, not more: reads in flight together share the device and
// complete together, so with four or eight of them the first chunk came
// only when nearly all had, and its checksum and copy followed the reads
// instead of overlapping them (a 16 MiB Tier.Read here, timed by a loop
// run during the change and not kept: 2 MiB chunks two at once 8.4 ms,
// eight at once 9.9, 4 MiB four at once 10.8; the disk's own 16 MiB read
// 5.3).
const chunksInFlight = 2

// chunkReader reads a record in chunks of readChunk, up to
// chunksInFlight at once, and hands them over in order.
type chunkReader struct {
	bufs   *readBufs
	slots  []chan *chunk // chunk i arrives on slots[i]
	next   int
	tokens chan struct{} // one per chunk read or held by the consumer
	quit   chan struct{}
	wg     sync.WaitGroup
}

// readChunks starts reading e's record from fd. The caller takes the
// chunks in order with get, gives each back with put, and calls stop
// when done (it returns once no read is under way). A record of up to
// readChunk bytes is one read, done before readChunks returns.
func (t *Tier) readChunks(fd file, e *entry) *chunkReader {
	r := &chunkReader{bufs: t.rbufs}
	read := func(off uint64) *chunk {
		c := &chunk{off: off}
		c.buf, c.mapped = r.bufs.get()
		c.buf = c.buf[:min(readChunk, e.len-off)]
		c.n, c.err = fd.ReadAt(c.buf, int64(e.off+c.off))
		if c.err != nil && errors.Is(c.err, io.EOF) && c.n == len(c.buf) {
			c.err = nil
		}
		return c
	}
	n := int((e.len + readChunk - 1) / readChunk)
	r.slots, r.tokens, r.quit = make([]chan *chunk, n), make(chan struct{}, chunksInFlight), make(chan struct{})
	for i := range r.slots {
		r.slots[i] = make(chan *chunk, 1)
	}
	if n == 1 {
		r.tokens <- struct{}{}
		r.slots[0] <- read(0)
		return r
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for i := range n {
			select {
			case r.tokens <- struct{}{}:
			case <-r.quit:
				return
			}
			off := uint64(i) * readChunk
			r.wg.Add(1)
			go func() {
				defer r.wg.Done()
				r.slots[i] <- read(off)
			}()
		}
	}()
	return r
}

// get returns the next chunk in order, nil after the last.
func (r *chunkReader) get() *chunk {
	if r.next == len(r.slots) {
		return nil
	}
	c := <-r.slots[r.next]
	r.next++
	return c
}

// put gives back a chunk get returned, letting another read start.
func (r *chunkReader) put(c *chunk) {
	r.bufs.put(c.buf, c.mapped)
	<-r.tokens
}

// stop ends the reads: none is started after it, and it waits for those
// under way, whose buffers it gives back.
func (r *chunkReader) stop() {
	close(r.quit)
	r.wg.Wait()
	for _, s := range r.slots[r.next:] {
		select {
		case c := <-s:
			r.bufs.put(c.buf, c.mapped)
		default:
		}
	}
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
	return fmt.Errorf("disk tier read %q: %w (%w)", e.Key, err, ErrDropped)
}
