package cororpc

import (
	"crypto/md5"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
)

// Wire constants of the coro_rpc protocol.
const (
	// Magic is the first byte of every coro_rpc header. A server sharing a
	// port with another protocol can tell coro_rpc traffic by it.
	Magic = 0x15
	// Version is the only protocol version coro_rpc speaks; a peer refuses
	// any header whose version is above it.
	Version = 0
	// SerializeStructPack is the only serialize_type coro_rpc accepts.
	SerializeStructPack = 0

	// RequestHeaderLen and ResponseHeaderLen are the packed header sizes.
	RequestHeaderLen  = 20
	ResponseHeaderLen = 16

	// DefaultMaxMessageLen bounds body plus attachment of one frame when
	// no limit is configured. coro_rpc itself has none below 4 GiB; 64 MiB
	// is far above any master RPC Mooncake sends (batch replies for
	// thousands of keys stay in the low megabytes) and low enough that a
	// hostile or corrupt header cannot make a peer allocate gigabytes.
	DefaultMaxMessageLen = 64 << 20
)

// Sentinel errors callers branch on. Errors returned by this package wrap
// them with the operation and the peer.
var (
	// ErrBadMagic: the first byte of a header is not [Magic]; the stream is
	// not coro_rpc or has lost framing.
	ErrBadMagic = errors.New("bad coro_rpc magic")
	// ErrBadVersion: the header's version is above [Version].
	ErrBadVersion = errors.New("unsupported coro_rpc version")
	// ErrBadSerializeType: a request names a serialization other than
	// struct_pack.
	ErrBadSerializeType = errors.New("unsupported coro_rpc serialize_type")
	// ErrTruncated: fewer bytes than a header needs.
	ErrTruncated = errors.New("truncated coro_rpc header")
	// ErrMessageTooLarge: a frame's body plus attachment exceeds the
	// configured limit; nothing was allocated for it.
	ErrMessageTooLarge = errors.New("coro_rpc message too large")
	// ErrUnknownSeq: a response answers no call in flight. The client drops
	// the connection because request/response matching can no longer be
	// trusted.
	ErrUnknownSeq = errors.New("coro_rpc response for unknown sequence number")
	// ErrConnectionLost: the connection broke while the call was in flight.
	// The call is not retried: whether it ran on the server is unknown, and
	// only the caller knows whether it is idempotent.
	ErrConnectionLost = errors.New("coro_rpc connection lost")
	// ErrClosed: the Client or Server was closed.
	ErrClosed = errors.New("coro_rpc endpoint closed")
)

// FunctionID is the route key coro_rpc gives a handler: the first four bytes
// of MD5 of its qualified name (e.g.
// "mooncake::WrappedMasterService::MountSegment"), read big-endian.
func FunctionID(qualifiedName string) uint32 {
	sum := md5.Sum([]byte(qualifiedName))
	return binary.BigEndian.Uint32(sum[:4])
}

// RequestHeader is coro_rpc's 20-byte request header.
type RequestHeader struct {
	Magic         uint8
	Version       uint8
	SerializeType uint8
	MsgType       uint8
	Seq           uint32
	FunctionID    uint32
	Length        uint32 // body bytes that follow the header
	AttachLength  uint32 // attachment bytes that follow the body
}

// ResponseHeader is coro_rpc's 16-byte response header. ErrCode is 0 on
// success; otherwise the body holds the error message (see [RPCError]).
type ResponseHeader struct {
	Magic        uint8
	Version      uint8
	ErrCode      uint8
	MsgType      uint8
	Seq          uint32
	Length       uint32
	AttachLength uint32
}

// AppendTo appends the encoded header to b.
func (h RequestHeader) AppendTo(b []byte) []byte {
	b = append(b, h.Magic, h.Version, h.SerializeType, h.MsgType)
	b = binary.LittleEndian.AppendUint32(b, h.Seq)
	b = binary.LittleEndian.AppendUint32(b, h.FunctionID)
	b = binary.LittleEndian.AppendUint32(b, h.Length)
	return binary.LittleEndian.AppendUint32(b, h.AttachLength)
}

// AppendTo appends the encoded header to b.
func (h ResponseHeader) AppendTo(b []byte) []byte {
	b = append(b, h.Magic, h.Version, h.ErrCode, h.MsgType)
	b = binary.LittleEndian.AppendUint32(b, h.Seq)
	b = binary.LittleEndian.AppendUint32(b, h.Length)
	return binary.LittleEndian.AppendUint32(b, h.AttachLength)
}

// ParseRequestHeader decodes the first [RequestHeaderLen] bytes of b and
// checks magic and version, as a coro_rpc server does before reading a body.
// It does not judge serialize_type or lengths: see [RequestHeader.Check].
func ParseRequestHeader(b []byte) (RequestHeader, error) {
	if len(b) < RequestHeaderLen {
		return RequestHeader{}, fmt.Errorf("request header: %d of %d bytes: %w", len(b), RequestHeaderLen, ErrTruncated)
	}
	h := RequestHeader{
		Magic:         b[0],
		Version:       b[1],
		SerializeType: b[2],
		MsgType:       b[3],
		Seq:           binary.LittleEndian.Uint32(b[4:]),
		FunctionID:    binary.LittleEndian.Uint32(b[8:]),
		Length:        binary.LittleEndian.Uint32(b[12:]),
		AttachLength:  binary.LittleEndian.Uint32(b[16:]),
	}
	if err := checkMagicVersion(h.Magic, h.Version); err != nil {
		return h, fmt.Errorf("request header: %w", err)
	}
	return h, nil
}

// ParseResponseHeader decodes the first [ResponseHeaderLen] bytes of b and
// checks magic and version.
func ParseResponseHeader(b []byte) (ResponseHeader, error) {
	if len(b) < ResponseHeaderLen {
		return ResponseHeader{}, fmt.Errorf("response header: %d of %d bytes: %w", len(b), ResponseHeaderLen, ErrTruncated)
	}
	h := ResponseHeader{
		Magic:        b[0],
		Version:      b[1],
		ErrCode:      b[2],
		MsgType:      b[3],
		Seq:          binary.LittleEndian.Uint32(b[4:]),
		Length:       binary.LittleEndian.Uint32(b[8:]),
		AttachLength: binary.LittleEndian.Uint32(b[12:]),
	}
	if err := checkMagicVersion(h.Magic, h.Version); err != nil {
		return h, fmt.Errorf("response header seq %d: %w", h.Seq, err)
	}
	return h, nil
}

func checkMagicVersion(magic, version uint8) error {
	if magic != Magic {
		return fmt.Errorf("magic %#02x, want %#02x: %w", magic, Magic, ErrBadMagic)
	}
	if version > Version {
		return fmt.Errorf("version %d, want %d: %w", version, Version, ErrBadVersion)
	}
	return nil
}

// Check validates what ParseRequestHeader leaves to the reader: the
// serialization and that body plus attachment fit in maxLen bytes (0 means
// [DefaultMaxMessageLen]).
func (h RequestHeader) Check(maxLen uint32) error {
	if h.SerializeType != SerializeStructPack {
		return fmt.Errorf("request seq %d function %#08x: serialize_type %d: %w", h.Seq, h.FunctionID, h.SerializeType, ErrBadSerializeType)
	}
	if err := checkLen(h.Length, h.AttachLength, maxLen); err != nil {
		return fmt.Errorf("request seq %d function %#08x: %w", h.Seq, h.FunctionID, err)
	}
	return nil
}

// Check validates that body plus attachment fit in maxLen bytes (0 means
// [DefaultMaxMessageLen]).
func (h ResponseHeader) Check(maxLen uint32) error {
	if err := checkLen(h.Length, h.AttachLength, maxLen); err != nil {
		return fmt.Errorf("response seq %d: %w", h.Seq, err)
	}
	return nil
}

func checkLen(body, attach, maxLen uint32) error {
	if maxLen == 0 {
		maxLen = DefaultMaxMessageLen
	}
	if total := uint64(body) + uint64(attach); total > uint64(maxLen) {
		return fmt.Errorf("body %d + attachment %d bytes exceed the limit of %d: %w", body, attach, maxLen, ErrMessageTooLarge)
	}
	return nil
}

// ReadRequest reads one request frame from r: header, body, attachment. It
// refuses a bad header or an oversized frame (maxLen 0 means
// [DefaultMaxMessageLen]) before allocating for the body; a stream that
// ends inside the frame yields an error wrapping io.ErrUnexpectedEOF (io.EOF
// if it ends before the first byte).
func ReadRequest(r io.Reader, maxLen uint32) (h RequestHeader, body, attach []byte, err error) {
	var hb [RequestHeaderLen]byte
	if _, err := io.ReadFull(r, hb[:]); err != nil {
		return h, nil, nil, fmt.Errorf("read request header: %w", err)
	}
	if h, err = ParseRequestHeader(hb[:]); err != nil {
		return h, nil, nil, err
	}
	if err = h.Check(maxLen); err != nil {
		return h, nil, nil, err
	}
	body, attach, err = readPayload(r, h.Length, h.AttachLength)
	if err != nil {
		return h, nil, nil, fmt.Errorf("request seq %d function %#08x: %w", h.Seq, h.FunctionID, err)
	}
	return h, body, attach, nil
}

// ReadResponse reads one response frame from r, with the checks of
// [ReadRequest].
func ReadResponse(r io.Reader, maxLen uint32) (h ResponseHeader, body, attach []byte, err error) {
	if h, err = readResponseHeader(r, maxLen); err != nil {
		return h, nil, nil, err
	}
	body, attach, err = readPayload(r, h.Length, h.AttachLength)
	if err != nil {
		return h, nil, nil, fmt.Errorf("response seq %d: %w", h.Seq, err)
	}
	return h, body, attach, nil
}

func readResponseHeader(r io.Reader, maxLen uint32) (ResponseHeader, error) {
	var hb [ResponseHeaderLen]byte
	if _, err := io.ReadFull(r, hb[:]); err != nil {
		return ResponseHeader{}, fmt.Errorf("read response header: %w", err)
	}
	h, err := ParseResponseHeader(hb[:])
	if err != nil {
		return h, err
	}
	return h, h.Check(maxLen)
}

// payloadChunk is the most readPayloadGrowing allocates ahead of the bytes
// it has received.
const payloadChunk = 1 << 20

// readPayloadGrowing reads what readPayload reads, but allocates as the
// bytes arrive (doubling, from at most payloadChunk), not the announced
// size up front: a peer that announces 64 MiB and stalls pins no more
// than about twice what it sent.
func readPayloadGrowing(r io.Reader, bodyLen, attachLen uint32) (body, attach []byte, err error) {
	n := uint64(bodyLen) + uint64(attachLen)
	if n <= payloadChunk {
		return readPayload(r, bodyLen, attachLen)
	}
	if n > math.MaxInt {
		return nil, nil, fmt.Errorf("payload of %d bytes: %w", n, ErrMessageTooLarge)
	}
	buf := make([]byte, 0, payloadChunk)
	for uint64(len(buf)) < n {
		if len(buf) == cap(buf) {
			next := make([]byte, len(buf), min(uint64(2*cap(buf)), n))
			copy(next, buf)
			buf = next
		}
		m, err := io.ReadFull(r, buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+m]
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, nil, fmt.Errorf("read %d-byte payload (%d bytes came): %w", n, len(buf), err)
		}
	}
	body = buf[:bodyLen:bodyLen]
	if attachLen > 0 {
		attach = buf[bodyLen:]
	}
	return body, attach, nil
}

// readPayload reads a body and an attachment whose lengths were already
// checked against the limit. Both live in one allocation.
func readPayload(r io.Reader, bodyLen, attachLen uint32) (body, attach []byte, err error) {
	n := uint64(bodyLen) + uint64(attachLen)
	if n == 0 {
		return nil, nil, nil
	}
	if n > math.MaxInt {
		return nil, nil, fmt.Errorf("payload of %d bytes: %w", n, ErrMessageTooLarge)
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(r, buf); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, nil, fmt.Errorf("read %d-byte payload: %w", n, err)
	}
	body = buf[:bodyLen:bodyLen]
	if attachLen > 0 {
		attach = buf[bodyLen:]
	}
	return body, attach, nil
}
