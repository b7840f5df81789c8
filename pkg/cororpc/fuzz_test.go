package cororpc

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

// fuzzLimit keeps fuzzed frames small; the limit check itself is part of
// what is fuzzed.
const fuzzLimit = 4096

// knownFrameError reports whether err is one of the ways a frame reader is
// allowed to fail.
func knownFrameError(err error) bool {
	for _, want := range []error{ErrBadMagic, ErrBadVersion, ErrBadSerializeType, ErrMessageTooLarge, io.EOF, io.ErrUnexpectedEOF} {
		if errors.Is(err, want) {
			return true
		}
	}
	return false
}

// Seeds: testdata/fuzz/FuzzReadRequest (captured frames and broken ones).
func FuzzReadRequest(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		h, body, attach, err := ReadRequest(bytes.NewReader(data), fuzzLimit)
		if err != nil {
			if !knownFrameError(err) {
				t.Fatalf("unexpected error kind: %v", err)
			}
			return
		}
		n := RequestHeaderLen + len(body) + len(attach)
		if n > len(data) || len(body) != int(h.Length) || len(attach) != int(h.AttachLength) || len(body)+len(attach) > fuzzLimit {
			t.Fatalf("header %+v, body %d, attachment %d, input %d", h, len(body), len(attach), len(data))
		}
		again := append(append(h.AppendTo(nil), body...), attach...)
		if !bytes.Equal(again, data[:n]) {
			t.Fatalf("frame re-encodes as %x, read from %x", again, data[:n])
		}
	})
}

// Seeds: testdata/fuzz/FuzzReadResponse.
func FuzzReadResponse(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		h, body, attach, err := ReadResponse(bytes.NewReader(data), fuzzLimit)
		if err != nil {
			if !knownFrameError(err) {
				t.Fatalf("unexpected error kind: %v", err)
			}
			return
		}
		n := ResponseHeaderLen + len(body) + len(attach)
		if n > len(data) || len(body) != int(h.Length) || len(attach) != int(h.AttachLength) {
			t.Fatalf("header %+v, body %d, attachment %d, input %d", h, len(body), len(attach), len(data))
		}
		again := append(append(h.AppendTo(nil), body...), attach...)
		if !bytes.Equal(again, data[:n]) {
			t.Fatalf("frame re-encodes as %x, read from %x", again, data[:n])
		}
		if h.ErrCode != 0 {
			checkErrorBody(t, h.ErrCode, body)
		}
	})
}

// Seeds: testdata/fuzz/FuzzDecodeErrorBody.
func FuzzDecodeErrorBody(f *testing.F) {
	f.Fuzz(func(t *testing.T, errCode byte, body []byte) {
		if errCode == 0 {
			return // a success response has no error body
		}
		checkErrorBody(t, errCode, body)
	})
}

func checkErrorBody(t *testing.T, errCode byte, body []byte) {
	t.Helper()
	code, msg, err := decodeErrorBody(errCode, body)
	if err != nil {
		if !errors.Is(err, errBadErrorBody) {
			t.Fatalf("unexpected error kind: %v", err)
		}
		return
	}
	if len(msg) > len(body) {
		t.Fatalf("%d-byte message from a %d-byte body", len(msg), len(body))
	}
	// What was decoded encodes to a body that decodes the same.
	enc, ec := appendErrorBody(nil, code, msg)
	code2, msg2, err := decodeErrorBody(ec, enc)
	if err != nil || code2 != code || msg2 != msg {
		t.Fatalf("re-encoded %d %q decodes as %d %q %v", code, msg, code2, msg2, err)
	}
}
