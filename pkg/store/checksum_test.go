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

// A reader that found every replica of a key corrupt removes that
// version only: a version another writer put between its read and the
// removal stays (before, the removal was by key and lost it).
func TestCorruptDropSparesNewerVersion(t *testing.T) {
	c := startMaster(t, master.Config{})
	c.client(16 << 20)
	cl := c.client(0, func(cfg *store.Config) { cfg.Checksums = true })
	other := c.client(0, func(cfg *store.Config) { cfg.Checksums = true })
	ctx := context.Background()
	old, newer := value(64<<10, 1), value(64<<10, 2)
	if err := cl.Put(ctx, "k", old); err != nil {
		t.Fatal(err)
	}
	var replaced atomic.Bool
	store.SetAfterRead(cl, func(key string, b []byte) {
		b[0] ^= 0x01
		if replaced.CompareAndSwap(false, true) {
			// Another writer replaces the key while the bytes read are
			// checked.
			if err := other.Remove(ctx, "k", true); err != nil {
				t.Errorf("remove the old version: %v", err)
			}
			if err := other.Put(ctx, "k", newer); err != nil {
				t.Errorf("put the newer version: %v", err)
			}
		}
	})
	if _, err := cl.Get(ctx, "k"); store.CodeOf(err) != store.InvalidReplica {
		t.Fatalf("get of a corrupt version: %v, want INVALID_REPLICA", err)
	}
	store.SetAfterRead(cl, nil)
	got, err := other.Get(ctx, "k")
	if err != nil || !bytes.Equal(got, newer) {
		t.Fatalf("the version put after the corrupt read: %v (bytes are the newer version's: %v)", err, bytes.Equal(got, newer))
	}
	// The corrupt version itself still goes.
	store.SetAfterRead(cl, func(_ string, b []byte) { b[0] ^= 0x01 })
	if _, err := cl.Get(ctx, "k"); store.CodeOf(err) != store.InvalidReplica {
		t.Fatalf("second corrupt get: %v, want INVALID_REPLICA", err)
	}
	if ok, _ := other.Exist(ctx, "k"); ok {
		t.Fatal("the version found corrupt is still there")
	}
}
