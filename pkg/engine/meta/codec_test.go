package meta

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/topo"
)

func readExample(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return bytes.TrimSpace(b)
}

// generic decodes JSON into maps with exact numbers, for field-by-field
// comparison independent of key order.
func generic(t *testing.T, b []byte) map[string]any {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var m map[string]any
	if err := d.Decode(&m); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	return m
}

func TestDecodeTCPExample(t *testing.T) {
	in := readExample(t, "tcp_segment.json")
	d, err := DecodeSegment(in)
	if err != nil {
		t.Fatal(err)
	}
	want := &SegmentDesc{
		Name: "node1", Protocol: "tcp", Timestamp: "2026-08-01 12:00:00.123456",
		TCPDataPort: 15432, TCPProtoVersion: 2,
		Buffers: []BufferDesc{
			{Name: "node1", Addr: 140230512345088, Length: 1 << 30},
			{Name: "node1", Addr: 140231586086912, Length: 1 << 30},
		},
	}
	if !reflect.DeepEqual(d, want) {
		t.Fatalf("decoded %+v\nwant    %+v", d, want)
	}
	out, err := EncodeSegment(d)
	if err != nil {
		t.Fatal(err)
	}
	if g, w := generic(t, out), generic(t, in); !reflect.DeepEqual(g, w) {
		t.Fatalf("re-encoded fields differ:\n got %s\nwant %s", out, in)
	}
}

func TestDecodeRDMAExample(t *testing.T) {
	in := readExample(t, "rdma_segment.json")
	d, err := DecodeSegment(in)
	if err != nil {
		t.Fatal(err)
	}
	if d.Name != "prefill-0" || d.Protocol != "rdma" || len(d.Devices) != 2 || len(d.Buffers) != 2 {
		t.Fatalf("decoded %+v", d)
	}
	if d.Devices[1] != (DeviceDesc{Name: "mlx5_1", LID: 7, GID: "00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:02"}) {
		t.Fatalf("device 1 = %+v", d.Devices[1])
	}
	if b := d.Buffers[0]; b.Name != "cpu:0" || b.Addr != 140230512345088 || !reflect.DeepEqual(b.Rkey, []uint32{2150912, 4294967295}) || !reflect.DeepEqual(b.Lkey, []uint32{2150912, 2151168}) {
		t.Fatalf("buffer 0 = %+v", b)
	}
	wantM := topo.Matrix{"cpu:0": {Preferred: []string{"mlx5_0"}, Accessible: []string{"mlx5_1"}}, "cpu:1": {Preferred: []string{"mlx5_1"}, Accessible: []string{}}}
	if !reflect.DeepEqual(d.PriorityMatrix, wantM) {
		t.Fatalf("matrix = %+v", d.PriorityMatrix)
	}
	out, err := EncodeSegment(d)
	if err != nil {
		t.Fatal(err)
	}
	if g, w := generic(t, out), generic(t, in); !reflect.DeepEqual(g, w) {
		t.Fatalf("re-encoded fields differ:\n got %s\nwant %s", out, in)
	}
	// Keys are decimal JSON numbers, never strings or floats.
	if !bytes.Contains(out, []byte(`"rkey":[2150912,4294967295]`)) {
		t.Fatalf("rkey not written as decimal numbers: %s", out)
	}
	if bytes.Contains(out, []byte("\n")) || bytes.Contains(out, []byte(": ")) {
		t.Fatalf("not compact: %s", out)
	}
}

func TestDecodeSHMExample(t *testing.T) {
	in := readExample(t, "tcp_shm_segment.json")
	d, err := DecodeSegment(in)
	if err != nil {
		t.Fatal(err)
	}
	want := &SHMDesc{BootID: "3f1c2a9e-0b7d-4c55-9e7a-1d2b3c4d5e6f", Token: "8c1f0e2d3b4a59687766554433221100", PID: 4242, UID: 1000,
		Buffers: []SHMBufferDesc{{Addr: 140230512345088, FD: 12, ID: 1}, {Addr: 140231586086912, FD: 13, ID: 2}}}
	if !reflect.DeepEqual(d.SHM, want) {
		t.Fatalf("mc_shm decoded %+v\nwant %+v", d.SHM, want)
	}
	out, err := EncodeSegment(d)
	if err != nil {
		t.Fatal(err)
	}
	g := generic(t, out)
	if w := generic(t, in); !reflect.DeepEqual(g, w) {
		t.Fatalf("re-encoded fields differ:\n got %s\nwant %s", out, in)
	}
	// What a Mooncake peer reads (every key but mc_shm) is the plain tcp
	// descriptor: protocol, port and buffers untouched.
	delete(g, "mc_shm")
	if w := generic(t, readExample(t, "tcp_segment.json")); !reflect.DeepEqual(g, w) {
		t.Fatalf("without mc_shm the descriptor is not the tcp one:\n got %v\nwant %v", g, w)
	}
	// An engine without shm writes no mc_shm key at all.
	d.SHM = nil
	if out, _ := EncodeSegment(d); bytes.Contains(out, []byte("mc_shm")) {
		t.Fatalf("mc_shm written without shm: %s", out)
	}
}

func TestDecodeDefaultsAndUnknownFields(t *testing.T) {
	in := `{"name":"n","protocol":"tcp","tcp_data_port":1,"buffers":[{"name":"n","addr":1,"length":1,"shm_name":"x"}],"rdma_server_name":"r","future":{"a":[1,2]}}`
	d, err := DecodeSegment([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if d.TCPProtoVersion != 1 {
		t.Fatalf("absent tcp_proto_version decoded as %d, want 1", d.TCPProtoVersion)
	}
	// Mooncake's Json::FastWriter ends values with a newline.
	d, err = DecodeSegment([]byte(`{"name":"n","protocol":"tcp","tcp_data_port":1,"tcp_proto_version":2,"buffers":[]}` + "\n"))
	if err != nil || d.TCPProtoVersion != 2 {
		t.Fatalf("tcp_proto_version 2: %v %v", d, err)
	}
}

func TestDecodeRejects(t *testing.T) {
	tcp := string(readExample(t, "tcp_segment.json"))
	rdma := string(readExample(t, "rdma_segment.json"))
	tshm := string(readExample(t, "tcp_shm_segment.json"))
	cases := []struct {
		name, in, want string
	}{
		{"buffer addr 0", strings.Replace(tcp, `"addr":140231586086912`, `"addr":0`, 1), `segment "node1": buffers[1].addr is 0`},
		{"buffer length 0", strings.Replace(tcp, `"length":1073741824,"name":"node1"}]`, `"length":0,"name":"node1"}]`, 1), `segment "node1": buffers[1].length is 0`},
		{"buffer name empty", strings.Replace(tcp, `"length":1073741824,"name":"node1"}]`, `"length":1073741824,"name":""}]`, 1), `segment "node1": buffers[1].name is empty`},
		{"buffer name absent", `{"name":"s","protocol":"tcp","tcp_data_port":9,"buffers":[{"addr":1,"length":1}]}`, `segment "s": buffers[0].name is empty`},
		{"device name empty", strings.Replace(rdma, `"name":"mlx5_1"`, `"name":""`, 1), `segment "prefill-0": devices[1].name is empty`},
		{"device gid empty", strings.Replace(rdma, `"gid":"fe:80:00:00:00:00:00:00:0e:42:a1:ff:fe:9c:3b:10"`, `"gid":""`, 1), `segment "prefill-0": devices[0].gid is empty`},
		{"device gid malformed", strings.Replace(rdma, `"gid":"fe:80:00:00:00:00:00:00:0e:42:a1:ff:fe:9c:3b:10"`, `"gid":"fe80::1"`, 1), `segment "prefill-0": devices[0].gid "fe80::1" is not 16 two-digit hex bytes joined by ':'`},
		{"rkey count", strings.Replace(rdma, `"rkey":[2151424,2151680]`, `"rkey":[2151424]`, 1), `segment "prefill-0": buffers[1].rkey has 1 keys, want 2 (one per device)`},
		{"lkey count", strings.Replace(rdma, `"lkey":[2150912,2151168]`, `"lkey":[2150912,2151168,3]`, 1), `segment "prefill-0": buffers[0].lkey has 3 keys, want 2 (one per device)`},
		{"rdma buffer addr 0", strings.Replace(rdma, `"addr":139620000000000`, `"addr":0`, 1), `segment "prefill-0": buffers[1].addr is 0`},
		{"rdma no devices", `{"name":"r","protocol":"rdma","devices":[],"buffers":[]}`, `segment "r": devices is empty (an rdma segment needs at least one device)`},
		{"tcp port", strings.Replace(tcp, `"tcp_data_port":15432`, `"tcp_data_port":0`, 1), `segment "node1": tcp_data_port 0 is not a port (1-65535)`},
		{"protocol missing", `{"name":"p","buffers":[]}`, `segment "p": protocol is missing`},
		{"protocol unknown", `{"name":"p","protocol":"nvlink","buffers":[]}`, `segment "p": protocol "nvlink" is not supported by mc (want tcp or rdma)`},
		{"wraps", `{"name":"w","protocol":"tcp","tcp_data_port":9,"buffers":[{"name":"w","addr":18446744073709551615,"length":2}]}`, `segment "w": buffers[0] addr 0xffffffffffffffff + length 2 wraps past the end of the address space`},
		{"addr as string", `{"name":"q","protocol":"tcp","tcp_data_port":9,"buffers":[{"name":"q","addr":"1","length":2}]}`, `segment "q": is not valid descriptor JSON: json: cannot unmarshal string into Go struct field`},
		{"negative addr", `{"name":"q","protocol":"tcp","tcp_data_port":9,"buffers":[{"name":"q","addr":-1,"length":2}]}`, `buffers.addr`},
		{"rkey over u32", strings.Replace(rdma, `4294967295`, `4294967296`, 1), `rkey`},
		{"not json", `{"name":`, `segment descriptor: is not valid descriptor JSON`},
		{"array", `[]`, `segment descriptor: is not valid descriptor JSON`},
		{"shm boot id", strings.Replace(tshm, `"boot_id":"3f1c2a9e-0b7d-4c55-9e7a-1d2b3c4d5e6f"`, `"boot_id":"node1"`, 1), `segment "node1": mc_shm.boot_id "node1" is not a boot id`},
		{"shm token", strings.Replace(tshm, `"token":"8c1f0e2d3b4a59687766554433221100"`, `"token":"8c1f"`, 1), `segment "node1": mc_shm.token token "8c1f": want 32 hex digits`},
		{"shm pid", strings.Replace(tshm, `"pid":4242`, `"pid":0`, 1), `segment "node1": mc_shm.pid 0 is not a process id`},
		{"shm uid", strings.Replace(tshm, `"uid":1000`, `"uid":-1`, 1), `segment "node1": mc_shm.uid -1 is negative`},
		{"shm buffer count", strings.Replace(tshm, `,{"addr":140231586086912,"fd":13,"id":2}`, ``, 1), `segment "node1": mc_shm.buffers has 1 entries, want 2 (one per buffer)`},
		{"shm buffer addr", strings.Replace(tshm, `"addr":140231586086912,"fd":13`, `"addr":140231586086913,"fd":13`, 1), `segment "node1": mc_shm.buffers[1].addr 0x7f8a35e00001 is not buffers[1].addr 0x7f8a35e00000`},
		{"shm buffer fd", strings.Replace(tshm, `"fd":13`, `"fd":-1`, 1), `segment "node1": mc_shm.buffers[1].fd -1 is negative`},
		{"shm buffer id", strings.Replace(tshm, `"id":1}`, `"id":0}`, 1), `segment "node1": mc_shm.buffers[0].id is 0`},
		{"matrix entry", strings.Replace(rdma, `"cpu:1":[["mlx5_1"],[]]`, `"cpu:1":[["mlx5_1"]]`, 1), `want exactly two lists`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, err := DecodeSegment([]byte(c.in))
			if err == nil {
				t.Fatalf("accepted: %+v", d)
			}
			if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v\nwant ErrMalformed containing %q", err, c.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("error is not one line: %q", err)
			}
		})
	}
}

func TestEncodeRefusesInvalid(t *testing.T) {
	d := &SegmentDesc{Name: "x", Protocol: "tcp", TCPDataPort: 1, Buffers: []BufferDesc{{Name: "x", Addr: 0, Length: 1}}}
	if _, err := EncodeSegment(d); err == nil || err.Error() != `segment "x": buffers[0].addr is 0` {
		t.Fatalf("err = %v", err)
	}
	if _, err := EncodeSegment(nil); err == nil {
		t.Fatal("nil accepted")
	}
}

func TestEncodeShape(t *testing.T) {
	d := &SegmentDesc{Name: "x", Protocol: "tcp", TCPDataPort: 7, TCPProtoVersion: 2}
	b, err := EncodeSegment(d)
	if err != nil {
		t.Fatal(err)
	}
	m := generic(t, b)
	if _, ok := m["devices"]; ok {
		t.Errorf("tcp descriptor has devices: %s", b)
	}
	if _, ok := m["priority_matrix"]; ok {
		t.Errorf("tcp descriptor has priority_matrix: %s", b)
	}
	if string(mustJSON(t, m["buffers"])) != "[]" {
		t.Errorf("buffers not an empty array: %s", b)
	}
	ts, _ := m["timestamp"].(string)
	if _, err := time.ParseInLocation("2006-01-02 15:04:05.000000", ts, time.Local); err != nil {
		t.Errorf("timestamp %q: %v", ts, err)
	}
	if d.Timestamp != "" {
		t.Errorf("EncodeSegment modified its input")
	}
	r := &SegmentDesc{Name: "r", Protocol: "rdma", Devices: []DeviceDesc{{Name: "mlx5_0", GID: FormatGID([16]byte{0xfe, 0x80, 15: 1})}}}
	b, err = EncodeSegment(r)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte(`"priority_matrix":{}`)) || !bytes.Contains(b, []byte(`"tcp_data_port":0`)) {
		t.Errorf("rdma shape: %s", b)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestKeys(t *testing.T) {
	cases := []struct{ got, want string }{
		{SegmentKey("", "node1"), "mooncake/ram/node1"},
		{SegmentKey("", "127.0.0.1:15000"), "mooncake/ram/127.0.0.1:15000"},
		{SegmentKey("", "nvmeof/node1"), "mooncake/nvmeof/node1"},
		{SegmentKey("c1", "node1"), "mooncake/c1/ram/node1"},
		{SegmentKey("c1/", "node1"), "mooncake/c1/ram/node1"},
		{SegmentKey("c1", "a/b"), "mooncake/c1/a/b"},
		{RPCMetaKey("", "node1"), "mooncake/rpc_meta/node1"},
		{RPCMetaKey("c1", "node1"), "mooncake/c1/rpc_meta/node1"},
	}
	for _, c := range cases {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

func TestTimestamp(t *testing.T) {
	ts := time.Date(2026, 8, 1, 9, 5, 7, 123456789, time.UTC)
	if got := Timestamp(ts); got != "2026-08-01 09:05:07.123456" {
		t.Fatalf("Timestamp = %q", got)
	}
	if got := Timestamp(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)); got != "2026-01-02 03:04:05.000000" {
		t.Fatalf("Timestamp = %q", got)
	}
}

func TestGID(t *testing.T) {
	g := [16]byte{0xfe, 0x80, 8: 0x0e, 0x42, 0xa1, 0xff, 0xfe, 0x9c, 0x3b, 0x10}
	s := FormatGID(g)
	if s != "fe:80:00:00:00:00:00:00:0e:42:a1:ff:fe:9c:3b:10" {
		t.Fatalf("FormatGID = %q", s)
	}
	back, err := ParseGID(s)
	if err != nil || back != g {
		t.Fatalf("ParseGID = %x, %v", back, err)
	}
	if g2, err := ParseGID(strings.ToUpper(s)); err != nil || g2 != g {
		t.Fatalf("upper case: %v", err)
	}
	for _, bad := range []string{"", "fe:80", "fe:80:00:00:00:00:00:00:0e:42:a1:ff:fe:9c:3b:1", "fe:80:00:00:00:00:00:00:0e:42:a1:ff:fe:9c:3b:1g", "fe:80:00:00:00:00:00:00:0e:42:a1:ff:fe:9c:3b:10:00", "fe:80:00:00:00:00:00:00:0e:42:a1:ff:fe:9c:3b:+1"} {
		if _, err := ParseGID(bad); err == nil {
			t.Errorf("ParseGID(%q) accepted", bad)
		}
	}
}

func TestRPCMetaCodec(t *testing.T) {
	b, err := EncodeRPCMeta(RPCMeta{IPOrHostName: "10.0.0.2", RPCPort: 15123})
	if err != nil || string(b) != `{"ip_or_host_name":"10.0.0.2","rpc_port":15123}` {
		t.Fatalf("EncodeRPCMeta = %s, %v", b, err)
	}
	m, err := DecodeRPCMeta("s", []byte(`{"ip_or_host_name":"h","rpc_port":1,"extra":true}`))
	if err != nil || m != (RPCMeta{"h", 1}) {
		t.Fatalf("DecodeRPCMeta = %+v, %v", m, err)
	}
	for _, bad := range []string{`{"rpc_port":1}`, `{"ip_or_host_name":"h","rpc_port":0}`, `{"ip_or_host_name":"h","rpc_port":70000}`, `x`} {
		if _, err := DecodeRPCMeta("s", []byte(bad)); err == nil || !strings.Contains(err.Error(), `rpc meta of "s"`) {
			t.Errorf("DecodeRPCMeta(%s) = %v", bad, err)
		}
	}
}

// FuzzDecodeSegment: no input panics, and whatever is accepted re-encodes
// to bytes that decode to the same descriptor (encode is stable).
func FuzzDecodeSegment(f *testing.F) {
	f.Add(readExample(f, "tcp_segment.json"))
	f.Add(readExample(f, "rdma_segment.json"))
	f.Add([]byte(`{"name":"n","protocol":"tcp","tcp_data_port":1,"buffers":[]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := DecodeSegment(data)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error does not match ErrMalformed: %v", err)
			}
			return
		}
		enc1, err := EncodeSegment(d)
		if err != nil {
			t.Fatalf("accepted descriptor does not encode: %v", err)
		}
		d2, err := DecodeSegment(enc1)
		if err != nil {
			t.Fatalf("re-decode: %v\n%s", err, enc1)
		}
		enc2, err := EncodeSegment(d2)
		if err != nil || !bytes.Equal(enc1, enc2) {
			t.Fatalf("unstable encoding:\n%s\n%s (%v)", enc1, enc2, err)
		}
	})
}
