package shm

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kvcache-ops/mc/pkg/engine/vmem"
)

// Region is one registered buffer backed by a memfd: the owner's side.
// Its methods are safe for concurrent use except Close, which must be
// the last call.
type Region struct {
	fd   int
	hdr  header
	data []byte
	id   uint64
}

// NewRegion creates a region of size bytes for the engine with token t.
// id must be unique among the engine's regions for its whole life (a
// counter): peers check it, so a descriptor number the owner has closed
// and reused for a new region never maps the new region in place of the
// old one.
func NewRegion(size int, t Token, id uint64) (*Region, error) {
	if size <= 0 {
		return nil, fmt.Errorf("shm region: size %d must be positive", size)
	}
	page := os.Getpagesize()
	if size > int(^uint(0)>>1)-2*page {
		return nil, fmt.Errorf("shm region: size %d too large", size)
	}
	fd, err := memfdCreate("mc-shm")
	if err != nil {
		return nil, fmt.Errorf("shm region: memfd_create: %w", err)
	}
	r := &Region{fd: fd, id: id}
	fail := func(what string, err error) (*Region, error) {
		r.unmap()
		unix.Close(fd)
		return nil, fmt.Errorf("shm region of %d bytes: %s: %w", size, what, err)
	}
	// memfds are created 0777 (0666 with MFD_NOEXEC_SEAL): only the
	// owner's user may open it through /proc/<pid>/fd.
	if err := unix.Fchmod(fd, 0o600); err != nil {
		return fail("chmod 0600", err)
	}
	total := int64(page) + int64((size+page-1)/page*page)
	if err := unix.Ftruncate(fd, total); err != nil {
		return fail("truncate", err)
	}
	// A peer maps the whole length: a file that could shrink under it
	// would turn its copies into SIGBUS.
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		return fail("seal", err)
	}
	hdr, err := unix.Mmap(fd, 0, page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail("map header", err)
	}
	r.hdr = hdr
	// Peers address the data by the owner's virtual address: it is placed
	// where no earlier region was, and reserved when closed.
	if r.data, err = vmem.Map(fd, int64(page), size); err != nil {
		return fail("map data", err)
	}
	r.hdr.set(offMagic, magic)
	r.hdr.set(offID, id)
	r.hdr.set(offAddr, uint64(uintptr(unsafe.Pointer(&r.data[0]))))
	r.hdr.set(offLength, uint64(size))
	r.hdr.set(offDataOff, uint64(page))
	copy(r.hdr[offToken:], t[:])
	r.hdr.set(offState, stateLive)
	return r, nil
}

// memfdCreate makes a close-on-exec, sealable memfd that can never be
// made executable (MFD_NOEXEC_SEAL, Linux 6.3; without it on older
// kernels, which reject the flag).
func memfdCreate(name string) (int, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING|unix.MFD_NOEXEC_SEAL)
	if errors.Is(err, unix.EINVAL) {
		fd, err = unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	}
	return fd, err
}

// Bytes is the buffer (the owner's mapping).
func (r *Region) Bytes() []byte { return r.data }

// FD is the memfd's descriptor number in this process, which peers open
// as /proc/<pid>/fd/<FD>.
func (r *Region) FD() int { return r.fd }

// ID is the region's id.
func (r *Region) ID() uint64 { return r.id }

// Retire marks the region unregistered: every peer copy that has not
// ended fails from now on, and peers do not map it any more.
func (r *Region) Retire() { r.hdr.set(offState, stateRetired) }

// Revive undoes Retire while the memory is still the owner's (an
// unregistration that was refused).
func (r *Region) Revive() { r.hdr.set(offState, stateLive) }

// Live reports whether the region is not retired.
func (r *Region) Live() bool { return r.hdr.state() == stateLive }

// Close retires the region, unmaps the owner's view and closes the memfd.
// The pages stay alive in peers' mappings until they unmap them: they are
// never reused for anything else, so a copy a peer finishes late lands in
// memory nobody else can see.
func (r *Region) Close() error {
	if r.hdr != nil {
		r.Retire()
	}
	err := r.unmap()
	if cerr := unix.Close(r.fd); err == nil && cerr != nil {
		err = fmt.Errorf("close memfd: %w", cerr)
	}
	return err
}

func (r *Region) unmap() error {
	var errs []error
	if r.data != nil {
		errs = append(errs, vmem.Release(r.data))
		r.data = nil
	}
	if r.hdr != nil {
		errs = append(errs, unix.Munmap(r.hdr))
		r.hdr = nil
	}
	return errors.Join(errs...)
}
