package tier

import (
	"bytes"
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
// mapped outside the Go heap (ReadBuffer: on huge pages where the kernel
// gives them) and kept for the tier's life. From a sync.Pool they did not
// last: the pool empties at every GC, and the buffers' own size brought
// GCs on, so most reads got a new buffer whose pages the kernel had to
// fault in and zero inside the read (Tier.Read of 16 MiB records ran at
// 0.44x of O_DIRECT reads of the same bytes into a reused buffer,
// BenchmarkRead).
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
	b, err := ReadBuffer(readChunk)
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
		_ = FreeReadBuffer(b)
	}
}

// close unmaps the free buffers (no read may hold one).
func (p *readBufs) close() {
	for {
		select {
		case b := <-p.free:
			_ = FreeReadBuffer(b)
		default:
			return
		}
	}
}

// hugePage is the size of a transparent huge page on x86-64 and of the
// usual arm64 one.
const hugePage = 2 << 20

// ReadBuffer maps n bytes of anonymous memory for O_DIRECT reads: on
// huge-page boundaries, with transparent huge pages asked for
// (MADV_HUGEPAGE) and every page faulted in, so a read neither faults nor
// lands on scattered pages. Where the disk is reached through a
// hypervisor or an IOMMU a read's cost grows with the physically
// separate pieces of its buffer: on this workplace's VMs (virtio-blk) a
// 1 MiB O_DIRECT read into 256 separate 4 KiB pages took 1.6-1.7 ms, into
// two or three runs of contiguous pages 0.35-0.4 ms, and into huge pages
// 0.3 ms (a scratch program reading the pages' frames from
// /proc/self/pagemap; BenchmarkRead's bounced/inplace is the measure kept).
// FreeReadBuffer unmaps it.
func ReadBuffer(n int) ([]byte, error) {
	if n <= 0 {
		return nil, fmt.Errorf("read buffer of %d bytes", n)
	}
	// Whole huge pages: a smaller mapping cannot have one.
	size := uintptr(n+hugePage-1) &^ (hugePage - 1)
	raw, err := unix.MmapPtr(-1, 0, nil, size+hugePage, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("map a read buffer of %d bytes: %w", size, err)
	}
	// Keep [off, off+size) on a huge-page boundary; the pieces either
	// side go back.
	start := uintptr(raw)
	off := (hugePage - start&(hugePage-1)) & (hugePage - 1)
	if off > 0 {
		_ = unix.MunmapPtr(raw, off)
	}
	if rest := hugePage - off; rest > 0 {
		_ = unix.MunmapPtr(unsafe.Add(raw, off+size), rest)
	}
	b := unsafe.Slice((*byte)(unsafe.Add(raw, off)), size)
	// Without THP the advice fails or is ignored: the buffer still
	// works, on small pages.
	_ = unix.Madvise(b, unix.MADV_HUGEPAGE)
	for i := 0; i < len(b); i += BlockSize {
		b[i] = 0
	}
	return b[:n], nil
}

// FreeReadBuffer unmaps a buffer ReadBuffer returned.
func FreeReadBuffer(b []byte) error {
	if cap(b) == 0 {
		return nil
	}
	return unix.MunmapPtr(unsafe.Pointer(unsafe.SliceData(b)), uintptr(cap(b)))
}

// hugePagesOn reports whether the kernel gives anonymous memory that asks
// for them transparent huge pages (sysfs: <root>/kernel/mm/
// transparent_hugepage/enabled says "[always]" or "[madvise]").
func hugePagesOn(sysfs string) bool {
	b, err := os.ReadFile(filepath.Join(sysfs, "kernel/mm/transparent_hugepage/enabled"))
	if err != nil {
		return false
	}
	return bytes.Contains(b, []byte("[always]")) || bytes.Contains(b, []byte("[madvise]"))
}
