package engine_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine"
)

// Renew revokes every grant of the old memory: a peer whose handle still
// describes it (a writer stalled across a master restart) fails, and the
// new memory at its new address gets none of its bytes. Over tcp the
// target's registry refuses the old range; over shm the old region is
// retired and the new one is another memfd.
func TestRenewFencesStaleHandles(t *testing.T) {
	for _, proto := range []string{"tcp", engine.ProtocolSHM} {
		t.Run(proto, func(t *testing.T) {
			ctx := context.Background()
			mod := func(c *engine.Config) {}
			if proto == engine.ProtocolSHM {
				mod = withProtocol(engine.ProtocolSHM)
			}
			target := newEngine(t, mod)
			old := register(t, target, 1<<20, true)
			init := newEngine(t, mod)
			src := register(t, init, 1<<20, false)
			fill(src.Bytes(), 9)
			stale := openSeg(t, init, target.SegmentName())
			if got := stale.Transport(); got != proto {
				t.Fatalf("segment opened via %q, want %q", got, proto)
			}
			if err := init.Transfer(ctx, engine.Request{Op: engine.Write, Source: src.Addr(), Segment: stale, Target: old.Addr(), Length: 4096}); err != nil {
				t.Fatalf("write before renew: %v", err)
			}
			oldAddr := old.Addr()
			fresh, err := target.Renew(ctx, old)
			if err != nil {
				t.Fatal(err)
			}
			if fresh.Addr() == oldAddr || fresh.Len() != 1<<20 {
				t.Fatalf("renewed memory at 0x%x (%d bytes), old at 0x%x", fresh.Addr(), fresh.Len(), oldAddr)
			}
			if !stale.Holds(oldAddr, 4096) || stale.Holds(fresh.Addr(), 4096) {
				t.Fatal("the stale handle should still describe the old memory only")
			}
			err = init.Transfer(ctx, engine.Request{Op: engine.Write, Source: src.Addr(), Segment: stale, Target: oldAddr, Length: 1 << 20})
			if err == nil {
				t.Fatal("a write through the stale handle succeeded")
			}
			t.Logf("stale write: %v", err)
			if !bytes.Equal(fresh.Bytes(), make([]byte, 1<<20)) {
				t.Fatal("the renewed memory got bytes of the stale write")
			}
			// A handle opened now reaches the new memory.
			seg := openSeg(t, init, target.SegmentName())
			if err := init.Transfer(ctx, engine.Request{Op: engine.Write, Source: src.Addr(), Segment: seg, Target: fresh.Addr(), Length: 1 << 20}); err != nil {
				t.Fatalf("write to the renewed memory: %v", err)
			}
			if !bytes.Equal(fresh.Bytes(), src.Bytes()) {
				t.Fatal("renewed memory differs from what was written")
			}
		})
	}
}

// A transfer still under way into the old memory (a writer stalled
// mid-payload, here a pin) does not hold up Renew: the old buffer is out
// of service at once and released when the transfer ends.
func TestRenewDoesNotWaitForStalledTransfers(t *testing.T) {
	ctx := context.Background()
	target := newEngine(t, func(c *engine.Config) { c.UnregisterGrace = 10 * time.Second })
	old := register(t, target, 1<<20, true)
	if !old.Pin() {
		t.Fatal("pin")
	}
	t0 := time.Now()
	fresh, err := target.Renew(ctx, old)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d > 2*time.Second {
		t.Fatalf("Renew waited %s for a transfer into the old memory", d)
	}
	for _, m := range target.Memory() {
		if m == old {
			t.Fatal("the old memory is still registered")
		}
	}
	if fresh.Addr() == old.Addr() {
		t.Fatal("renewed at the same address")
	}
	old.Bytes()[0] = 1 // still mapped while the transfer holds it
	old.Unpin()
	deadline := time.Now().Add(5 * time.Second)
	for old.Pin() {
		old.Unpin()
		if time.Now().After(deadline) {
			t.Fatal("the old memory was never released after its last transfer")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
