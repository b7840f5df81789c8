package store

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// MaxRequestElements bounds the elements of all repeated fields of one
// request together (CheckElements): a batch holds at most MaxBatchSize
// items, each with a few slices.
const MaxRequestElements = 64 * MaxBatchSize

// CheckElements refuses b, the wire form of a message md, when its
// repeated and map fields, nested messages' included, hold more than
// limit elements together; it reads b without decoding it. A repeated
// field's element can be 2 bytes on the wire (an empty string) and 16 in
// Go, a packed varint 1 byte and 8, so a 60 MB request of 30 million
// empty keys decoded into 2 GB before the batch limit refused it. Bytes
// that are no valid message are left for the decoder to report.
func CheckElements(b []byte, md protoreflect.MessageDescriptor, limit int) error {
	if len(b) <= limit {
		// Every element takes at least a byte on the wire (a packed
		// varint), so a body this short cannot hold more: every
		// ordinary request is let through without a second parse.
		return nil
	}
	n := 0
	if err := countElements(b, md, &n, limit, 0); err != nil {
		return Errorf(InvalidParams, "%s: %v", md.Name(), err)
	}
	return nil
}

func countElements(b []byte, md protoreflect.MessageDescriptor, n *int, limit, depth int) error {
	if depth > 64 {
		return nil // the decoder refuses deeper nesting itself
	}
	for len(b) > 0 {
		num, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return nil
		}
		b = b[l:]
		l = protowire.ConsumeFieldValue(num, typ, b)
		if l < 0 {
			return nil
		}
		val := b[:l]
		b = b[l:]
		fd := md.Fields().ByNumber(num)
		if fd == nil {
			continue
		}
		if fd.IsList() || fd.IsMap() {
			*n += elementsIn(fd, typ, val)
			if *n > limit {
				return fmt.Errorf("more than %d elements in repeated fields (at %s)", limit, fd.Name())
			}
		}
		if typ == protowire.BytesType && (fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind) {
			inner, _ := protowire.ConsumeBytes(val)
			if err := countElements(inner, fd.Message(), n, limit, depth+1); err != nil {
				return err
			}
		}
	}
	return nil
}

// elementsIn counts the elements one occurrence of list or map field fd
// carries: one, or a packed run's.
func elementsIn(fd protoreflect.FieldDescriptor, typ protowire.Type, val []byte) int {
	if typ != protowire.BytesType {
		return 1
	}
	switch fd.Kind() {
	case protoreflect.StringKind, protoreflect.BytesKind, protoreflect.MessageKind, protoreflect.GroupKind:
		return 1
	case protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind, protoreflect.FloatKind:
		p, _ := protowire.ConsumeBytes(val)
		return max(len(p)/4, 1)
	case protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind, protoreflect.DoubleKind:
		p, _ := protowire.ConsumeBytes(val)
		return max(len(p)/8, 1)
	}
	// Packed varints: one ends at each byte below 0x80.
	p, _ := protowire.ConsumeBytes(val)
	c := 0
	for _, x := range p {
		if x < 0x80 {
			c++
		}
	}
	return max(c, 1)
}
