package meta

import (
	"errors"
	"reflect"
	"testing"
)

func TestFileSegment(t *testing.T) {
	in := `{"buffers":[{"file_path":"/dev/nvme0n1p1","length":1073741824,"local_path_map":{"host-a":"/mnt/nvmeof/0","host-b":"/mnt/x"}}],"future":1}`
	d, err := DecodeFileSegment("f", []byte(in))
	if err != nil {
		t.Fatal(err)
	}
	want := &FileSegmentDesc{Buffers: []FileBufferDesc{{Length: 1 << 30, FilePath: "/dev/nvme0n1p1", LocalPathMap: map[string]string{"host-a": "/mnt/nvmeof/0", "host-b": "/mnt/x"}}}}
	if !reflect.DeepEqual(d, want) {
		t.Fatalf("decoded %+v", d)
	}
	out, err := EncodeFileSegment(d)
	if err != nil {
		t.Fatal(err)
	}
	if g, w := generic(t, out), generic(t, []byte(in)); len(g) != 1 || !reflect.DeepEqual(g["buffers"], w["buffers"]) {
		t.Fatalf("re-encoded %s", out)
	}
	if FileSegmentKey("c", "f") != "mooncake/c/nvmeof/f" || FileSegmentKey("", "f") != "mooncake/nvmeof/f" {
		t.Fatal("FileSegmentKey")
	}
	for bad, msg := range map[string]string{
		`{"buffers":[{"length":1}]}`:                    `segment "f": buffers[0].file_path is empty`,
		`{"buffers":[{"file_path":"/x","length":0}]}`:   `segment "f": buffers[0].length is 0`,
		`{"buffers":[{"file_path":"/x","length":"1"}]}`: `segment "f": is not valid file segment JSON`,
	} {
		_, err := DecodeFileSegment("f", []byte(bad))
		if !errors.Is(err, ErrMalformed) || len(err.Error()) < len(msg) || err.Error()[:len(msg)] != msg {
			t.Errorf("%s: %v, want %q", bad, err, msg)
		}
	}
}
