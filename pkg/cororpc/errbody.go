package cororpc

import (
	"crypto/md5"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"
)

// Errc is a coro_rpc error code (coro_rpc::errc, impl/errno.h). Codes up to
// 255 travel in the response header's err_code byte; larger ones (user
// codes) travel in the body with err_code 255.
type Errc uint16

// The codes coro_rpc defines, in its order.
const (
	ErrcOK Errc = iota
	ErrcIOError
	ErrcNotConnected
	ErrcTimedOut
	ErrcInvalidRPCArguments
	ErrcAddressInUse
	ErrcBadAddress
	ErrcOpenError
	ErrcListenError
	ErrcOperationCanceled
	ErrcRPCThrowException
	ErrcFunctionNotRegistered
	ErrcProtocolError
	ErrcUnknownProtocolVersion
	ErrcMessageTooLarge
	ErrcServerHasRan
	ErrcInvalidRPCResult
	ErrcSerialNumberConflict
)

// errcWide is the err_code byte that says "the code is in the body".
const errcWide = math.MaxUint8

var errcNames = [...]string{
	"ok", "io_error", "not_connected", "timed_out", "invalid_rpc_arguments",
	"address_in_used", "bad_address", "open_error", "listen_error",
	"operation_canceled", "rpc_throw_exception", "function_not_registered",
	"protocol_error", "unknown_protocol_version", "message_too_large",
	"server_has_ran", "invalid_rpc_result", "serial_number_conflict",
}

// String returns coro_rpc's enumerator name, or errc(N) for a user code.
func (c Errc) String() string {
	if int(c) < len(errcNames) {
		return errcNames[c]
	}
	return fmt.Sprintf("errc(%d)", uint16(c))
}

// NotRegisteredMessage is the text coro_rpc's router answers an unknown
// function id with (router.hpp); Server sends the same so that Mooncake's
// clients log what they would log against the real master.
const NotRegisteredMessage = "the rpc function not registered"

// RPCError is an error response: the server ran (or refused to run) the call
// and answered with a non-zero err_code. Handlers may return one to choose
// the code a client sees.
type RPCError struct {
	Code     Errc
	Message  string
	Function uint32 // the function id called; 0 when unknown
}

func (e *RPCError) Error() string {
	var b strings.Builder
	if e.Function != 0 {
		fmt.Fprintf(&b, "coro_rpc function %#08x: ", e.Function)
	} else {
		b.WriteString("coro_rpc: ")
	}
	fmt.Fprintf(&b, "%s (%d)", e.Code, uint16(e.Code))
	if e.Message != "" {
		b.WriteString(": ")
		b.WriteString(e.Message)
	}
	return b.String()
}

// The error body is struct_pack-encoded, but only in two fixed shapes, so it
// is decoded here by hand rather than through pkg/structpack: a string (the
// message) when the code fits err_code, and pair<uint16 code, string message>
// when err_code is 255. struct_pack writes a u32 little-endian type hash
// (MD5 of the type literal, first four bytes big-endian, bit 0 cleared),
// with bit 0 set when a metainfo byte follows; the metainfo's bit 2 says the
// NUL-terminated type literal follows (builds without NDEBUG, as the
// captured mooncake_master), bits 3-4 give the width of container sizes
// (1, 2, 4 or 8 bytes; 1 when there is no metainfo), bits 0-1 announce
// compatible fields, which neither shape has. Then the payload: the u16
// code for the pair, the string's size at that width, its bytes.
// Sources: struct_pack/packer.hpp (serialize_metainfo),
// calculate_size.hpp (get_serialize_runtime_info),
// unpacker.hpp (deserialize_metainfo), type_calculate.hpp and type_id.hpp.
var (
	// string<char>: string_t (0x80) then char (0x0c).
	literalString = "\x80\x0c"
	// pair<uint16_t, string>: struct begin (0xfd), uint16 (0x08), string,
	// struct end (0xff). coro_rpc::rpc_error reflects to the same fields.
	literalCodeAndString = "\xfd\x08\x80\x0c\xff"

	hashString        = typeHash(literalString)
	hashCodeAndString = typeHash(literalCodeAndString)
)

func typeHash(literal string) uint32 {
	sum := md5.Sum([]byte(literal))
	return binary.BigEndian.Uint32(sum[:4]) &^ 1
}

// appendErrorBody appends the error body coro_rpc's prepare_response writes
// for code and msg and returns it with the err_code byte for the header.
// The type literal is embedded, as the captured master does; decoders
// accept both forms. Code 255 itself goes as a pair: prepare_response would
// send it as a bare string with err_code 255, which coro_rpc's own client
// then fails to decode as the pair it expects for 255.
func appendErrorBody(b []byte, code Errc, msg string) ([]byte, uint8) {
	wide := code >= errcWide
	hash, literal := hashString, literalString
	if wide {
		hash, literal = hashCodeAndString, literalCodeAndString
	}
	width, widthBits := 1, byte(0)
	switch n := uint64(len(msg)); {
	case n >= 1<<32:
		width, widthBits = 8, 3
	case n >= 1<<16:
		width, widthBits = 4, 2
	case n >= 1<<8:
		width, widthBits = 2, 1
	}
	b = binary.LittleEndian.AppendUint32(b, hash|1)
	b = append(b, 0b100|widthBits<<3)
	b = append(b, literal...)
	b = append(b, 0)
	if wide {
		b = binary.LittleEndian.AppendUint16(b, uint16(code))
	}
	var size [8]byte
	binary.LittleEndian.PutUint64(size[:], uint64(len(msg)))
	b = append(b, size[:width]...)
	b = append(b, msg...)
	if wide {
		return b, errcWide
	}
	return b, uint8(code)
}

var errBadErrorBody = errors.New("malformed coro_rpc error body")

// decodeErrorBody decodes the body of a response whose err_code is errCode
// (non-zero) into the code and message the server sent.
func decodeErrorBody(errCode uint8, body []byte) (Errc, string, error) {
	wide := errCode == errcWide
	if wide && len(body) >= 4 && binary.LittleEndian.Uint32(body)>>1 == hashString>>1 {
		// Code 255 itself, as coro_rpc's prepare_response sends it.
		wide = false
	}
	hash, literal, shape := hashString, literalString, "string"
	if wide {
		hash, literal, shape = hashCodeAndString, literalCodeAndString, "pair<uint16,string>"
	}
	fail := func(format string, args ...any) (Errc, string, error) {
		return Errc(errCode), "", fmt.Errorf("err_code %d body (%d bytes) as struct_pack %s: %s: %w",
			errCode, len(body), shape, fmt.Sprintf(format, args...), errBadErrorBody)
	}
	b := body
	if len(b) < 4 {
		return fail("no type hash")
	}
	head := binary.LittleEndian.Uint32(b)
	b = b[4:]
	if head>>1 != hash>>1 {
		return fail("type hash %#08x, want %#08x", head&^1, hash)
	}
	width := 1
	if head&1 != 0 {
		if len(b) < 1 {
			return fail("no metainfo byte")
		}
		meta := b[0]
		b = b[1:]
		if meta&0b11 != 0 {
			return fail("metainfo %#02x announces compatible fields", meta)
		}
		if meta&0b100 != 0 {
			if len(b) < len(literal)+1 || string(b[:len(literal)]) != literal || b[len(literal)] != 0 {
				return fail("type literal does not match")
			}
			b = b[len(literal)+1:]
		}
		width = 1 << (meta >> 3 & 0b11)
	}
	code := Errc(errCode)
	if wide {
		if len(b) < 2 {
			return fail("no error code")
		}
		code = Errc(binary.LittleEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) < width {
		return fail("no string size")
	}
	var size [8]byte
	copy(size[:], b[:width])
	n := binary.LittleEndian.Uint64(size[:])
	b = b[width:]
	if n > uint64(len(b)) {
		return fail("string of %d bytes, %d left", n, len(b))
	}
	return code, string(b[:n]), nil
}
