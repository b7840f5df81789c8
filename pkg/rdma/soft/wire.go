package soft

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/kvcache-ops/mc/pkg/rdma"
)

// The soft NIC's wire. Each device listens on a loopback TCP port (its LID)
// and dials one connection per peer device it sends to. A dialed
// connection starts with a hello naming the sender, then carries requests
// (with WRITE payloads) one way and responses (with READ payloads) the
// other, in order, so each QP's requests complete in post order as on an
// RC QP. All integers are little-endian.
//
//	hello    (8):  u32 magic "MCSN" | u16 version | u16 sender LID
//	request  (40): u8 1 | u8 opcode | u16 0 | u32 dst qpn | u32 src qpn |
//	               u32 rkey | u64 seq | u64 remote addr | u32 length | u32 0
//	response (24): u8 2 | u8 wc status | u16 0 | u32 requester qpn |
//	               u64 seq | u32 length | u32 0
//
// A request's length bytes follow a WRITE; a response's follow a
// successful READ.

const (
	helloLen    = 8
	requestLen  = 40
	responseLen = 24

	helloMagic   = 0x4e53434d // "MCSN" read as little-endian
	wireVersion  = 1
	typeRequest  = 1
	typeResponse = 2

	// maxMessage bounds a request's length (as ibv_query_device's
	// max_msg_sz does): 1 GiB.
	maxMessage = 1 << 30
)

var errBadFrame = errors.New("bad soft NIC frame")

type request struct {
	op     rdma.Opcode
	dstQPN uint32
	srcQPN uint32
	rkey   uint32
	seq    uint64
	raddr  uint64
	length uint32
}

type response struct {
	status rdma.WCStatus
	dstQPN uint32
	seq    uint64
	length uint32
}

func encodeHello(b []byte, lid uint16) {
	binary.LittleEndian.PutUint32(b[0:], helloMagic)
	binary.LittleEndian.PutUint16(b[4:], wireVersion)
	binary.LittleEndian.PutUint16(b[6:], lid)
}

func decodeHello(b []byte) (uint16, error) {
	if len(b) < helloLen {
		return 0, fmt.Errorf("%w: hello of %d bytes", errBadFrame, len(b))
	}
	if m := binary.LittleEndian.Uint32(b); m != helloMagic {
		return 0, fmt.Errorf("%w: hello magic %#x", errBadFrame, m)
	}
	if v := binary.LittleEndian.Uint16(b[4:]); v != wireVersion {
		return 0, fmt.Errorf("%w: wire version %d, want %d", errBadFrame, v, wireVersion)
	}
	return binary.LittleEndian.Uint16(b[6:]), nil
}

func encodeRequest(b []byte, r request) {
	clear(b[:requestLen])
	b[0] = typeRequest
	b[1] = byte(r.op)
	binary.LittleEndian.PutUint32(b[4:], r.dstQPN)
	binary.LittleEndian.PutUint32(b[8:], r.srcQPN)
	binary.LittleEndian.PutUint32(b[12:], r.rkey)
	binary.LittleEndian.PutUint64(b[16:], r.seq)
	binary.LittleEndian.PutUint64(b[24:], r.raddr)
	binary.LittleEndian.PutUint32(b[32:], r.length)
}

func decodeRequest(b []byte) (request, error) {
	var r request
	if len(b) < requestLen {
		return r, fmt.Errorf("%w: request of %d bytes", errBadFrame, len(b))
	}
	if b[0] != typeRequest {
		return r, fmt.Errorf("%w: type %d, want request", errBadFrame, b[0])
	}
	r.op = rdma.Opcode(b[1])
	if r.op != rdma.OpRead && r.op != rdma.OpWrite {
		return r, fmt.Errorf("%w: opcode %d", errBadFrame, b[1])
	}
	r.dstQPN = binary.LittleEndian.Uint32(b[4:])
	r.srcQPN = binary.LittleEndian.Uint32(b[8:])
	r.rkey = binary.LittleEndian.Uint32(b[12:])
	r.seq = binary.LittleEndian.Uint64(b[16:])
	r.raddr = binary.LittleEndian.Uint64(b[24:])
	r.length = binary.LittleEndian.Uint32(b[32:])
	if r.length > maxMessage {
		return r, fmt.Errorf("%w: length %d over %d", errBadFrame, r.length, maxMessage)
	}
	return r, nil
}

func encodeResponse(b []byte, r response) {
	clear(b[:responseLen])
	b[0] = typeResponse
	b[1] = byte(r.status)
	binary.LittleEndian.PutUint32(b[4:], r.dstQPN)
	binary.LittleEndian.PutUint64(b[8:], r.seq)
	binary.LittleEndian.PutUint32(b[16:], r.length)
}

func decodeResponse(b []byte) (response, error) {
	var r response
	if len(b) < responseLen {
		return r, fmt.Errorf("%w: response of %d bytes", errBadFrame, len(b))
	}
	if b[0] != typeResponse {
		return r, fmt.Errorf("%w: type %d, want response", errBadFrame, b[0])
	}
	r.status = rdma.WCStatus(b[1])
	if r.status < 0 || r.status > rdma.WCGeneralErr {
		return r, fmt.Errorf("%w: status %d", errBadFrame, b[1])
	}
	r.dstQPN = binary.LittleEndian.Uint32(b[4:])
	r.seq = binary.LittleEndian.Uint64(b[8:])
	r.length = binary.LittleEndian.Uint32(b[16:])
	if r.length > maxMessage {
		return r, fmt.Errorf("%w: length %d over %d", errBadFrame, r.length, maxMessage)
	}
	return r, nil
}
