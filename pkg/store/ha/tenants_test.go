package ha_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine"
	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/ha"
	"github.com/kvcache-ops/mc/pkg/store/master"
)

// Issue 37 items 1 and 2 under HA: a new leader keeps every object's
// tenant (two tenants' objects of the same key each read back as their
// own), loads the quota policy, and its ledger charges each tenant what
// its objects hold (a recount), so quotas hold across a failover.
func TestTenantsAcrossFailover(t *testing.T) {
	h := newHarness(t)
	pol := filepath.Join(t.TempDir(), "tenants.yaml")
	if err := os.WriteFile(pol, []byte("version: 1\ntenants:\n  - name: a\n    quota: 1GB\n  - name: b\n    quota: 1GB\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	h.cfg = func(cfg *ha.Config) {
		cfg.Master.Tenants = master.TenantConfig{Enabled: true, ConnectorURI: pol}
	}
	h.candidate()
	h.candidate()
	h.leader(5 * time.Second)
	h.client(32 << 20)
	ctx := context.Background()
	tenant := func(name string) *store.Client {
		cl, err := store.New(ctx, store.Config{
			Master: h.direct, ClusterID: h.cluster, PingInterval: 100 * time.Millisecond,
			RPCTimeout: 2 * time.Second, StagingSize: 16 << 20, Tenant: name,
			EngineConfig: engine.Config{BindAddress: "127.0.0.1", HandshakeAddr: "127.0.0.1:0"},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			cl.Close(ctx)
		})
		return cl
	}
	a, b := tenant("a"), tenant("b")
	va, vb := value("a/k", 5000), value("b/k", 7000)
	if err := a.Put(ctx, "k", va); err != nil {
		t.Fatal(err)
	}
	if err := b.Put(ctx, "k", vb); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"x1", "x2", "x3"} {
		if err := a.Put(ctx, k, value(k, 3000)); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Remove(ctx, "x2", false); err != nil {
		t.Fatal(err)
	}
	wantA, wantB := uint64(5000+2*3000), uint64(7000)

	old := h.leader(time.Second)
	h.forget(old)
	old.Kill()
	h.candidate()
	next := h.leader(testLease + 2*time.Second)
	if next == old {
		t.Fatal("the killed candidate still leads")
	}
	// Serving again once a put succeeds.
	for deadline := time.Now().Add(3*testLease + 5*time.Second); ; {
		err := a.Put(ctx, "after", value("after", 1000))
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no put after the failover: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	wantA += 1000
	for _, c := range []struct {
		cl   *store.Client
		who  string
		want []byte
	}{{a, "a", va}, {b, "b", vb}} {
		got, err := c.cl.Get(ctx, "k")
		if err != nil || !bytes.Equal(got, c.want) {
			t.Fatalf("tenant %s reads k after the failover: %d bytes, %v; want its own %d", c.who, len(got), err, len(c.want))
		}
	}
	if ok, err := b.Exist(ctx, "x1"); ok || err != nil {
		t.Fatalf("tenant b sees tenant a's x1 after the failover: %v %v", ok, err)
	}
	m := next.Master()
	for tn, want := range map[string]uint64{"a": wantA, "b": wantB} {
		if got, recount := m.ChargedBytes(tn), m.TenantRecount(tn); got != want || recount != want {
			t.Errorf("new leader charges tenant %s %d bytes (recount %d), want %d", tn, got, recount, want)
		}
		q, err := m.TenantQuotaOf(tn)
		if err != nil || q.RequestedQuotaBytes != 1<<30 || !q.HasExplicitPolicy {
			t.Errorf("new leader's quota of tenant %s: %+v, %v; want the policy's 1 GiB", tn, q, err)
		}
	}
}
