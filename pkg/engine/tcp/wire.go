// Package tcp is mc's Mooncake-compatible TCP data transport (compat.md §2):
// the 24-byte request header and 8-byte status words as pure codecs, a data
// Server that moves bytes straight between the socket and registered memory
// after checking every range, and a Client that keeps several persistent,
// pipelined lanes per peer.
//
// The package knows nothing of segments or batches: the server asks a
// Memory for the registered bytes behind an address range, and the client
// completes each Op through its Done callback. pkg/engine adapts both.
package tcp

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// HeaderSize is the length of a request header on the wire.
const HeaderSize = 24

// StatusSize is the length of a v2 status word.
const StatusSize = 8

// Opcodes. Version 2 sets VersionBit; v1 peers send the bare opcode and get
// no status frames.
const (
	OpRead     uint8 = 0
	OpWrite    uint8 = 1
	VersionBit uint8 = 0x80
)

// Status words (little-endian u64 on the wire).
const (
	StatusOK       uint64 = 0x4D43545600000000 // "MCTV" << 32
	StatusRejected uint64 = StatusOK | 1
)

// ErrBadOpcode is returned by DecodeHeader for an opcode other than
// 0, 1, 0x80 or 0x81.
var ErrBadOpcode = errors.New("unknown opcode")

// ErrRejected is the reason a task fails when the peer answered with the
// rejected status (its registered memory does not hold the range).
var ErrRejected = errors.New("target rejected the address range (not inside one registered buffer)")

// Header is one request: Size bytes at the target's virtual address Addr.
type Header struct {
	Size  uint64
	Addr  uint64
	Write bool
	V2    bool // status frames are exchanged
}

// Opcode returns the wire opcode byte of h.
func (h Header) Opcode() uint8 {
	op := OpRead
	if h.Write {
		op = OpWrite
	}
	if h.V2 {
		op |= VersionBit
	}
	return op
}

// PutHeader encodes h into b[:HeaderSize] (padding zeroed).
func PutHeader(b []byte, h Header) {
	_ = b[HeaderSize-1]
	binary.LittleEndian.PutUint64(b[0:], h.Size)
	binary.LittleEndian.PutUint64(b[8:], h.Addr)
	b[16] = h.Opcode()
	clear(b[17:HeaderSize])
}

// AppendHeader appends the encoding of h to dst.
func AppendHeader(dst []byte, h Header) []byte {
	var b [HeaderSize]byte
	PutHeader(b[:], h)
	return append(dst, b[:]...)
}

// DecodeHeader decodes b[:HeaderSize]. The seven padding bytes are not
// checked: Mooncake declares them but does not promise to zero them, and
// they carry nothing. Sizes and addresses are checked by the server against
// registered memory, not here.
func DecodeHeader(b []byte) (Header, error) {
	if len(b) < HeaderSize {
		return Header{}, fmt.Errorf("tcp header: %d bytes, want %d", len(b), HeaderSize)
	}
	h := Header{
		Size: binary.LittleEndian.Uint64(b[0:]),
		Addr: binary.LittleEndian.Uint64(b[8:]),
	}
	op := b[16]
	h.V2 = op&VersionBit != 0
	switch op &^ VersionBit {
	case OpRead:
	case OpWrite:
		h.Write = true
	default:
		return Header{}, fmt.Errorf("tcp header: opcode 0x%02x: %w", op, ErrBadOpcode)
	}
	return h, nil
}

// PutStatus encodes a status word into b[:StatusSize].
func PutStatus(b []byte, s uint64) { binary.LittleEndian.PutUint64(b, s) }

// CheckStatus interprets a received status word.
func CheckStatus(b []byte) error {
	s := binary.LittleEndian.Uint64(b)
	switch s {
	case StatusOK:
		return nil
	case StatusRejected:
		return ErrRejected
	}
	return fmt.Errorf("tcp status word 0x%016x is neither OK nor rejected (peer speaks another protocol?)", s)
}
