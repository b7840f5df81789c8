package handshake

import (
	"bytes"
	"encoding/hex"
	"errors"
	"io"
	"strings"
	"testing"
)

// Byte vectors written from compat.md §3: u64 LE length counting the type
// byte and the JSON, then the type byte, then the JSON.
var frameVectors = []struct {
	name    string
	t       FrameType
	payload string
	wire    string // hex
}{
	{"metadata request", Metadata, `{}`,
		"0300000000000000" + "01" + "7b7d"},
	{"connection", Connection, `{"qp_num":[7]}`,
		"0f00000000000000" + "00" + hex.EncodeToString([]byte(`{"qp_num":[7]}`))},
	{"notify", Notify, `{"name":"a","notify_msg":"x"}`,
		"1e00000000000000" + "02" + hex.EncodeToString([]byte(`{"name":"a","notify_msg":"x"}`))},
	{"probe empty payload", Probe, ``,
		"0100000000000000" + "03"},
}

func TestFrameVectors(t *testing.T) {
	for _, v := range frameVectors {
		t.Run(v.name, func(t *testing.T) {
			want, _ := hex.DecodeString(v.wire)
			got := AppendFrame(nil, v.t, []byte(v.payload))
			if !bytes.Equal(got, want) {
				t.Fatalf("AppendFrame = %x, want %x", got, want)
			}
			var w bytes.Buffer
			if err := WriteFrame(&w, v.t, []byte(v.payload)); err != nil || !bytes.Equal(w.Bytes(), want) {
				t.Fatalf("WriteFrame = %x, %v; want %x", w.Bytes(), err, want)
			}
			typ, p, err := ReadFrame(bytes.NewReader(want), 0)
			if err != nil || typ != v.t || string(p) != v.payload {
				t.Fatalf("ReadFrame = %v %q %v", typ, p, err)
			}
		})
	}
}

func TestAppendFrameAppends(t *testing.T) {
	got := AppendFrame([]byte("xy"), Probe, []byte("{}"))
	if string(got[:2]) != "xy" || len(got) != 2+8+1+2 {
		t.Fatalf("AppendFrame did not append: %x", got)
	}
}

func TestReadFrameSequence(t *testing.T) {
	var b []byte
	b = AppendFrame(b, Metadata, []byte(`{"a":1}`))
	b = AppendFrame(b, Notify, []byte(`{}`))
	r := bytes.NewReader(b)
	if typ, p, err := ReadFrame(r, 0); err != nil || typ != Metadata || string(p) != `{"a":1}` {
		t.Fatalf("first: %v %q %v", typ, p, err)
	}
	if typ, p, err := ReadFrame(r, 0); err != nil || typ != Notify || string(p) != `{}` {
		t.Fatalf("second: %v %q %v", typ, p, err)
	}
	if _, _, err := ReadFrame(r, 0); err != io.EOF {
		t.Fatalf("after last frame: %v, want io.EOF", err)
	}
}

func TestReadFrameErrors(t *testing.T) {
	le := func(n uint64) []byte {
		b := make([]byte, 8)
		for i := range b {
			b[i] = byte(n >> (8 * i))
		}
		return b
	}
	cases := []struct {
		name  string
		in    []byte
		max   int
		is    error
		inMsg string
	}{
		{"empty stream", nil, 0, io.EOF, "EOF"},
		{"short length", []byte{1, 0, 0}, 0, io.ErrUnexpectedEOF, "3 of 8 bytes"},
		{"zero length", le(0), 0, ErrEmptyFrame, "length 0"},
		{"over default limit", le(DefaultMaxLength + 1), 0, ErrFrameTooLarge, "exceeds limit 1048576"},
		{"over explicit limit", append(le(11), make([]byte, 11)...), 10, ErrFrameTooLarge, "length 11 exceeds limit 10"},
		{"over max max", le(MaxMaxLength + 1), 1 << 30, ErrFrameTooLarge, "exceeds limit 134217728"},
		{"huge length", le(^uint64(0)), 0, ErrFrameTooLarge, "18446744073709551615"},
		{"no type byte", le(5), 0, io.ErrUnexpectedEOF, "frame type"},
		{"short payload", append(append(le(5), 1), "ab"...), 0, io.ErrUnexpectedEOF, "2 of 4 bytes"},
		{"short large payload", append(append(le(200000), 1), "ab"...), 0, io.ErrUnexpectedEOF, "2 of 199999 bytes"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := ReadFrame(bytes.NewReader(c.in), c.max)
			if !errors.Is(err, c.is) || !strings.Contains(err.Error(), c.inMsg) {
				t.Fatalf("err = %v, want %v containing %q", err, c.is, c.inMsg)
			}
		})
	}
}

func TestReadFrameLargePayload(t *testing.T) {
	payload := bytes.Repeat([]byte("x"), 300000) // beyond the chunked-read threshold
	typ, p, err := ReadFrame(bytes.NewReader(AppendFrame(nil, Metadata, payload)), 0)
	if err != nil || typ != Metadata || !bytes.Equal(p, payload) {
		t.Fatalf("ReadFrame large: %v %d %v", typ, len(p), err)
	}
	// Exactly at the limit is accepted; the limit counts the type byte.
	typ, p, err = ReadFrame(bytes.NewReader(AppendFrame(nil, Probe, payload)), len(payload)+1)
	if err != nil || typ != Probe || len(p) != len(payload) {
		t.Fatalf("at limit: %v", err)
	}
	if _, _, err = ReadFrame(bytes.NewReader(AppendFrame(nil, Probe, payload)), len(payload)); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("one over limit: %v", err)
	}
}

func TestFrameTypeString(t *testing.T) {
	for typ, want := range map[FrameType]string{Connection: "Connection", Metadata: "Metadata", Notify: "Notify", Probe: "Probe", 9: "FrameType(9)"} {
		if typ.String() != want {
			t.Errorf("%d.String() = %q, want %q", typ, typ.String(), want)
		}
	}
}

// FuzzReadFrame: no input panics or allocates past the bound, and whatever
// decodes re-encodes to exactly the bytes consumed.
func FuzzReadFrame(f *testing.F) {
	for _, v := range frameVectors {
		b, _ := hex.DecodeString(v.wire)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		const max = 4096
		r := bytes.NewReader(data)
		typ, p, err := ReadFrame(r, max)
		if err != nil {
			if p != nil {
				t.Fatalf("payload returned with error %v", err)
			}
			return
		}
		if len(p)+1 > max {
			t.Fatalf("payload %d bytes beyond limit %d", len(p), max)
		}
		consumed := len(data) - r.Len()
		if re := AppendFrame(nil, typ, p); !bytes.Equal(re, data[:consumed]) {
			t.Fatalf("re-encoded %x, consumed %x", re, data[:consumed])
		}
	})
}
