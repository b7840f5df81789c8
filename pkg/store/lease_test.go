package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/master"
)

// A writer that reads what it writes (issue 34, item 7): when every
// object is leased, a put that only needs a lease to end waits for it
// within its deadline instead of failing "nothing evictable: leased".
func TestPutWaitsForLeaseInsteadOfFailing(t *testing.T) {
	const ttl = 1500 * time.Millisecond
	c := startMaster(t, master.Config{KVLeaseTTL: ttl, HighWatermark: 1})
	c.client(4 << 20) // 4 regions of 1 MiB: 16 slots of 256 KiB
	cl := c.client(0)
	ctx := context.Background()
	leased := fillAndLease(t, cl, 15, ttl)
	// 300 KiB fits no free slot: room needs an eviction, and every
	// object is leased.
	err := cl.Put(ctx, "new", value(300<<10, 99))
	if err != nil {
		t.Fatalf("put into a pool of leased objects: %v (want it to wait for a lease to end)", err)
	}
	if waited := time.Since(leased); waited < ttl {
		t.Errorf("put returned after %s: it cannot have waited for a lease of %s", waited, ttl)
	}
	if n := gauge(t, c.m, "mc_store_put_lease_waits_total"); n < 1 {
		t.Errorf("%v lease waits counted", n)
	}
}

// Mooncake's semantics are kept for a put that may not wait (Mooncake's
// wire carries no wait): it fails at once, naming the leases.
func TestPutWithNoWaitFailsOnLeases(t *testing.T) {
	c := startMaster(t, master.Config{KVLeaseTTL: time.Minute, HighWatermark: 1})
	c.client(4 << 20)
	cl := c.client(0)
	ctx := context.Background()
	var keys []string
	for i := range 15 {
		key := fmt.Sprint("old", i)
		if err := cl.Put(ctx, key, value(256<<10, byte(i))); err != nil {
			t.Fatalf("fill %s: %v", key, err)
		}
		keys = append(keys, key)
	}
	cl.BatchGet(ctx, keys)
	r := c.m.BatchPutStart(store.UUID{First: 1, Second: 2}, "", []master.PutItem{{Key: "new", Size: 300 << 10}}, store.ReplicateConfig{ReplicaNum: 1})[0]
	if store.CodeOf(r.Err) != store.NoAvailableHandle {
		t.Fatalf("put start with no wait into leased objects: %v, want NO_AVAILABLE_HANDLE", r.Err)
	}
	// A deadline shorter than the leases: the put does not wait in vain.
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := cl.Put(short, "new", value(300<<10, 99)); store.CodeOf(err) != store.NoAvailableHandle {
		t.Fatalf("put with a deadline before any lease ends: %v, want NO_AVAILABLE_HANDLE", err)
	}
	if d := time.Since(start); d > 250*time.Millisecond {
		t.Errorf("a put that no lease end could serve took %s", d)
	}
}

// The same writer near the eviction watermark (issue 34, item 7, measured
// on real processes): a put that would take the store over the watermark
// while everything else is leased would be the watermark round's own
// victim, and was refused at once, though the leases ended within its
// deadline (a writer reading what it wrote had 27,111 of 28,032 puts
// refused in 10 s). It waits for them, as a put that needs room does.
func TestPutOverWatermarkWaitsForLeases(t *testing.T) {
	const ttl = 1500 * time.Millisecond
	c := startMaster(t, master.Config{KVLeaseTTL: ttl, HighWatermark: 0.9})
	c.client(4 << 20)
	cl := c.client(0)
	ctx := context.Background()
	leased := fillAndLease(t, cl, 14, ttl)
	// 93.75% with it: over the watermark, and every other object leased.
	if err := cl.Put(ctx, "new", value(256<<10, 99)); err != nil {
		t.Fatalf("put over the watermark into a pool of leased objects: %v (want it to wait for the leases to end)", err)
	}
	if waited := time.Since(leased); waited < ttl {
		t.Errorf("put returned after %s: it cannot have waited for a lease of %s", waited, ttl)
	}
	if n := gauge(t, c.m, "mc_store_put_lease_waits_total"); n < 1 {
		t.Errorf("%v lease waits counted", n)
	}
}

// A put start waits for read leases to end within the caller's deadline
// even when that deadline is later than the client's RPC timeout (issue
// 34 item 7: with 10 s leases and the 5 s RPC timeout, a writer that
// reads what it writes had half its puts refused in every lease cycle
// although it allowed them longer).
func TestPutWaitsForLeasePastRPCTimeout(t *testing.T) {
	const ttl = 1500 * time.Millisecond
	c := startMaster(t, master.Config{KVLeaseTTL: ttl, HighWatermark: 1})
	c.client(4 << 20)
	cl := c.client(0, func(cfg *store.Config) { cfg.RPCTimeout = 500 * time.Millisecond })
	ctx := context.Background()
	leased := fillAndLease(t, cl, 15, ttl)
	long, cancel := context.WithTimeout(ctx, 4*ttl)
	defer cancel()
	if err := cl.Put(long, "new", value(300<<10, 99)); err != nil {
		t.Fatalf("put with a deadline past the leases but an RPC timeout before them: %v (want it to wait)", err)
	}
	if waited := time.Since(leased); waited < ttl {
		t.Errorf("put returned after %s: it cannot have waited for a lease of %s", waited, ttl)
	}
}

// fillAndLease puts n objects of 256 KiB (old0...), lets them grow older
// than the lease TTL (evictable once unleased), then reads them all, so
// each holds a read lease granted after the time it returns.
func fillAndLease(t *testing.T, cl *store.Client, n int, ttl time.Duration) time.Time {
	t.Helper()
	ctx := context.Background()
	var keys []string
	for i := range n {
		key := fmt.Sprint("old", i)
		if err := cl.Put(ctx, key, value(256<<10, byte(i))); err != nil {
			t.Fatalf("fill %s: %v", key, err)
		}
		keys = append(keys, key)
	}
	time.Sleep(ttl + 50*time.Millisecond)
	leased := time.Now()
	if _, errs := cl.BatchGet(ctx, keys); errs[0] != nil {
		t.Fatalf("read: %v", errs[0])
	}
	return leased
}
