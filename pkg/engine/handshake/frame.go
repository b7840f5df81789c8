// Package handshake speaks Mooncake's handshake socket (compat.md §3): the
// TCP side channel peers use to exchange segment descriptors in
// P2PHANDSHAKE mode and to set up RDMA queue pairs. A connection carries one
// request frame and one reply frame of the same type; the frame is a
// little-endian u64 length (counting the type byte and the JSON), the type
// byte, then JSON.
//
// Framing (AppendFrame, ReadFrame) is pure and fuzzed; Server and Request
// put it on sockets with a length bound and a deadline on every read.
package handshake

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// FrameType is the byte after the length that says what a frame is for.
type FrameType uint8

// Mooncake's frame types.
const (
	Connection FrameType = 0 // RDMA queue-pair exchange (ConnectionInfo)
	Metadata   FrameType = 1 // segment descriptor request/reply
	Notify     FrameType = 2 // notification message
	Probe      FrameType = 3 // liveness probe
)

func (t FrameType) String() string {
	switch t {
	case Connection:
		return "Connection"
	case Metadata:
		return "Metadata"
	case Notify:
		return "Notify"
	case Probe:
		return "Probe"
	}
	return fmt.Sprintf("FrameType(%d)", uint8(t))
}

// Length limits, as Mooncake's MC_HANDSHAKE_MAX_LENGTH: the default bound
// on a frame's length field and the largest bound a user may configure.
const (
	DefaultMaxLength = 1 << 20
	MaxMaxLength     = 128 << 20
)

// HeaderSize is the size of the length field.
const HeaderSize = 8

// ErrFrameTooLarge is returned (wrapped) when a frame's length field exceeds
// the configured bound; the frame's payload is not read.
var ErrFrameTooLarge = errors.New("handshake frame too large")

// ErrEmptyFrame is returned (wrapped) when a length field is 0: a valid
// frame always counts at least its type byte.
var ErrEmptyFrame = errors.New("handshake frame has length 0")

// effectiveMax maps a caller's bound to the one enforced: <= 0 means the
// default, and nothing above MaxMaxLength is allowed.
func effectiveMax(max int) int {
	switch {
	case max <= 0:
		return DefaultMaxLength
	case max > MaxMaxLength:
		return MaxMaxLength
	}
	return max
}

// AppendFrame appends the encoded frame to dst and returns the result.
func AppendFrame(dst []byte, t FrameType, payload []byte) []byte {
	dst = binary.LittleEndian.AppendUint64(dst, uint64(len(payload))+1)
	dst = append(dst, byte(t))
	return append(dst, payload...)
}

// WriteFrame writes one frame with a single Write call.
func WriteFrame(w io.Writer, t FrameType, payload []byte) error {
	buf := AppendFrame(make([]byte, 0, HeaderSize+1+len(payload)), t, payload)
	if _, err := w.Write(buf); err != nil {
		return fmt.Errorf("write %v frame: %w", t, err)
	}
	return nil
}

// readChunk caps how much memory a frame may claim before its bytes arrive,
// so a peer announcing a large frame and sending nothing costs little.
const readChunk = 64 << 10

// ReadFrame reads one frame. max bounds the length field (type byte plus
// JSON); <= 0 means DefaultMaxLength and values above MaxMaxLength are
// clamped. A stream that ends before any byte returns io.EOF (unwrapped,
// like io.Reader); a stream cut inside a frame returns an error wrapping
// io.ErrUnexpectedEOF.
func ReadFrame(r io.Reader, max int) (FrameType, []byte, error) {
	max = effectiveMax(max)
	var hdr [HeaderSize + 1]byte
	n, err := io.ReadFull(r, hdr[:HeaderSize])
	if err != nil {
		if n == 0 && errors.Is(err, io.EOF) {
			return 0, nil, io.EOF
		}
		return 0, nil, fmt.Errorf("read handshake frame length (%d of %d bytes): %w", n, HeaderSize, err)
	}
	length := binary.LittleEndian.Uint64(hdr[:HeaderSize])
	if length == 0 {
		return 0, nil, ErrEmptyFrame
	}
	if length > uint64(max) {
		return 0, nil, fmt.Errorf("%w: length %d exceeds limit %d (MC_HANDSHAKE_MAX_LENGTH)", ErrFrameTooLarge, length, max)
	}
	if _, err := io.ReadFull(r, hdr[HeaderSize:]); err != nil {
		return 0, nil, fmt.Errorf("read handshake frame type: %w", noEOF(err))
	}
	t := FrameType(hdr[HeaderSize])
	size := int(length - 1)
	if size <= readChunk {
		payload := make([]byte, size)
		if n, err := io.ReadFull(r, payload); err != nil {
			return 0, nil, fmt.Errorf("read %v frame payload (%d of %d bytes): %w", t, n, size, noEOF(err))
		}
		return t, payload, nil
	}
	var buf bytes.Buffer
	buf.Grow(readChunk)
	if n, err := io.CopyN(&buf, r, int64(size)); err != nil {
		return 0, nil, fmt.Errorf("read %v frame payload (%d of %d bytes): %w", t, n, size, noEOF(err))
	}
	return t, buf.Bytes(), nil
}

// noEOF turns a bare EOF inside a frame into ErrUnexpectedEOF.
func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}
