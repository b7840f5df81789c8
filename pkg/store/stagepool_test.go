package store

import (
	"context"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine"
)

// TestStagingReleaseByOwner: a reader's hand-back (ReleaseStaged, or the
// release list of its next read) frees only readers' batches; an id of a
// master's load, sent by a reader, must not free a range the master's
// transfer may still be reading (that copy would carry another record's
// bytes), and the master frees only its own.
func TestStagingReleaseByOwner(t *testing.T) {
	ctx := context.Background()
	e, err := engine.New(ctx, engine.Config{BindAddress: "127.0.0.1", HandshakeAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	mem, err := e.RegisterMemory(ctx, 1<<20, "cpu:0", true)
	if err != nil {
		t.Fatal(err)
	}
	p, err := newStagingPool(mem, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	stage := func(master bool) uint64 {
		addrs, gen, _, err := p.take(ctx, []uint64{4096})
		if err != nil {
			t.Fatal(err)
		}
		return p.add(gen, addrs, []uint64{4096}, master)
	}
	mid, rid := stage(true), stage(false)
	if p.release(mid, false) {
		t.Fatal("a reader's hand-back freed a master's staged batch")
	}
	if p.release(rid, true) {
		t.Fatal("the master's RELEASE freed a reader's staged batch")
	}
	if !p.release(mid, true) || !p.release(rid, false) {
		t.Fatal("an owner could not free its own staged batch")
	}
	if p.release(rid, false) {
		t.Fatal("a batch was freed twice")
	}
}
