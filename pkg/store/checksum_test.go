package store_test

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/master"
)

// A replica whose bytes are not what was put (here: flipped as they are
// read) is never returned: the get reads another replica, and a key with
// no good replica fails INVALID_REPLICA and is removed. Mismatches are
// counted by the client and, through its pings, in the master's
// /metrics.
func TestChecksumCatchesWrongBytes(t *testing.T) {
	c := startMaster(t, master.Config{})
	c.client(16 << 20)
	c.client(16 << 20)
	cl := c.client(0, func(cfg *store.Config) { cfg.Checksums = true })
	ctx := context.Background()
	v := value(1<<20, 5)
	if err := cl.Put(ctx, "two", v, store.WithReplicas(2)); err != nil {
		t.Fatal(err)
	}
	if err := cl.Put(ctx, "one", v); err != nil {
		t.Fatal(err)
	}
	var flips atomic.Int64
	store.SetAfterRead(cl, func(key string, b []byte) {
		if key == "one" || flips.Add(1) == 1 {
			b[len(b)/2] ^= 0x40 // the first read of "two", every read of "one"
		}
	})
	got, err := cl.Get(ctx, "two")
	if err != nil || !bytes.Equal(got, v) {
		t.Fatalf("get two with one bad replica: %v (bytes equal: %v)", err, bytes.Equal(got, v))
	}
	if _, err := cl.Get(ctx, "one"); store.CodeOf(err) != store.InvalidReplica {
		t.Fatalf("get one, whose only replica is bad: %v, want INVALID_REPLICA", err)
	}
	if ok, _ := cl.Exist(ctx, "one"); ok {
		t.Fatal("a key whose every replica failed its checksum is still there")
	}
	if n := cl.Stats().ChecksumMismatches; n != 2 {
		t.Fatalf("client counted %d mismatches, want 2", n)
	}
	waitFor(t, "the master to count the mismatches", 5*time.Second, func() bool {
		return gauge(t, c.m, "mc_store_checksum_mismatches_total") == 2
	})
	// With checksums off (the default) nothing is checked (and nothing
	// recorded).
	off := c.client(0)
	store.SetAfterRead(off, func(string, []byte) { t.Error("a client with checksums off checked one") })
	if err := off.Put(ctx, "plain", v); err != nil {
		t.Fatal(err)
	}
	if got, err := off.Get(ctx, "plain"); err != nil || !bytes.Equal(got, v) {
		t.Fatalf("get with checksums off: %v", err)
	}
	store.SetAfterRead(cl, nil)
	if reps, err := cl.Query(ctx, "plain"); err != nil || len(reps) != 1 {
		t.Fatalf("query plain: %v", err)
	}
}
