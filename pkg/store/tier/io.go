package tier

import (
	"errors"
	"fmt"
	"math/bits"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// file is what the tier needs of an open data file. Tests put a faulty
// one in its place (Config.openFile) to fail reads, writes or syncs.
type file interface {
	ReadAt(p []byte, off int64) (int, error)
	WriteAt(p []byte, off int64) (int, error)
	// Sync makes written data durable (fdatasync: the size is included,
	// the timestamps need not be).
	Sync() error
	Close() error
}

// openFunc opens a data file; direct asks for O_DIRECT.
type openFunc func(path string, flag int, direct bool) (file, error)

type osFile struct{ *os.File }

func (f osFile) Sync() error {
	for {
		err := unix.Fdatasync(int(f.Fd()))
		if err != unix.EINTR {
			if err != nil {
				return &os.PathError{Op: "fdatasync", Path: f.Name(), Err: err}
			}
			return nil
		}
	}
}

func openOS(path string, flag int, direct bool) (file, error) {
	if direct {
		flag |= unix.O_DIRECT
	}
	f, err := os.OpenFile(path, flag, 0o644)
	if err != nil {
		return nil, err
	}
	return osFile{f}, nil
}

// probeDirect reports whether dir's filesystem takes O_DIRECT reads and
// writes of aligned blocks (tmpfs before Linux 6.6 refuses the open, some
// filesystems the write). Any other failure means dir is not writable.
func probeDirect(dir string, open openFunc) (bool, error) {
	path := filepath.Join(dir, ".probe")
	defer os.Remove(path)
	buf := alignedBuf(BlockSize)
	defer putAligned(buf)
	for _, direct := range []bool{true, false} {
		f, err := open(path, os.O_CREATE|os.O_RDWR|os.O_TRUNC, direct)
		if direct && errors.Is(err, unix.EINVAL) {
			continue
		}
		if err != nil {
			return false, err
		}
		_, err = f.WriteAt(buf, 0)
		if err == nil {
			_, err = f.ReadAt(buf, 0)
		}
		f.Close()
		if direct && errors.Is(err, unix.EINVAL) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("write a test block: %w", err)
		}
		return direct, nil
	}
	return false, errors.New("unreachable")
}

// syncDir makes a created or removed directory entry durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Aligned buffers: O_DIRECT needs the memory, the file offset and the
// length aligned. Buffers come in size classes of 2^k and 1.5*2^k blocks
// (at most a third wasted), pooled per class: a 16 MiB read must not
// allocate 16 MiB each time.
var alignedPools [2 * 48]sync.Pool

func sizeClass(n int) (class, size int) {
	blocks := max((n+BlockSize-1)/BlockSize, 1)
	k := bits.Len(uint(blocks - 1)) // the least k with 2^k >= blocks
	if k >= 2 && 3<<(k-2) >= blocks {
		return 2*k - 1, (3 << (k - 2)) * BlockSize
	}
	return 2 * k, (1 << k) * BlockSize
}

// alignedBuf returns a BlockSize-aligned buffer of exactly n bytes (its
// capacity may be larger); putAligned gives it back.
func alignedBuf(n int) []byte {
	class, size := sizeClass(n)
	if b, ok := alignedPools[class].Get().(*[]byte); ok {
		return (*b)[:n]
	}
	raw := make([]byte, size+BlockSize)
	off := 0
	if r := int(uintptr(unsafe.Pointer(&raw[0])) & (BlockSize - 1)); r != 0 {
		off = BlockSize - r
	}
	return raw[off : off+n : off+size]
}

func putAligned(b []byte) {
	class, size := sizeClass(cap(b))
	if size != cap(b) {
		return // not one of ours
	}
	b = b[:cap(b)]
	alignedPools[class].Put(&b)
}

// readBufs holds the read path's bounce buffers, readChunk bytes each,
// mapped outside the Go heap and kept for the tier's life. From a
// sync.Pool they did not last: the pool empties at every GC, and the
// buffers' own size brought GCs on, so most reads got a new buffer whose
// pages the kernel had to fault in and zero inside the read (Tier.Read
// of 16 MiB records ran at 0.44x of O_DIRECT reads of the same bytes
// into a reused buffer, BenchmarkRead).
type readBufs struct {
	free  chan []byte
	inUse atomic.Int64 // mapped buffers handed out and not given back
}

func newReadBufs(n int) *readBufs { return &readBufs{free: make(chan []byte, n)} }

// get returns a buffer of readChunk bytes; mapped says it is one of ours
// (when the mapping fails, a heap buffer does the read all the same).
func (p *readBufs) get() (b []byte, mapped bool) {
	select {
	case b = <-p.free:
		p.inUse.Add(1)
		return b, true
	default:
	}
	b, err := unix.Mmap(-1, 0, readChunk, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return alignedBuf(readChunk), false
	}
	p.inUse.Add(1)
	return b, true
}

func (p *readBufs) put(b []byte, mapped bool) {
	if !mapped {
		putAligned(b)
		return
	}
	p.inUse.Add(-1)
	b = b[:cap(b)]
	select {
	case p.free <- b:
	default:
		_ = unix.Munmap(b)
	}
}

// close unmaps the free buffers (no read may hold one).
func (p *readBufs) close() {
	for {
		select {
		case b := <-p.free:
			_ = unix.Munmap(b)
		default:
			return
		}
	}
}
