package store

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/kvcache-ops/mc/pkg/store/storepb"
)

// TestCheckElements: the elements of repeated fields (packed varints one
// each, nested messages' too) count together against the limit, read off
// the wire without decoding.
func TestCheckElements(t *testing.T) {
	req := &pb.SessionRequest{Call: &pb.SessionRequest_PutEnd{PutEnd: &pb.BatchKeysRequest{
		Keys: make([]string, 10), Checksums: []uint64{1, 300, 1 << 40, 0, 7}}}}
	b, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	md := req.ProtoReflect().Descriptor()
	const total = 10 + 5
	for _, limit := range []int{total, total + 1, 1 << 20} {
		if err := CheckElements(b, md, limit); err != nil {
			t.Errorf("limit %d: %v", limit, err)
		}
	}
	for _, limit := range []int{0, 10, total - 1} {
		err := CheckElements(b, md, limit)
		if !errors.Is(err, ErrInvalidParams) || !strings.Contains(err.Error(), "elements in repeated fields") {
			t.Errorf("limit %d: %v; want INVALID_PARAMS", limit, err)
		}
	}
	// Garbage is the decoder's to report.
	if err := CheckElements([]byte{0xff, 0xff, 0xff}, md, 1); err != nil {
		t.Errorf("garbage: %v", err)
	}
}
