package store_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/master"
)

// Tenants through the paths that move an object without its writer: the
// disk tier (offload on eviction, read back from disk) and a drain (a
// copy to another segment, the source unmounted). Each tenant reads its own bytes of the same
// key after the move, the other tenant's key stays invisible, and the
// quota ledger equals a recount of the objects.
func TestTenantsKeptByDiskTierAndDrain(t *testing.T) {
	ctx := context.Background()
	ledger := func(t *testing.T, m *master.Master) {
		t.Helper()
		for _, tn := range []string{"a", "b"} {
			if got, want := m.ChargedBytes(tn), m.TenantRecount(tn); got != want {
				t.Errorf("tenant %s: ledger charges %d bytes, its objects hold %d", tn, got, want)
			}
		}
	}
	read := func(t *testing.T, cl *store.Client, key string, want []byte, who string) {
		t.Helper()
		got, err := cl.Get(ctx, key)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("tenant %s reads %q: %d bytes, %v; want its own %d", who, key, len(got), err, len(want))
		}
	}

	t.Run("disk tier", func(t *testing.T) {
		cfg := multiTenant(t)
		cfg.PromoteAfter = -1
		c := startMaster(t, cfg)
		c.tierNodeWith(16<<20, store.TierConfig{Dir: t.TempDir(), Capacity: 256 << 20, StagingSize: 8 << 20})
		a := c.client(0, withTenant("a", false, c.addr))
		b := c.client(0, withTenant("b", false, c.addr))
		va, vb := value(1<<20, 1), value(1<<20, 2)
		putRetry(t, a, "k", va)
		putRetry(t, b, "k", vb)
		// 20 MiB more of each into a 16 MiB segment (each tenant's share
		// of it a third): the oldest of each go to disk.
		for i := range 20 {
			putRetry(t, a, fmt.Sprint("fill", i), value(1<<20, byte(i)))
			putRetry(t, b, fmt.Sprint("fill", i), value(1<<20, byte(i+100)))
		}
		waitFor(t, "the offloads to land", 60*time.Second, func() bool { return c.m.TierTotals().Inflight == 0 })
		if !diskOnly(t, a, "k") || !diskOnly(t, b, "k") {
			t.Fatalf("tenant a's and b's k should live on disk only by now")
		}
		read(t, a, "k", va, "a")
		read(t, b, "k", vb, "b")
		d := c.client(0, withTenant("", false, c.addr))
		if _, err := d.Get(ctx, "k"); !errors.Is(err, store.ErrObjectNotFound) {
			t.Fatalf("default tenant reads another tenant's disk object: %v", err)
		}
		ledger(t, c.m)
	})

	t.Run("drain", func(t *testing.T) {
		c := startMaster(t, multiTenant(t))
		n1 := c.client(16 << 20)
		c.client(16 << 20)
		seg1, _ := n1.Segment()
		a := c.client(0, withTenant("a", false, c.addr))
		b := c.client(0, withTenant("b", false, c.addr))
		va, vb := value(1<<20, 3), value(1<<20, 4)
		on1 := store.WithConfig(store.ReplicateConfig{ReplicaNum: 1, PreferredSegments: []string{seg1.Name}})
		if err := a.Put(ctx, "k", va, on1); err != nil {
			t.Fatal(err)
		}
		if err := b.Put(ctx, "k", vb, on1); err != nil {
			t.Fatal(err)
		}
		id := createDrain(t, c.m, master.DrainRequest{Segments: []string{seg1.Name}, Unmount: true})
		if j := waitDrain(t, c.m, id, 20*time.Second); j.Status != master.DrainSucceeded {
			t.Fatalf("drain: %+v", j)
		}
		for _, cl := range []*store.Client{a, b} {
			reps, err := cl.Query(ctx, "k")
			if err != nil || len(reps) != 1 || reps[0].Segment == seg1.Name {
				t.Fatalf("k after the drain: %+v, %v; want one replica off %s", reps, err, seg1.Name)
			}
		}
		read(t, a, "k", va, "a")
		read(t, b, "k", vb, "b")
		if got := c.m.ChargedBytes("a"); got != 1<<20 {
			t.Errorf("tenant a charged %d bytes after the drain, want its one 1 MiB replica", got)
		}
		ledger(t, c.m)
	})
}

// TestTenantPromotionWithinQuota: a read that would promote a disk
// object back into memory past its tenant's quota is staged instead
// (Mooncake refuses such a promotion), and promotes once the tenant has
// room again.
func TestTenantPromotionWithinQuota(t *testing.T) {
	ctx := context.Background()
	pol := filepath.Join(t.TempDir(), "tenants.yaml")
	if err := os.WriteFile(pol, []byte("version: 1\ntenants:\n  - name: a\n    quota: 2MB\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c := startMaster(t, master.Config{KVLeaseTTL: 200 * time.Millisecond, Tenants: master.TenantConfig{Enabled: true, ConnectorURI: pol}})
	c.tierNode(16<<20, t.TempDir(), 64<<20)
	a := c.client(0, withTenant("a", false, c.addr))
	vk := value(1<<20, 7)
	putRetry(t, a, "k", vk)
	putRetry(t, a, "f1", value(1<<20, 8))
	time.Sleep(300 * time.Millisecond) // past the lease TTL: k may go
	c.m.Evict(1 << 20)
	waitFor(t, "k offloaded", 20*time.Second, func() bool { return c.m.TierTotals().Offloads == 1 })
	if !diskOnly(t, a, "k") {
		t.Fatal("k should live on disk only")
	}
	putRetry(t, a, "f2", value(1<<20, 9)) // a's whole 2 MiB in memory
	check := func(wantCharged uint64, wantPromotions uint64) {
		t.Helper()
		for range 2 {
			got, err := a.Get(ctx, "k")
			if err != nil || !bytes.Equal(got, vk) {
				t.Fatalf("get k from disk: %d bytes, %v", len(got), err)
			}
		}
		if got := c.m.ChargedBytes("a"); got != wantCharged {
			t.Fatalf("tenant a (quota 2 MiB) charged %d after reads of its disk object, want %d", got, wantCharged)
		}
		if got, want := c.m.ChargedBytes("a"), c.m.TenantRecount("a"); got != want {
			t.Fatalf("tenant a: ledger %d, recount %d", got, want)
		}
		if p := c.m.TierTotals().Promotions; p != wantPromotions {
			t.Fatalf("%d promotions, want %d", p, wantPromotions)
		}
	}
	check(2<<20, 0)
	if err := a.Remove(ctx, "f2", true); err != nil {
		t.Fatal(err)
	}
	check(2<<20, 1)
}
