package structpack

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"unsafe"
)

// A node is the cached plan for one Go type: its literal, its C++ layout
// facts and the functions that encode and decode it. Plans are built once
// per type, so a hot message never walks reflection type information again.
type node struct {
	typ reflect.Type
	lit []byte // the type literal of this type as a member

	// trivial: C++ is_trivial_serializable, the type is copied with memcpy
	// (padding included) as a member of a trivial struct, an element of a
	// vector or array, or on its own. csize and calign are its C++ sizeof
	// and alignof then.
	trivial bool
	csize   int
	calign  int

	// min is the fewest bytes the type takes on its own, per container
	// length width (1, 2, 4, 8 bytes); decoders check a container's count
	// against it before allocating.
	min [4]int

	enc func(*encoder, reflect.Value)
	dec func(*decoder, reflect.Value) error
	// encImg and decImg are the memcpy image of a trivial type, csize
	// bytes. They differ from enc/dec only for std::monostate, which
	// writes nothing on its own and one byte inside a memcpy'd object.
	encImg func(*encoder, reflect.Value)
	decImg func(*decoder, reflect.Value) error
}

var widths = [4]int{1, 2, 4, 8}

type encoder struct {
	buf    []byte
	width  int
	maxLen uint64
	err    error
}

func (e *encoder) length(n int) {
	u := uint64(n)
	if u > e.maxLen {
		e.maxLen = u
	}
	switch e.width {
	case 1:
		e.buf = append(e.buf, byte(u))
	case 2:
		e.buf = binary.LittleEndian.AppendUint16(e.buf, uint16(u))
	case 4:
		e.buf = binary.LittleEndian.AppendUint32(e.buf, uint32(u))
	default:
		e.buf = binary.LittleEndian.AppendUint64(e.buf, u)
	}
}

func (e *encoder) zeros(n int) {
	for ; n > 0; n-- {
		e.buf = append(e.buf, 0)
	}
}

func (e *encoder) fail(err error) {
	if e.err == nil {
		e.err = err
	}
}

type decoder struct {
	data  []byte
	off   int
	width int
	wi    int // index of width in widths
	// borrow makes decoded strings point into data (UnmarshalArgsBorrow).
	borrow bool
	// maxElems bounds the elements of all vectors (but byte vectors and
	// strings) and maps of the message together, 0 none; elems counts
	// them.
	maxElems, elems int
}

// elements counts n more elements of a vector or map of type t against
// maxElems, before they are made. A vector's length is bounded by the
// bytes left, but an element of a few bytes on the wire (an empty string:
// its 4-byte length) takes several times that in Go (16 bytes), so a
// 64 MiB message could make a GiB of them.
func (d *decoder) elements(t reflect.Type, n int) error {
	d.elems += n
	if d.maxElems > 0 && d.elems > d.maxElems {
		return d.errorf(t, ErrTooManyElements, "%d elements with those before, over the limit of %d", d.elems, d.maxElems)
	}
	return nil
}

func (d *decoder) left() int { return len(d.data) - d.off }

func (d *decoder) errorf(t reflect.Type, sentinel error, format string, args ...any) error {
	return &DecodeError{Elem: t.String(), Offset: d.off, Reason: fmt.Sprintf(format, args...), Err: sentinel}
}

// take returns the next n bytes, or a truncation error naming t.
func (d *decoder) take(n int, t reflect.Type) ([]byte, error) {
	if d.left() < n {
		return nil, d.errorf(t, ErrTruncated, "need %d bytes, %d left", n, d.left())
	}
	b := d.data[d.off : d.off+n]
	d.off += n
	return b, nil
}

// count reads a container length and checks that count elements of at
// least minElem bytes each fit in what is left, so no allocation is sized
// by an unchecked number.
func (d *decoder) count(t reflect.Type, minElem int) (int, error) {
	at := d.off
	b, err := d.take(d.width, t)
	if err != nil {
		return 0, err
	}
	var n uint64
	switch d.width {
	case 1:
		n = uint64(b[0])
	case 2:
		n = uint64(binary.LittleEndian.Uint16(b))
	case 4:
		n = uint64(binary.LittleEndian.Uint32(b))
	default:
		n = binary.LittleEndian.Uint64(b)
	}
	if minElem < 1 {
		minElem = 1
	}
	if n > uint64(d.left()/minElem) {
		d.off = at
		return 0, d.errorf(t, ErrTruncated, "length %d needs at least %d bytes per element, %d bytes left", n, minElem, d.left()-d.width)
	}
	return int(n), nil
}

// discriminator reads a bool-like byte that must be 0 or 1.
func (d *decoder) discriminator(t reflect.Type, what string) (bool, error) {
	b, err := d.take(1, t)
	if err != nil {
		return false, err
	}
	if b[0] > 1 {
		d.off--
		return false, d.errorf(t, ErrMalformed, "%s byte %#02x is neither 0 nor 1", what, b[0])
	}
	return b[0] == 1, nil
}

var (
	planMu    sync.Mutex // serialises building; lookups go through nodeCache
	nodeCache sync.Map   // reflect.Type -> *node

	aggregateType   = reflect.TypeFor[Aggregate]()
	optionalTagType = reflect.TypeFor[optionalTag]()
	expectedTagType = reflect.TypeFor[expectedTag]()
	variantType     = reflect.TypeFor[Variant]()
)

// nodeFor returns the plan of t, building it on first use.
func nodeFor(t reflect.Type) (*node, error) {
	if n, ok := nodeCache.Load(t); ok {
		return n.(*node), nil
	}
	planMu.Lock()
	defer planMu.Unlock()
	b := builder{root: t, building: map[reflect.Type]bool{}}
	return b.build(t, "")
}

type builder struct {
	root     reflect.Type
	building map[reflect.Type]bool
}

func (b *builder) unsupported(path, format string, args ...any) error {
	return &UnsupportedTypeError{Type: b.root, Path: path, Reason: fmt.Sprintf(format, args...)}
}

func (b *builder) build(t reflect.Type, path string) (*node, error) {
	if n, ok := nodeCache.Load(t); ok {
		return n.(*node), nil
	}
	if b.building[t] {
		return nil, b.unsupported(path, "recursive type %v", t)
	}
	b.building[t] = true
	defer delete(b.building, t)
	n, err := b.make(t, path)
	if err != nil {
		return nil, err
	}
	if n.encImg == nil && n.trivial {
		n.encImg, n.decImg = n.enc, n.dec
	}
	nodeCache.Store(t, n)
	return n, nil
}

func (b *builder) make(t reflect.Type, path string) (*node, error) {
	switch t.Kind() {
	case reflect.Bool:
		return boolNode(t), nil
	case reflect.Int8:
		return intNode(t, idInt8, 1, true), nil
	case reflect.Int16:
		return intNode(t, idInt16, 2, true), nil
	case reflect.Int32:
		return intNode(t, idInt32, 4, true), nil
	case reflect.Int64, reflect.Int:
		return intNode(t, idInt64, 8, true), nil
	case reflect.Uint8:
		return intNode(t, idUint8, 1, false), nil
	case reflect.Uint16:
		return intNode(t, idUint16, 2, false), nil
	case reflect.Uint32:
		return intNode(t, idUint32, 4, false), nil
	case reflect.Uint64, reflect.Uint, reflect.Uintptr:
		return intNode(t, idUint64, 8, false), nil
	case reflect.Float32:
		return floatNode(t, idFloat32, 4), nil
	case reflect.Float64:
		return floatNode(t, idFloat64, 8), nil
	case reflect.String:
		return stringNode(t), nil
	case reflect.Slice:
		return b.sliceNode(t, path)
	case reflect.Array:
		return b.arrayNode(t, path)
	case reflect.Map:
		return b.mapNode(t, path)
	case reflect.Struct:
		return b.structLike(t, path)
	case reflect.Pointer:
		return nil, b.unsupported(path, "pointer %v: use Optional for std::optional or a value for a member", t)
	case reflect.Interface:
		return nil, b.unsupported(path, "interface %v outside a Variant", t)
	}
	return nil, b.unsupported(path, "%v (kind %v) has no struct_pack counterpart", t, t.Kind())
}

func fixedMin(n int) [4]int { return [4]int{n, n, n, n} }

func boolNode(t reflect.Type) *node {
	return &node{
		typ: t, lit: []byte{idBool}, trivial: true, csize: 1, calign: 1, min: fixedMin(1),
		enc: func(e *encoder, v reflect.Value) {
			var c byte
			if v.Bool() {
				c = 1
			}
			e.buf = append(e.buf, c)
		},
		dec: func(d *decoder, v reflect.Value) error {
			x, err := d.discriminator(t, "bool")
			if err != nil {
				return err
			}
			v.SetBool(x)
			return nil
		},
	}
}

func intNode(t reflect.Type, id byte, size int, signed bool) *node {
	n := &node{typ: t, lit: []byte{id}, trivial: true, csize: size, calign: size, min: fixedMin(size)}
	// Go int, uint and uintptr travel as 64 bits and may be narrower.
	narrowable := t.Kind() == reflect.Int || t.Kind() == reflect.Uint || t.Kind() == reflect.Uintptr
	if signed {
		n.enc = func(e *encoder, v reflect.Value) {
			x := v.Int()
			switch size {
			case 1:
				e.buf = append(e.buf, byte(x))
			case 2:
				e.buf = binary.LittleEndian.AppendUint16(e.buf, uint16(x))
			case 4:
				e.buf = binary.LittleEndian.AppendUint32(e.buf, uint32(x))
			default:
				e.buf = binary.LittleEndian.AppendUint64(e.buf, uint64(x))
			}
		}
		n.dec = func(d *decoder, v reflect.Value) error {
			b, err := d.take(size, t)
			if err != nil {
				return err
			}
			var x int64
			switch size {
			case 1:
				x = int64(int8(b[0]))
			case 2:
				x = int64(int16(binary.LittleEndian.Uint16(b)))
			case 4:
				x = int64(int32(binary.LittleEndian.Uint32(b)))
			default:
				x = int64(binary.LittleEndian.Uint64(b))
			}
			if narrowable && v.OverflowInt(x) {
				d.off -= size
				return d.errorf(t, ErrMalformed, "%d overflows %v", x, t)
			}
			v.SetInt(x)
			return nil
		}
		return n
	}
	n.enc = func(e *encoder, v reflect.Value) {
		x := v.Uint()
		switch size {
		case 1:
			e.buf = append(e.buf, byte(x))
		case 2:
			e.buf = binary.LittleEndian.AppendUint16(e.buf, uint16(x))
		case 4:
			e.buf = binary.LittleEndian.AppendUint32(e.buf, uint32(x))
		default:
			e.buf = binary.LittleEndian.AppendUint64(e.buf, x)
		}
	}
	n.dec = func(d *decoder, v reflect.Value) error {
		b, err := d.take(size, t)
		if err != nil {
			return err
		}
		var x uint64
		switch size {
		case 1:
			x = uint64(b[0])
		case 2:
			x = uint64(binary.LittleEndian.Uint16(b))
		case 4:
			x = uint64(binary.LittleEndian.Uint32(b))
		default:
			x = binary.LittleEndian.Uint64(b)
		}
		if narrowable && v.OverflowUint(x) {
			d.off -= size
			return d.errorf(t, ErrMalformed, "%d overflows %v", x, t)
		}
		v.SetUint(x)
		return nil
	}
	return n
}

func floatNode(t reflect.Type, id byte, size int) *node {
	n := &node{typ: t, lit: []byte{id}, trivial: true, csize: size, calign: size, min: fixedMin(size)}
	if size == 4 {
		n.enc = func(e *encoder, v reflect.Value) {
			e.buf = binary.LittleEndian.AppendUint32(e.buf, math.Float32bits(float32(v.Float())))
		}
		n.dec = func(d *decoder, v reflect.Value) error {
			b, err := d.take(4, t)
			if err != nil {
				return err
			}
			v.SetFloat(float64(math.Float32frombits(binary.LittleEndian.Uint32(b))))
			return nil
		}
		return n
	}
	n.enc = func(e *encoder, v reflect.Value) {
		e.buf = binary.LittleEndian.AppendUint64(e.buf, math.Float64bits(v.Float()))
	}
	n.dec = func(d *decoder, v reflect.Value) error {
		b, err := d.take(8, t)
		if err != nil {
			return err
		}
		v.SetFloat(math.Float64frombits(binary.LittleEndian.Uint64(b)))
		return nil
	}
	return n
}

func stringNode(t reflect.Type) *node {
	return &node{
		typ: t, lit: []byte{idString, idChar}, min: widths,
		enc: func(e *encoder, v reflect.Value) {
			s := v.String()
			e.length(len(s))
			e.buf = append(e.buf, s...)
		},
		dec: func(d *decoder, v reflect.Value) error {
			n, err := d.count(t, 1)
			if err != nil {
				return err
			}
			if d.borrow && n > 0 {
				v.SetString(unsafe.String(&d.data[d.off], n))
			} else {
				v.SetString(string(d.data[d.off : d.off+n]))
			}
			d.off += n
			return nil
		},
	}
}

func monostateNode(t reflect.Type) *node {
	return &node{
		typ: t, lit: []byte{idMonostate}, trivial: true, csize: 1, calign: 1,
		enc: func(*encoder, reflect.Value) {},
		dec: func(*decoder, reflect.Value) error { return nil },
		encImg: func(e *encoder, _ reflect.Value) {
			e.buf = append(e.buf, 0)
		},
		decImg: func(d *decoder, _ reflect.Value) error {
			_, err := d.take(1, t)
			return err
		},
	}
}

// elemCodec picks how a container element travels: trivially copyable
// elements are memcpy'd (their image), others encoded one by one.
func elemCodec(n *node) (func(*encoder, reflect.Value), func(*decoder, reflect.Value) error, [4]int) {
	if n.trivial {
		return n.encImg, n.decImg, fixedMin(n.csize)
	}
	return n.enc, n.dec, n.min
}

func (b *builder) sliceNode(t reflect.Type, path string) (*node, error) {
	en, err := b.build(t.Elem(), path+"[]")
	if err != nil {
		return nil, err
	}
	encElem, decElem, elemMin := elemCodec(en)
	if elemMin[0] == 0 {
		return nil, b.unsupported(path, "%v: elements that encode to no bytes leave a vector's length unbounded by the input", t)
	}
	n := &node{typ: t, lit: append([]byte{idVector}, en.lit...), min: widths}
	if t.Elem().Kind() == reflect.Uint8 {
		n.enc = func(e *encoder, v reflect.Value) {
			e.length(v.Len())
			e.buf = append(e.buf, v.Bytes()...)
		}
		n.dec = func(d *decoder, v reflect.Value) error {
			cnt, err := d.count(t, 1)
			if err != nil {
				return err
			}
			if v.Cap() >= cnt {
				v.SetLen(cnt)
			} else {
				v.Set(reflect.MakeSlice(t, cnt, cnt))
			}
			copy(v.Bytes(), d.data[d.off:d.off+cnt])
			d.off += cnt
			return nil
		}
		return n, nil
	}
	n.enc = func(e *encoder, v reflect.Value) {
		l := v.Len()
		e.length(l)
		for i := range l {
			encElem(e, v.Index(i))
		}
	}
	n.dec = func(d *decoder, v reflect.Value) error {
		cnt, err := d.count(t, elemMin[d.wi])
		if err == nil {
			err = d.elements(t, cnt)
		}
		if err != nil {
			return err
		}
		if v.Cap() >= cnt {
			v.SetLen(cnt)
		} else {
			v.Set(reflect.MakeSlice(t, cnt, cnt))
		}
		for i := range cnt {
			if err := decElem(d, v.Index(i)); err != nil {
				return withPath(err, "["+strconv.Itoa(i)+"]")
			}
		}
		return nil
	}
	return n, nil
}

func (b *builder) arrayNode(t reflect.Type, path string) (*node, error) {
	cnt := t.Len()
	if cnt == 0 {
		return nil, b.unsupported(path, "%v: std::array of size 0 is not allowed by struct_pack", t)
	}
	en, err := b.build(t.Elem(), path+"[]")
	if err != nil {
		return nil, err
	}
	lit := append([]byte{idArray}, en.lit...)
	lit = appendSizeLiteral(lit, uint64(cnt))
	n := &node{typ: t, lit: lit, trivial: en.trivial}
	encElem, decElem, elemMin := elemCodec(en)
	for i := range n.min {
		n.min[i] = cnt * elemMin[i]
	}
	if en.trivial {
		n.csize, n.calign = cnt*en.csize, en.calign
	}
	if t.Elem().Kind() == reflect.Uint8 {
		n.enc = func(e *encoder, v reflect.Value) {
			if v.CanAddr() {
				e.buf = append(e.buf, v.Bytes()...)
				return
			}
			for i := range cnt {
				e.buf = append(e.buf, byte(v.Index(i).Uint()))
			}
		}
		n.dec = func(d *decoder, v reflect.Value) error {
			src, err := d.take(cnt, t)
			if err != nil {
				return err
			}
			copy(v.Bytes(), src)
			return nil
		}
		return n, nil
	}
	n.enc = func(e *encoder, v reflect.Value) {
		for i := range cnt {
			encElem(e, v.Index(i))
		}
	}
	n.dec = func(d *decoder, v reflect.Value) error {
		for i := range cnt {
			if err := decElem(d, v.Index(i)); err != nil {
				return withPath(err, "["+strconv.Itoa(i)+"]")
			}
		}
		return nil
	}
	return n, nil
}

func (b *builder) mapNode(t reflect.Type, path string) (*node, error) {
	kn, err := b.build(t.Key(), path+"[key]")
	if err != nil {
		return nil, err
	}
	vn, err := b.build(t.Elem(), path+"[value]")
	if err != nil {
		return nil, err
	}
	// packer.hpp writes a map entry as std::pair<const K, V>, memcpy'd with
	// its padding when the pair is trivially copyable, while unpacker.hpp
	// reads key and value one after the other without it. Such a map does
	// not survive even between two C++ peers, so it is refused.
	if kn.trivial && vn.trivial {
		voff := alignUp(kn.csize, vn.calign)
		psize := alignUp(voff+vn.csize, max(kn.calign, vn.calign))
		if voff != kn.csize || psize != voff+vn.csize || kn.lit[0] == idMonostate || vn.lit[0] == idMonostate {
			return nil, b.unsupported(path, "%v: struct_pack at 7801bc9 writes this map's entries with padding but reads them without", t)
		}
	}
	entryMin := [4]int{}
	for i := range entryMin {
		entryMin[i] = kn.min[i] + vn.min[i]
	}
	if entryMin[0] == 0 {
		return nil, b.unsupported(path, "%v: entries that encode to no bytes leave a map's length unbounded by the input", t)
	}
	less := keyOrder(t.Key(), kn)
	lit := append([]byte{idMap}, kn.lit...)
	lit = append(lit, vn.lit...)
	n := &node{typ: t, lit: lit, min: widths}
	n.enc = func(e *encoder, v reflect.Value) {
		keys := v.MapKeys()
		less(e, keys)
		e.length(len(keys))
		for _, k := range keys {
			kn.enc(e, k)
			vn.enc(e, v.MapIndex(k))
		}
	}
	n.dec = func(d *decoder, v reflect.Value) error {
		cnt, err := d.count(t, entryMin[d.wi])
		if err == nil {
			err = d.elements(t, cnt)
		}
		if err != nil {
			return err
		}
		m := reflect.MakeMapWithSize(t, cnt)
		k := reflect.New(t.Key()).Elem()
		val := reflect.New(t.Elem()).Elem()
		for i := range cnt {
			// Zeroed each time so a slice in one entry never shares the
			// backing array of the previous one.
			k.SetZero()
			val.SetZero()
			at := d.off
			if err := kn.dec(d, k); err != nil {
				return withPath(err, "[key #"+strconv.Itoa(i)+"]")
			}
			if m.MapIndex(k).IsValid() {
				d.off = at
				return withPath(d.errorf(t.Key(), ErrMalformed, "duplicate map key"), "[key #"+strconv.Itoa(i)+"]")
			}
			if err := vn.dec(d, val); err != nil {
				return withPath(err, "[value #"+strconv.Itoa(i)+"]")
			}
			m.SetMapIndex(k, val)
		}
		v.Set(m)
		return nil
	}
	return n, nil
}

// keyOrder returns a sorter giving map keys a deterministic order: the
// natural one for numbers, strings and bools (which is std::map's), and
// for other keys the order of their encodings.
func keyOrder(kt reflect.Type, kn *node) func(*encoder, []reflect.Value) {
	switch kt.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return func(_ *encoder, ks []reflect.Value) {
			slices.SortFunc(ks, func(a, b reflect.Value) int { return cmp.Compare(a.Int(), b.Int()) })
		}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return func(_ *encoder, ks []reflect.Value) {
			slices.SortFunc(ks, func(a, b reflect.Value) int { return cmp.Compare(a.Uint(), b.Uint()) })
		}
	case reflect.Float32, reflect.Float64:
		return func(_ *encoder, ks []reflect.Value) {
			slices.SortFunc(ks, func(a, b reflect.Value) int { return cmp.Compare(a.Float(), b.Float()) })
		}
	case reflect.String:
		return func(_ *encoder, ks []reflect.Value) {
			slices.SortFunc(ks, func(a, b reflect.Value) int { return cmp.Compare(a.String(), b.String()) })
		}
	case reflect.Bool:
		return func(_ *encoder, ks []reflect.Value) {
			slices.SortFunc(ks, func(a, b reflect.Value) int {
				switch {
				case a.Bool() == b.Bool():
					return 0
				case b.Bool():
					return -1
				}
				return 1
			})
		}
	}
	return func(e *encoder, ks []reflect.Value) {
		type keyed struct {
			k   reflect.Value
			enc []byte
		}
		all := make([]keyed, len(ks))
		for i, k := range ks {
			scratch := encoder{width: e.width}
			kn.enc(&scratch, k)
			all[i] = keyed{k, scratch.buf}
		}
		slices.SortFunc(all, func(a, b keyed) int { return bytes.Compare(a.enc, b.enc) })
		for i := range all {
			ks[i] = all[i].k
		}
	}
}

func alignUp(n, a int) int {
	if a <= 1 {
		return n
	}
	return (n + a - 1) / a * a
}

func (b *builder) structLike(t reflect.Type, path string) (*node, error) {
	if t.NumField() == 0 {
		return monostateNode(t), nil
	}
	if isVariant(t) {
		return b.variantNode(t, path)
	}
	switch t.Field(0).Type {
	case optionalTagType:
		return b.optionalNode(t, path)
	case expectedTagType:
		return b.expectedNode(t, path)
	}
	return b.structNode(t, path)
}

func (b *builder) optionalNode(t reflect.Type, path string) (*node, error) {
	vf, _ := t.FieldByName("Value")
	okf, _ := t.FieldByName("Valid")
	vi, oi := vf.Index[0], okf.Index[0]
	vn, err := b.build(vf.Type, path+".Value")
	if err != nil {
		return nil, err
	}
	n := &node{typ: t, lit: append([]byte{idOptional}, vn.lit...), min: fixedMin(1)}
	n.enc = func(e *encoder, v reflect.Value) {
		if !v.Field(oi).Bool() {
			e.buf = append(e.buf, 0)
			return
		}
		e.buf = append(e.buf, 1)
		vn.enc(e, v.Field(vi))
	}
	n.dec = func(d *decoder, v reflect.Value) error {
		has, err := d.discriminator(t, "optional has_value")
		if err != nil {
			return err
		}
		v.Field(oi).SetBool(has)
		if !has {
			v.Field(vi).SetZero()
			return nil
		}
		return withPath(vn.dec(d, v.Field(vi)), ".Value")
	}
	return n, nil
}

func (b *builder) expectedNode(t reflect.Type, path string) (*node, error) {
	vf, _ := t.FieldByName("Value")
	ef, _ := t.FieldByName("Error")
	hf, _ := t.FieldByName("HasError")
	vi, ei, hi := vf.Index[0], ef.Index[0], hf.Index[0]
	vn, err := b.build(vf.Type, path+".Value")
	if err != nil {
		return nil, err
	}
	en, err := b.build(ef.Type, path+".Error")
	if err != nil {
		return nil, err
	}
	lit := append([]byte{idExpected}, vn.lit...)
	lit = append(lit, en.lit...)
	n := &node{typ: t, lit: lit}
	for i := range n.min {
		n.min[i] = 1 + min(vn.min[i], en.min[i])
	}
	n.enc = func(e *encoder, v reflect.Value) {
		if v.Field(hi).Bool() {
			e.buf = append(e.buf, 0)
			en.enc(e, v.Field(ei))
			return
		}
		e.buf = append(e.buf, 1)
		vn.enc(e, v.Field(vi))
	}
	n.dec = func(d *decoder, v reflect.Value) error {
		ok, err := d.discriminator(t, "expected has_value")
		if err != nil {
			return err
		}
		v.Field(hi).SetBool(!ok)
		if ok {
			v.Field(ei).SetZero()
			return withPath(vn.dec(d, v.Field(vi)), ".Value")
		}
		v.Field(vi).SetZero()
		return withPath(en.dec(d, v.Field(ei)), ".Error")
	}
	return n, nil
}

// isVariant reports whether t itself declares VariantAlternatives; a
// struct that merely embeds a Variant type (and so gets the method
// promoted) is an ordinary struct with a variant member.
func isVariant(t reflect.Type) bool {
	if !reflect.PointerTo(t).Implements(variantType) {
		return false
	}
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous && (f.Type.Implements(variantType) || reflect.PointerTo(f.Type).Implements(variantType)) {
			return false
		}
	}
	return true
}

// alternatives calls the user's VariantAlternatives, turning a panic in it
// into an error.
func (b *builder) alternatives(t reflect.Type, path string) (alts []any, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = b.unsupported(path, "%v.VariantAlternatives panicked: %v", t, r)
		}
	}()
	return reflect.New(t).Interface().(Variant).VariantAlternatives(), nil
}

func (b *builder) variantNode(t reflect.Type, path string) (*node, error) {
	holder := -1
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Tag.Get("structpack") == "-" {
			continue
		}
		if holder >= 0 || f.Type.Kind() != reflect.Interface || !f.IsExported() {
			return nil, b.unsupported(path, "Variant %v must be a struct with one exported field of interface type", t)
		}
		holder = i
	}
	if holder < 0 {
		return nil, b.unsupported(path, "Variant %v has no field to hold its alternative", t)
	}
	ft := t.Field(holder).Type
	alts, err := b.alternatives(t, path)
	if err != nil {
		return nil, err
	}
	if len(alts) == 0 || len(alts) > 255 {
		return nil, b.unsupported(path, "Variant %v lists %d alternatives, struct_pack allows 1 to 255", t, len(alts))
	}
	types := make([]reflect.Type, len(alts))
	nodes := make([]*node, len(alts))
	mono := -1
	lit := []byte{idVariant}
	n := &node{typ: t}
	for i, a := range alts {
		if a == nil {
			return nil, b.unsupported(path, "Variant %v alternative %d is nil; list a zero value of its type", t, i)
		}
		at := reflect.TypeOf(a)
		if slices.Contains(types[:i], at) {
			return nil, b.unsupported(path, "Variant %v lists %v twice; alternatives are told apart by type", t, at)
		}
		if !at.AssignableTo(ft) {
			return nil, b.unsupported(path, "Variant %v alternative %v does not fit its field of type %v", t, at, ft)
		}
		an, err := b.build(at, path+".("+at.String()+")")
		if err != nil {
			return nil, err
		}
		types[i], nodes[i] = at, an
		if an.lit[0] == idMonostate && mono < 0 {
			mono = i
		}
		lit = append(lit, an.lit...)
		for w := range n.min {
			if i == 0 || 1+an.min[w] < n.min[w] {
				n.min[w] = 1 + an.min[w]
			}
		}
	}
	if len(alts) == 1 && mono == 0 {
		return nil, b.unsupported(path, "Variant %v holds only a monostate, which struct_pack refuses", t)
	}
	n.lit = append(lit, idEnd)
	n.enc = func(e *encoder, v reflect.Value) {
		f := v.Field(holder)
		idx := -1
		var val reflect.Value
		if f.IsNil() {
			idx = mono
			if idx >= 0 {
				val = reflect.Zero(types[idx])
			}
		} else {
			val = f.Elem()
			dt := val.Type()
			for i, at := range types {
				if at == dt {
					idx = i
					break
				}
			}
		}
		if idx < 0 {
			if f.IsNil() {
				e.fail(fmt.Errorf("variant %v holds nothing and has no monostate alternative", t))
			} else {
				e.fail(fmt.Errorf("variant %v holds %v, which is not one of its alternatives", t, val.Type()))
			}
			return
		}
		e.buf = append(e.buf, byte(idx))
		nodes[idx].enc(e, val)
	}
	n.dec = func(d *decoder, v reflect.Value) error {
		b, err := d.take(1, t)
		if err != nil {
			return err
		}
		idx := int(b[0])
		if idx >= len(types) {
			d.off--
			return d.errorf(t, ErrMalformed, "variant index %d out of range, %v has %d alternatives", idx, t, len(types))
		}
		nv := reflect.New(types[idx]).Elem()
		if err := nodes[idx].dec(d, nv); err != nil {
			return withPath(err, ".("+types[idx].String()+")")
		}
		v.Field(holder).Set(nv)
		return nil
	}
	return n, nil
}

type structField struct {
	index int
	name  string
	node  *node
	pad   int // trivial structs: zero bytes before this member
}

func (b *builder) structNode(t reflect.Type, path string) (*node, error) {
	var fields []structField
	var skipped []int
	aggregate := false
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Type == aggregateType {
			aggregate = true
			continue
		}
		if f.Tag.Get("structpack") == "-" {
			if f.IsExported() { // reflection cannot set the others
				skipped = append(skipped, i)
			}
			continue
		}
		if !f.IsExported() {
			return nil, b.unsupported(path+"."+f.Name, "unexported field of %v: export it or tag it `structpack:\"-\"`", t)
		}
		fn, err := b.build(f.Type, path+"."+f.Name)
		if err != nil {
			return nil, err
		}
		fields = append(fields, structField{index: i, name: f.Name, node: fn})
	}
	if len(fields) == 0 {
		return nil, b.unsupported(path, "struct %v has no members to serialize", t)
	}
	lit := []byte{idStruct}
	trivial := aggregate
	for _, f := range fields {
		lit = append(lit, f.node.lit...)
		trivial = trivial && f.node.trivial
	}
	n := &node{typ: t, trivial: trivial}
	tail := 0
	if trivial {
		off, al := 0, 1
		for i := range fields {
			fn := fields[i].node
			fields[i].pad = alignUp(off, fn.calign) - off
			off += fields[i].pad + fn.csize
			al = max(al, fn.calign)
		}
		n.csize, n.calign = alignUp(off, al), al
		tail = n.csize - off
		// get_types_literal: pack alignment, then alignment. Both are the
		// largest member alignment without #pragma pack or an override.
		lit = appendSizeLiteral(lit, uint64(al))
		lit = appendSizeLiteral(lit, uint64(al))
		n.min = fixedMin(n.csize)
	} else {
		for _, f := range fields {
			for w := range n.min {
				n.min[w] += f.node.min[w]
			}
		}
	}
	n.lit = append(lit, idEnd)
	clearSkipped := func(v reflect.Value) {
		for _, i := range skipped {
			v.Field(i).SetZero()
		}
	}
	if trivial {
		n.enc = func(e *encoder, v reflect.Value) {
			for _, f := range fields {
				e.zeros(f.pad)
				f.node.encImg(e, v.Field(f.index))
			}
			e.zeros(tail)
		}
		n.dec = func(d *decoder, v reflect.Value) error {
			if d.left() < n.csize {
				return d.errorf(t, ErrTruncated, "need %d bytes, %d left", n.csize, d.left())
			}
			for _, f := range fields {
				d.off += f.pad // padding is not data; C++ copies whatever it holds
				if err := f.node.decImg(d, v.Field(f.index)); err != nil {
					return withPath(err, "."+f.name)
				}
			}
			d.off += tail
			clearSkipped(v)
			return nil
		}
		return n, nil
	}
	n.enc = func(e *encoder, v reflect.Value) {
		for _, f := range fields {
			f.node.enc(e, v.Field(f.index))
		}
	}
	n.dec = func(d *decoder, v reflect.Value) error {
		for _, f := range fields {
			if err := f.node.dec(d, v.Field(f.index)); err != nil {
				return withPath(err, "."+f.name)
			}
		}
		clearSkipped(v)
		return nil
	}
	return n, nil
}
