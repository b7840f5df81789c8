package structpack_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"runtime"
	"strings"
	"testing"

	"github.com/kvcache-ops/mc/pkg/structpack"
)

func TestHashMismatch(t *testing.T) {
	ping := firstBody(t, "Ping", false) // UUID, with its literal embedded
	var wrong structpack.Expected[string, ErrorCode]
	err := structpack.Unmarshal(ping, &wrong)
	var hm *structpack.HashMismatchError
	if !errors.As(err, &hm) {
		t.Fatalf("decoding a Ping request as %T: %v, want *HashMismatchError", wrong, err)
	}
	if hm.Got != 0x3c6d83e0 || hm.Want == hm.Got || !bytes.Equal(hm.GotLiteral, []byte{0xfd, 0x04, 0x04, 0x89, 0x89, 0xff}) {
		t.Fatalf("mismatch %+v", hm)
	}
	for _, want := range []string{"Expected[string,", "0x3c6d83e0", "tl::expected<std::string, int32_t>", "embeds literal fd04048989ff", "struct{uint64_t, uint64_t}"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}

	short, _ := structpack.Marshal(clientID, structpack.WithLiteral(false))
	err = structpack.Unmarshal(short, &wrong)
	if !errors.As(err, &hm) || hm.GotLiteral != nil || !strings.Contains(err.Error(), "embeds no type literal") {
		t.Fatalf("mismatch without literal: %v", err)
	}

	// Same hash, other literal: C++ calls this a hash conflict; so do we.
	forged := bytes.Clone(ping)
	forged[6] = 0x03 // fd 04 04 ... -> fd 03 04 ...
	var id UUID
	err = structpack.Unmarshal(forged, &id)
	if !errors.As(err, &hm) || hm.Got != hm.Want || !strings.Contains(err.Error(), "embedded literal does not") {
		t.Fatalf("forged literal: %v", err)
	}
}

func TestTruncatedCapturesFail(t *testing.T) {
	for _, c := range loadCaptures(t) {
		spec := mooncakeCalls[c.Call]
		for _, body := range [][]byte{unhex(t, c.RequestBody), unhex(t, c.ResponseBody)} {
			if len(body) == 0 {
				continue
			}
			fresh := func() []any { return []any{spec.resp()} }
			if err := structpack.UnmarshalArgs(body, fresh()...); err != nil {
				fresh = spec.args
			}
			for n := range len(body) {
				err := structpack.UnmarshalArgs(body[:n], fresh()...)
				if !errors.Is(err, structpack.ErrTruncated) {
					t.Fatalf("%s: %d of %d bytes: %v, want ErrTruncated", c.Call, n, len(body), err)
				}
			}
		}
	}
}

// decodeErr decodes msg into a new T and returns the *DecodeError.
func decodeErr[T any](t *testing.T, msg []byte) *structpack.DecodeError {
	t.Helper()
	var v T
	err := structpack.Unmarshal(msg, &v)
	var de *structpack.DecodeError
	if !errors.As(err, &de) {
		t.Fatalf("decoding %x as %T: %v, want *DecodeError", msg, v, err)
	}
	return de
}

// noLiteral encodes v without literal, so payload offsets are 4 + n.
func noLiteral(t *testing.T, v any) []byte {
	t.Helper()
	b, err := structpack.Marshal(v, structpack.WithLiteral(false))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestMalformedValues(t *testing.T) {
	type flags struct {
		A uint32
		B bool
	}
	msg := noLiteral(t, flags{A: 1, B: true})
	msg[8] = 2
	de := decodeErr[flags](t, msg)
	if !errors.Is(de, structpack.ErrMalformed) || de.Offset != 8 || de.Path != ".B" || de.Elem != "bool" ||
		!strings.Contains(de.Error(), "flags") || !strings.Contains(de.Error(), "0x02") {
		t.Errorf("bool 2: %+v (%v)", de, de)
	}

	msg = noLiteral(t, structpack.Some(uint16(1)))
	msg[4] = 7
	de = decodeErr[structpack.Optional[uint16]](t, msg)
	if !errors.Is(de, structpack.ErrMalformed) || de.Offset != 4 || !strings.Contains(de.Reason, "optional") {
		t.Errorf("optional 7: %+v", de)
	}

	msg = noLiteral(t, structpack.ExpectedVoid[ErrorCode]{})
	msg[4] = 0xff
	de = decodeErr[structpack.ExpectedVoid[ErrorCode]](t, msg)
	if !errors.Is(de, structpack.ErrMalformed) || de.Offset != 4 || !strings.Contains(de.Reason, "expected") {
		t.Errorf("expected 0xff: %+v", de)
	}

	msg = noLiteral(t, []ReplicaDescriptor{{Descriptor: DescriptorVariant{Value: NoFDescriptor{}}}})
	msg[4+1+8] = 5 // five alternatives: 0..4
	de = decodeErr[[]ReplicaDescriptor](t, msg)
	if !errors.Is(de, structpack.ErrMalformed) || de.Offset != 13 || de.Path != "[0].Descriptor" ||
		!strings.Contains(de.Reason, "variant index 5 out of range") {
		t.Errorf("variant 5: %+v", de)
	}

	msg = append(noLiteral(t, clientID), 0)
	de = decodeErr[UUID](t, msg)
	if !errors.Is(de, structpack.ErrMalformed) || de.Offset != 20 || !strings.Contains(de.Reason, "1 bytes after") {
		t.Errorf("trailing byte: %+v", de)
	}

	// Two equal keys: no std::map or unordered_map writes that.
	msg = noLiteral(t, map[string]int8{"a": 1, "b": 2})
	copy(msg[4+1+2+1+1:], "a") // count, "a", value, length, then the second key
	de = decodeErr[map[string]int8](t, msg)
	if !errors.Is(de, structpack.ErrMalformed) || !strings.Contains(de.Reason, "duplicate") {
		t.Errorf("duplicate key: %+v", de)
	}
}

func TestMetainfoChecks(t *testing.T) {
	h, _ := structpack.Hash(reflect.TypeFor[string]())
	head := binary.LittleEndian.AppendUint32(nil, h|1)
	for _, c := range []struct {
		meta byte
		want string
	}{
		{0x01, "compatible"},
		{0x20, "unknown bits"},
	} {
		msg := append(bytes.Clone(head), c.meta, 0)
		de := decodeErr[string](t, msg)
		if !errors.Is(de, structpack.ErrMalformed) || de.Offset != 4 || !strings.Contains(de.Reason, c.want) {
			t.Errorf("metainfo %#02x: %+v", c.meta, de)
		}
	}
	de := decodeErr[string](t, append(bytes.Clone(head), 0x04, 0x80, 0x0c))
	if !errors.Is(de, structpack.ErrTruncated) || !strings.Contains(de.Reason, "NUL") {
		t.Errorf("unterminated literal: %+v", de)
	}
	// A flagged message with metainfo 0 (one-byte lengths, no literal)
	// is not what C++ writes but what it reads; so do we.
	var s string
	if err := structpack.Unmarshal(append(bytes.Clone(head), 0x00, 0x01, 'z'), &s); err != nil || s != "z" {
		t.Errorf("metainfo 0: %q %v", s, err)
	}
}

func TestHugeLengthsDoNotAllocate(t *testing.T) {
	h, _ := structpack.Hash(reflect.TypeFor[[]Segment]())
	msg := binary.LittleEndian.AppendUint32(nil, h|1)
	msg = append(msg, 0x18) // eight-byte lengths
	msg = binary.LittleEndian.AppendUint64(msg, 1<<62)
	msg = append(msg, make([]byte, 64)...)
	var segs []Segment
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 20 {
		if err := structpack.Unmarshal(msg, &segs); !errors.Is(err, structpack.ErrTruncated) {
			t.Fatalf("2^62 segments in 64 bytes: %v", err)
		}
	}
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got > 64<<10 || segs != nil {
		t.Fatalf("%d bytes allocated (segs %d) for lengths the input cannot hold", got, len(segs))
	}
	// A Segment needs at least 16+8+8 bytes plus four lengths: 3 of them
	// do not fit in 64 bytes even though 64 > 3.
	msg = binary.LittleEndian.AppendUint32(nil, h)
	msg = append(msg, 3)
	msg = append(msg, make([]byte, 64)...)
	de := decodeErr[[]Segment](t, msg)
	if !errors.Is(de, structpack.ErrTruncated) || !strings.Contains(de.Reason, "at least 36 bytes per element") {
		t.Errorf("3 segments in 64 bytes: %+v", de)
	}
}
