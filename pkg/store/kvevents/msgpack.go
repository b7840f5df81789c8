package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// The encoder writes each value in the shortest form, as msgpack-c's
// packer does, so a batch is byte for byte what Mooncake's publisher
// sends for the same events.

func appendNil(b []byte) []byte { return append(b, 0xc0) }

func appendUint(b []byte, u uint64) []byte {
	switch {
	case u < 1<<7:
		return append(b, byte(u))
	case u < 1<<8:
		return append(b, 0xcc, byte(u))
	case u < 1<<16:
		return binary.BigEndian.AppendUint16(append(b, 0xcd), uint16(u))
	case u < 1<<32:
		return binary.BigEndian.AppendUint32(append(b, 0xce), uint32(u))
	}
	return binary.BigEndian.AppendUint64(append(b, 0xcf), u)
}

func appendInt(b []byte, i int64) []byte {
	switch {
	case i >= 0:
		return appendUint(b, uint64(i))
	case i >= -32:
		return append(b, byte(int8(i)))
	case i >= math.MinInt8:
		return append(b, 0xd0, byte(int8(i)))
	case i >= math.MinInt16:
		return binary.BigEndian.AppendUint16(append(b, 0xd1), uint16(int16(i)))
	case i >= math.MinInt32:
		return binary.BigEndian.AppendUint32(append(b, 0xd2), uint32(int32(i)))
	}
	return binary.BigEndian.AppendUint64(append(b, 0xd3), uint64(i))
}

func appendStr(b []byte, s string) []byte {
	n := len(s)
	switch {
	case n < 32:
		b = append(b, 0xa0|byte(n))
	case n < 1<<8:
		b = append(b, 0xd9, byte(n))
	case n < 1<<16:
		b = binary.BigEndian.AppendUint16(append(b, 0xda), uint16(n))
	default:
		b = binary.BigEndian.AppendUint32(append(b, 0xdb), uint32(n))
	}
	return append(b, s...)
}

// appendOptStr is nil for "" (Mooncake's PackOptionalString).
func appendOptStr(b []byte, s string) []byte {
	if s == "" {
		return appendNil(b)
	}
	return appendStr(b, s)
}

func appendArrayHeader(b []byte, n int) []byte {
	switch {
	case n < 16:
		return append(b, 0x90|byte(n))
	case n < 1<<16:
		return binary.BigEndian.AppendUint16(append(b, 0xdc), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(b, 0xdd), uint32(n))
}

func appendMapHeader(b []byte, n int) []byte {
	switch {
	case n < 16:
		return append(b, 0x80|byte(n))
	case n < 1<<16:
		return binary.BigEndian.AppendUint16(append(b, 0xde), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(b, 0xdf), uint32(n))
}

// maxDepth bounds the nesting a decoded payload may have.
const maxDepth = 16

var errShort = errors.New("msgpack: truncated")

// decodeValue decodes one msgpack value from b: nil, bool, uint64
// (non-negative integers), int64 (negative ones), float64, string, []byte,
// []any or map[string]any. It returns the rest of b.
func decodeValue(b []byte) (any, []byte, error) { return decodeDepth(b, 0) }

func decodeDepth(b []byte, depth int) (any, []byte, error) {
	if depth > maxDepth {
		return nil, nil, fmt.Errorf("msgpack: nested deeper than %d", maxDepth)
	}
	if len(b) == 0 {
		return nil, nil, errShort
	}
	c, b := b[0], b[1:]
	need := func(n int) ([]byte, []byte, error) {
		if n < 0 || len(b) < n {
			return nil, nil, errShort
		}
		return b[:n], b[n:], nil
	}
	uintN := func(n int) (uint64, []byte, error) {
		v, rest, err := need(n)
		if err != nil {
			return 0, nil, err
		}
		var u uint64
		for _, x := range v {
			u = u<<8 | uint64(x)
		}
		return u, rest, nil
	}
	switch {
	case c <= 0x7f:
		return uint64(c), b, nil
	case c >= 0xe0:
		return int64(int8(c)), b, nil
	case c&0xf0 == 0x80:
		return decodeMap(b, int(c&0x0f), depth)
	case c&0xf0 == 0x90:
		return decodeArray(b, int(c&0x0f), depth)
	case c&0xe0 == 0xa0:
		v, rest, err := need(int(c & 0x1f))
		return string(v), rest, err
	}
	switch c {
	case 0xc0:
		return nil, b, nil
	case 0xc2:
		return false, b, nil
	case 0xc3:
		return true, b, nil
	case 0xc4, 0xc5, 0xc6, 0xd9, 0xda, 0xdb:
		w := map[byte]int{0xc4: 1, 0xc5: 2, 0xc6: 4, 0xd9: 1, 0xda: 2, 0xdb: 4}[c]
		n, rest, err := uintN(w)
		if err != nil {
			return nil, nil, err
		}
		b = rest
		v, rest, err := need(int(min(n, uint64(len(b)+1))))
		if err != nil {
			return nil, nil, err
		}
		if c <= 0xc6 {
			return append([]byte(nil), v...), rest, nil
		}
		return string(v), rest, nil
	case 0xca:
		u, rest, err := uintN(4)
		return float64(math.Float32frombits(uint32(u))), rest, err
	case 0xcb:
		u, rest, err := uintN(8)
		return math.Float64frombits(u), rest, err
	case 0xcc, 0xcd, 0xce, 0xcf:
		return uintN(1 << (c - 0xcc))
	case 0xd0, 0xd1, 0xd2, 0xd3:
		w := 1 << (c - 0xd0)
		u, rest, err := uintN(w)
		if err != nil {
			return nil, nil, err
		}
		shift := 64 - 8*w
		i := int64(u<<shift) >> shift
		if i >= 0 {
			return uint64(i), rest, nil
		}
		return i, rest, nil
	case 0xdc, 0xdd, 0xde, 0xdf:
		w := 2
		if c == 0xdd || c == 0xdf {
			w = 4
		}
		n, rest, err := uintN(w)
		if err != nil {
			return nil, nil, err
		}
		if n > uint64(len(rest)) { // every element takes a byte at least
			return nil, nil, errShort
		}
		if c <= 0xdd {
			return decodeArray(rest, int(n), depth)
		}
		return decodeMap(rest, int(n), depth)
	}
	return nil, nil, fmt.Errorf("msgpack: unsupported type byte 0x%02x", c)
}

func decodeArray(b []byte, n, depth int) (any, []byte, error) {
	if n > len(b) {
		return nil, nil, errShort
	}
	out := make([]any, n)
	for i := range out {
		v, rest, err := decodeDepth(b, depth+1)
		if err != nil {
			return nil, nil, err
		}
		out[i], b = v, rest
	}
	return out, b, nil
}

func decodeMap(b []byte, n, depth int) (any, []byte, error) {
	if 2*n > len(b) {
		return nil, nil, errShort
	}
	out := make(map[string]any, n)
	for range n {
		k, rest, err := decodeDepth(b, depth+1)
		if err != nil {
			return nil, nil, err
		}
		ks, ok := k.(string)
		if !ok {
			return nil, nil, fmt.Errorf("msgpack: map key %v is not a string", k)
		}
		v, rest, err := decodeDepth(rest, depth+1)
		if err != nil {
			return nil, nil, err
		}
		out[ks], b = v, rest
	}
	return out, b, nil
}
