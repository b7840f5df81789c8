package store_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/master"
)

// createDrain starts a drain job once the nodes have asked for drain
// tasks (a node does so right after it mounts).
func createDrain(t *testing.T, m *master.Master, req master.DrainRequest) store.UUID {
	t.Helper()
	var id store.UUID
	var err error
	waitFor(t, "the nodes to take drain tasks", 5*time.Second, func() bool {
		id, err = m.CreateDrainJob(req)
		return err == nil
	})
	return id
}

// A drained segment comes back into service without restarting its
// node, and a put that fails because drains keep every segment out of
// service says so (issue 40, item 7): before, it said "no segment has
// 1048576 free bytes (used 0 of 33554432)", with room in plain sight.
func TestUndoDrain(t *testing.T) {
	c := startMaster(t, master.Config{})
	a := c.client(16 << 20)
	b := c.client(16 << 20)
	cl := c.client(0)
	ctx := context.Background()
	segA, _ := a.Segment()
	segB, _ := b.Segment()
	id := createDrain(t, c.m, master.DrainRequest{Segments: []string{segA.Name, segB.Name}})
	if j := waitDrain(t, c.m, id, 10*time.Second); j.Status != master.DrainSucceeded {
		t.Fatalf("drain of two empty segments: %+v", j)
	}
	err := cl.Put(ctx, "k", value(1<<20, 1))
	if store.CodeOf(err) != store.NoAvailableHandle {
		t.Fatalf("put with every segment drained: %v, want NO_AVAILABLE_HANDLE", err)
	}
	for _, want := range []string{"no segment in service has 1048576 free bytes", "2 segments are draining/drained", segA.Name, "mc store drain --undo SEGMENT"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("put error %q does not say %q", err, want)
		}
	}
	if st := c.m.Stats(); st.EvictedKeys != 0 {
		t.Errorf("a put no eviction could serve evicted %d keys", st.EvictedKeys)
	}

	prev, err := c.m.UndrainSegment(segA.Name)
	if err != nil || prev != master.SegDrained {
		t.Fatalf("undo drain of %s: was %v, %v; want DRAINED, nil", segA.Name, prev, err)
	}
	if st, _ := c.m.SegmentStatusOf(segA.Name); st != master.SegOK {
		t.Fatalf("%s is %v after undo, want OK", segA.Name, st)
	}
	if err := cl.Put(ctx, "k", value(1<<20, 1), store.WithConfig(store.ReplicateConfig{ReplicaNum: 1, HardPin: true})); err != nil {
		t.Fatalf("put after undo: %v", err)
	}
	if reps, err := cl.Query(ctx, "k"); err != nil || len(reps) != 1 || reps[0].Segment != segA.Name {
		t.Fatalf("replicas of k after undo: %+v %v (want one, on %s)", reps, err, segA.Name)
	}
	// Idempotent, and a clear refusal for a segment that is not there.
	if prev, err := c.m.UndrainSegment(segA.Name); err != nil || prev != master.SegOK {
		t.Fatalf("undo of a segment in service: %v %v", prev, err)
	}
	if _, err := c.m.UndrainSegment("no-such-seg"); store.CodeOf(err) != store.SegmentNotFound {
		t.Fatalf("undo of an unknown segment: %v", err)
	}
	// One segment drained, the other holding a pinned object: eviction
	// cannot make room, and the hint says where the room went.
	err = cl.Put(ctx, "big", value(16<<20-4096, 2), store.WithConfig(store.ReplicateConfig{ReplicaNum: 1, PreferredSegments: []string{segA.Name}}))
	if err == nil || !strings.Contains(err.Error(), "1 segment is draining/drained ("+segB.Name) {
		t.Fatalf("put beyond the segment in service: %v", err)
	}
}

// Undo of a DRAINING segment cancels the job draining it alone; one
// draining it with others is refused, naming the job.
func TestUndoDrainWhileDraining(t *testing.T) {
	c := startMaster(t, master.Config{})
	a := c.client(16 << 20)
	b := c.client(16 << 20)
	c.client(16 << 20)
	segA, _ := a.Segment()
	segB, _ := b.Segment()
	// A put being written on A keeps a drain of A running.
	r := c.m.BatchPutStart(store.NewUUID(), "", []master.PutItem{{Key: "w", Size: 4096}}, store.ReplicateConfig{ReplicaNum: 1, PreferredSegments: []string{segA.Name}})[0]
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	id := createDrain(t, c.m, master.DrainRequest{Segments: []string{segA.Name, segB.Name}})
	_, err := c.m.UndrainSegment(segA.Name)
	if store.CodeOf(err) != store.UnavailableInCurrentStatus || !strings.Contains(err.Error(), id.String()) || !strings.Contains(err.Error(), segB.Name) {
		t.Fatalf("undo of one segment of a two-segment job: %v", err)
	}
	if err := c.m.CancelDrainJob(id); err != nil {
		t.Fatal(err)
	}
	waitDrain(t, c.m, id, 5*time.Second)

	id = createDrain(t, c.m, master.DrainRequest{Segments: []string{segA.Name}})
	prev, err := c.m.UndrainSegment(segA.Name)
	if err != nil || prev != master.SegDraining {
		t.Fatalf("undo of a draining segment: was %v, %v", prev, err)
	}
	if j := waitDrain(t, c.m, id, 5*time.Second); j.Status != master.DrainCanceled {
		t.Fatalf("the job draining the undone segment: %+v, want CANCELED", j)
	}
	if st, _ := c.m.SegmentStatusOf(segA.Name); st != master.SegOK {
		t.Fatalf("%s is %v, want OK", segA.Name, st)
	}
}
