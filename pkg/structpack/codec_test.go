package structpack_test

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/kvcache-ops/mc/pkg/structpack"
)

type plainPair struct { // a YLT_REFL struct or std::tuple: never memcpy'd
	A uint32
	B uint16
}

type aggArray struct {
	_ structpack.Aggregate
	A uint32
	B [2]uint16
}

type aggNested struct {
	_ structpack.Aggregate
	P structpack.Pair[uint8, uint8]
	X uint32
}

type aggWithString struct { // an aggregate with a string is not memcpy'd
	_ structpack.Aggregate
	A uint32
	S string
}

type aggMonostate struct {
	_ structpack.Aggregate
	A uint8
	M structpack.Monostate
	B uint16
}

type plainMonostate struct {
	A uint8
	M structpack.Monostate
	B uint16
}

type ErrOrText struct{ Value any }

func (ErrOrText) VariantAlternatives() []any {
	return []any{structpack.Monostate{}, int32(0), ""}
}

func TestLiteralRules(t *testing.T) {
	cases := []struct {
		typ  reflect.Type
		want string
	}{
		{reflect.TypeFor[int8](), "05"},
		{reflect.TypeFor[uint8](), "06"},
		{reflect.TypeFor[int16](), "07"},
		{reflect.TypeFor[uint16](), "08"},
		{reflect.TypeFor[int32](), "01"},
		{reflect.TypeFor[uint32](), "02"},
		{reflect.TypeFor[int64](), "03"},
		{reflect.TypeFor[uint64](), "04"},
		{reflect.TypeFor[int](), "03"},
		{reflect.TypeFor[uint](), "04"},
		{reflect.TypeFor[uintptr](), "04"},
		{reflect.TypeFor[ErrorCode](), "01"}, // an enum: its underlying type
		{reflect.TypeFor[bool](), "0b"},
		{reflect.TypeFor[float32](), "11"},
		{reflect.TypeFor[float64](), "12"},
		{reflect.TypeFor[string](), "800c"},
		{reflect.TypeFor[[]byte](), "8406"},
		{reflect.TypeFor[[]string](), "84800c"},
		{reflect.TypeFor[[3]uint16](), "810884"},        // size 3 -> 3+129
		{reflect.TypeFor[[127]uint8](), "81060182"},     // 127 = 0*127^0 + 1*127: digits 0+1, 1+129
		{reflect.TypeFor[[200]uint8](), "81064a82"},     // 200 = 73 + 1*127
		{reflect.TypeFor[[16129]uint8](), "8106010182"}, // 127^2
		{reflect.TypeFor[map[string]uint64](), "82800c04"},
		{reflect.TypeFor[structpack.Optional[int32]](), "8501"},
		{reflect.TypeFor[structpack.Expected[string, ErrorCode]](), "87800c01"},
		{reflect.TypeFor[structpack.ExpectedVoid[ErrorCode]](), "87fa01"},
		{reflect.TypeFor[structpack.Monostate](), "fa"},
		{reflect.TypeFor[struct{}](), "fa"},
		{reflect.TypeFor[structpack.Pair[uint64, uint64]](), "fd04048989ff"},
		{reflect.TypeFor[structpack.Pair[int32, int64]](), "fd01038989ff"},
		{reflect.TypeFor[structpack.Pair[uint8, uint16]](), "fd06088383ff"},
		{reflect.TypeFor[structpack.Pair[uint8, uint8]](), "fd06068282ff"},
		{reflect.TypeFor[structpack.Pair[string, int32]](), "fd800c01ff"},
		{reflect.TypeFor[plainPair](), "fd0208ff"},
		{reflect.TypeFor[aggArray](), "fd0281088385" + "85ff"},
		{reflect.TypeFor[aggNested](), "fdfd06068282ff028585ff"},
		{reflect.TypeFor[aggWithString](), "fd02800cff"},
		{reflect.TypeFor[aggMonostate](), "fd06fa088383ff"},
		{reflect.TypeFor[ErrOrText](), "86fa01800cff"},
		{reflect.TypeFor[structpack.Optional[UUID]](), "85fd04048989ff"},
		{reflect.TypeFor[*Segment](), "fdfd04048989ff800c0404800c800c800cff"}, // a top-level pointer stands for its target
	}
	for _, c := range cases {
		got, err := structpack.Literal(c.typ)
		if err != nil {
			t.Errorf("Literal(%v): %v", c.typ, err)
			continue
		}
		if hex.EncodeToString(got) != c.want {
			t.Errorf("Literal(%v) = %x, want %s", c.typ, got, c.want)
		}
	}
}

func TestHashOfPingRequest(t *testing.T) {
	// From the spec: Ping's request literal fd04048989ff hashes to 0x3c6d83e0.
	h, err := structpack.Hash(reflect.TypeFor[UUID]())
	if err != nil {
		t.Fatal(err)
	}
	if h != 0x3c6d83e0 {
		t.Fatalf("Hash(UUID) = %#08x, want 0x3c6d83e0", h)
	}
	b, err := structpack.Marshal(clientID)
	if err != nil {
		t.Fatal(err)
	}
	if want := "e1836d3c04fd04048989ff000ed20d27d1f640fb955b78ca354b5f28"; hex.EncodeToString(b) != want {
		t.Fatalf("Marshal(client id) = %x, want %s", b, want)
	}
}

// payload marshals v without a literal and strips the four-byte head,
// checking that no metainfo was needed.
func payload(t *testing.T, v any) []byte {
	t.Helper()
	b, err := structpack.Marshal(v, structpack.WithLiteral(false))
	if err != nil {
		t.Fatal(err)
	}
	if b[0]&1 != 0 {
		t.Fatalf("Marshal(%T) set the metainfo flag: %x", v, b)
	}
	return b[4:]
}

func TestTrivialLayout(t *testing.T) {
	cases := []struct {
		name string
		v    any
		want string
	}{
		{"padding between", structpack.Pair[int32, int64]{First: 1, Second: 2}, "01000000" + "00000000" + "0200000000000000"},
		{"tail padding", structpack.Pair[int64, int32]{First: 1, Second: 2}, "0100000000000000" + "02000000" + "00000000"},
		{"YLT_REFL struct has none", PingResponse{ViewVersionID: 1, ClientStatus: 2}, "0100000000000000" + "02000000"},
		{"monostate takes a byte in a memcpy'd struct", aggMonostate{A: 1, B: 2}, "01" + "00" + "0200"},
		{"and none in a reflected one", plainMonostate{A: 1, B: 2}, "01" + "0200"},
		{"vector of monostate is memcpy'd", []structpack.Monostate{{}, {}, {}}, "03" + "000000"},
		{"vector of trivial structs keeps their padding", []structpack.Pair[uint16, uint8]{{First: 1, Second: 2}}, "01" + "0100" + "02" + "00"},
		{"array of trivial structs", [2]structpack.Pair[uint8, uint16]{{First: 1, Second: 2}, {First: 3, Second: 4}}, "01000200" + "03000400"},
		{"nested aggregate", aggNested{P: structpack.Pair[uint8, uint8]{First: 1, Second: 2}, X: 3}, "0102" + "0000" + "03000000"},
	}
	for _, c := range cases {
		if got := hex.EncodeToString(payload(t, c.v)); got != c.want {
			t.Errorf("%s: payload of %T = %s, want %s", c.name, c.v, got, c.want)
		}
	}

	// Padding is not data: C++ copies whatever the bytes hold.
	b, err := structpack.Marshal(structpack.Pair[int32, int64]{First: -1, Second: 7}, structpack.WithLiteral(false))
	if err != nil {
		t.Fatal(err)
	}
	copy(b[4+4:], []byte{0xaa, 0xbb, 0xcc, 0xdd})
	var p structpack.Pair[int32, int64]
	if err := structpack.Unmarshal(b, &p); err != nil {
		t.Fatal(err)
	}
	if p.First != -1 || p.Second != 7 {
		t.Fatalf("decoded %+v with garbage padding", p)
	}
}

func TestContainerWidth(t *testing.T) {
	cases := []struct {
		name     string
		v        any
		literal  bool
		meta     int // -1: no metainfo byte
		lenWidth int
	}{
		{"255 bytes fit one byte", strings.Repeat("x", 255), false, -1, 1},
		{"256 need two", strings.Repeat("x", 256), false, 0x08, 2},
		{"with literal", strings.Repeat("x", 256), true, 0x0c, 2},
		{"literal, short", "x", true, 0x04, 1},
		{"65536 need four", make([]byte, 1<<16), false, 0x10, 4},
	}
	for _, c := range cases {
		b, err := structpack.Marshal(c.v, structpack.WithLiteral(c.literal))
		if err != nil {
			t.Fatal(err)
		}
		head := binary.LittleEndian.Uint32(b)
		off := 4
		if c.meta < 0 {
			if head&1 != 0 {
				t.Errorf("%s: flag set in %#x", c.name, head)
			}
		} else {
			if head&1 == 0 || int(b[4]) != c.meta {
				t.Errorf("%s: head %#x meta %#02x, want flag and %#02x", c.name, head, b[4], c.meta)
			}
			off = 5
			if c.literal {
				off += bytes.IndexByte(b[5:], 0) + 1
			}
		}
		n := reflect.ValueOf(c.v).Len()
		var got int
		switch c.lenWidth {
		case 1:
			got = int(b[off])
		case 2:
			got = int(binary.LittleEndian.Uint16(b[off:]))
		case 4:
			got = int(binary.LittleEndian.Uint32(b[off:]))
		}
		if got != n || len(b) != off+c.lenWidth+n {
			t.Errorf("%s: length %d in %d-byte width, message %d bytes; want %d", c.name, got, c.lenWidth, len(b), n)
		}
		back := reflect.New(reflect.TypeOf(c.v))
		if err := structpack.Unmarshal(b, back.Interface()); err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
	}

	// The width is one for the whole message: a short string next to a
	// long vector gets two-byte lengths too.
	type mixed struct {
		Short string
		Long  []uint8
	}
	b, err := structpack.Marshal(mixed{Short: "ab", Long: make([]uint8, 300)}, structpack.WithLiteral(false))
	if err != nil {
		t.Fatal(err)
	}
	if b[4] != 0x08 || binary.LittleEndian.Uint16(b[5:]) != 2 || string(b[7:9]) != "ab" || binary.LittleEndian.Uint16(b[9:]) != 300 {
		t.Fatalf("mixed widths: % x", b[:12])
	}

	// Decoding honours any width the metainfo names, eight bytes included.
	h, _ := structpack.Hash(reflect.TypeFor[string]())
	msg := binary.LittleEndian.AppendUint32(nil, h|1)
	msg = append(msg, 0x18)
	msg = binary.LittleEndian.AppendUint64(msg, 3)
	msg = append(msg, "abc"...)
	var s string
	if err := structpack.Unmarshal(msg, &s); err != nil || s != "abc" {
		t.Fatalf("8-byte lengths: %q, %v", s, err)
	}
}

type kitchenSink struct {
	I8      int8
	I16     int16
	I32     int32
	I64     int64
	I       int
	U8      uint8
	U16     uint16
	U32     uint32
	U64     uint64
	U       uint
	Ptr     uintptr
	B       bool
	F32     float32
	F64     float64
	S       string
	Bytes   []byte
	Ints    []int32
	Arr     [3]int16
	Strs    [2]string
	Map     map[string][]uint64
	IntMap  map[int64]string
	PairMap map[structpack.Pair[uint32, uint32]]uint32
	Opt     structpack.Optional[[]string]
	NoOpt   structpack.Optional[Segment]
	Exp     structpack.Expected[map[string]int32, string]
	ExpErr  structpack.Expected[uint8, ErrorCode]
	Void    structpack.ExpectedVoid[ErrorCode]
	Var     []ErrOrText
	Desc    []ReplicaDescriptor
	Nested  [2]structpack.Pair[string, structpack.Optional[bool]]
	Empty   structpack.Monostate
	Skipped string `structpack:"-"`
	private int    `structpack:"-"`
}

func sampleSink() kitchenSink {
	return kitchenSink{
		I8: -8, I16: -1600, I32: -320000, I64: math.MinInt64, I: -42,
		U8: 200, U16: 60000, U32: 4000000000, U64: math.MaxUint64, U: 7, Ptr: 0x7fbea6000000,
		B: true, F32: 1.5, F64: -math.Pi, S: "héllo",
		Bytes:   []byte{0, 1, 2, 255},
		Ints:    []int32{-1, 0, 1},
		Arr:     [3]int16{-3, 0, 3},
		Strs:    [2]string{"a", ""},
		Map:     map[string][]uint64{"b": {2}, "a": {1, 1}, "c": nil},
		IntMap:  map[int64]string{-5: "neg", 5: "pos", 0: "zero"},
		PairMap: map[structpack.Pair[uint32, uint32]]uint32{{First: 2, Second: 1}: 21, {First: 1, Second: 2}: 12},
		Opt:     structpack.Some([]string{"x", "y"}),
		Exp:     structpack.Expected[map[string]int32, string]{Value: map[string]int32{"k": -1}},
		ExpErr:  structpack.Expected[uint8, ErrorCode]{Error: -704, HasError: true},
		Var:     []ErrOrText{{Value: structpack.Monostate{}}, {Value: int32(-9)}, {Value: "text"}},
		Desc: []ReplicaDescriptor{
			{ID: 1, Descriptor: DescriptorVariant{Value: MemoryDescriptor{BufferDescriptor{Size: 4096, BufferAddress: 0x1000, Protocol: "tcp", TransportEndpoint: "h:1"}}}, Status: 3},
			{ID: 2, Descriptor: DescriptorVariant{Value: DiskDescriptor{FilePath: "/d/f", ObjectSize: 9}}, Status: 3},
			{ID: 3, Descriptor: DescriptorVariant{Value: LocalDiskDescriptor{ClientID: clientID, ObjectSize: 10, TransportEndpoint: "h:2"}}},
			{ID: 4, Descriptor: DescriptorVariant{Value: DistributedFSDescriptor{FilePath: "/dfs", Offset: 1, ObjectSize: 2, AlignedSize: 4096, ShardIdx: -1}}},
			{ID: 5, Descriptor: DescriptorVariant{Value: NoFDescriptor{}}},
		},
		Nested: [2]structpack.Pair[string, structpack.Optional[bool]]{{First: "t", Second: structpack.Some(true)}, {First: "n"}},
	}
}

func TestRoundTripAllKinds(t *testing.T) {
	in := sampleSink()
	for _, lit := range []bool{true, false} {
		b, err := structpack.Marshal(in, structpack.WithLiteral(lit))
		if err != nil {
			t.Fatal(err)
		}
		var out kitchenSink
		out.Skipped, out.private = "stale", 3
		if err := structpack.Unmarshal(b, &out); err != nil {
			t.Fatalf("literal %v: %v", lit, err)
		}
		if out.private != 3 {
			t.Fatalf("an unexported skipped field was touched: %d", out.private)
		}
		out.private = 0
		if !reflect.DeepEqual(in, out) {
			t.Fatalf("literal %v: round trip\n%+v\n%+v", lit, in, out)
		}
		again, err := structpack.Marshal(out, structpack.WithLiteral(lit))
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("literal %v: re-encoding differs: %v", lit, err)
		}
	}
}

func TestSkippedFieldNotEncoded(t *testing.T) {
	a, b := sampleSink(), sampleSink()
	b.Skipped = "anything"
	ea, _ := structpack.Marshal(a)
	eb, _ := structpack.Marshal(b)
	if !bytes.Equal(ea, eb) {
		t.Fatal("a field tagged structpack:\"-\" changed the encoding")
	}
}

func TestMapOrder(t *testing.T) {
	m := map[string]int8{"b": 2, "a": 1, "c": 3, "": 0}
	want := "04" + "00" + "00" + "0161" + "01" + "0162" + "02" + "0163" + "03"
	for range 20 { // map iteration order varies between runs; the encoding must not
		if got := hex.EncodeToString(payload(t, m)); got != want {
			t.Fatalf("map payload %s, want %s", got, want)
		}
	}
	neg := map[int32]int32{3: 0, -2: 0, 0: 0}
	if got := hex.EncodeToString(payload(t, neg)); got != "03"+"feffffff00000000"+"0000000000000000"+"0300000000000000" {
		t.Fatalf("int map payload %s, want ascending -2, 0, 3", got)
	}
}

func TestVariant(t *testing.T) {
	for i, v := range []ErrOrText{{Value: structpack.Monostate{}}, {Value: int32(5)}, {Value: "s"}} {
		p := payload(t, v)
		if int(p[0]) != i {
			t.Errorf("%v encoded with index %d, want %d", v.Value, p[0], i)
		}
	}
	// A nil holder is the monostate alternative, if there is one.
	if p := payload(t, ErrOrText{}); !bytes.Equal(p, []byte{0}) {
		t.Errorf("nil variant payload %x, want 00", p)
	}
	var back ErrOrText
	b, _ := structpack.Marshal(ErrOrText{})
	if err := structpack.Unmarshal(b, &back); err != nil || back.Value != (structpack.Monostate{}) {
		t.Errorf("nil variant decoded as %#v, %v", back.Value, err)
	}
	if _, err := structpack.Marshal(ErrOrText{Value: 3.5}); err == nil || !strings.Contains(err.Error(), "float64") {
		t.Errorf("variant holding a foreign type: %v", err)
	}
	if _, err := structpack.Marshal(DescriptorVariant{}); err == nil || !strings.Contains(err.Error(), "no monostate") {
		t.Errorf("nil variant without monostate: %v", err)
	}
}

func TestMarshalArgsIsTuple(t *testing.T) {
	seg := Segment{ID: clientID, Name: "n", Base: 1, Size: 2, Protocol: "tcp"}
	args, err := structpack.MarshalArgs(seg, clientID)
	if err != nil {
		t.Fatal(err)
	}
	tuple, err := structpack.Marshal(struct {
		S Segment
		C UUID
	}{seg, clientID})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(args, tuple) {
		t.Fatalf("MarshalArgs %x\nstruct      %x", args, tuple)
	}
	single, _ := structpack.MarshalArgs(clientID)
	bare, _ := structpack.Marshal(clientID)
	if !bytes.Equal(single, bare) {
		t.Fatal("a lone argument must be packed as itself, not as a one-element tuple")
	}
	var s2 Segment
	var c2 UUID
	if err := structpack.UnmarshalArgs(args, &s2, &c2); err != nil || s2 != seg || c2 != clientID {
		t.Fatalf("UnmarshalArgs: %+v %v %v", s2, c2, err)
	}
	if err := structpack.UnmarshalArgs([]byte{1}); !errors.Is(err, structpack.ErrMalformed) {
		t.Fatalf("bytes for a call without arguments: %v", err)
	}
}

func TestUnmarshalReusesWithoutStaleData(t *testing.T) {
	big := []ReplicaDescriptor{
		{ID: 9, Descriptor: DescriptorVariant{Value: DiskDescriptor{FilePath: "old"}}, Status: 1},
		{ID: 8, Descriptor: DescriptorVariant{Value: NoFDescriptor{}}},
		{ID: 7, Descriptor: DescriptorVariant{Value: NoFDescriptor{}}},
	}
	small := []ReplicaDescriptor{{ID: 1, Descriptor: DescriptorVariant{Value: MemoryDescriptor{}}}}
	b, _ := structpack.Marshal(small)
	dst := big
	if err := structpack.Unmarshal(b, &dst); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(dst, small) || &dst[0] != &big[0] {
		t.Fatalf("decoded %+v (reused backing: %v)", dst, &dst[0] == &big[0])
	}
	opt := structpack.Some(Segment{Name: "stale"})
	nb, _ := structpack.Marshal(structpack.Optional[Segment]{})
	if err := structpack.Unmarshal(nb, &opt); err != nil || opt != (structpack.Optional[Segment]{}) {
		t.Fatalf("empty optional left %+v, %v", opt, err)
	}
}

func TestConcurrentPlans(t *testing.T) {
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 50 {
				var v any
				switch (i + j) % 3 {
				case 0:
					v = sampleSink()
				case 1:
					v = []Segment{{Name: "x"}}
				default:
					v = map[string]structpack.Optional[UUID]{"k": structpack.Some(clientID)}
				}
				b, err := structpack.Marshal(v)
				if err != nil {
					t.Error(err)
					return
				}
				out := reflect.New(reflect.TypeOf(v))
				if err := structpack.Unmarshal(b, out.Interface()); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

type recursive struct{ Kids []recursive }

type withPointer struct{ P *int }

type withIface struct{ X any }

type withUnexported struct {
	A int32
	b int32
}

type onlySkipped struct {
	A int32 `structpack:"-"`
}

type noAlts struct{ V any }

func (noAlts) VariantAlternatives() []any { return nil }

type dupAlts struct{ V any }

func (dupAlts) VariantAlternatives() []any { return []any{int32(0), int32(1)} }

type onlyMono struct{ V any }

func (onlyMono) VariantAlternatives() []any { return []any{structpack.Monostate{}} }

type panicky struct{ V any }

func (panicky) VariantAlternatives() []any { panic("boom") }

type zeroSized struct{ M structpack.Monostate }

func TestUnsupportedTypes(t *testing.T) {
	_ = withUnexported{b: 0}
	cases := []struct {
		typ  reflect.Type
		want string
	}{
		{reflect.TypeFor[recursive](), "recursive"},
		{reflect.TypeFor[withPointer](), "pointer"},
		{reflect.TypeFor[withIface](), "interface"},
		{reflect.TypeFor[withUnexported](), "unexported"},
		{reflect.TypeFor[onlySkipped](), "no members"},
		{reflect.TypeFor[[0]int32](), "size 0"},
		{reflect.TypeFor[chan int](), "no struct_pack counterpart"},
		{reflect.TypeFor[complex128](), "no struct_pack counterpart"},
		{reflect.TypeFor[map[int32]uint64](), "padding"},
		{reflect.TypeFor[noAlts](), "0 alternatives"},
		{reflect.TypeFor[dupAlts](), "twice"},
		{reflect.TypeFor[onlyMono](), "only a monostate"},
		{reflect.TypeFor[panicky](), "panicked"},
		{reflect.TypeFor[[]zeroSized](), "no bytes"},
	}
	for _, c := range cases {
		_, err := structpack.Literal(c.typ)
		var ute *structpack.UnsupportedTypeError
		if !errors.As(err, &ute) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Literal(%v) error %v, want an UnsupportedTypeError mentioning %q", c.typ, err, c.want)
		}
	}
	if _, err := structpack.Marshal(nil); err == nil {
		t.Error("Marshal(nil) succeeded")
	}
	var s string
	for _, target := range []any{s, nil, (*string)(nil)} {
		if err := structpack.Unmarshal([]byte{1, 2, 3, 4}, target); err == nil || !strings.Contains(err.Error(), "non-nil pointer") {
			t.Errorf("Unmarshal into %T: %v", target, err)
		}
	}
	if _, err := structpack.Literal(nil); err == nil {
		t.Error("Literal(nil) succeeded")
	}
}

func TestDescribeLiteral(t *testing.T) {
	cases := map[string]string{
		"fd04048989ff":                     "struct{uint64_t, uint64_t} /*memcpy, align 8*/",
		"87fd0301ff01":                     "tl::expected<struct{int64_t, int32_t}, int32_t>",
		"87fa01":                           "tl::expected<std::monostate, int32_t>",
		"8106010182":                       "std::array<uint8_t, 16129>",
		"86fa01800cff":                     "std::variant<std::monostate, int32_t, std::string>",
		"8784fdfd04048989ff01800c0302ff01": "tl::expected<std::vector<struct{struct{uint64_t, uint64_t} /*memcpy, align 8*/, int32_t, std::string, int64_t, uint32_t}>, int32_t>",
		"82800c8504":                       "map<std::string, std::optional<uint64_t>>",
		"fd04":                             "malformed literal fd04",
		"":                                 "empty literal",
		"fdff":                             "struct{}",
		"86ff":                             "malformed literal 86ff",
	}
	for lit, want := range cases {
		b, _ := hex.DecodeString(lit)
		if got := structpack.DescribeLiteral(b); got != want {
			t.Errorf("DescribeLiteral(%s) = %q, want %q", lit, got, want)
		}
	}
}

// UnmarshalArgsBorrow decodes what UnmarshalArgs decodes, with strings
// pointing into the message (a change of the message shows through, which
// is the contract) and no allocation per string once the slice exists.
func TestUnmarshalArgsBorrow(t *testing.T) {
	keys := []string{"a", "", "model:llama@rank0/abc", strings.Repeat("k", 300)}
	body, err := structpack.MarshalArgs(keys, "tenant")
	if err != nil {
		t.Fatal(err)
	}
	var copied, borrowed []string
	var t1, t2 string
	if err := structpack.UnmarshalArgs(body, &copied, &t1); err != nil {
		t.Fatal(err)
	}
	if err := structpack.UnmarshalArgsBorrow(body, &borrowed, &t2); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(copied, keys) || !reflect.DeepEqual(borrowed, keys) || t1 != "tenant" || t2 != "tenant" {
		t.Fatalf("copied %q %q, borrowed %q %q", copied, t1, borrowed, t2)
	}
	i := bytes.Index(body, []byte("model:llama"))
	body[i] = 'M'
	if borrowed[2][0] != 'M' || copied[2][0] != 'm' {
		t.Fatalf("after the message changed: borrowed %q (want it to show), copied %q (want it not to)", borrowed[2], copied[2])
	}
	body[i] = 'm'
	allocs := testing.AllocsPerRun(100, func() {
		if err := structpack.UnmarshalArgsBorrow(body, &borrowed, &t2); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 0 {
		t.Fatalf("%.1f allocations per borrowed decode into a slice that fits, want none", allocs)
	}
	// Bad input is refused exactly as without borrowing.
	if err := structpack.UnmarshalArgsBorrow(body[:len(body)-3], &borrowed, &t2); !errors.Is(err, structpack.ErrTruncated) {
		t.Fatalf("truncated: %v", err)
	}
}
