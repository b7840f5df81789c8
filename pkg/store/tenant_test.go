package store_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/master"
	"github.com/kvcache-ops/mc/pkg/store/mooncake"
)

// tenantPolicy writes a policy file for tenants a, b and default.
func tenantPolicy(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "tenants.yaml")
	body := "version: 1\ntenants:\n  - name: a\n    quota: 1GB\n  - name: b\n    quota: 1GB\n  - name: default\n    quota: 1GB\n"
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func multiTenant(t *testing.T) master.Config {
	return master.Config{Tenants: master.TenantConfig{Enabled: true, ConnectorURI: tenantPolicy(t)}}
}

func withTenant(tenant string, mooncake bool, addr string) func(*store.Config) {
	return func(cfg *store.Config) {
		cfg.Tenant = tenant
		if mooncake {
			cfg.Master = "mooncake://" + addr
		}
	}
}

// TestTenantsIsolateKeys: with multi-tenant mode, two tenants putting the
// same key get their own bytes back, over mc's gRPC and over Mooncake's
// wire, and every key verb sees only the caller's tenant.
func TestTenantsIsolateKeys(t *testing.T) {
	for _, wire := range []string{"grpc", "mooncake"} {
		t.Run(wire, func(t *testing.T) {
			c := startMaster(t, multiTenant(t))
			c.client(64 << 20)
			moon := wire == "mooncake"
			a := c.client(0, withTenant("a", moon, c.addr))
			b := c.client(0, withTenant("b", moon, c.addr))
			d := c.client(0, withTenant("", moon, c.addr))
			ctx := context.Background()
			va, vb := value(5000, 1), value(7000, 2)
			if err := a.Put(ctx, "k", va); err != nil {
				t.Fatal(err)
			}
			if err := b.Put(ctx, "k", vb); err != nil {
				t.Fatalf("tenant b's put of a key tenant a holds: %v", err)
			}
			if got, err := a.Get(ctx, "k"); err != nil || !bytes.Equal(got, va) {
				t.Fatalf("tenant a reads %d bytes, %v; want its own 5000", len(got), err)
			}
			if got, err := b.Get(ctx, "k"); err != nil || !bytes.Equal(got, vb) {
				t.Fatalf("tenant b reads %d bytes, %v; want its own 7000", len(got), err)
			}
			// The default tenant sees neither.
			if ok, err := d.Exist(ctx, "k"); ok || err != nil {
				t.Fatalf("default tenant: exist = %v, %v", ok, err)
			}
			if _, err := d.Get(ctx, "k"); !errors.Is(err, store.ErrObjectNotFound) {
				t.Fatalf("default tenant: get = %v, want OBJECT_NOT_FOUND", err)
			}
			if err := a.Put(ctx, "only-a", va); err != nil {
				t.Fatal(err)
			}
			if ok, _ := b.Exist(ctx, "only-a"); ok {
				t.Fatal("tenant b sees tenant a's key")
			}
			if reps, err := a.Query(ctx, "only-a"); err != nil || len(reps) != 1 {
				t.Fatalf("tenant a's query: %v, %v", reps, err)
			}
			if _, err := b.Query(ctx, "only-a"); !errors.Is(err, store.ErrObjectNotFound) {
				t.Fatalf("tenant b's query of a's key: %v", err)
			}
			// Regex reads and removes: user keys, own tenant only.
			m, err := a.GetReplicaListByRegex(ctx, "^")
			if err != nil || !slices.Equal(m.Keys, []string{"k", "only-a"}) {
				t.Fatalf("tenant a's ls --regex: %v, %v", m.Keys, err)
			}
			if m, _ := b.GetReplicaListByRegex(ctx, "^"); !slices.Equal(m.Keys, []string{"k"}) {
				t.Fatalf("tenant b's ls --regex: %v", m.Keys)
			}
			rm, err := b.RemoveByRegex(ctx, "only|k", true, false)
			// (Mooncake's wire answers a count only.)
			if err != nil || rm.RemovedCount != 1 || (!moon && !slices.Equal(rm.Removed, []string{"k"})) {
				t.Fatalf("tenant b's rm --regex: %+v, %v", rm, err)
			}
			if got, err := a.Get(ctx, "k"); err != nil || !bytes.Equal(got, va) {
				t.Fatalf("tenant a's key after b's regex remove: %d bytes, %v", len(got), err)
			}
			// rm of another tenant's key finds nothing.
			if err := b.Remove(ctx, "only-a", true); !errors.Is(err, store.ErrObjectNotFound) {
				t.Fatalf("tenant b removes a's key: %v", err)
			}
			if err := b.Put(ctx, "b2", vb); err != nil {
				t.Fatal(err)
			}
			// remove_all of tenant b leaves a's keys.
			if n, err := b.RemoveAll(ctx); err != nil || n != 1 {
				t.Fatalf("tenant b's remove_all: %d, %v; want its 1 key", n, err)
			}
			if ok, _ := a.Exist(ctx, "only-a"); !ok {
				t.Fatal("tenant b's remove_all removed tenant a's key")
			}
			if err := a.Remove(ctx, "only-a", true); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestTenantsWriteNeedsPolicy: a tenant without a quota policy cannot put
// (TENANT_NOT_REGISTERED), as mooncake_master; it can read (nothing).
func TestTenantsWriteNeedsPolicy(t *testing.T) {
	for _, wire := range []string{"grpc", "mooncake"} {
		t.Run(wire, func(t *testing.T) {
			c := startMaster(t, multiTenant(t))
			c.client(64 << 20)
			x := c.client(0, withTenant("x", wire == "mooncake", c.addr))
			ctx := context.Background()
			err := x.Put(ctx, "k", value(10, 1))
			if store.CodeOf(err) != store.TenantNotRegistered {
				t.Fatalf("put by a tenant without policy: %v, want TENANT_NOT_REGISTERED", err)
			}
			if ok, err := x.Exist(ctx, "k"); ok || err != nil {
				t.Fatalf("exist: %v, %v", ok, err)
			}
		})
	}
}

// TestTenantsIgnoredWithoutMode: without multi-tenant mode the tenant is
// ignored and keys are shared, as Mooncake's.
func TestTenantsIgnoredWithoutMode(t *testing.T) {
	c := startMaster(t, master.Config{})
	c.client(64 << 20)
	a := c.client(0, withTenant("a", false, c.addr))
	b := c.client(0, withTenant("b", true, c.addr))
	ctx := context.Background()
	v := value(100, 3)
	if err := a.Put(ctx, "shared", v); err != nil {
		t.Fatal(err)
	}
	if got, err := b.Get(ctx, "shared"); err != nil || !bytes.Equal(got, v) {
		t.Fatalf("without the mode tenant b reads %d bytes, %v; want a's", len(got), err)
	}
}

// TestTenantsAdminReads: the admin API's key reads take ?tenant_id=
// (default "default", as mooncake_master's), /get_all_keys?all_tenants=true
// lists every tenant's keys, and keys come back without their scope.
func TestTenantsAdminReads(t *testing.T) {
	c := startMaster(t, multiTenant(t))
	c.client(64 << 20)
	ctx := context.Background()
	a := c.client(0, withTenant("a", false, c.addr))
	d := c.client(0)
	if err := a.Put(ctx, "ka", value(10, 1)); err != nil {
		t.Fatal(err)
	}
	if err := d.Put(ctx, "kd", value(10, 2)); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(master.NewAdminHandler(c.m, master.AdminOptions{}))
	defer srv.Close()
	adm, err := store.NewAdmin(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if keys, err := adm.Keys(ctx, ""); err != nil || !slices.Equal(keys, []string{"kd"}) {
		t.Fatalf("default tenant's keys: %v, %v", keys, err)
	}
	adm.SetTenant("a")
	if keys, err := adm.Keys(ctx, ""); err != nil || !slices.Equal(keys, []string{"ka"}) {
		t.Fatalf("tenant a's keys: %v, %v", keys, err)
	}
	if reps, err := adm.QueryKey(ctx, "ka"); err != nil || len(reps) != 1 {
		t.Fatalf("tenant a's /query_key: %v, %v", reps, err)
	}
	if res, err := adm.BatchQuery(ctx, []string{"ka", "kd"}); err != nil || res["ka"].Error != "" || res["kd"].Error == "" {
		t.Fatalf("tenant a's /batch_query_keys: %+v, %v", res, err)
	}
	all, err := adm.KeysAllTenants(ctx, "")
	want := []store.TenantKey{{Tenant: "a", Key: "ka"}, {Tenant: "default", Key: "kd"}}
	if err != nil || !slices.Equal(all, want) {
		t.Fatalf("all tenants' keys: %v, %v; want %v", all, err, want)
	}
	adm.SetTenant("_bad")
	if _, err := adm.Keys(ctx, ""); err == nil {
		t.Fatal("a reserved tenant id was accepted")
	}
}

// TestCheckTenant: the ids Mooncake's TenantId::IsValid refuses.
func TestCheckTenant(t *testing.T) {
	for _, bad := range []string{"", "_x", "_", "a\x00b", "a\tb", "a\x7fb", "a\nb", string(make([]byte, store.MaxTenantLength+1))} {
		if err := store.CheckTenant(bad); store.CodeOf(err) != store.InvalidParams {
			t.Errorf("tenant %q: %v, want INVALID_PARAMS", bad, err)
		}
	}
	for _, good := range []string{"default", "a", "team-1/llama", "x_", "é"} {
		if err := store.CheckTenant(good); err != nil {
			t.Errorf("tenant %q: %v", good, err)
		}
	}
}

// TestScopedKeys: the stored form round-trips, the default tenant's keys
// are stored as they are, and no user key can pass for another tenant's.
func TestScopedKeys(t *testing.T) {
	if k := store.ScopeKey("default", "k"); k != "k" {
		t.Fatalf("default tenant's key stored as %q", k)
	}
	if k := store.ScopeKey("a", "k"); k != "a\x00k" {
		t.Fatalf("tenant a's key stored as %q", k)
	}
	// A default-tenant key holding a NUL is scoped, and then invalid.
	k := store.ScopeKey("default", "a\x00k")
	if tt, _ := store.SplitKey(k); tt != "default" || store.CheckStoredKey(k) == nil {
		t.Fatalf("default tenant's key with a NUL stored as %q (tenant %q), check %v", k, tt, store.CheckStoredKey(k))
	}
	if got := store.ScopeKeys("default", []string{"x", "a\x00k"}); got[1] == "a\x00k" {
		t.Fatal("ScopeKeys let a key with a NUL through as another tenant's")
	}
	for _, c := range []struct{ t, k string }{{"a", "k"}, {"default", "k"}, {"b", "x/y"}} {
		tt, kk := store.SplitKey(store.ScopeKey(c.t, c.k))
		if tt != c.t || kk != c.k {
			t.Errorf("split(scope(%q, %q)) = %q, %q", c.t, c.k, tt, kk)
		}
		if err := store.CheckStoredKey(store.ScopeKey(c.t, c.k)); err != nil {
			t.Errorf("stored key of %q/%q: %v", c.t, c.k, err)
		}
	}
}

// TestTenantBadIDs: over Mooncake's wire, a read with an invalid tenant
// id is INVALID_PARAMS and a put TENANT_NOT_REGISTERED (mooncake_master's
// answers), an empty id reads the default tenant and cannot put; over
// gRPC the same; the client refuses such an id before any call.
func TestTenantBadIDs(t *testing.T) {
	c := startMaster(t, multiTenant(t))
	c.client(64 << 20)
	ctx := context.Background()
	code := func(err error) int32 {
		var me *mooncake.Error
		if errors.As(err, &me) {
			return int32(me.Code)
		}
		return int32(store.CodeOf(err))
	}
	for _, bad := range []string{"a\x01b", "_reserved", "tab\there", "del\x7f"} {
		mc := mooncake.NewClient(c.addr, nil)
		mc.Tenant = bad
		if _, err := mc.ExistKey(ctx, "k"); code(err) != int32(store.InvalidParams) {
			t.Errorf("ExistKey with tenant %q: %v, want INVALID_PARAMS", bad, err)
		}
		if _, err := mc.GetReplicaList(ctx, "k"); code(err) != int32(store.InvalidParams) {
			t.Errorf("GetReplicaList with tenant %q: %v, want INVALID_PARAMS", bad, err)
		}
		if _, errs, err := mc.BatchGetReplicaList(ctx, []string{"k", "l"}); err != nil || code(errs[1]) != int32(store.InvalidParams) {
			t.Errorf("BatchGetReplicaList with tenant %q: %v %v, want INVALID_PARAMS", bad, errs, err)
		}
		if _, err := mc.PutStart(ctx, mooncake.UUID{First: 1, Second: 2}, "k", 10, mooncake.ReplicateConfig{ReplicaNum: 1}, false); code(err) != int32(store.TenantNotRegistered) {
			t.Errorf("PutStart with tenant %q: %v, want TENANT_NOT_REGISTERED", bad, err)
		}
		mc.Close()
	}
	mc := mooncake.NewClient(c.addr, nil)
	defer mc.Close()
	mc.Tenant = ""
	if ok, err := mc.ExistKey(ctx, "k"); ok || err != nil {
		t.Errorf("ExistKey with an empty tenant: %v, %v; want the default tenant's answer", ok, err)
	}
	if _, err := mc.PutStart(ctx, mooncake.UUID{First: 1, Second: 2}, "k", 10, mooncake.ReplicateConfig{ReplicaNum: 1}, false); code(err) != int32(store.TenantNotRegistered) {
		t.Errorf("PutStart with an empty tenant: %v, want TENANT_NOT_REGISTERED", err)
	}
	if _, err := store.New(ctx, store.Config{Master: c.addr, Tenant: "_admin"}); store.CodeOf(err) != store.InvalidParams {
		t.Fatalf("a client with a reserved tenant id: %v", err)
	}
}

// TestTenantQuotaAdmin: GET|PUT|DELETE /api/v1/tenant_quotas with
// mooncake_master's shapes, codes and reasons; the policy file is
// rewritten and read back by the next master (a restart).
func TestTenantQuotaAdmin(t *testing.T) {
	cfg := multiTenant(t)
	c := startMaster(t, cfg)
	c.client(64 << 20)
	ctx := context.Background()
	a := c.client(0, withTenant("a", false, c.addr))
	if err := a.Put(ctx, "k", value(1000, 1)); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(master.NewAdminHandler(c.m, master.AdminOptions{}))
	defer srv.Close()
	call := func(method, path, body string) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var v map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		return resp.StatusCode, v
	}
	code, v := call("GET", "/api/v1/tenant_quotas", "")
	data, _ := v["data"].([]any)
	if code != 200 || v["success"] != true || len(data) != 3 {
		t.Fatalf("GET list: %d %v", code, v)
	}
	// Three tenants of 1 GiB on 64 MiB: a third each, the byte left over
	// to the first by name (equal remainders).
	code, v = call("GET", "/api/v1/tenant_quotas?tenant_id=a", "")
	d, _ := v["data"].(map[string]any)
	if code != 200 || d["tenant_id"] != "a" || d["charged_bytes"] != float64(1000) || d["requested_quota_bytes"] != float64(1<<30) ||
		d["effective_quota_bytes"] != float64(64<<20/3+1) || d["over_quota"] != false || d["has_explicit_policy"] != true || d["admission_closed"] != false {
		t.Fatalf("GET a: %d %v", code, v)
	}
	// Bad input, each with mooncake_master's status, code and reason.
	for _, c := range []struct {
		method, path, body string
		status             int
		code               float64
		msg                string
	}{
		{"GET", "/api/v1/tenant_quotas?tenant_id=_x", "", 400, -600, "Invalid tenant_id"},
		{"GET", "/api/v1/tenant_quotas?tenant_id=a%01b", "", 400, -600, "Invalid tenant_id"},
		{"GET", "/api/v1/tenant_quotas?tenant_id=nobody", "", 404, -704, "OBJECT_NOT_FOUND"},
		{"PUT", "/api/v1/tenant_quotas", `{"requested_quota_bytes":5}`, 400, -600, "Missing or invalid tenant_id"},
		{"PUT", "/api/v1/tenant_quotas?tenant_id=c", `{"requested_quota_bytes":-1}`, 400, -600, ""},
		{"PUT", "/api/v1/tenant_quotas?tenant_id=c", `{"requested_quota_bytes":"lots"}`, 400, -600, ""},
		{"PUT", "/api/v1/tenant_quotas?tenant_id=c", `{"requested_quota_bytes":0}`, 400, -600, "Tenant quota must be in [1, 2^63 - 1] bytes"},
		{"PUT", "/api/v1/tenant_quotas?tenant_id=c", `{"requested_quota_bytes":9223372036854775808}`, 400, -600, "Tenant quota must be in [1, 2^63 - 1] bytes"},
		{"DELETE", "/api/v1/tenant_quotas?tenant_id=nobody", "", 404, -704, "OBJECT_NOT_FOUND"},
		{"DELETE", "/api/v1/tenant_quotas?tenant_id=a", "", 409, -1702, "TENANT_NOT_EMPTY"},
	} {
		code, v := call(c.method, c.path, c.body)
		msg, _ := v["error_message"].(string)
		if code != c.status || v["success"] != false || v["error_code"] != c.code || (c.msg != "" && msg != c.msg) || (c.msg == "" && !strings.HasPrefix(msg, "Invalid JSON body: ")) {
			t.Errorf("%s %s %s: %d %v; want %d %v %q", c.method, c.path, c.body, code, v, c.status, c.code, c.msg)
		}
	}
	// A quota above the capacity is taken; its effective quota is the
	// capacity's share (Mooncake's).
	code, v = call("PUT", "/api/v1/tenant_quotas?tenant_id=c", `{"requested_quota_bytes":1099511627776}`)
	if d, _ := v["data"].(map[string]any); code != 200 || d["requested_quota_bytes"] != float64(1<<40) || d["effective_quota_bytes"].(float64) >= float64(64<<20) {
		t.Fatalf("PUT c above capacity: %d %v", code, v)
	}
	if code, v = call("DELETE", "/api/v1/tenant_quotas?tenant_id=b", ""); code != 200 || v["success"] != true || v["data"] != nil {
		t.Fatalf("DELETE b: %d %v", code, v)
	}
	// The file now holds a, c and default; a new master reads it.
	pol, err := master.LoadTenantPolicy(cfg.Tenants.ConnectorURI)
	if err != nil || len(pol) != 3 || pol["c"] != 1<<40 || pol["a"] != 1<<30 {
		t.Fatalf("policy file after PUT and DELETE: %v, %v", pol, err)
	}
	m2, err := master.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m2.TenantQuotaOf("c"); err != nil {
		t.Fatalf("restarted master: tenant c: %v", err)
	}
	if _, err := m2.TenantQuotaOf("b"); store.CodeOf(err) != store.ObjectNotFound {
		t.Fatalf("restarted master: tenant b: %v", err)
	}
}

// TestTenantPolicyFile: the policy file as mooncake_master reads it.
func TestTenantPolicyFile(t *testing.T) {
	pol, err := master.ParseTenantPolicy([]byte("version: 1\ntenants:\n  - name: a\n    quota: 2GB\n  - name: b\n    quota: 512\n"))
	if err != nil || pol["a"] != 2<<30 || pol["b"] != 512 {
		t.Fatalf("parse: %v, %v", pol, err)
	}
	for body, want := range map[string]string{
		"tenants: []":                                                                "version is required",
		"version: 2\ntenants: []":                                                    "unsupported tenant quota policy version: 2",
		"version: 1":                                                                 "tenants must be a YAML sequence",
		"version: 1\ntenants:\n  - quota: 1":                                         "tenant name is required",
		"version: 1\ntenants:\n  - name: a":                                          "tenant quota is required",
		"version: 1\ntenants:\n  - name: _a\n    quota: 1":                           `invalid tenant name "_a"`,
		"version: 1\ntenants:\n  - name: a\n    quota: -1":                           "quota must start with an integer",
		"version: 1\ntenants:\n  - name: a\n    quota: 0":                            "quota must be positive",
		"version: 1\ntenants:\n  - name: a\n    quota: 5PB":                          `unsupported quota unit "PB"`,
		"version: 1\ntenants:\n  - name: a\n    quota: 1\n  - name: a\n    quota: 2": `duplicate tenant name "a"`,
		"- 1": "must be a YAML map",
	} {
		if _, err := master.ParseTenantPolicy([]byte(body)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("policy %q: %v, want %q", body, err, want)
		}
	}
	if _, err := master.New(master.Config{Tenants: master.TenantConfig{Enabled: true}}); err == nil {
		t.Fatal("multi-tenant mode without a policy file was accepted")
	}
	if _, err := master.New(master.Config{Tenants: master.TenantConfig{Enabled: true, ConnectorURI: filepath.Join(t.TempDir(), "missing.yaml")}}); err == nil {
		t.Fatal("a missing policy file was accepted")
	}
}
