package structpack

import (
	"errors"
	"fmt"
	"reflect"
)

// Sentinels a *DecodeError unwraps to.
var (
	// ErrTruncated: the message ends before the value it announces.
	ErrTruncated = errors.New("message truncated")
	// ErrMalformed: bytes no struct_pack encoder of the type writes (a
	// discriminator other than 0 or 1, a variant index out of range, a
	// duplicate map key, bytes after the value, unknown metainfo bits).
	ErrMalformed = errors.New("malformed message")
	// ErrTooManyElements: the message's vectors and maps hold more
	// elements than the decoder was allowed (ArgsDecoder.MaxElems).
	ErrTooManyElements = errors.New("too many elements")
)

// DecodeError reports bytes that do not decode as the requested type.
type DecodeError struct {
	Type   string // Go type of the whole message (or the argument tuple)
	Path   string // where inside it, such as ".Value[3].Name"; empty for the top
	Elem   string // Go type of the value at Path
	Offset int    // byte offset into the message
	Reason string
	Err    error // ErrTruncated, ErrMalformed or ErrTooManyElements
}

func (e *DecodeError) Error() string {
	where := e.Path
	if where == "" {
		where = "top"
	}
	return fmt.Sprintf("structpack: decode %s: offset %d, %s (%s): %s", e.Type, e.Offset, where, e.Elem, e.Reason)
}

func (e *DecodeError) Unwrap() error { return e.Err }

// withPath prefixes the path of a *DecodeError as it unwinds through the
// composite values holding the failed one; the cost is paid only on error.
func withPath(err error, seg string) error {
	if de, ok := err.(*DecodeError); ok {
		de.Path = seg + de.Path
	}
	return err
}

// HashMismatchError reports a message whose type hash (or embedded type
// literal) is not the one of the Go type it is decoded into: the peer
// speaks another version of the message.
type HashMismatchError struct {
	Type        string // Go type decoded into
	Want        uint32 // hash of Type's literal, bit 0 clear
	Got         uint32 // hash in the message, bit 0 clear
	WantLiteral []byte // Type's literal
	GotLiteral  []byte // the literal the message embeds; nil if it embeds none
}

func (e *HashMismatchError) Error() string {
	var what string
	if e.Got == e.Want {
		what = fmt.Sprintf("message type hash %#08x matches %s but its embedded literal does not", e.Got, e.Type)
	} else {
		what = fmt.Sprintf("message type hash %#08x is not %#08x of %s", e.Got, e.Want, e.Type)
	}
	s := fmt.Sprintf("structpack: %s, C++ %s", what, DescribeLiteral(e.WantLiteral))
	if e.GotLiteral != nil {
		return s + fmt.Sprintf("; the message embeds literal %x, C++ %s", e.GotLiteral, DescribeLiteral(e.GotLiteral))
	}
	return s + "; the message embeds no type literal"
}

// UnsupportedTypeError reports a Go type this package cannot map to a
// struct_pack type.
type UnsupportedTypeError struct {
	Type   reflect.Type // the type asked for
	Path   string       // where inside it the offending type sits
	Reason string
}

func (e *UnsupportedTypeError) Error() string {
	if e.Path == "" {
		return fmt.Sprintf("structpack: type %v: %s", e.Type, e.Reason)
	}
	return fmt.Sprintf("structpack: type %v: %s: %s", e.Type, e.Path, e.Reason)
}
