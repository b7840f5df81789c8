// Package shm is the memory half of the transfer engine's same-host
// transport: registered memory backed by a memfd that another process of
// the same user on the same host can map, and the peer side that maps it.
//
// A Region (the owner's side) is one memfd: a header page, then the
// buffer. The header carries a magic, the owner engine's token, the
// region's id, address and length (so a peer can tell the file it opened
// is the buffer the descriptor names, not whatever now holds that pid or
// fd number) and a state word the owner flips to retired when it
// unregisters the buffer, which every peer copy checks before and after
// it moves a byte. The file is mode 0600 and sealed against shrinking, so
// a mapped peer can never fault on a truncated file.
//
// A Peer (the mapping side) is reached by the owner's pid and the memfd's
// descriptor number: /proc/<pid>/fd/<n>. That path opens only for a
// process allowed to inspect the owner (same user, or CAP_SYS_PTRACE) and
// only while the owner is alive; nothing is left in a filesystem when the
// owner dies, as a /dev/shm file would be after SIGKILL. The Peer holds a
// pidfd of the owner so that copies can tell, after the fact, whether the
// owner was still alive when they ended.
//
// Host identity is the kernel boot id (Identity.BootID), which differs
// between hosts and between boots of one host; containers that share a
// kernel share it but may not share a pid namespace, which the token in
// the header catches.
//
// Main types: Region, Peer, Mapping, Identity, Token.
package shm

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Sentinel errors, matched with errors.Is.
var (
	// ErrOtherHost: the peer's boot id is not this host's.
	ErrOtherHost = errors.New("peer is on another host")
	// ErrOtherUser: the peer runs as (or its memory belongs to) another
	// user; mapping another user's memory is refused.
	ErrOtherUser = errors.New("peer memory belongs to another user")
	// ErrUnmappable: the peer's memory could not be mapped or is not what
	// its descriptor says (another pid namespace, an exited process, a
	// reused descriptor number, a file that is not sealed).
	ErrUnmappable = errors.New("peer memory cannot be mapped")
	// ErrPeerExited: the owner process exited; copies that ended after
	// that are not reported as done.
	ErrPeerExited = errors.New("peer process exited")
	// ErrRetired: the owner unregistered the buffer.
	ErrRetired = errors.New("buffer unregistered by its owner")
	// ErrUnsupported: shared-memory regions need Linux (memfd, pidfd).
	ErrUnsupported = errors.New("shared-memory transport needs Linux")
)

// Token is an engine's random identity, written into every region header
// and advertised beside it. Random (not a counter or the pid) so that no
// other process can have made a matching region before the descriptor
// existed, and two engines never share one.
type Token [16]byte

// NewToken returns a random token.
func NewToken() (Token, error) {
	var t Token
	if _, err := rand.Read(t[:]); err != nil {
		return t, fmt.Errorf("shm token: %w", err)
	}
	return t, nil
}

// String is the token as 32 lower-case hex digits (its descriptor form).
func (t Token) String() string { return hex.EncodeToString(t[:]) }

// ParseToken parses String's form.
func ParseToken(s string) (Token, error) {
	var t Token
	if len(s) != 2*len(t) {
		return t, fmt.Errorf("token %q: want %d hex digits", s, 2*len(t))
	}
	if _, err := hex.Decode(t[:], []byte(s)); err != nil {
		return t, fmt.Errorf("token %q: want %d hex digits", s, 2*len(t))
	}
	return t, nil
}

// DefaultProcFS is where procfs is mounted.
const DefaultProcFS = "/proc"

// BootID reads the kernel boot id under procfs (DefaultProcFS when
// empty): <procfs>/sys/kernel/random/boot_id, a UUID.
func BootID(procfs string) (string, error) {
	if procfs == "" {
		procfs = DefaultProcFS
	}
	p := filepath.Join(procfs, "sys", "kernel", "random", "boot_id")
	b, err := os.ReadFile(p)
	if err != nil {
		return "", fmt.Errorf("read boot id: %w", err)
	}
	id := strings.TrimSpace(string(b))
	if !ValidBootID(id) {
		return "", fmt.Errorf("read boot id: %s holds %q, not a UUID", p, id)
	}
	return id, nil
}

// ValidBootID reports whether s has the boot id's form: a UUID in
// lower-case hex, 8-4-4-4-12.
func ValidBootID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i, c := range s {
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
				return false
			}
		}
	}
	return true
}

// Identity is what a peer needs to decide whether it can map an engine's
// memory and to reach it: the host (boot id), the engine (token), the
// owner process and its user.
type Identity struct {
	BootID string
	Token  Token
	PID    int
	UID    int
}

// Self is the identity of this process for an engine with token t, boot
// id read under procfs.
func Self(procfs string, t Token) (Identity, error) {
	id, err := BootID(procfs)
	if err != nil {
		return Identity{}, err
	}
	return Identity{BootID: id, Token: t, PID: os.Getpid(), UID: os.Geteuid()}, nil
}

// BufferRef names one region of a peer: its address and length as the
// descriptor lists them, the memfd's descriptor number in the owner
// process and the region id.
type BufferRef struct {
	Addr, Length uint64
	FD           int
	ID           uint64
}

// Header layout (one page at the start of every region). Offsets in
// bytes; every field is a native-endian uint64 except the token.
const (
	offMagic   = 0
	offState   = 8
	offID      = 16
	offAddr    = 24
	offLength  = 32
	offDataOff = 40
	offToken   = 48
	headerUsed = offToken + len(Token{})
)

// magic is "mcshm\x00v1" read as a little-endian word; a different
// layout gets a different magic.
const magic = 0x3176_006d_6873_636d

// Region states. A region is created initialising, published live and
// retired once; it never comes back to live after its memory is gone.
const (
	stateInit    = 0
	stateLive    = 1
	stateRetired = 2
)
