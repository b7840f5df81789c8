package ha_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/store/mooncake"
)

// TestResizeAcrossFailover: an upsert that resizes its object is granted,
// and the leader dies before the writer ends it. The next leader restores
// the resize as under way on the object, as the dead leader had it: the
// writer's revoke gives it back (the old version stays readable, and the
// writer learns that its upsert was not stored), and the writer's End
// completes it. Before, the next leader held the resize as a reservation
// only, answered the writer's revoke "complete", and mc's client took
// that for its End having landed (make soak with HA: upserts acknowledged
// across a failover, the version before them read back).
func TestResizeAcrossFailover(t *testing.T) {
	h := newHarness(t)
	h.candidate()
	h.candidate()
	lead := h.leader(5 * time.Second)
	h.client(64 << 20) // the node
	cl := h.client(0)
	ctx := context.Background()
	keys := []string{"revoked", "ended"}
	for _, k := range keys {
		if err := cl.Put(ctx, k, value(k, 4096)); err != nil {
			t.Fatal(err)
		}
	}
	w := mooncake.UUID{First: 77, Second: 1}
	rc := mooncake.ReplicateConfig{ReplicaNum: 1, PreferredSegments: []string{}, PreferredNoFSegments: []string{}}
	wire := mooncake.NewClient(lead.Advertise(), nil)
	defer wire.Close()
	grant := map[string]uint64{}
	for _, k := range keys {
		d, err := wire.PutStart(ctx, w, k, 8192, rc, true)
		if err != nil {
			t.Fatalf("upsert start %q: %v", k, err)
		}
		b, ok := d[0].Memory()
		if len(d) != 1 || !ok {
			t.Fatalf("upsert start %q: %+v", k, d)
		}
		grant[k] = b.BufferAddress
	}
	h.forget(lead)
	lead.Kill()
	next := h.leader(testLease + 2*time.Second)
	wire2 := mooncake.NewClient(next.Advertise(), nil)
	defer wire2.Close()

	if err := wire2.PutRevoke(ctx, w, "revoked", true); err != nil {
		t.Fatalf("the writer's revoke of its resize after the failover: %v (want it given back)", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		v, err := cl.Get(ctx, "revoked")
		if err == nil {
			if !bytes.Equal(v, value("revoked", 4096)) {
				t.Fatalf("get after the revoked resize: %d bytes, not the version before it", len(v))
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("get after the revoked resize: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}

	if err := wire2.PutEnd(ctx, w, "ended", true); err != nil {
		t.Fatalf("the writer's End of its resize after the failover: %v", err)
	}
	r, err := wire2.GetReplicaList(ctx, "ended")
	if err != nil {
		t.Fatal(err)
	}
	if b, ok := r.Replicas[0].Memory(); len(r.Replicas) != 1 || !ok || b.BufferAddress != grant["ended"] || b.Size != 8192 {
		t.Fatalf("after the End: replicas %+v, want the resize's range 0x%x of 8192 bytes", r.Replicas, grant["ended"])
	}
}
