package structpack_test

import (
	"bytes"
	"errors"
	"reflect"
	"testing"

	"github.com/kvcache-ops/mc/pkg/structpack"
)

// fuzzTargets are the Go types fuzzed inputs are decoded as: every
// captured call's arguments and result, and a type using every kind.
func fuzzTargets() []func() []any {
	var out []func() []any
	for _, name := range []string{"ServiceReady", "GetStorageConfig", "MountSegment", "ReMountSegment", "FetchTasks",
		"Ping", "PutStart", "PutEnd", "GetReplicaList", "ExistKey", "Remove"} {
		c := mooncakeCalls[name]
		if len(c.args()) > 0 {
			out = append(out, c.args)
		}
		out = append(out, func() []any { return []any{c.resp()} })
	}
	return append(out, func() []any { return []any{new(kitchenSink)} })
}

// FuzzUnmarshal feeds arbitrary bytes to every target type. Decoding must
// fail with a typed error or succeed; what succeeds must re-encode, with
// or without literal, to bytes that decode to the same value.
func FuzzUnmarshal(f *testing.F) {
	for _, c := range loadCaptures(f) {
		for _, s := range []string{c.RequestBody, c.ResponseBody} {
			if b := unhex(f, s); len(b) > 0 {
				f.Add(b)
			}
		}
	}
	sink, err := structpack.Marshal(sampleSink())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(sink)
	targets := fuzzTargets()
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, fresh := range targets {
			ps := fresh()
			err := structpack.UnmarshalArgs(data, ps...)
			if err != nil {
				var de *structpack.DecodeError
				var hm *structpack.HashMismatchError
				if !errors.As(err, &de) && !errors.As(err, &hm) {
					t.Fatalf("untyped decode error %T: %v", err, err)
				}
				if de != nil && !errors.Is(err, structpack.ErrTruncated) && !errors.Is(err, structpack.ErrMalformed) {
					t.Fatalf("DecodeError without a sentinel: %v", err)
				}
				continue
			}
			vals := make([]any, len(ps))
			for i, p := range ps {
				vals[i] = reflect.ValueOf(p).Elem().Interface()
			}
			for _, lit := range []bool{true, false} {
				first, err := structpack.AppendMarshalArgs(nil, vals, structpack.WithLiteral(lit))
				if err != nil {
					t.Fatalf("re-encode %T: %v", ps[0], err)
				}
				again := fresh()
				if err := structpack.UnmarshalArgs(first, again...); err != nil {
					t.Fatalf("decode of own encoding %x: %v", first, err)
				}
				vals2 := make([]any, len(again))
				for i, p := range again {
					vals2[i] = reflect.ValueOf(p).Elem().Interface()
				}
				second, err := structpack.AppendMarshalArgs(nil, vals2, structpack.WithLiteral(lit))
				if err != nil || !bytes.Equal(first, second) {
					t.Fatalf("encoding not stable:\n%x\n%x (%v)", first, second, err)
				}
			}
		}
	})
}

// FuzzDescribeLiteral: any bytes, such as a literal a peer embeds, render
// without a panic and within a bounded length.
func FuzzDescribeLiteral(f *testing.F) {
	for _, c := range loadCaptures(f) {
		for _, s := range []string{c.RequestBody, c.ResponseBody} {
			b := unhex(f, s)
			if len(b) > 5 {
				if end := bytes.IndexByte(b[5:], 0); end >= 0 {
					f.Add(b[5 : 5+end])
				}
			}
		}
	}
	f.Fuzz(func(t *testing.T, lit []byte) {
		if s := structpack.DescribeLiteral(lit); len(s) > 2100+2*len(lit)+20 {
			t.Fatalf("description of %d bytes is %d long", len(lit), len(s))
		}
	})
}
