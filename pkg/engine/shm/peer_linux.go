package shm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// Local is this side of a mapping: where procfs is, this host's boot id
// and the user this engine runs as.
type Local struct {
	ProcFS string // DefaultProcFS when empty
	BootID string
	UID    int
}

// Peer is another engine's process, attached: its identity checked and a
// pidfd held. Its methods are safe for concurrent use.
type Peer struct {
	id    Identity
	local Local

	mu     sync.RWMutex // Close must not close the pidfd under a poll
	pidfd  int
	closed bool
}

// Mapping is one of the peer's regions mapped into this process. Close
// it after its last use.
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

// Close unmaps the region.
func (m *Mapping) Close() error {
	if m.all == nil {
		return nil
	}
	err := unix.Munmap(m.all)
	m.all, m.hdr, m.data = nil, nil, nil
	return err
}

// Attach checks that the engine identified by peer may be mapped from
// here and holds its process: it refuses a peer on another host
// (ErrOtherHost) or of another user (ErrOtherUser), and a process that
// cannot be found (ErrUnmappable).
func Attach(local Local, peer Identity) (*Peer, error) {
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
	return &Peer{id: peer, local: local, pidfd: pidfd}, nil
}

// Map maps one region of the peer, checking the file is the region b
// names (ErrUnmappable; ErrOtherUser for a file of another user;
// ErrRetired for a region already unregistered).
func (p *Peer) Map(b BufferRef) (*Mapping, error) {
	m, err := mapRegion(p.local, p.id, b)
	if err != nil {
		return nil, err
	}
	// The pidfd was opened before the file: if the process it names is
	// still alive now, /proc/<pid> was that process all along (a pid is
	// not reused while its process lives).
	if p.Exited() {
		m.Close()
		return nil, fmt.Errorf("%w: process %d exited while its memory was being mapped", ErrUnmappable, p.id.PID)
	}
	return m, nil
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

// Identity is the peer's identity as given to Attach.
func (p *Peer) Identity() Identity { return p.id }

// Exited reports whether the peer process has exited (its pidfd is
// readable), or the Peer is closed. A copy that ended while the process
// was alive landed in its memory.
func (p *Peer) Exited() bool {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return true
	}
	fds := []unix.PollFd{{Fd: int32(p.pidfd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return err != nil || n > 0
	}
}

// Close releases the pidfd; mappings are closed on their own. It is
// idempotent.
func (p *Peer) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	return unix.Close(p.pidfd)
}
