package tcp

import (
	"bytes"
	"encoding/hex"
	"errors"
	"testing"
)

// Byte vectors written from compat.md §2, not from the encoder.
func TestHeaderVectors(t *testing.T) {
	cases := []struct {
		name string
		h    Header
		hex  string
	}{
		{"read v2", Header{Size: 4096, Addr: 0x7f0000001000, V2: true},
			"0010000000000000" + "00100000007f0000" + "80" + "00000000000000"},
		{"write v2", Header{Size: 1, Addr: 0x1122334455667788, Write: true, V2: true},
			"0100000000000000" + "8877665544332211" + "81" + "00000000000000"},
		{"read v1", Header{Size: 65536, Addr: 0x10},
			"0000010000000000" + "1000000000000000" + "00" + "00000000000000"},
		{"write v1", Header{Size: 0xffffffffffffffff, Addr: 0, Write: true},
			"ffffffffffffffff" + "0000000000000000" + "01" + "00000000000000"},
	}
	for _, c := range cases {
		want, _ := hex.DecodeString(c.hex)
		if len(want) != HeaderSize {
			t.Fatalf("%s: vector is %d bytes", c.name, len(want))
		}
		got := AppendHeader(nil, c.h)
		if !bytes.Equal(got, want) {
			t.Errorf("%s: encode\n got %x\nwant %x", c.name, got, want)
		}
		h, err := DecodeHeader(want)
		if err != nil || h != c.h {
			t.Errorf("%s: decode = %+v, %v; want %+v", c.name, h, err, c.h)
		}
	}
}

func TestOpcodes(t *testing.T) {
	for op, want := range map[uint8]Header{
		0x00: {}, 0x01: {Write: true}, 0x80: {V2: true}, 0x81: {Write: true, V2: true},
	} {
		b := make([]byte, HeaderSize)
		b[16] = op
		h, err := DecodeHeader(b)
		if err != nil || h != want || h.Opcode() != op {
			t.Errorf("opcode 0x%02x: %+v %v", op, h, err)
		}
	}
	for _, op := range []uint8{0x02, 0x7f, 0x82, 0xff, 0x40} {
		b := make([]byte, HeaderSize)
		b[16] = op
		if _, err := DecodeHeader(b); !errors.Is(err, ErrBadOpcode) {
			t.Errorf("opcode 0x%02x: err %v, want ErrBadOpcode", op, err)
		}
	}
	if _, err := DecodeHeader(make([]byte, 23)); err == nil {
		t.Error("short header accepted")
	}
	// Padding is ignored (Mooncake does not promise to zero it).
	b := AppendHeader(nil, Header{Size: 8, Addr: 8, V2: true})
	b[20] = 0xee
	if h, err := DecodeHeader(b); err != nil || h.Size != 8 {
		t.Errorf("dirty padding: %+v %v", h, err)
	}
}

func TestStatusVectors(t *testing.T) {
	ok, _ := hex.DecodeString("000000005654434d") // LE of 0x4D43545600000000: "MCTV" in the high half
	rej, _ := hex.DecodeString("010000005654434d")
	var b [StatusSize]byte
	PutStatus(b[:], StatusOK)
	if !bytes.Equal(b[:], ok) {
		t.Errorf("OK = %x, want %x", b, ok)
	}
	PutStatus(b[:], StatusRejected)
	if !bytes.Equal(b[:], rej) {
		t.Errorf("rejected = %x, want %x", b, rej)
	}
	if StatusOK != 0x4D43545600000000 || StatusRejected != StatusOK|1 {
		t.Error("status constants")
	}
	if err := CheckStatus(ok); err != nil {
		t.Error(err)
	}
	if err := CheckStatus(rej); !errors.Is(err, ErrRejected) {
		t.Errorf("rejected: %v", err)
	}
	if err := CheckStatus(make([]byte, 8)); err == nil || errors.Is(err, ErrRejected) {
		t.Errorf("zero word: %v", err)
	}
}

func FuzzDecodeHeader(f *testing.F) {
	f.Add(AppendHeader(nil, Header{Size: 4096, Addr: 0x7f0000001000, V2: true}))
	f.Add(AppendHeader(nil, Header{Size: 1, Addr: 1, Write: true}))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := DecodeHeader(b)
		if err != nil {
			return
		}
		// What decodes re-encodes to the same size, address and opcode.
		e := AppendHeader(nil, h)
		if !bytes.Equal(e[:17], b[:17]) {
			t.Fatalf("re-encode %x != %x", e[:17], b[:17])
		}
		h2, err := DecodeHeader(e)
		if err != nil || h2 != h {
			t.Fatalf("round trip %+v -> %+v %v", h, h2, err)
		}
	})
}
