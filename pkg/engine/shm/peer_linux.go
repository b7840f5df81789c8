package shm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// Local is this side of a mapping: where procfs is, this host's boot id
// and the user this engine runs as.
type Local struct {
	ProcFS string // DefaultProcFS when empty
	BootID string
	UID    int
}

// Peer is another engine's memory mapped into this process. Its methods
// are safe for concurrent use; Close must come after every use of the
// mappings.
type Peer struct {
	id    Identity
	pidfd int
	maps  []*Mapping
}

// Mapping is one of the peer's regions as mapped here.
type Mapping struct {
	ref  BufferRef
	all  []byte // header page and data, one mapping
	hdr  header
	data []byte
}

// Bytes is the region's data ([Addr, Addr+Length) of the peer).
func (m *Mapping) Bytes() []byte { return m.data }

// Ref is the buffer the mapping was opened for.
func (m *Mapping) Ref() BufferRef { return m.ref }

// Live reports whether the owner has not unregistered the region.
func (m *Mapping) Live() bool { return m.hdr.state() == stateLive }

// Open maps bufs of the engine identified by peer. It refuses a peer on
// another host (ErrOtherHost), of another user (ErrOtherUser), and any
// file that is not what the descriptor says (ErrUnmappable, or
// ErrRetired for a region already unregistered).
func Open(local Local, peer Identity, bufs []BufferRef) (*Peer, error) {
	if local.ProcFS == "" {
		local.ProcFS = DefaultProcFS
	}
	if peer.BootID != local.BootID {
		return nil, fmt.Errorf("%w: boot id %s, this host's %s", ErrOtherHost, peer.BootID, local.BootID)
	}
	if peer.UID != local.UID {
		return nil, fmt.Errorf("%w: the peer engine runs as uid %d, this engine as uid %d", ErrOtherUser, peer.UID, local.UID)
	}
	if peer.PID <= 0 {
		return nil, fmt.Errorf("%w: pid %d", ErrUnmappable, peer.PID)
	}
	pidfd, err := unix.PidfdOpen(peer.PID, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: process %d: %v", ErrUnmappable, peer.PID, err)
	}
	p := &Peer{id: peer, pidfd: pidfd}
	for _, b := range bufs {
		m, err := mapRegion(local, peer, b)
		if err != nil {
			p.Close()
			return nil, err
		}
		p.maps = append(p.maps, m)
	}
	// The pidfd was opened before the files: if the process it names is
	// still alive now, /proc/<pid> was that process all along (a pid is
	// not reused while its process lives).
	if p.Exited() {
		p.Close()
		return nil, fmt.Errorf("%w: process %d exited while its memory was being mapped", ErrUnmappable, peer.PID)
	}
	return p, nil
}

func mapRegion(local Local, peer Identity, b BufferRef) (*Mapping, error) {
	path := filepath.Join(local.ProcFS, strconv.Itoa(peer.PID), "fd", strconv.Itoa(b.FD))
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s (buffer 0x%x): %s", ErrUnmappable, path, b.Addr, fmt.Sprintf(format, a...))
	}
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, bad("open: %v", err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, bad("stat: %v", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, bad("not a regular file")
	}
	if int(st.Uid) != local.UID {
		return nil, fmt.Errorf("%w: %s (buffer 0x%x) is owned by uid %d, this engine runs as uid %d", ErrOtherUser, path, b.Addr, st.Uid, local.UID)
	}
	if st.Mode&0o077 != 0 {
		return nil, bad("mode %04o gives other users access (want 0600)", st.Mode&0o7777)
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return nil, bad("not a sealed memfd: %v", err)
	}
	if seals&unix.F_SEAL_SHRINK == 0 {
		return nil, bad("not sealed against shrinking")
	}
	page := uint64(os.Getpagesize())
	if b.Length == 0 || b.Length > uint64(st.Size) || uint64(st.Size)-b.Length < page {
		return nil, bad("%d bytes, too small for a %d-byte buffer after the header page", st.Size, b.Length)
	}
	all, err := unix.Mmap(fd, 0, int(page+b.Length), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, bad("mmap: %v", err)
	}
	m := &Mapping{ref: b, all: all, hdr: header(all[:page]), data: all[page : page+b.Length : page+b.Length]}
	var why string
	switch {
	case m.hdr.get(offMagic) != magic:
		why = "no mc region header"
	case m.hdr.token() != peer.Token:
		why = "a region of another engine (token differs)"
	case m.hdr.get(offID) != b.ID:
		why = fmt.Sprintf("region %d, want %d (the descriptor is stale)", m.hdr.get(offID), b.ID)
	case m.hdr.get(offAddr) != b.Addr || m.hdr.get(offLength) != b.Length:
		why = fmt.Sprintf("region at 0x%x of %d bytes, want 0x%x of %d", m.hdr.get(offAddr), m.hdr.get(offLength), b.Addr, b.Length)
	case m.hdr.get(offDataOff) != page:
		why = fmt.Sprintf("data at offset %d, want %d", m.hdr.get(offDataOff), page)
	}
	if why != "" {
		unix.Munmap(all)
		return nil, bad("%s", why)
	}
	if !m.Live() {
		unix.Munmap(all)
		return nil, fmt.Errorf("%s (buffer 0x%x): %w", path, b.Addr, ErrRetired)
	}
	return m, nil
}

// Identity is the peer's identity as given to Open.
func (p *Peer) Identity() Identity { return p.id }

// Mappings are the mapped regions, in the order Open was given them.
func (p *Peer) Mappings() []*Mapping { return p.maps }

// Exited reports whether the peer process has exited (its pidfd is
// readable). A copy that ended while it was alive landed in its memory.
func (p *Peer) Exited() bool {
	fds := []unix.PollFd{{Fd: int32(p.pidfd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return err != nil || n > 0
	}
}

// Close unmaps every region and closes the pidfd. It is idempotent.
func (p *Peer) Close() error {
	var errs []error
	for _, m := range p.maps {
		errs = append(errs, unix.Munmap(m.all))
	}
	p.maps = nil
	if p.pidfd >= 0 {
		errs = append(errs, unix.Close(p.pidfd))
		p.pidfd = -1
	}
	return errors.Join(errs...)
}
