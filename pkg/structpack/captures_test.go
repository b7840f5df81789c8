package structpack_test

import (
	"bufio"
	"bytes"
	"crypto/md5"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"os"
	"reflect"
	"testing"

	"github.com/kvcache-ops/mc/pkg/structpack"
)

type capture struct {
	Call         string `json:"call"`
	RequestBody  string `json:"request_body"`
	ResponseBody string `json:"response_body"`
}

// loadCaptures reads the bodies captured between a real mooncake_client
// and mooncake_master (copied from the spec's mooncake-captures.jsonl).
func loadCaptures(t testing.TB) []capture {
	t.Helper()
	f, err := os.Open("testdata/mooncake-captures.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []capture
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var c capture
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			t.Fatalf("captures line %d: %v", len(out)+1, err)
		}
		out = append(out, c)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatal("no captures")
	}
	return out
}

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// splitHeader takes a captured body apart by the layout alone, without
// this package: hash head, metainfo, embedded literal, payload.
func splitHeader(t *testing.T, body []byte) (head uint32, meta byte, lit, payload []byte) {
	t.Helper()
	if len(body) < 5 {
		t.Fatalf("body %x too short", body)
	}
	head = binary.LittleEndian.Uint32(body)
	if head&1 == 0 {
		t.Fatalf("captured head %#x has no metainfo flag", head)
	}
	meta = body[4]
	if meta != 0x04 {
		t.Fatalf("captured metainfo %#x, want 0x04 (literal, 1-byte lengths)", meta)
	}
	end := bytes.IndexByte(body[5:], 0)
	if end < 0 {
		t.Fatalf("no literal terminator in %x", body)
	}
	return head, meta, body[5 : 5+end], body[5+end+1:]
}

// checkMessage verifies one captured body against the Go types that
// mirror it: the literal and hash computed from the Go types equal the
// captured ones, it decodes, re-encodes byte-exact, and encodes without a
// literal to the same payload.
func checkMessage(t *testing.T, body []byte, tuple reflect.Type, fresh func() []any) []any {
	t.Helper()
	head, _, lit, payload := splitHeader(t, body)
	sum := md5.Sum(lit)
	if got := binary.BigEndian.Uint32(sum[:4]) &^ 1; got != head&^1 {
		t.Fatalf("MD5 of captured literal %x gives %#08x, head says %#08x", lit, got, head&^1)
	}
	if tuple != nil {
		gotLit, err := structpack.Literal(tuple)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(gotLit, lit) {
			t.Fatalf("Literal(%v) = %x, captured %x", tuple, gotLit, lit)
		}
		h, err := structpack.Hash(tuple)
		if err != nil {
			t.Fatal(err)
		}
		if h != head&^1 {
			t.Fatalf("Hash(%v) = %#08x, captured %#08x", tuple, h, head&^1)
		}
	}
	ps := fresh()
	if len(ps) == 1 {
		gotLit, err := structpack.Literal(reflect.TypeOf(ps[0]).Elem())
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(gotLit, lit) {
			t.Fatalf("Literal(%T) = %x, captured %x", ps[0], gotLit, lit)
		}
		if h, _ := structpack.Hash(reflect.TypeOf(ps[0])); h != head&^1 {
			t.Fatalf("Hash(%T) = %#08x, captured %#08x", ps[0], h, head&^1)
		}
	}
	if err := structpack.UnmarshalArgs(body, ps...); err != nil {
		t.Fatalf("decode: %v", err)
	}
	vals := make([]any, len(ps))
	for i, p := range ps {
		vals[i] = reflect.ValueOf(p).Elem().Interface()
	}
	again, err := structpack.MarshalArgs(vals...)
	if err != nil {
		t.Fatalf("re-encode: %v", err)
	}
	if !bytes.Equal(again, body) {
		t.Fatalf("re-encoded\n%x\ncaptured\n%x", again, body)
	}
	short, err := structpack.AppendMarshalArgs(nil, vals, structpack.WithLiteral(false))
	if err != nil {
		t.Fatal(err)
	}
	want := binary.LittleEndian.AppendUint32(nil, head&^1)
	want = append(want, payload...)
	if !bytes.Equal(short, want) {
		t.Fatalf("without literal\n%x\nwant\n%x", short, want)
	}
	ps2 := fresh()
	if err := structpack.UnmarshalArgs(short, ps2...); err != nil {
		t.Fatalf("decode without literal: %v", err)
	}
	if !reflect.DeepEqual(ps, ps2) {
		t.Fatalf("decoded with and without literal differ:\n%#v\n%#v", ps, ps2)
	}
	return vals
}

func TestCapturedBodiesRoundTrip(t *testing.T) {
	for i, c := range loadCaptures(t) {
		spec, ok := mooncakeCalls[c.Call]
		if !ok {
			t.Fatalf("capture %d: no Go mirror for call %s", i, c.Call)
		}
		t.Run(c.Call+"/request", func(t *testing.T) {
			body := unhex(t, c.RequestBody)
			if len(body) == 0 {
				if n := len(spec.args()); n != 0 {
					t.Fatalf("empty captured request, but the mirror takes %d arguments", n)
				}
				got, err := structpack.MarshalArgs()
				if err != nil || len(got) != 0 {
					t.Fatalf("MarshalArgs() = %x, %v; coro_rpc sends no body for no arguments", got, err)
				}
				return
			}
			checkMessage(t, body, spec.tuple, spec.args)
		})
		t.Run(c.Call+"/response", func(t *testing.T) {
			checkMessage(t, unhex(t, c.ResponseBody), nil, func() []any { return []any{spec.resp()} })
		})
	}
}

// firstBody returns the first captured body of a call.
func firstBody(t *testing.T, call string, response bool) []byte {
	t.Helper()
	for _, c := range loadCaptures(t) {
		if c.Call == call {
			if response {
				return unhex(t, c.ResponseBody)
			}
			return unhex(t, c.RequestBody)
		}
	}
	t.Fatalf("no capture of %s", call)
	return nil
}

var clientID = UUID{First: 0xfb40f6d1270dd20e, Second: 0x285f4b35ca785b95}

// TestCapturedValues checks decoded field values against what the spec
// says the captures carry.
func TestCapturedValues(t *testing.T) {
	var ready structpack.Expected[string, ErrorCode]
	if err := structpack.Unmarshal(firstBody(t, "ServiceReady", true), &ready); err != nil {
		t.Fatal(err)
	}
	if ready.HasError || ready.Value != "2.0.0" {
		t.Fatalf("ServiceReady = %+v, want ok 2.0.0", ready)
	}

	var ping UUID
	if err := structpack.UnmarshalArgs(firstBody(t, "Ping", false), &ping); err != nil {
		t.Fatal(err)
	}
	if ping != clientID {
		t.Fatalf("Ping client id = %#x, want %#x", ping, clientID)
	}

	var pong structpack.Expected[PingResponse, ErrorCode]
	if err := structpack.Unmarshal(firstBody(t, "Ping", true), &pong); err != nil {
		t.Fatal(err)
	}
	if pong.HasError || pong.Value != (PingResponse{ViewVersionID: 0, ClientStatus: 2}) {
		t.Fatalf("Ping response = %+v, want ok view 0 status 2 (NEED_REMOUNT)", pong)
	}

	var seg Segment
	var owner UUID
	if err := structpack.UnmarshalArgs(firstBody(t, "MountSegment", false), &seg, &owner); err != nil {
		t.Fatal(err)
	}
	if seg.Name != "127.0.0.1:13401" || seg.Base != 0x7fbea6000000 || seg.Size != 256<<20 ||
		seg.TEEndpoint != "127.0.0.1:13401" || seg.Protocol != "tcp" || seg.HostID != "" || owner != clientID {
		t.Fatalf("MountSegment args = %+v, %#x", seg, owner)
	}

	var mounted structpack.ExpectedVoid[ErrorCode]
	if err := structpack.Unmarshal(firstBody(t, "MountSegment", true), &mounted); err != nil || mounted.HasError {
		t.Fatalf("MountSegment response = %+v, %v; want ok", mounted, err)
	}

	var removed structpack.ExpectedVoid[ErrorCode]
	if err := structpack.Unmarshal(firstBody(t, "Remove", true), &removed); err != nil {
		t.Fatal(err)
	}
	if !removed.HasError || removed.Error != -704 {
		t.Fatalf("Remove response = %+v, want error -704", removed)
	}

	var replicas structpack.Expected[[]ReplicaDescriptor, ErrorCode]
	if err := structpack.Unmarshal(firstBody(t, "PutStart", true), &replicas); err != nil {
		t.Fatal(err)
	}
	if replicas.HasError || len(replicas.Value) != 1 {
		t.Fatalf("PutStart response = %+v, want one replica", replicas)
	}
	mem, ok := replicas.Value[0].Descriptor.Value.(MemoryDescriptor)
	if !ok {
		t.Fatalf("PutStart replica holds %T, want MemoryDescriptor", replicas.Value[0].Descriptor.Value)
	}
	if mem.BufferDescriptor.Protocol != "tcp" || mem.BufferDescriptor.TransportEndpoint != "127.0.0.1:13401" ||
		replicas.Value[0].Status != 2 {
		t.Fatalf("PutStart replica = %+v", replicas.Value[0])
	}
}
