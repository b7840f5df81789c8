package structpack

import (
	"crypto/md5"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
)

// Type ids of type_id.hpp that this package writes or names.
const (
	idInt32     = 0x01
	idUint32    = 0x02
	idInt64     = 0x03
	idUint64    = 0x04
	idInt8      = 0x05
	idUint8     = 0x06
	idInt16     = 0x07
	idUint16    = 0x08
	idBool      = 0x0b
	idChar      = 0x0c
	idFloat32   = 0x11
	idFloat64   = 0x12
	idString    = 0x80
	idArray     = 0x81
	idMap       = 0x82
	idSet       = 0x83
	idVector    = 0x84
	idOptional  = 0x85
	idVariant   = 0x86
	idExpected  = 0x87
	idBitset    = 0x88
	idPolyPtr   = 0x89
	idUserType  = 0xf9
	idMonostate = 0xfa
	idCircle    = 0xfb
	idEndWithID = 0xfc
	idStruct    = 0xfd
	idEnd       = 0xff
)

// appendSizeLiteral appends get_size_literal<n>: base-127 digits, least
// significant first, each +1 so no byte is 0 (the literal travels
// NUL-terminated), and the last +129 so it is the only byte above 128.
func appendSizeLiteral(dst []byte, n uint64) []byte {
	for n >= 127 {
		dst = append(dst, byte(n%127+1))
		n /= 127
	}
	return append(dst, byte(n+129))
}

// literalHash is get_types_code: MD5 of the literal, first four bytes
// read big-endian, bit 0 cleared for the metainfo flag.
func literalHash(lit []byte) uint32 {
	sum := md5.Sum(lit)
	return binary.BigEndian.Uint32(sum[:4]) &^ 1
}

var fundamentalNames = map[byte]string{
	0x01: "int32_t", 0x02: "uint32_t", 0x03: "int64_t", 0x04: "uint64_t",
	0x05: "int8_t", 0x06: "uint8_t", 0x07: "int16_t", 0x08: "uint16_t",
	0x09: "__int128", 0x0a: "unsigned __int128", 0x0b: "bool", 0x0c: "char",
	0x0d: "char16_t", 0x0e: "char32_t", 0x0f: "wchar_t", 0x10: "float16_t",
	0x11: "float", 0x12: "double", 0x13: "float128_t",
	0x14: "var_int32_t", 0x15: "var_int64_t", 0x16: "var_uint32_t", 0x17: "var_uint64_t",
	0x18: "fast var_int32_t", 0x19: "fast var_int64_t", 0x1a: "fast var_uint32_t", 0x1b: "fast var_uint64_t",
	idMonostate: "std::monostate",
}

// DescribeLiteral renders a struct_pack type literal as a C++-like type,
// such as tl::expected<struct{int64_t, int32_t}, int32_t>, so an error can
// say what a peer sent. Struct names are not in literals, so structs,
// pairs and tuples all read struct{...}. Bytes that do not parse come back
// as hex.
func DescribeLiteral(lit []byte) string {
	const maxOut = 2048
	p := literalParser{b: lit}
	var sb strings.Builder
	for p.i < len(p.b) {
		if sb.Len() > 0 {
			sb.WriteString(", ")
		}
		if !p.typ(&sb, 0) || sb.Len() > maxOut*4 {
			return fmt.Sprintf("malformed literal %x", lit)
		}
	}
	if sb.Len() == 0 {
		return "empty literal"
	}
	s := sb.String()
	if len(s) > maxOut {
		s = s[:maxOut] + "..."
	}
	return s
}

type literalParser struct {
	b []byte
	i int
}

func (p *literalParser) next() (byte, bool) {
	if p.i >= len(p.b) {
		return 0, false
	}
	c := p.b[p.i]
	p.i++
	return c, true
}

func (p *literalParser) size() (uint64, bool) {
	var n, mul uint64 = 0, 1
	for k := 0; k < 10; k++ {
		c, ok := p.next()
		if !ok || c == 0 || c == 128 {
			return 0, false
		}
		if c > 128 {
			return n + uint64(c-129)*mul, true
		}
		n += uint64(c-1) * mul
		mul *= 127
	}
	return 0, false
}

// alignTrailer recognises the two alignment size literals and the end of
// a trivially copyable struct. Alignments are powers of two up to 16, all
// single bytes none of which starts a complete type on its own, so a valid
// literal cannot be misread here.
func (p *literalParser) alignTrailer() (uint64, bool) {
	if p.i+3 > len(p.b) {
		return 0, false
	}
	isAlign := func(c byte) bool {
		switch c {
		case 0x81, 0x82, 0x83, 0x85, 0x89, 0x91:
			return true
		}
		return false
	}
	a, b, end := p.b[p.i], p.b[p.i+1], p.b[p.i+2]
	if !isAlign(a) || !isAlign(b) || (end != idEnd && end != idEndWithID) {
		return 0, false
	}
	p.i += 2
	return uint64(b - 129), true
}

func (p *literalParser) typ(sb *strings.Builder, depth int) bool {
	if depth > 64 {
		return false
	}
	c, ok := p.next()
	if !ok {
		return false
	}
	if name, ok := fundamentalNames[c]; ok {
		sb.WriteString(name)
		return true
	}
	one := func(prefix string) bool {
		sb.WriteString(prefix)
		if !p.typ(sb, depth+1) {
			return false
		}
		sb.WriteByte('>')
		return true
	}
	two := func(prefix string) bool {
		sb.WriteString(prefix)
		if !p.typ(sb, depth+1) {
			return false
		}
		sb.WriteString(", ")
		if !p.typ(sb, depth+1) {
			return false
		}
		sb.WriteByte('>')
		return true
	}
	switch c {
	case idString:
		ch, ok := p.next()
		if !ok {
			return false
		}
		if ch == idChar {
			sb.WriteString("std::string")
			return true
		}
		name, ok := fundamentalNames[ch]
		if !ok {
			return false
		}
		sb.WriteString("std::basic_string<" + name + ">")
		return true
	case idArray:
		sb.WriteString("std::array<")
		if !p.typ(sb, depth+1) {
			return false
		}
		n, ok := p.size()
		if !ok {
			return false
		}
		sb.WriteString(", " + strconv.FormatUint(n, 10) + ">")
		return true
	case idMap:
		return two("map<")
	case idSet:
		return one("set<")
	case idVector:
		return one("std::vector<")
	case idOptional:
		return one("std::optional<")
	case idExpected:
		return two("tl::expected<")
	case idPolyPtr:
		return one("std::unique_ptr<")
	case idBitset:
		n, ok := p.size()
		if !ok {
			return false
		}
		sb.WriteString("std::bitset<" + strconv.FormatUint(n, 10) + ">")
		return true
	case idCircle:
		n, ok := p.size()
		if !ok {
			return false
		}
		sb.WriteString("<recursive reference " + strconv.FormatUint(n, 10) + ">")
		return true
	case idUserType:
		start := p.i
		for p.i < len(p.b) && p.b[p.i] != idEnd {
			p.i++
		}
		if p.i >= len(p.b) {
			return false
		}
		sb.WriteString("user-defined " + strconv.Quote(string(p.b[start:p.i])))
		p.i++
		return true
	case idVariant:
		sb.WriteString("std::variant<")
		for k := 0; ; k++ {
			if p.i < len(p.b) && p.b[p.i] == idEnd {
				p.i++
				sb.WriteByte('>')
				return k > 0
			}
			if k > 0 {
				sb.WriteString(", ")
			}
			if !p.typ(sb, depth+1) {
				return false
			}
		}
	case idStruct:
		sb.WriteString("struct{")
		for k := 0; ; k++ {
			if align, ok := p.alignTrailer(); ok {
				sb.WriteString("} /*memcpy, align " + strconv.FormatUint(align, 10) + "*/")
				return p.structEnd(sb)
			}
			if p.i < len(p.b) && (p.b[p.i] == idEnd || p.b[p.i] == idEndWithID) {
				sb.WriteByte('}')
				return p.structEnd(sb)
			}
			if k > 0 {
				sb.WriteString(", ")
			}
			if !p.typ(sb, depth+1) {
				return false
			}
		}
	}
	return false
}

func (p *literalParser) structEnd(sb *strings.Builder) bool {
	c, ok := p.next()
	if !ok {
		return false
	}
	if c == idEndWithID {
		id, ok := p.size()
		if !ok {
			return false
		}
		sb.WriteString(" /*id " + strconv.FormatUint(id, 10) + "*/")
	}
	return true
}
