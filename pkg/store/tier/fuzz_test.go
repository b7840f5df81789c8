package tier

import (
	"bytes"
	"testing"
)

// FuzzDecodeRecord feeds arbitrary bytes to the record decoder (what the
// scan and every read run over bytes from disk): it must not panic, must
// not claim more bytes than it was given, and whatever it accepts must be
// exactly what encodeRecord makes of the decoded key, version and value.
// Seeds (testdata/fuzz/FuzzDecodeRecord): valid records, one with a long
// key, a truncated one, flipped header and value bytes.
func FuzzDecodeRecord(f *testing.F) {
	f.Add(encoded("k", 1, []byte("value")))
	f.Add([]byte("MCT1"))
	f.Add(encodedAs("k", 1, []byte("value"), true))
	f.Fuzz(func(t *testing.T, b []byte) {
		need := headerNeed(b)
		if need < headerLen || need > headerLen+MaxKeyLen {
			t.Fatalf("headerNeed %d outside [%d, %d]", need, headerLen, headerLen+MaxKeyLen)
		}
		h, herr := decodeHeader(b)
		rec, v, err := decodeRecord(b)
		if (herr == nil) != (err == nil || err == errDataCRC || err == errTruncated) {
			t.Fatalf("decodeHeader %v but decodeRecord %v", herr, err)
		}
		if err != nil {
			if !isCorrupt(err) {
				t.Fatalf("decode error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		if rec.Key != h.key || rec.Size != uint64(len(v)) || rec.Version != h.version {
			t.Fatalf("record %+v, header %+v, %d value bytes", rec, h, len(v))
		}
		// The header, key and value are what encodeRecordAs makes of
		// them in the format the magic names (MCT2's padding between key
		// and value is not read).
		hk, voff := headerLen+len(rec.Key), int(h.valueOff())
		if n := voff + len(v); n > len(b) {
			t.Fatalf("decoded %d bytes from %d", n, len(b))
		}
		again := make([]byte, alignUp(uint64(voff+len(v))))
		encodeRecordAs(again, rec.Key, rec.Version, v, h.aligned)
		if !bytes.Equal(again[:hk], b[:hk]) || !bytes.Equal(again[voff:voff+len(v)], b[voff:voff+len(v)]) {
			t.Fatalf("re-encoding differs:\n%x\n%x", again[:voff+len(v)], b[:voff+len(v)])
		}
	})
}

func encodedAs(key string, version uint64, v []byte, aligned bool) []byte {
	b := make([]byte, alignUp(valueOff(len(key), aligned)+uint64(len(v))))
	encodeRecordAs(b, key, version, v, aligned)
	return b
}

func encoded(key string, version uint64, v []byte) []byte {
	b := make([]byte, recordLen(len(key), uint64(len(v))))
	encodeRecord(b, key, version, v)
	return b
}

func TestEncodeDecode(t *testing.T) {
	b := encoded("key", 7, []byte("hello"))
	if len(b) != BlockSize {
		t.Fatalf("record of 40 bytes takes %d, want one block", len(b))
	}
	rec, v, err := decodeRecord(b)
	if err != nil || rec != (Record{Key: "key", Size: 5, Version: 7}) || string(v) != "hello" {
		t.Fatalf("decode: %+v %q %v", rec, v, err)
	}
	for _, tc := range []struct {
		name string
		mut  func([]byte) []byte
		want error
	}{
		{"magic", func(b []byte) []byte { b[0] = 'X'; return b }, errMagic},
		{"key byte", func(b []byte) []byte { b[headerLen] ^= 1; return b }, errHeaderCRC},
		{"version", func(b []byte) []byte { b[16] ^= 1; return b }, errHeaderCRC},
		{"value byte", func(b []byte) []byte { b[headerLen+3+4] ^= 1; return b }, errDataCRC},
		{"truncated", func(b []byte) []byte { return b[:headerLen+3+2] }, errTruncated},
		{"short", func(b []byte) []byte { return b[:20] }, errShortHeader},
	} {
		c := encoded("key", 7, []byte("hello"))
		if _, _, err := decodeRecord(tc.mut(c)); err != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}

func TestSizeClasses(t *testing.T) {
	prev := 0
	for n := 1; n < 70*BlockSize; n += 511 {
		c, size := sizeClass(n)
		if size < n || size%BlockSize != 0 || size > n*3/2+2*BlockSize {
			t.Fatalf("sizeClass(%d) = %d bytes", n, size)
		}
		if c2, s2 := sizeClass(size); c2 != c || s2 != size {
			t.Fatalf("class of a class size %d moves: %d/%d vs %d/%d", size, c2, s2, c, size)
		}
		if size < prev {
			t.Fatalf("sizes not monotonic at %d", n)
		}
		prev = size
		b := alignedBuf(n)
		if len(b) != n || cap(b) != size {
			t.Fatalf("alignedBuf(%d): len %d cap %d", n, len(b), cap(b))
		}
		putAligned(b)
	}
}
