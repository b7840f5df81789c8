package soft

import (
	"bytes"
	"testing"

	"github.com/kvcache-ops/mc/pkg/rdma"
)

func TestRequestVector(t *testing.T) {
	r := request{op: rdma.OpWrite, dstQPN: 0x102, srcQPN: 0x203, rkey: 0x1000, seq: 7, raddr: 0x7f0000001000, length: 65536}
	var b [requestLen]byte
	encodeRequest(b[:], r)
	want := []byte{
		1, 1, 0, 0, // type, opcode, pad
		0x02, 0x01, 0, 0, // dst qpn
		0x03, 0x02, 0, 0, // src qpn
		0x00, 0x10, 0, 0, // rkey
		7, 0, 0, 0, 0, 0, 0, 0, // seq
		0x00, 0x10, 0, 0, 0, 0x7f, 0, 0, // remote addr
		0, 0, 1, 0, 0, 0, 0, 0, // length, pad
	}
	if !bytes.Equal(b[:], want) {
		t.Fatalf("encoded\n%v\nwant\n%v", b, want)
	}
	got, err := decodeRequest(want)
	if err != nil || got != r {
		t.Fatalf("decoded %+v, %v", got, err)
	}
}

func TestResponseVector(t *testing.T) {
	r := response{status: rdma.WCRemAccessErr, dstQPN: 0x203, seq: 9, length: 0}
	var b [responseLen]byte
	encodeResponse(b[:], r)
	want := []byte{2, 10, 0, 0, 0x03, 0x02, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	if !bytes.Equal(b[:], want) {
		t.Fatalf("encoded %v", b)
	}
	if got, err := decodeResponse(want); err != nil || got != r {
		t.Fatalf("decoded %+v, %v", got, err)
	}
}

func TestDecodeRejects(t *testing.T) {
	var b [requestLen]byte
	encodeRequest(b[:], request{op: rdma.OpRead, length: 1})
	bad := func(mut func(b []byte)) []byte { c := bytes.Clone(b[:]); mut(c); return c }
	for name, in := range map[string][]byte{
		"short":    b[:10],
		"type":     bad(func(b []byte) { b[0] = 2 }),
		"opcode":   bad(func(b []byte) { b[1] = 9 }),
		"too long": bad(func(b []byte) { b[35] = 0x80 }),
	} {
		if _, err := decodeRequest(in); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := decodeHello([]byte{1, 2, 3, 4, 1, 0, 0, 0}); err == nil {
		t.Error("bad magic accepted")
	}
}

// FuzzDecodeRequest: no input panics, and whatever decodes re-encodes to
// the same header bytes (modulo padding).
func FuzzDecodeRequest(f *testing.F) {
	var b [requestLen]byte
	encodeRequest(b[:], request{op: rdma.OpWrite, dstQPN: 1, srcQPN: 2, rkey: 3, seq: 4, raddr: 5, length: 6})
	f.Add(b[:])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, in []byte) {
		r, err := decodeRequest(in)
		if err != nil {
			return
		}
		if r.length > maxMessage {
			t.Fatalf("length %d over bound", r.length)
		}
		var out [requestLen]byte
		encodeRequest(out[:], r)
		again, err := decodeRequest(out[:])
		if err != nil || again != r {
			t.Fatalf("round trip %+v -> %+v, %v", r, again, err)
		}
	})
}

// FuzzDecodeResponse mirrors FuzzDecodeRequest for responses.
func FuzzDecodeResponse(f *testing.F) {
	var b [responseLen]byte
	encodeResponse(b[:], response{status: rdma.WCSuccess, dstQPN: 1, seq: 2, length: 3})
	f.Add(b[:])
	f.Fuzz(func(t *testing.T, in []byte) {
		r, err := decodeResponse(in)
		if err != nil {
			return
		}
		var out [responseLen]byte
		encodeResponse(out[:], r)
		if again, err := decodeResponse(out[:]); err != nil || again != r {
			t.Fatalf("round trip %+v -> %+v, %v", r, again, err)
		}
	})
}

// FuzzSpan guards the responder's bounds check, the soft NIC's security
// boundary: a range is accepted only if it lies inside the region.
func FuzzSpan(f *testing.F) {
	f.Add(uint64(0x1000), uint64(0x1000), uint32(16), 64)
	f.Add(uint64(0x1000), uint64(0x1040), uint32(1), 64)
	f.Add(uint64(0x1000), uint64(0xfff), uint32(1), 64)
	f.Add(^uint64(0)-8, ^uint64(0), uint32(100), 64)
	f.Fuzz(func(t *testing.T, base, addr uint64, length uint32, size int) {
		if size <= 0 || size > 1<<16 {
			return
		}
		m := &mr{buf: make([]byte, size), addr: base}
		off, ok := m.span(addr, length)
		inside := addr >= base && addr-base <= uint64(size) && uint64(length) <= uint64(size)-(addr-base)
		if ok != inside {
			t.Fatalf("span(%#x, %d) in [%#x, +%d) = %v, want %v", addr, length, base, size, ok, inside)
		}
		if ok {
			_ = m.buf[off : off+int(length)] // must not panic
		}
	})
}
