package store

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/kvcache-ops/mc/pkg/store/storepb"
)

func goodTable() *pb.ReplicaTable {
	return &pb.ReplicaTable{
		Segments: []*pb.ReplicaTable_SegmentRef{
			{SegmentName: "a:1", TeEndpoint: "a:1", Protocol: "tcp"},
			{SegmentName: "b:2", TeEndpoint: "b:2", Protocol: "rdma"},
		},
		// Key 0: two replicas; key 1 failed; key 2: one replica.
		Codes:         []int32{0, int32(ObjectNotFound), 0},
		LeaseTtlMs:    []uint64{5000, 0, 5000},
		ReplicaCounts: []uint32{2, 0, 1},
		Messages:      []string{"OBJECT_NOT_FOUND: key \"x\" not found"},
		Segment:       []uint32{0, 1, 1},
		Address:       []uint64{4096, 8192, 12288},
		Length:        []uint64{100, 100, 7},
		Status:        []pb.ReplicaStatus{pb.ReplicaStatus_COMPLETE, pb.ReplicaStatus_COMPLETE, pb.ReplicaStatus_PROCESSING},
	}
}

func TestReplicaTableFromPB(t *testing.T) {
	reps, errs, err := replicaTableFromPB(goodTable(), 3)
	if err != nil {
		t.Fatal(err)
	}
	want0 := []Replica{{Segment: "a:1", Endpoint: "a:1", Protocol: "tcp", Addr: 4096, Len: 100, Complete: true, Lease: 5 * time.Second},
		{Segment: "b:2", Endpoint: "b:2", Protocol: "rdma", Addr: 8192, Len: 100, Complete: true, Lease: 5 * time.Second}}
	if len(reps[0]) != 2 || reps[0][0] != want0[0] || reps[0][1] != want0[1] || errs[0] != nil {
		t.Fatalf("key 0: %+v %v", reps[0], errs[0])
	}
	if CodeOf(errs[1]) != ObjectNotFound || !strings.Contains(errs[1].Error(), `key "x" not found`) || reps[1] != nil {
		t.Fatalf("key 1: %+v %v", reps[1], errs[1])
	}
	if len(reps[2]) != 1 || reps[2][0].Addr != 12288 || reps[2][0].Complete || cap(reps[0]) != 2 {
		t.Fatalf("key 2: %+v (key 0's slice must not reach into it: cap %d)", reps[2], cap(reps[0]))
	}
	bad := map[string]func(*pb.ReplicaTable){
		"keys":             func(x *pb.ReplicaTable) { x.Codes = x.Codes[:2] },
		"replica columns":  func(x *pb.ReplicaTable) { x.Length = x.Length[:2] },
		"segment index":    func(x *pb.ReplicaTable) { x.Segment[2] = 2 },
		"counts too high":  func(x *pb.ReplicaTable) { x.ReplicaCounts[2] = 2 },
		"counts too low":   func(x *pb.ReplicaTable) { x.ReplicaCounts[0] = 1 },
		"missing message":  func(x *pb.ReplicaTable) { x.Messages = nil },
		"message too many": func(x *pb.ReplicaTable) { x.Messages = append(x.Messages, "extra") },
		"disk columns":     func(x *pb.ReplicaTable) { withDisk(x); x.DiskTier = x.DiskTier[:2] },
		"disk keys":        func(x *pb.ReplicaTable) { withDisk(x); x.DiskKey = x.DiskKey[:1] },
	}
	for name, f := range bad {
		x := goodTable()
		f(x)
		if _, _, err := replicaTableFromPB(x, 3); CodeOf(err) != RPCFail || !strings.Contains(err.Error(), "malformed replica table") {
			t.Errorf("%s: %v, want RPC_FAIL naming the malformed table", name, err)
		}
	}
}

// withDisk makes key 2's one replica its record on a node's disk, stored
// under a tenant's scoped key.
func withDisk(x *pb.ReplicaTable) {
	x.DiskVersion, x.DiskService, x.DiskTier = []uint64{0, 0, 7}, []string{"", "", "b:9"}, []string{"", "", "t1"}
	x.DiskKey = []string{"", "", "a\x00k"}
}

// A disk record's stored key reaches the reader (with tenants it is not
// the key asked), and an absent column means the key asked.
func TestReplicaTableDiskKey(t *testing.T) {
	x := goodTable()
	withDisk(x)
	reps, _, err := replicaTableFromPB(x, 3)
	if err != nil {
		t.Fatal(err)
	}
	if d := reps[2][0].Disk; d == nil || d.Key != "a\x00k" || d.Version != 7 || d.Service != "b:9" || d.Tier != "t1" {
		t.Fatalf("key 2's disk record: %+v", d)
	}
	x.DiskKey = nil
	if reps, _, err = replicaTableFromPB(x, 3); err != nil || reps[2][0].Disk == nil || reps[2][0].Disk.Key != "" {
		t.Fatalf("no disk_key column: %+v, %v", reps[2][0].Disk, err)
	}
}

// FuzzReplicaTable: whatever a master (or anything on its port) sends, the
// decoder returns an error or replicas that add up, never panics.
func FuzzReplicaTable(f *testing.F) {
	good, _ := proto.Marshal(goodTable())
	f.Add(good, 3)
	f.Add([]byte{}, 0)
	f.Add(good[:len(good)/2], 3)
	f.Fuzz(func(t *testing.T, b []byte, n int) {
		if n < 0 || n > 1<<16 {
			return
		}
		var x pb.ReplicaTable
		if proto.Unmarshal(b, &x) != nil {
			return
		}
		reps, errs, err := replicaTableFromPB(&x, n)
		if err != nil {
			return
		}
		total := 0
		for i := range n {
			if (errs[i] != nil) == (x.Codes[i] == 0) {
				t.Fatalf("key %d: code %d but error %v", i, x.Codes[i], errs[i])
			}
			total += len(reps[i])
		}
		if total != len(x.Segment) {
			t.Fatalf("%d replicas decoded of %d sent", total, len(x.Segment))
		}
	})
}
