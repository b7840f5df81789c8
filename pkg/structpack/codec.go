package structpack

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// Option adjusts Marshal. It is a plain value, not a closure, so passing
// options costs no allocation on the hot path.
type Option struct {
	setLiteral, literal bool
}

type options struct {
	literal bool
}

// WithLiteral chooses whether Marshal embeds the type literal after the
// metainfo byte, as C++ builds without NDEBUG do (and the Mooncake builds
// captured here did). The default is true, so messages equal theirs byte
// for byte; false gives the shorter form of release builds. Both decode
// everywhere.
func WithLiteral(on bool) Option {
	return Option{setLiteral: true, literal: on}
}

func makeOptions(opts []Option) options {
	o := options{literal: true}
	for _, opt := range opts {
		if opt.setLiteral {
			o.literal = opt.literal
		}
	}
	return o
}

// Marshal encodes v as a struct_pack message of v's type.
func Marshal(v any, opts ...Option) ([]byte, error) {
	return AppendMarshal(nil, v, opts...)
}

// AppendMarshal appends the struct_pack message of v to dst.
func AppendMarshal(dst []byte, v any, opts ...Option) ([]byte, error) {
	rv, err := topValue(v)
	if err != nil {
		return dst, err
	}
	p, err := planForType(rv.Type())
	if err != nil {
		return dst, err
	}
	vals := [1]reflect.Value{rv}
	return p.encode(dst, vals[:], makeOptions(opts))
}

// MarshalArgs encodes the arguments of an RPC call as coro_rpc does: no
// arguments give an empty body, one is packed as itself, several as one
// std::tuple (the same bytes as a Go struct with those fields).
func MarshalArgs(args ...any) ([]byte, error) {
	return AppendMarshalArgs(nil, args)
}

// AppendMarshalArgs appends the body MarshalArgs would return to dst.
func AppendMarshalArgs(dst []byte, args []any, opts ...Option) ([]byte, error) {
	if len(args) == 0 {
		return dst, nil
	}
	if len(args) == 1 {
		return AppendMarshal(dst, args[0], opts...)
	}
	vals := make([]reflect.Value, len(args))
	types := make([]reflect.Type, len(args))
	for i, a := range args {
		rv, err := topValue(a)
		if err != nil {
			return dst, err
		}
		vals[i], types[i] = rv, rv.Type()
	}
	p, err := planFor(types)
	if err != nil {
		return dst, err
	}
	return p.encode(dst, vals, makeOptions(opts))
}

// Unmarshal decodes a struct_pack message into the value v points to. The
// message may or may not embed its type literal and may use any container
// length width.
func Unmarshal(data []byte, v any) error {
	return unmarshalOne(data, v, ArgsDecoder{})
}

func unmarshalOne(data []byte, v any, o ArgsDecoder) error {
	rv, err := target(v)
	if err != nil {
		return err
	}
	p, err := planForType(rv.Type())
	if err != nil {
		return err
	}
	vals := [1]reflect.Value{rv}
	return p.decodeWith(data, vals[:], o)
}

// UnmarshalArgs decodes an RPC request body into the arguments ptrs point
// to, the reverse of MarshalArgs.
func UnmarshalArgs(data []byte, ptrs ...any) error {
	return ArgsDecoder{}.UnmarshalArgs(data, ptrs...)
}

// UnmarshalArgsBorrow is UnmarshalArgs with every decoded string pointing
// into data instead of a copy of its own: no allocation per string, for a
// hot handler that is done with its arguments before data changes or goes
// (a batch of keys to look up). A string kept longer must be cloned.
func UnmarshalArgsBorrow(data []byte, ptrs ...any) error {
	return ArgsDecoder{Borrow: true}.UnmarshalArgs(data, ptrs...)
}

// ArgsDecoder decodes RPC arguments as UnmarshalArgs does, with options
// for a message from a peer that is not trusted.
type ArgsDecoder struct {
	// Borrow: decoded strings point into data (UnmarshalArgsBorrow).
	Borrow bool
	// MaxElems, when above 0, bounds the elements of all the message's
	// vectors (but strings and byte vectors) and maps together; a message
	// with more fails with ErrTooManyElements before they are made.
	MaxElems int
}

// UnmarshalArgs decodes data into ptrs (see the package's UnmarshalArgs).
func (o ArgsDecoder) UnmarshalArgs(data []byte, ptrs ...any) error {
	return unmarshalArgs(data, o, ptrs)
}

func unmarshalArgs(data []byte, o ArgsDecoder, ptrs []any) error {
	if len(ptrs) == 0 {
		if len(data) != 0 {
			return &DecodeError{Type: "()", Elem: "()", Reason: strconv.Itoa(len(data)) + " bytes for a call without arguments", Err: ErrMalformed}
		}
		return nil
	}
	if len(ptrs) == 1 {
		return unmarshalOne(data, ptrs[0], o)
	}
	var valsArr [maxCachedArgs]reflect.Value
	var typesArr [maxCachedArgs]reflect.Type
	vals, types := valsArr[:0], typesArr[:0]
	if len(ptrs) > maxCachedArgs {
		vals, types = make([]reflect.Value, 0, len(ptrs)), make([]reflect.Type, 0, len(ptrs))
	}
	vals, types = vals[:len(ptrs)], types[:len(ptrs)]
	for i, ptr := range ptrs {
		rv, err := target(ptr)
		if err != nil {
			return err
		}
		vals[i], types[i] = rv, rv.Type()
	}
	p, err := planFor(types)
	if err != nil {
		return err
	}
	return p.decodeWith(data, vals, o)
}

// Literal returns the struct_pack type literal of t (get_types_literal).
// A Go struct has the literal of the std::tuple of its fields, so the
// literal of several RPC arguments is that of a struct holding them.
func Literal(t reflect.Type) ([]byte, error) {
	p, err := planForType(derefType(t))
	if err != nil {
		return nil, err
	}
	return slices.Clone(p.lit), nil
}

// Hash returns the type hash of t as a message carries it, bit 0 (the
// metainfo flag) clear.
func Hash(t reflect.Type) (uint32, error) {
	p, err := planForType(derefType(t))
	if err != nil {
		return 0, err
	}
	return p.hash, nil
}

func derefType(t reflect.Type) reflect.Type {
	if t != nil && t.Kind() == reflect.Pointer {
		return t.Elem()
	}
	return t
}

func topValue(v any) (reflect.Value, error) {
	rv := reflect.ValueOf(v)
	if !rv.IsValid() {
		return rv, errors.New("structpack: cannot encode nil")
	}
	if rv.Kind() == reflect.Pointer {
		if rv.IsNil() {
			return rv, errors.New("structpack: cannot encode a nil " + rv.Type().String())
		}
		rv = rv.Elem()
	}
	return rv, nil
}

func target(v any) (reflect.Value, error) {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return rv, fmt.Errorf("structpack: decode target must be a non-nil pointer, not %T", v)
	}
	return rv.Elem(), nil
}

// rootPlan is the plan of a whole message: one value, or the tuple of a
// call's arguments.
type rootPlan struct {
	name  string
	lit   []byte
	hash  uint32
	nodes []*node
	hint  atomic.Int64 // size of the last message, to allocate once
}

// The encoder and decoder state would escape to the heap on every call
// (the plan's functions are called indirectly); pooling them saves that.
var (
	encoderPool = sync.Pool{New: func() any { return new(encoder) }}
	decoderPool = sync.Pool{New: func() any { return new(decoder) }}
)

const maxCachedArgs = 8

type rootKey struct {
	n  int
	ts [maxCachedArgs]reflect.Type
}

var (
	rootCache sync.Map // rootKey -> *rootPlan, for argument lists
	typeCache sync.Map // reflect.Type -> *rootPlan, for single values: a cheaper key
)

func planForType(t reflect.Type) (*rootPlan, error) {
	if p, ok := typeCache.Load(t); ok {
		return p.(*rootPlan), nil
	}
	if t == nil {
		return nil, errors.New("structpack: nil type")
	}
	p, err := planFor([]reflect.Type{t})
	if err != nil {
		return nil, err
	}
	actual, _ := typeCache.LoadOrStore(t, p)
	return actual.(*rootPlan), nil
}

func planFor(types []reflect.Type) (*rootPlan, error) {
	var key rootKey
	cacheable := len(types) <= maxCachedArgs
	if cacheable {
		key.n = copy(key.ts[:], types)
		if p, ok := rootCache.Load(key); ok {
			return p.(*rootPlan), nil
		}
	}
	p := &rootPlan{nodes: make([]*node, len(types))}
	names := make([]string, len(types))
	for i, t := range types {
		if t == nil {
			return nil, errors.New("structpack: nil type")
		}
		n, err := nodeFor(t)
		if err != nil {
			return nil, err
		}
		p.nodes[i], names[i] = n, t.String()
	}
	if len(types) == 1 {
		p.name, p.lit = names[0], p.nodes[0].lit
	} else {
		// std::tuple<Args...>: never memcpy'd, so no alignment trailer.
		p.name = "(" + strings.Join(names, ", ") + ")"
		p.lit = []byte{idStruct}
		for _, n := range p.nodes {
			p.lit = append(p.lit, n.lit...)
		}
		p.lit = append(p.lit, idEnd)
	}
	p.hash = literalHash(p.lit)
	if cacheable {
		actual, _ := rootCache.LoadOrStore(key, p)
		p = actual.(*rootPlan)
	}
	return p, nil
}

// widthFor is get_serialize_runtime_info's choice of container length
// width from the largest container in the message.
func widthFor(maxLen uint64) int {
	switch {
	case maxLen < 1<<8:
		return 1
	case maxLen < 1<<16:
		return 2
	case maxLen < 1<<32:
		return 4
	}
	return 8
}

func widthCode(w int) byte {
	switch w {
	case 2:
		return 1
	case 4:
		return 2
	case 8:
		return 3
	}
	return 0
}

func (p *rootPlan) encode(dst []byte, vals []reflect.Value, o options) ([]byte, error) {
	start := len(dst)
	if h := int(p.hint.Load()); cap(dst)-start < h {
		dst = slices.Grow(dst, h)
	}
	// The width depends on the largest container, known only after the
	// payload is walked: encode with one-byte lengths and, in the rare
	// message holding a container of 256 or more, once more with the width
	// the first pass found.
	e := encoderPool.Get().(*encoder)
	defer func() {
		*e = encoder{}
		encoderPool.Put(e)
	}()
	*e = encoder{buf: dst, width: 1}
	for {
		e.buf, e.maxLen = e.buf[:start], 0
		p.header(e, o.literal)
		for i, n := range p.nodes {
			n.enc(e, vals[i])
		}
		if e.err != nil {
			return dst[:start], errors.New("structpack: encode " + p.name + ": " + e.err.Error())
		}
		w := widthFor(e.maxLen)
		if w == e.width {
			break
		}
		e.width = w
	}
	if size := int64(len(e.buf) - start); size != p.hint.Load() {
		p.hint.Store(size)
	}
	return e.buf, nil
}

func (p *rootPlan) header(e *encoder, literal bool) {
	head := p.hash
	flag := literal || e.width != 1
	if flag {
		head |= 1
	}
	e.buf = binary.LittleEndian.AppendUint32(e.buf, head)
	if !flag {
		return
	}
	meta := widthCode(e.width) << 3
	if literal {
		meta |= 0b100
	}
	e.buf = append(e.buf, meta)
	if literal {
		e.buf = append(e.buf, p.lit...)
		e.buf = append(e.buf, 0)
	}
}

func (p *rootPlan) decodeWith(data []byte, vals []reflect.Value, o ArgsDecoder) error {
	d := decoderPool.Get().(*decoder)
	*d = decoder{data: data, width: 1, borrow: o.Borrow, maxElems: o.MaxElems}
	err := p.decodeMessage(d, vals)
	*d = decoder{}
	decoderPool.Put(d)
	if de, ok := err.(*DecodeError); ok {
		de.Type = p.name
	}
	return err
}

const (
	metaCompatible = 0b00011
	metaLiteral    = 0b00100
	metaWidth      = 0b11000
)

func headerError(off int, what string, sentinel error, reason string) *DecodeError {
	return &DecodeError{Elem: what, Offset: off, Reason: reason, Err: sentinel}
}

func (p *rootPlan) decodeMessage(d *decoder, vals []reflect.Value) error {
	data := d.data
	if len(data) < 4 {
		return headerError(0, "hash head", ErrTruncated, "need 4 bytes, "+strconv.Itoa(len(data))+" left")
	}
	head := binary.LittleEndian.Uint32(data)
	d.off = 4
	if head&^1 != p.hash {
		return p.mismatch(head, data)
	}
	if head&1 != 0 {
		if len(data) < 5 {
			return headerError(4, "metainfo", ErrTruncated, "hash head announces a metainfo byte, none follows")
		}
		meta := data[4]
		d.off = 5
		if meta&metaCompatible != 0 {
			return headerError(4, "metainfo", ErrMalformed, "metainfo "+hexByte(meta)+" announces struct_pack compatible members, which this package does not support")
		}
		if meta&^(metaCompatible|metaLiteral|metaWidth) != 0 {
			return headerError(4, "metainfo", ErrMalformed, "metainfo "+hexByte(meta)+" has unknown bits set")
		}
		if meta&metaLiteral != 0 {
			end := bytes.IndexByte(data[5:], 0)
			if end < 0 {
				return headerError(5, "type literal", ErrTruncated, "type literal has no NUL terminator")
			}
			if got := data[5 : 5+end]; !bytes.Equal(got, p.lit) {
				return &HashMismatchError{Type: p.name, Want: p.hash, Got: head &^ 1, WantLiteral: p.lit, GotLiteral: slices.Clone(got)}
			}
			d.off = 5 + end + 1
		}
		d.wi = int(meta&metaWidth) >> 3
		d.width = widths[d.wi]
	}
	for i, n := range p.nodes {
		if err := n.dec(d, vals[i]); err != nil {
			if len(p.nodes) > 1 {
				return withPath(err, "[arg "+strconv.Itoa(i)+"]")
			}
			return err
		}
	}
	if d.off != len(data) {
		return headerError(d.off, p.name, ErrMalformed, strconv.Itoa(len(data)-d.off)+" bytes after the value")
	}
	return nil
}

// mismatch builds the error for a foreign hash, with the literal the
// message embeds when it has one: that names the peer's type.
func (p *rootPlan) mismatch(head uint32, data []byte) error {
	err := &HashMismatchError{Type: p.name, Want: p.hash, Got: head &^ 1, WantLiteral: p.lit}
	if head&1 != 0 && len(data) > 5 && data[4]&(metaLiteral|metaCompatible) == metaLiteral {
		if end := bytes.IndexByte(data[5:], 0); end >= 0 {
			err.GotLiteral = slices.Clone(data[5 : 5+end])
		}
	}
	return err
}

func hexByte(b byte) string {
	const digits = "0123456789abcdef"
	return "0x" + string([]byte{digits[b>>4], digits[b&15]})
}
