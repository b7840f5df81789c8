package store_test

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/master"
)

func onSegment(name string) store.PutOption {
	return store.WithConfig(store.ReplicateConfig{ReplicaNum: 1, PreferredSegments: []string{name}})
}

func waitDrain(t *testing.T, m *master.Master, id store.UUID, d time.Duration) master.DrainJob {
	t.Helper()
	var j master.DrainJob
	waitFor(t, "the drain job to end", d, func() bool {
		var err error
		if j, err = m.QueryDrainJob(id); err != nil {
			t.Fatal(err)
		}
		return j.Status.Done()
	})
	return j
}

// Two nodes: everything that lived only on A is copied to B by A's
// engine, byte for byte, while clients keep reading and writing; A is
// then unmounted and nothing is lost.
func TestDrainMovesBytesWhileServing(t *testing.T) {
	c := startMaster(t, master.Config{})
	a := c.client(32 << 20)
	c.client(32 << 20)
	cl := c.client(0)
	ctx := context.Background()
	segA, _ := a.Segment()
	vals := map[string][]byte{}
	for i := range 60 {
		k := fmt.Sprintf("obj/%03d", i)
		vals[k] = value(100<<10+i*13, byte(i))
		if err := cl.Put(ctx, k, vals[k], onSegment(segA.Name)); err != nil {
			t.Fatal(err)
		}
	}
	// Service goes on: reads of the drained keys and new puts.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var reads, puts atomic.Int64
	errs := make(chan error, 2)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			k := fmt.Sprintf("obj/%03d", i%60)
			got, err := cl.Get(ctx, k)
			if err != nil || !bytes.Equal(got, vals[k]) {
				errs <- fmt.Errorf("get %s during the drain: %v", k, err)
				return
			}
			reads.Add(1)
			if err := cl.Put(ctx, fmt.Sprintf("new/%d", i), value(4096, byte(i))); err != nil {
				errs <- fmt.Errorf("put during the drain: %v", err)
				return
			}
			puts.Add(1)
		}
	}()
	id, err := c.m.CreateDrainJob(master.DrainRequest{Segments: []string{segA.Name}, Unmount: true})
	if err != nil {
		t.Fatal(err)
	}
	j := waitDrain(t, c.m, id, 20*time.Second)
	close(stop)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	if j.Status != master.DrainSucceeded || !j.Unmounted || j.Succeeded < 60 {
		t.Fatalf("job %+v", j)
	}
	if reads.Load() == 0 || puts.Load() == 0 {
		t.Fatalf("no service during the drain (%d reads, %d puts)", reads.Load(), puts.Load())
	}
	if st := a.Stats(); st.DrainCopies < 60 {
		t.Fatalf("node A made %d copies, want >= 60", st.DrainCopies)
	}
	for k, want := range vals {
		got, err := cl.Get(ctx, k)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("get %s after the drain: %v (equal %v)", k, err, bytes.Equal(got, want))
		}
		reps, _ := cl.Query(ctx, k)
		if len(reps) != 1 || reps[0].Segment == segA.Name {
			t.Fatalf("%s replicas after the drain and unmount: %+v", k, reps)
		}
	}
}

// The draining node SIGKILLed mid-job: the job fails with a clear state
// once the master drops the node, and every copy made so far reads back.
func TestDrainSourceKilled(t *testing.T) {
	c := startMaster(t, master.Config{ClientTTL: 500 * time.Millisecond})
	child, childSeg := startChildNode(t, c.addr)
	c.client(64 << 20)
	cl := c.client(0)
	ctx := context.Background()
	vals := map[string][]byte{}
	for i := range 200 {
		k := fmt.Sprintf("k%03d", i)
		vals[k] = value(128<<10, byte(i))
		if err := cl.Put(ctx, k, vals[k], onSegment(childSeg)); err != nil {
			t.Fatal(err)
		}
	}
	id, err := c.m.CreateDrainJob(master.DrainRequest{Segments: []string{childSeg}, MaxConcurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "some copies", 10*time.Second, func() bool {
		j, _ := c.m.QueryDrainJob(id)
		return j.Succeeded >= 5
	})
	child.Process.Kill()
	child.Wait()
	j := waitDrain(t, c.m, id, 10*time.Second)
	if j.Status != master.DrainFailed || j.Code != store.SegmentNotFound {
		t.Fatalf("job %+v: want FAILED, segment not found", j)
	}
	var ok int
	for k, want := range vals {
		got, err := cl.Get(ctx, k)
		if err != nil {
			continue
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s: a copy made before the kill reads back wrong", k)
		}
		ok++
	}
	if ok < j.Succeeded || ok == len(vals) {
		t.Fatalf("%d objects read back; the job copied %d of %d", ok, j.Succeeded, len(vals))
	}
}

// A target node SIGKILLed mid-job: copies to it fail and are made again
// on another node; the job succeeds and every object reads back. The
// target is stopped (SIGSTOP) as soon as a few copies are done, so its
// copies hang rather than finish, then killed; a run whose job had ended
// before the kill (on a loaded machine 100 copies take 0.2 s, and the
// copies the target held then die with it after the job's check) is
// made again.
func TestDrainTargetKilled(t *testing.T) {
	var (
		c    *cluster
		cl   *store.Client
		segB store.SegmentInfo
		id   store.UUID
		vals map[string][]byte
		ctx  = context.Background()
	)
	for attempt := 0; ; attempt++ {
		c = startMaster(t, master.Config{ClientTTL: 500 * time.Millisecond})
		a := c.client(32 << 20)
		child, childSeg := startChildNode(t, c.addr)
		b := c.client(32 << 20)
		cl = c.client(0)
		segA, _ := a.Segment()
		segB, _ = b.Segment()
		vals = map[string][]byte{}
		for i := range 100 {
			k := fmt.Sprintf("k%03d", i)
			vals[k] = value(128<<10, byte(i))
			if err := cl.Put(ctx, k, vals[k], onSegment(segA.Name)); err != nil {
				t.Fatal(err)
			}
		}
		var err error
		id, err = c.m.CreateDrainJob(master.DrainRequest{Segments: []string{segA.Name}, Targets: []string{childSeg, segB.Name}, MaxConcurrency: 2})
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, "some copies", 10*time.Second, func() bool {
			j, _ := c.m.QueryDrainJob(id)
			return j.Succeeded >= 5
		})
		child.Process.Signal(syscall.SIGSTOP)
		child.Process.Kill()
		child.Wait()
		if j, _ := c.m.QueryDrainJob(id); j.Finished.IsZero() {
			break
		}
		if attempt == 4 {
			t.Fatal("the job ended before its target was killed, 5 times")
		}
	}
	j := waitDrain(t, c.m, id, 20*time.Second)
	if j.Status != master.DrainSucceeded {
		t.Fatalf("job %+v: want SUCCEEDED with the dead target's copies made elsewhere", j)
	}
	waitFor(t, "the dead target dropped", 5*time.Second, func() bool { return len(c.m.Segments()) == 2 })
	for k, want := range vals {
		reps, err := cl.Query(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		var onB bool
		for _, r := range reps {
			onB = onB || r.Segment == segB.Name
		}
		if !onB {
			t.Fatalf("%s has no copy on the surviving target: %+v", k, reps)
		}
		if got, err := cl.Get(ctx, k); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("get %s: %v", k, err)
		}
	}
}
