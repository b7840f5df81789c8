package master

import (
	"fmt"
	"testing"

	"github.com/kvcache-ops/mc/pkg/store"
)

// A writer that could not write one replica ends its put with the
// other: the failed replica is dropped and its space freed, its segment
// is avoided until its node pings, and the ping brings it back.
func TestPutEndDropsFailedReplicaAndAvoidsSegment(t *testing.T) {
	m, _ := newTestMaster(t, Config{})
	mount(t, m, "n1", "s1", "10.0.0.1", 0, 64*MiB)
	mount(t, m, "n2", "s2", "10.0.0.2", 1<<40, 64*MiB)
	two := store.ReplicateConfig{ReplicaNum: 2}
	reps := putStart(t, m, "w", "k", 4*KiB, two)
	if len(reps) != 2 {
		t.Fatalf("%d replicas granted, want 2", len(reps))
	}
	used := m.space.used.Load()
	errs := m.BatchPutEndFailed(uuidOf("w"), []string{"k"}, nil, []FailedReplica{{Key: 0, Segment: "s2"}})
	if errs[0] != nil {
		t.Fatalf("put end with one failed replica: %v", errs[0])
	}
	r := get(m, "k")
	if r.Err != nil || len(r.Replicas) != 1 || r.Replicas[0].Segment != "s1" {
		t.Fatalf("k after its s2 replica failed: %+v %v, want one replica on s1", r.Replicas, r.Err)
	}
	if got := m.space.used.Load(); got != used-4*KiB {
		t.Errorf("used %d after the drop, want %d (the failed replica's space freed)", got, used-4*KiB)
	}
	if metric(t, m, "mc_store_put_replicas_dropped_total") != 1 || metric(t, m, "mc_store_unreachable_segments") != 1 {
		t.Error("the dropped replica or the unreachable segment is not counted")
	}
	// Avoided: a put asking for 2 gets the one segment left.
	for i := range 5 {
		if reps := put(t, m, "w", fmt.Sprint("avoid", i), 4*KiB, two); len(reps) != 1 || reps[0].Segment != "s1" {
			t.Fatalf("put %d while s2 is unreachable: %+v, want one replica on s1", i, reps)
		}
	}
	// Another node's ping proves nothing about s2.
	m.Ping(uuidOf("n1"))
	if reps := put(t, m, "w", "still", 4*KiB, two); len(reps) != 1 {
		t.Fatalf("put after n1 pinged: %d replicas, want 1 (s2 still avoided)", len(reps))
	}
	// Its own node's ping does.
	m.Ping(uuidOf("n2"))
	if reps := put(t, m, "w", "back", 4*KiB, two); len(reps) != 2 {
		t.Fatalf("put after n2 pinged: %d replicas, want 2", len(reps))
	}
	if metric(t, m, "mc_store_unreachable_segments") != 0 {
		t.Error("s2 still counted unreachable after its node pinged")
	}
	mustInvariants(t, m)
}

// When every segment with room was reported unreachable, a put is still
// placed (the report may be the writer's own trouble) rather than
// refused; and a put end that would keep no replica is refused and
// changes nothing.
func TestUnreachableOnlySegmentStillPlaced(t *testing.T) {
	m, _ := newTestMaster(t, Config{})
	mount(t, m, "n1", "s1", "10.0.0.1", 0, 64*MiB)
	putStart(t, m, "w", "k", 4*KiB)
	err := m.BatchPutEndFailed(uuidOf("w"), []string{"k"}, nil, []FailedReplica{{Key: 0, Segment: "s1"}})[0]
	wantCode(t, "put end with its only replica failed", err, store.InvalidParams)
	if errs := m.BatchPutRevoke(uuidOf("w"), []string{"k"}); errs[0] != nil {
		t.Fatalf("revoke after the refused end: %v", errs[0])
	}
	if reps := put(t, m, "w", "k2", 4*KiB); len(reps) != 1 {
		t.Fatalf("put with the only segment unreachable: %d replicas", len(reps))
	}
	if e := m.BatchPutEndFailed(uuidOf("w"), []string{"k"}, nil, []FailedReplica{{Key: 3, Segment: "s1"}})[0]; store.CodeOf(e) != store.InvalidParams {
		t.Errorf("failed replica of key 3 in a batch of 1: %v, want INVALID_PARAMS", e)
	}
	mustInvariants(t, m)
}
