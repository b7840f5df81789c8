package master

import (
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/kvcache-ops/mc/pkg/store"
)

// tenantMaster is a multi-tenant master with policy (tenant: bytes).
func tenantMaster(t *testing.T, cfg Config, policy map[string]uint64) *Master {
	t.Helper()
	p := filepath.Join(t.TempDir(), "tenants.yaml")
	if err := os.WriteFile(p, FormatTenantPolicy(policy), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg.Tenants = TenantConfig{Enabled: true, ConnectorURI: p}
	m, _ := newTestMaster(t, cfg)
	return m
}

func tenantKeys(m *Master, tenant string) map[string]bool {
	out := map[string]bool{}
	m.KeysIn(tenant, "", func(k string, _ uint64) bool { out[k] = true; return true })
	return out
}

// TestTenantQuotaEvictsOwnFirst: a put over its tenant's quota evicts that
// tenant's own objects (oldest first under LRU), never another's, and
// fails with TENANT_QUOTA_EXCEEDED when none of its own can go.
func TestTenantQuotaEvictsOwnFirst(t *testing.T) {
	m := tenantMaster(t, Config{}, map[string]uint64{"a": 4 * MiB, "b": 4 * MiB})
	mount(t, m, "node", "seg", "127.0.0.1", 0, 16*MiB)
	sk := func(t, k string) string { return store.ScopeKey(t, k) }
	for i := range 3 {
		put(t, m, "w", sk("b", fmt.Sprint("b", i)), MiB)
	}
	for i := range 4 {
		put(t, m, "w", sk("a", fmt.Sprint("a", i)), MiB)
	}
	if c := m.ChargedBytes("a"); c != 4*MiB {
		t.Fatalf("tenant a charged %d, want 4 MiB", c)
	}
	// The store has room (16 MiB, 7 used): only a's quota is short.
	put(t, m, "w", sk("a", "a4"), MiB)
	if got := tenantKeys(m, "a"); len(got) != 4 || got["a0"] || !got["a4"] {
		t.Fatalf("tenant a after a put over its quota: %v; want a0 (its oldest) evicted", got)
	}
	if got := tenantKeys(m, "b"); len(got) != 3 {
		t.Fatalf("tenant b lost objects to a's quota: %v", got)
	}
	if c := m.ChargedBytes("a"); c != 4*MiB {
		t.Fatalf("tenant a charged %d after its eviction, want 4 MiB", c)
	}
	// Nothing of a's can go (all hard-pinned): the put fails.
	for i := 1; i <= 4; i++ {
		if err := remove(m, sk("a", fmt.Sprint("a", i)), true); err != nil {
			t.Fatal(err)
		}
	}
	pin := store.ReplicateConfig{ReplicaNum: 1, HardPin: true}
	for i := range 4 {
		put(t, m, "w", sk("a", fmt.Sprint("p", i)), MiB, pin)
	}
	r := m.BatchPutStart(uuidOf("w"), "", []PutItem{{sk("a", "more"), MiB}}, one())[0]
	wantCode(t, "put over quota with nothing evictable", r.Err, store.TenantQuotaExceeded)
	if got := tenantKeys(m, "b"); len(got) != 3 {
		t.Fatalf("tenant b lost objects: %v", got)
	}
	// A put within quota of the other tenant is untouched by a's.
	put(t, m, "w", sk("b", "b3"), MiB)
	mustInvariants(t, m)
	// /metrics, under mooncake_master's names.
	for _, c := range []struct {
		name, tenant string
		want         float64
	}{
		{"mooncake_tenant_quota_charged_bytes", "b", 4 << 20},
		{"mooncake_tenant_quota_requested_bytes", "a", 4 << 20},
		{"mooncake_tenant_quota_effective_bytes", "a", 4 << 20},
		{"mooncake_tenant_quota_over_quota", "a", 0},
		{"mooncake_tenant_quota_explicit_policy", "b", 1},
		{"mc_tenant_objects", "a", 4},
	} {
		if got := metric(t, m, c.name, "tenant_id", c.tenant); got != c.want {
			t.Errorf("%s{tenant_id=%q} = %v, want %v", c.name, c.tenant, got, c.want)
		}
	}
	if got := metric(t, m, "mooncake_tenant_quota_allocatable_capacity_bytes"); got != 16<<20 {
		t.Errorf("allocatable capacity %v", got)
	}
}

// TestTenantQuotaRefusalNotPlacedByMakeRoom: a put refused by its
// tenant's quota while the tenant has a put in progress is answered
// NO_AVAILABLE_HANDLE (retry once it lands), and stays refused: the
// store's own eviction-for-room step, which retries NO_AVAILABLE_HANDLE
// items, must not place it past the quota (it did: the storm's overrun).
func TestTenantQuotaRefusalNotPlacedByMakeRoom(t *testing.T) {
	m := tenantMaster(t, Config{}, map[string]uint64{"a": 2 * MiB})
	mount(t, m, "node", "seg", "127.0.0.1", 0, 16*MiB)
	sk := func(k string) string { return store.ScopeKey("a", k) }
	// a's whole quota in a put still being written: nothing of a's to
	// evict, and the store has 14 MiB free.
	putStart(t, m, "w1", sk("writing"), 2*MiB)
	r := m.BatchPutStart(uuidOf("w2"), "", []PutItem{{sk("more"), MiB}}, one())[0]
	if r.Err == nil {
		t.Errorf("put of 1 MiB over tenant a's 2 MiB quota (2 MiB being written) placed at %v", r.Replicas)
	}
	wantCode(t, "put over quota while the tenant's own put is in progress", r.Err, store.NoAvailableHandle)
	if c := m.ChargedBytes("a"); c != 2*MiB {
		t.Fatalf("tenant a charged %d, want its 2 MiB quota at most", c)
	}
	// Once the put in progress is gone, a put within the quota is placed.
	if err := m.BatchPutRevoke(uuidOf("w1"), []string{sk("writing")})[0]; err != nil {
		t.Fatal(err)
	}
	put(t, m, "w2", sk("more"), MiB)
	if c := m.ChargedBytes("a"); c != MiB {
		t.Fatalf("tenant a charged %d, want 1 MiB", c)
	}
	mustInvariants(t, m)
}

// TestTenantUpsertRevokeGivesChargeBack: a resizing upsert revoked keeps
// the old version, and its tenant is charged the old version only (the
// revoke left the new replicas' bytes in the ledger: a tenant then
// refused puts it had room for).
func TestTenantUpsertRevokeGivesChargeBack(t *testing.T) {
	m := tenantMaster(t, Config{}, map[string]uint64{"a": 3 * MiB})
	mount(t, m, "node", "seg", "127.0.0.1", 0, 16*MiB)
	k := store.ScopeKey("a", "k")
	put(t, m, "w", k, MiB)
	if r := m.BatchUpsertStart(uuidOf("w"), "", []PutItem{{k, 2 * MiB}}, one())[0]; r.Err != nil {
		t.Fatal(r.Err)
	}
	if c := m.ChargedBytes("a"); c != 3*MiB {
		t.Fatalf("tenant a charged %d during the resize, want 3 MiB (old and new)", c)
	}
	if err := m.BatchUpsertRevoke(uuidOf("w"), []string{k})[0]; err != nil {
		t.Fatal(err)
	}
	if c := m.ChargedBytes("a"); c != MiB {
		t.Fatalf("tenant a charged %d after the resize was revoked, want 1 MiB (the old version)", c)
	}
	mustInvariants(t, m)
	// The quota's other 2 MiB are usable again.
	put(t, m, "w", store.ScopeKey("a", "k2"), 2*MiB)
}

// TestTenantLedgerStorm: concurrent puts, upserts, removes, evictions (a
// small store) and a lost segment by two tenants; the ledger then equals a
// recount of the objects (checkInvariants) and no quota was overrun.
func TestTenantLedgerStorm(t *testing.T) {
	m := tenantMaster(t, Config{}, map[string]uint64{"a": 6 * MiB, "b": 3 * MiB})
	mount(t, m, "node", "seg", "127.0.0.1", 0, 8*MiB)
	mount(t, m, "node2", "seg2", "127.0.0.2", 1<<40, 4*MiB)
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewSource(int64(w)))
			tenant := []string{"a", "b"}[w%2]
			writer := uuidOf(fmt.Sprint("w", w))
			for i := range 300 {
				key := store.ScopeKey(tenant, fmt.Sprintf("k%d", rng.Intn(40)))
				size := uint64(64<<10) * uint64(1+rng.Intn(8))
				cfg := store.ReplicateConfig{ReplicaNum: 1 + rng.Intn(2)}
				switch rng.Intn(4) {
				case 0, 1:
					r := m.BatchPutStart(writer, "", []PutItem{{key, size}}, cfg)[0]
					if r.Err == nil {
						if rng.Intn(5) == 0 {
							m.BatchPutRevoke(writer, []string{key})
						} else {
							m.BatchPutEnd(writer, []string{key})
						}
					}
				case 2:
					if r := m.BatchUpsertStart(writer, "", []PutItem{{key, size}}, cfg)[0]; r.Err == nil {
						m.BatchUpsertEnd(writer, []string{key})
					}
				case 3:
					m.BatchRemove([]string{key}, true)
				}
				if i%50 == 0 {
					m.EvictIfNeeded()
				}
				if q := m.ChargedBytes(tenant); q > 6*MiB {
					t.Errorf("tenant %s charged %d, over any quota", tenant, q)
				}
			}
		}()
	}
	wg.Wait()
	mustInvariants(t, m)
	// A segment lost (its node gone) takes its replicas' charge along.
	if err := m.UnmountSegment(uuidOf("node2"), segInfo("seg2", "127.0.0.2", 1<<40, 4*MiB).ID); err != nil {
		t.Fatal(err)
	}
	mustInvariants(t, m)
	for _, tenant := range []string{"a", "b"} {
		if c, r := m.ChargedBytes(tenant), m.TenantRecount(tenant); c != r {
			t.Fatalf("tenant %s: ledger %d, recount %d", tenant, c, r)
		}
	}
	// Emptied, every tenant is charged nothing.
	m.RemoveAll()
	for _, tenant := range []string{"a", "b"} {
		if c := m.ChargedBytes(tenant); c != 0 {
			t.Fatalf("tenant %s charged %d with no objects", tenant, c)
		}
	}
}

// TestTenantRestoreKeepsTenant: objects restored from the HA op log (a
// new leader, a restart) keep their tenant, are charged to it, and a
// restored master lists them per tenant.
func TestTenantRestoreKeepsTenant(t *testing.T) {
	pol := map[string]uint64{"a": 8 * MiB, "b": 8 * MiB, "default": 8 * MiB}
	m1 := tenantMaster(t, Config{}, pol)
	seg := mount(t, m1, "node", "seg", "127.0.0.1", 0, 16*MiB)
	var objs []RestoredObject
	for _, tk := range [][2]string{{"a", "k"}, {"b", "k"}, {"default", "k"}} {
		key := store.ScopeKey(tk[0], tk[1])
		reps := put(t, m1, "w", key, MiB)
		objs = append(objs, RestoredObject{Key: key, Size: MiB, Replicas: []RestoredReplica{{Segment: seg, Addr: reps[0].Addr}}})
	}
	m2 := tenantMaster(t, Config{}, pol)
	if err := m2.Restore(objs); err != nil {
		t.Fatalf("restore of scoped keys: %v", err)
	}
	for _, tenant := range []string{"a", "b", "default"} {
		if got := tenantKeys(m2, tenant); len(got) != 1 || !got["k"] {
			t.Fatalf("restored tenant %s lists %v", tenant, got)
		}
		if c := m2.ChargedBytes(tenant); c != MiB {
			t.Fatalf("restored tenant %s charged %d", tenant, c)
		}
	}
	if r := get(m2, store.ScopeKey("b", "k")); r.Err != nil || r.Replicas[0].Addr != objs[1].Replicas[0].Addr {
		t.Fatalf("tenant b's restored key: %+v", r)
	}
	mustInvariants(t, m2)
}
