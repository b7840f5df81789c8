package coll

import (
	"fmt"
	"unsafe"
)

// DType is an element type collectives reduce.
type DType uint8

// Element types.
const (
	Int32 DType = iota + 1
	Int64
	Float32
	Float64
)

// Size is the element size in bytes.
func (d DType) Size() int {
	switch d {
	case Int32, Float32:
		return 4
	case Int64, Float64:
		return 8
	}
	return 0
}

func (d DType) String() string {
	switch d {
	case Int32:
		return "int32"
	case Int64:
		return "int64"
	case Float32:
		return "float32"
	case Float64:
		return "float64"
	}
	return fmt.Sprintf("DType(%d)", uint8(d))
}

// ReduceOp combines elements of different ranks.
type ReduceOp uint8

// Reduction operators.
const (
	Sum ReduceOp = iota
	Max
	Min
	Product
)

func (o ReduceOp) String() string {
	switch o {
	case Sum:
		return "sum"
	case Max:
		return "max"
	case Min:
		return "min"
	case Product:
		return "product"
	}
	return fmt.Sprintf("ReduceOp(%d)", uint8(o))
}

// Elem is the set of Go element types the typed collectives accept.
type Elem interface {
	int32 | int64 | float32 | float64
}

// DTypeOf returns the DType of T.
func DTypeOf[T Elem]() DType {
	var z T
	switch any(z).(type) {
	case int32:
		return Int32
	case int64:
		return Int64
	case float32:
		return Float32
	default:
		return Float64
	}
}

// asBytes views a typed slice as bytes (no copy).
func asBytes[T Elem](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*int(unsafe.Sizeof(s[0])))
}

// typed views b as elements of T; len(b) is a multiple of T's size and b
// is aligned for T (registered memory is page aligned and every offset
// the collectives use is a multiple of the element size).
func typed[T Elem](b []byte) []T {
	var z T
	n := len(b) / int(unsafe.Sizeof(z))
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*T)(unsafe.Pointer(&b[0])), n)
}

// reduceInto sets dst[i] = dst[i] op src[i].
func reduceInto(dt DType, op ReduceOp, dst, src []byte) {
	switch dt {
	case Int32:
		reduceT(op, typed[int32](dst), typed[int32](src))
	case Int64:
		reduceT(op, typed[int64](dst), typed[int64](src))
	case Float32:
		reduceT(op, typed[float32](dst), typed[float32](src))
	case Float64:
		reduceT(op, typed[float64](dst), typed[float64](src))
	}
}

// reduceT keeps the operator switch outside the loops so each loop is a
// plain element-wise kernel the compiler can keep tight.
func reduceT[T Elem](op ReduceOp, dst, src []T) {
	src = src[:len(dst)]
	switch op {
	case Sum:
		// Unrolled: the bulk of an all-reduce's own CPU time.
		i := 0
		for ; i+4 <= len(dst); i += 4 {
			d, s := dst[i:i+4:i+4], src[i:i+4:i+4]
			d[0] += s[0]
			d[1] += s[1]
			d[2] += s[2]
			d[3] += s[3]
		}
		for ; i < len(dst); i++ {
			dst[i] += src[i]
		}
	case Product:
		for i := range dst {
			dst[i] *= src[i]
		}
	case Max:
		for i := range dst {
			if src[i] > dst[i] {
				dst[i] = src[i]
			}
		}
	case Min:
		for i := range dst {
			if src[i] < dst[i] {
				dst[i] = src[i]
			}
		}
	}
}

func checkTypes(dt DType, op ReduceOp) error {
	if dt.Size() == 0 {
		return fmt.Errorf("element type %v: want int32, int64, float32 or float64", dt)
	}
	if op > Product {
		return fmt.Errorf("reduce op %v: want sum, max, min or product", op)
	}
	return nil
}
