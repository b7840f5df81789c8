package structpack

import (
	"errors"
	"testing"
)

// TestArgsDecoderMaxElems: the elements of all vectors and maps of a
// message count together against MaxElems, refused before they are made;
// strings and byte vectors do not count; 0 is no limit.
func TestArgsDecoderMaxElems(t *testing.T) {
	keys := make([]string, 10)
	nested := [][]uint64{{1, 2}, {3}}
	m := map[string]uint64{"a": 1, "b": 2}
	body, err := MarshalArgs(keys, nested, m, "a string of some bytes", []byte("bytes too"))
	if err != nil {
		t.Fatal(err)
	}
	// 10 keys + 2 inner vectors + 3 numbers + 2 map entries.
	const total = 10 + 2 + 3 + 2
	decode := func(max int) error {
		var k []string
		var n [][]uint64
		var mm map[string]uint64
		var s string
		var b []byte
		return ArgsDecoder{MaxElems: max}.UnmarshalArgs(body, &k, &n, &mm, &s, &b)
	}
	for _, max := range []int{0, total, total + 1} {
		if err := decode(max); err != nil {
			t.Errorf("MaxElems %d: %v", max, err)
		}
	}
	for _, max := range []int{1, 9, total - 1} {
		err := decode(max)
		var de *DecodeError
		if !errors.Is(err, ErrTooManyElements) || !errors.As(err, &de) {
			t.Errorf("MaxElems %d: %v; want ErrTooManyElements", max, err)
		}
	}
	// Refused before they are made: a vector of a million empty strings
	// (4 MB) allocates next to nothing.
	many, err := MarshalArgs(make([]string, 1<<20))
	if err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(5, func() {
		var k []string
		if err := (ArgsDecoder{MaxElems: 1000}).UnmarshalArgs(many, &k); !errors.Is(err, ErrTooManyElements) {
			t.Fatalf("a million keys against 1000: %v", err)
		}
		if k != nil {
			t.Fatalf("made %d keys", len(k))
		}
	})
	if allocs > 10 {
		t.Errorf("%v allocations refusing a million keys", allocs)
	}
}
