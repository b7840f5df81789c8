package ha_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/master"
)

// A leader running a drain is killed: the new leader knows the job from
// the op log and reports it FAILED with why; the copies committed before
// the kill are there; a new drain then finishes the work.
func TestDrainAcrossFailover(t *testing.T) {
	h := newHarness(t)
	h.candidate()
	h.candidate()
	old := h.leader(5 * time.Second)
	a := h.client(32 << 20)
	b := h.client(32 << 20)
	cl := h.client(0)
	ctx := context.Background()
	segA, _ := a.Segment()
	segB, _ := b.Segment()
	const n, size = 150, 64 << 10
	for i := range n {
		k := fmt.Sprintf("d%03d", i)
		if err := cl.Put(ctx, k, value(k, size), store.WithConfig(store.ReplicateConfig{ReplicaNum: 1, PreferredSegments: []string{segA.Name}})); err != nil {
			t.Fatal(err)
		}
	}
	id, err := old.Master().CreateDrainJob(master.DrainRequest{Segments: []string{segA.Name}, MaxConcurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		j, err := old.Master().QueryDrainJob(id)
		if err != nil {
			t.Fatal(err)
		}
		if j.Succeeded >= 5 {
			break
		}
		if j.Status.Done() || time.Now().After(deadline) {
			t.Fatalf("drain before the kill: %+v", j)
		}
		time.Sleep(2 * time.Millisecond)
	}
	h.forget(old)
	old.Kill()
	next := h.leader(testLease + 5*time.Second)
	j, err := next.Master().QueryDrainJob(id)
	if err != nil {
		t.Fatalf("the new leader does not know the drain job: %v", err)
	}
	if j.Status != master.DrainFailed || !strings.Contains(j.Message, "lost leadership") {
		t.Fatalf("drain job on the new leader: %s %q", j.Status, j.Message)
	}
	// Copies committed before the kill are in the new leader's metadata.
	var onB int
	for i := range n {
		reps, err := cl.Query(ctx, fmt.Sprintf("d%03d", i))
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range reps {
			if r.Segment == segB.Name {
				onB++
			}
		}
	}
	if onB < 5 {
		t.Fatalf("%d objects have their copy on B after the failover, want >= 5", onB)
	}
	// The segments are in service again; a new drain finishes the work.
	var id2 store.UUID
	for end := time.Now().Add(5 * time.Second); ; {
		if id2, err = next.Master().CreateDrainJob(master.DrainRequest{Segments: []string{segA.Name}, Unmount: true}); err == nil {
			break
		}
		if time.Now().After(end) { // A re-mounts on the new leader within a ping or two
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for end := time.Now().Add(20 * time.Second); ; {
		j2, _ := next.Master().QueryDrainJob(id2)
		if j2.Status.Done() {
			if j2.Status != master.DrainSucceeded || !j2.Unmounted {
				t.Fatalf("second drain: %+v", j2)
			}
			break
		}
		if time.Now().After(end) {
			t.Fatalf("second drain still %s", j2.Status)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for i := range n {
		k := fmt.Sprintf("d%03d", i)
		got, err := cl.Get(ctx, k)
		if err != nil || !bytes.Equal(got, value(k, size)) {
			t.Fatalf("get %s after the drains: %v", k, err)
		}
	}
}
