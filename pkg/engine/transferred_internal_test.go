package engine

import (
	"context"
	"errors"
	"testing"
)

// halfRoute moves half of each task, as a transport whose later slices
// failed, then fails it.
type halfRoute struct{}

func (halfRoute) Submit(tasks []*Task) {
	for _, t := range tasks {
		t.AddTransferred(t.Request().Length / 2)
		t.Complete(errors.New("second half failed"))
	}
}

func (halfRoute) Close() error { return nil }

func TestFailedTaskReportsBytesMoved(t *testing.T) {
	ctx := context.Background()
	e, err := New(ctx, Config{LocalServerName: "x", BindAddress: "127.0.0.1", HandshakeAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	m, err := e.RegisterMemory(ctx, 1<<16, "cpu:0", false)
	if err != nil {
		t.Fatal(err)
	}
	seg := &Segment{name: "half", route: halfRoute{}, localSeg: true, e: e}
	b, _ := e.AllocateBatch(1)
	if _, err := b.Submit(Request{Op: Read, Source: m.Addr(), Segment: seg, Target: m.Addr() + 4096, Length: 8192}); err != nil {
		t.Fatal(err)
	}
	b.Wait(ctx)
	st, _ := b.TaskStatus(0)
	if st.Status != Failed || st.Transferred != 4096 {
		t.Fatalf("status %+v, want FAILED with 4096 bytes moved", st)
	}
}
