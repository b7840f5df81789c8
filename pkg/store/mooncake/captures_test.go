package mooncake

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/kvcache-ops/mc/pkg/structpack"
)

// capture is one call seen between a real Mooncake client and a real
// mooncake_master (testdata/*.jsonl; see scripts/mooncake-capture.py).
type capture struct {
	Call           string `json:"call"`
	FunctionID     string `json:"function_id"`
	RequestHeader  string `json:"request_header"`
	RequestBody    string `json:"request_body"`
	ResponseHeader string `json:"response_header"`
	ResponseBody   string `json:"response_body"`
}

func readCaptures(t testing.TB) []capture { return readCaptureFiles(t, "testdata/captures-*.jsonl") }

func readCaptureFiles(t testing.TB, glob string) []capture {
	t.Helper()
	files, err := filepath.Glob(glob)
	if err != nil || len(files) == 0 {
		t.Fatalf("no captures in testdata: %v", err)
	}
	var out []capture
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(fh)
		sc.Buffer(nil, 1<<26)
		for sc.Scan() {
			if len(bytes.TrimSpace(sc.Bytes())) == 0 {
				continue
			}
			var c capture
			if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			out = append(out, c)
		}
		fh.Close()
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

// shapes are the Go types of each call's arguments and answer: the
// mirror of the C++ signatures this package sends and decodes.
var shapes = map[string]struct {
	args []any
	resp any
}{
	"ServiceReady":           {nil, ExpectString{}},
	"GetStorageConfig":       {nil, ExpectConfig{}},
	"MountSegment":           {[]any{Segment{}, UUID{}}, ExpectVoid{}},
	"ReMountSegment":         {[]any{[]Segment{}, UUID{}}, ExpectVoid{}},
	"Ping":                   {[]any{UUID{}}, ExpectPing{}},
	"ExistKey":               {[]any{"", ""}, ExpectBool{}},
	"BatchExistKey":          {[]any{[]string{}, ""}, []ExpectBool{}},
	"GetReplicaList":         {[]any{"", ""}, ExpectList{}},
	"BatchGetReplicaList":    {[]any{[]string{}, ""}, []ExpectList{}},
	"PutStart":               {[]any{UUID{}, "", uint64(0), ReplicateConfig{}, ""}, ExpectDescs{}},
	"BatchPutStart":          {[]any{UUID{}, []string{}, []uint64{}, ReplicateConfig{}, ""}, []ExpectDescs{}},
	"PutEnd":                 {[]any{UUID{}, ObjectMeta{}, ReplicaType(0), ""}, ExpectVoid{}},
	"BatchPutEnd":            {[]any{UUID{}, []ObjectMeta{}, ReplicaType(0), ""}, []ExpectVoid{}},
	"PutRevoke":              {[]any{UUID{}, "", ReplicaType(0), ""}, ExpectVoid{}},
	"BatchPutRevoke":         {[]any{UUID{}, []string{}, ReplicaType(0), ""}, []ExpectVoid{}},
	"Remove":                 {[]any{"", false, ""}, ExpectVoid{}},
	"BatchRemove":            {[]any{[]string{}, false, ""}, []ExpectVoid{}},
	"RemoveAll":              {[]any{false, ""}, int64(0)},
	"UnmountSegment":         {[]any{UUID{}, UUID{}}, ExpectVoid{}},
	"GracefulUnmountSegment": {[]any{UUID{}, UUID{}, uint64(0)}, ExpectVoid{}},
	"GetReplicaListByRegex":  {[]any{"", ""}, ExpectByRegex{}},
	"BatchUpsertStart":       {[]any{UUID{}, []string{}, []uint64{}, ReplicateConfig{}, ""}, []ExpectDescs{}},
	"BatchUpsertEnd":         {[]any{UUID{}, []ObjectMeta{}, ""}, []ExpectVoid{}},
	"BatchUpsertRevoke":      {[]any{UUID{}, []string{}, ""}, []ExpectVoid{}},
	"FetchTasks":             {[]any{UUID{}, uint64(0)}, ExpectTasks{}},
}

// TestCapturesRoundTrip decodes every captured call this package makes
// with its Go mirror and encodes it back byte for byte: request bodies
// (what the real client sends) and answers (what the real master sends).
func TestCapturesRoundTrip(t *testing.T) {
	caps := readCaptures(t)
	seen := map[string]bool{}
	for i, c := range caps {
		id, err := strconv.ParseUint(strings.TrimPrefix(c.FunctionID, "0x"), 16, 32)
		if err != nil {
			t.Fatalf("capture %d: function id %q", i, c.FunctionID)
		}
		if got := FunctionID(c.Call); got != uint32(id) {
			t.Errorf("%s: function id %#08x, captured %#08x", c.Call, got, id)
		}
		sh, ok := shapes[c.Call]
		if !ok {
			continue // a call mc's client does not make (FetchTasks)
		}
		seen[c.Call] = true
		req := unhex(t, c.RequestBody)
		ptrs := make([]any, len(sh.args))
		for j, a := range sh.args {
			ptrs[j] = reflect.New(reflect.TypeOf(a)).Interface()
		}
		if err := structpack.UnmarshalArgs(req, ptrs...); err != nil {
			t.Errorf("%s request: %v", c.Call, err)
			continue
		}
		vals := make([]any, len(ptrs))
		for j, p := range ptrs {
			vals[j] = reflect.ValueOf(p).Elem().Interface()
		}
		again, err := structpack.MarshalArgs(vals...)
		if err != nil || !bytes.Equal(again, req) {
			t.Errorf("%s request re-encodes to %x (%v), captured %x", c.Call, again, err, req)
		}
		resp := unhex(t, c.ResponseBody)
		rp := reflect.New(reflect.TypeOf(sh.resp))
		if err := structpack.Unmarshal(resp, rp.Interface()); err != nil {
			t.Errorf("%s answer: %v", c.Call, err)
			continue
		}
		again, err = structpack.Marshal(rp.Elem().Interface())
		if err != nil || !bytes.Equal(again, resp) {
			t.Errorf("%s answer re-encodes to %x (%v), captured %x", c.Call, again, err, resp)
		}
	}
	for _, want := range []string{"ServiceReady", "MountSegment", "Ping", "ReMountSegment", "GetStorageConfig"} {
		if !seen[want] {
			t.Errorf("no capture of %s", want)
		}
	}
}

// TestCapturedMountSegment checks the fields of the captured mount, so the
// mirror's field order is pinned by values, not just by lengths.
func TestCapturedMountSegment(t *testing.T) {
	for _, c := range readCaptures(t) {
		if c.Call != "MountSegment" {
			continue
		}
		var seg Segment
		var client UUID
		if err := structpack.UnmarshalArgs(unhex(t, c.RequestBody), &seg, &client); err != nil {
			t.Fatal(err)
		}
		if seg.Name != "127.0.0.1:13401" || seg.TEEndpoint != "127.0.0.1:13401" || seg.Protocol != "tcp" ||
			seg.Size != 256<<20 || seg.Base != 0x7fbea6000000 || seg.HostID != "" {
			t.Errorf("segment %+v", seg)
		}
		if client.First == 0 || client.Second == 0 {
			t.Errorf("client id %+v", client)
		}
		return
	}
	t.Fatal("no MountSegment capture")
}

// TestCapturedPythonPut pins the ReplicateConfig mirror by values: the
// real Python client's PutStart of a 1 MiB "py/a".
func TestCapturedPythonPut(t *testing.T) {
	for _, c := range readCaptureFiles(t, "testdata/captures-python_client.jsonl") {
		if c.Call != "PutStart" {
			continue
		}
		var client UUID
		var key, tenant string
		var n uint64
		var rc ReplicateConfig
		if err := structpack.UnmarshalArgs(unhex(t, c.RequestBody), &client, &key, &n, &rc, &tenant); err != nil {
			t.Fatal(err)
		}
		if key != "py/a" || n != 1<<20 || tenant != DefaultTenant || rc.ReplicaNum != 1 || rc.WithHardPin || rc.SoftPinAction != SoftPinPreserve {
			t.Fatalf("PutStart(%q, %d, %+v, %q)", key, n, rc, tenant)
		}
		var r ExpectDescs
		if err := structpack.Unmarshal(unhex(t, c.ResponseBody), &r); err != nil || r.HasError || len(r.Value) != 1 {
			t.Fatalf("answer %+v, %v", r, err)
		}
		if b, ok := r.Value[0].Memory(); !ok || b.Size != 1<<20 || b.Protocol != "tcp" || b.TransportEndpoint == "" {
			t.Fatalf("descriptor %+v", r.Value[0])
		}
		return
	}
	t.Fatal("no PutStart capture")
}
