package cororpc

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"runtime"
	"strconv"
	"testing"
)

// capture is one call captured between a real mooncake_client and a real
// mooncake_master (testdata/mooncake-captures.jsonl, a copy of
// shared/spec/mooncake-captures.jsonl).
type capture struct {
	Call       string `json:"call"`
	FunctionID string `json:"function_id"`
	ReqHeader  string `json:"request_header"`
	ReqBody    string `json:"request_body"`
	RespHeader string `json:"response_header"`
	RespBody   string `json:"response_body"`
}

func (c capture) bytes(t testing.TB) (reqHdr, reqBody, respHdr, respBody []byte) {
	t.Helper()
	dec := func(s string) []byte {
		b, err := hex.DecodeString(s)
		if err != nil {
			t.Fatalf("%s: bad hex %q: %v", c.Call, s, err)
		}
		return b
	}
	return dec(c.ReqHeader), dec(c.ReqBody), dec(c.RespHeader), dec(c.RespBody)
}

func (c capture) fnID(t testing.TB) uint32 {
	t.Helper()
	v, err := strconv.ParseUint(c.FunctionID, 0, 32)
	if err != nil {
		t.Fatalf("%s: function_id %q: %v", c.Call, c.FunctionID, err)
	}
	return uint32(v)
}

func loadCaptures(t testing.TB) []capture {
	t.Helper()
	f, err := os.Open("testdata/mooncake-captures.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []capture
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
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
	if len(out) < 10 {
		t.Fatalf("only %d captures", len(out))
	}
	return out
}

func TestCapturedHeadersDecodeAndReencode(t *testing.T) {
	for i, c := range loadCaptures(t) {
		reqHdr, reqBody, respHdr, respBody := c.bytes(t)
		rq, err := ParseRequestHeader(reqHdr)
		if err != nil {
			t.Fatalf("%d %s: request header: %v", i, c.Call, err)
		}
		want := RequestHeader{
			Magic: 0x15, Version: 0, SerializeType: 0, MsgType: 0,
			Seq: rq.Seq, FunctionID: c.fnID(t), Length: uint32(len(reqBody)),
		}
		if rq != want {
			t.Errorf("%d %s: request header %+v, want %+v", i, c.Call, rq, want)
		}
		if err := rq.Check(0); err != nil {
			t.Errorf("%d %s: Check: %v", i, c.Call, err)
		}
		if got := rq.AppendTo(nil); !bytes.Equal(got, reqHdr) {
			t.Errorf("%d %s: request header re-encodes as %x, want %x", i, c.Call, got, reqHdr)
		}

		rs, err := ParseResponseHeader(respHdr)
		if err != nil {
			t.Fatalf("%d %s: response header: %v", i, c.Call, err)
		}
		wantResp := ResponseHeader{Magic: 0x15, Seq: rq.Seq, Length: uint32(len(respBody))}
		if rs != wantResp {
			t.Errorf("%d %s: response header %+v, want %+v", i, c.Call, rs, wantResp)
		}
		if got := rs.AppendTo(nil); !bytes.Equal(got, respHdr) {
			t.Errorf("%d %s: response header re-encodes as %x, want %x", i, c.Call, got, respHdr)
		}

		// Whole frames read back through the stream readers.
		h, body, attach, err := ReadRequest(bytes.NewReader(append(reqHdr, reqBody...)), 0)
		if err != nil || h != rq || !bytes.Equal(body, reqBody) || attach != nil {
			t.Errorf("%d %s: ReadRequest = %+v, %x, %x, %v", i, c.Call, h, body, attach, err)
		}
		rh, body, _, err := ReadResponse(bytes.NewReader(append(respHdr, respBody...)), 0)
		if err != nil || rh != rs || !bytes.Equal(body, respBody) {
			t.Errorf("%d %s: ReadResponse = %+v, %x, %v", i, c.Call, rh, body, err)
		}
	}
}

// One line checked field by field against the spec's prose, so the test
// above is not only the decoder agreeing with the encoder.
func TestMountSegmentHeaderFields(t *testing.T) {
	b, _ := hex.DecodeString("1500000002000000bbc47e3e7500000000000000")
	h, err := ParseRequestHeader(b)
	if err != nil {
		t.Fatal(err)
	}
	if h.Seq != 2 || h.FunctionID != 0x3e7ec4bb || h.Length != 117 || h.AttachLength != 0 {
		t.Fatalf("got %+v", h)
	}
	b, _ = hex.DecodeString("15000000000000001100000000000000")
	r, err := ParseResponseHeader(b)
	if err != nil {
		t.Fatal(err)
	}
	if r.Seq != 0 || r.Length != 17 || r.ErrCode != 0 {
		t.Fatalf("got %+v", r)
	}
}

func TestFunctionIDs(t *testing.T) {
	const prefix = "mooncake::WrappedMasterService::"
	seen := map[string]bool{}
	for _, c := range loadCaptures(t) {
		reqHdr, _, _, _ := c.bytes(t)
		h, err := ParseRequestHeader(reqHdr)
		if err != nil {
			t.Fatal(err)
		}
		got := FunctionID(prefix + c.Call)
		if got != c.fnID(t) || got != h.FunctionID {
			t.Errorf("FunctionID(%q) = %#08x; capture says %s, header carries %#08x", prefix+c.Call, got, c.FunctionID, h.FunctionID)
		}
		seen[c.Call] = true
	}
	if len(seen) < 10 {
		t.Errorf("only %d distinct calls in the captures: %v", len(seen), seen)
	}
	// The ids the spec lists.
	for name, want := range map[string]uint32{
		"MountSegment":     0x3e7ec4bb,
		"Ping":             0xd6c2dae5,
		"ServiceReady":     0x7b81bb56,
		"GetStorageConfig": 0x8da9b0a6,
		"FetchTasks":       0xdf141844,
		"ReMountSegment":   0x0b053b72,
	} {
		if got := FunctionID(prefix + name); got != want {
			t.Errorf("FunctionID(%s) = %#08x, want %#08x", name, got, want)
		}
	}
}

func TestParseHeaderErrors(t *testing.T) {
	good, _ := hex.DecodeString("1500000002000000bbc47e3e7500000000000000")
	for _, tc := range []struct {
		name string
		b    []byte
		want error
	}{
		{"empty", nil, ErrTruncated},
		{"short", good[:15], ErrTruncated},
		{"magic", append([]byte{0x16}, good[1:]...), ErrBadMagic},
		{"http2 preface", []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), ErrBadMagic},
		{"version", append([]byte{0x15, 1}, good[2:]...), ErrBadVersion},
	} {
		if _, err := ParseRequestHeader(tc.b); !errors.Is(err, tc.want) {
			t.Errorf("request %s: err %v, want %v", tc.name, err, tc.want)
		}
		if _, err := ParseResponseHeader(tc.b); !errors.Is(err, tc.want) {
			t.Errorf("response %s: err %v, want %v", tc.name, err, tc.want)
		}
	}
	if _, err := ParseRequestHeader(good[:19]); !errors.Is(err, ErrTruncated) {
		t.Errorf("19-byte request header: %v", err)
	}
	h, _ := ParseRequestHeader(good)
	h.SerializeType = 1
	if err := h.Check(0); !errors.Is(err, ErrBadSerializeType) {
		t.Errorf("serialize_type 1: %v", err)
	}
}

func TestLengthLimit(t *testing.T) {
	h := RequestHeader{Magic: Magic, Length: 600, AttachLength: 424}
	if err := h.Check(1024); err != nil {
		t.Errorf("1024 bytes under a 1024 limit: %v", err)
	}
	h.AttachLength++
	if err := h.Check(1024); !errors.Is(err, ErrMessageTooLarge) {
		t.Errorf("1025 bytes under a 1024 limit: %v", err)
	}
	// Both fields at their maximum must not overflow into a small sum.
	r := ResponseHeader{Magic: Magic, Length: 0xffffffff, AttachLength: 0xffffffff}
	if err := r.Check(0xffffffff); !errors.Is(err, ErrMessageTooLarge) {
		t.Errorf("8 GiB under a 4 GiB limit: %v", err)
	}
	r = ResponseHeader{Magic: Magic, Length: DefaultMaxMessageLen + 1}
	if err := r.Check(0); !errors.Is(err, ErrMessageTooLarge) {
		t.Errorf("default limit not applied: %v", err)
	}
}

// A header announcing 4 GiB must be refused before the reader allocates for
// it: the stream holds only the header.
func TestOversizedFrameRefusedBeforeAllocating(t *testing.T) {
	frame := ResponseHeader{Magic: Magic, Seq: 7, Length: 0xfffffff0}.AppendTo(nil)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, _, _, err := ReadResponse(bytes.NewReader(frame), 1<<20)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrMessageTooLarge) {
		t.Fatalf("err %v, want ErrMessageTooLarge", err)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<10 {
		t.Errorf("reader allocated %d bytes for a refused frame", grew)
	}
	rq := RequestHeader{Magic: Magic, Length: 1 << 20, AttachLength: 1}.AppendTo(nil)
	if _, _, _, err := ReadRequest(bytes.NewReader(rq), 1<<20); !errors.Is(err, ErrMessageTooLarge) {
		t.Errorf("request: err %v, want ErrMessageTooLarge", err)
	}
}

func TestTruncatedFrames(t *testing.T) {
	c := loadCaptures(t)[2] // MountSegment, 117-byte body
	reqHdr, reqBody, respHdr, respBody := c.bytes(t)
	req := append(append([]byte{}, reqHdr...), reqBody...)
	resp := append(append([]byte{}, respHdr...), respBody...)
	if _, _, _, err := ReadRequest(bytes.NewReader(nil), 0); !errors.Is(err, io.EOF) {
		t.Errorf("empty stream: %v, want io.EOF", err)
	}
	for _, n := range []int{1, 19, 20, 21, len(req) - 1} {
		_, _, _, err := ReadRequest(bytes.NewReader(req[:n]), 0)
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("request cut at %d of %d: %v, want io.ErrUnexpectedEOF", n, len(req), err)
		}
	}
	for _, n := range []int{1, 15, 16, len(resp) - 1} {
		_, _, _, err := ReadResponse(bytes.NewReader(resp[:n]), 0)
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("response cut at %d of %d: %v, want io.ErrUnexpectedEOF", n, len(resp), err)
		}
	}
}

func TestAttachmentFollowsBody(t *testing.T) {
	h := RequestHeader{Magic: Magic, Seq: 9, FunctionID: 1, Length: 3, AttachLength: 4}
	frame := append(h.AppendTo(nil), "abcWXYZ"...)
	got, body, attach, err := ReadRequest(bytes.NewReader(frame), 0)
	if err != nil || got != h || string(body) != "abc" || string(attach) != "WXYZ" {
		t.Fatalf("got %+v %q %q %v", got, body, attach, err)
	}
	// Appending to the body must not overwrite the attachment sharing its
	// allocation.
	_ = append(body, '!')
	if string(attach) != "WXYZ" {
		t.Fatalf("attachment clobbered: %q", attach)
	}
}
