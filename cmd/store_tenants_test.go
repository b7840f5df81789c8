package cmd

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvcache-ops/mc/pkg/store"
)

// TestStoreTenantsCLI: mc serve store --enable_multi_tenants from
// master.json (--config-path) with a policy file; mc store verbs with
// --tenant / MC_TENANT see their own tenant's keys; mc store tenants
// lists, sets and removes quotas, refusing bad input with exit 64.
func TestStoreTenantsCLI(t *testing.T) {
	isolateEnv(t)
	dir := t.TempDir()
	pol := filepath.Join(dir, "tenants.yaml")
	os.WriteFile(pol, []byte("version: 1\ntenants:\n  - name: a\n    quota: 8MB\n  - name: b\n    quota: 8MB\n"), 0o644)
	conf := filepath.Join(dir, "master.json")
	os.WriteFile(conf, []byte(`{"enable_multi_tenants": true, "tenant_quota_connector_type": "file", "tenant_quota_connector_uri": "`+pol+`"}`), 0o644)
	rpc, admin, _, _ := startServeStore(t, "--segment-size", "32M", "--config-path", conf)
	m := []string{"--master", rpc, "--admin", admin}
	va, vb := filepath.Join(dir, "va"), filepath.Join(dir, "vb")
	os.WriteFile(va, []byte("tenant a's bytes"), 0o644)
	os.WriteFile(vb, []byte("tenant b's other bytes"), 0o644)
	run := func(want int, args ...string) string {
		t.Helper()
		out, errs, code := execMC(t, append(args, m...)...)
		if code != want {
			t.Fatalf("mc %s: exit %d, want %d: %s %s", strings.Join(args, " "), code, want, out, errs)
		}
		return out + errs
	}
	run(0, "store", "put", "k", va, "--tenant", "a")
	t.Setenv("MC_TENANT", "b")
	run(0, "store", "put", "k", vb)
	got := filepath.Join(dir, "got")
	run(0, "store", "get", "k", "--file", got)
	if b, _ := os.ReadFile(got); string(b) != "tenant b's other bytes" {
		t.Fatalf("tenant b (MC_TENANT) reads %q", b)
	}
	run(0, "store", "get", "k", "--file", got, "--tenant", "a")
	if b, _ := os.ReadFile(got); string(b) != "tenant a's bytes" {
		t.Fatalf("tenant a reads %q", b)
	}
	t.Setenv("MC_TENANT", "")
	if out := run(0, "store", "ls"); strings.Contains(out, "k") {
		t.Fatalf("the default tenant lists %q", out)
	}
	if out := run(0, "store", "ls", "--tenant", "a"); strings.TrimSpace(out) != "k" {
		t.Fatalf("tenant a lists %q, want its key without a scope", out)
	}
	if out := run(0, "store", "ls", "--all-tenants"); out != "a\tk\nb\tk\n" {
		t.Fatalf("ls --all-tenants: %q", out)
	}
	run(64, "store", "ls", "--tenant", "_x")
	run(64, "store", "put", "k", va, "--tenant", "a\x01")
	if _, errs, code := execMC(t, "bench", "store", "--tenant", "_x"); code != 64 || !strings.Contains(errs, "invalid --tenant") {
		t.Fatalf("bench store with a reserved tenant: %d %q", code, errs)
	}

	var tl struct {
		Tenants []store.TenantQuota `json:"tenants"`
	}
	out := run(0, "store", "tenants", "-o", "json")
	if err := json.Unmarshal([]byte(out), &tl); err != nil || len(tl.Tenants) != 2 || tl.Tenants[0].TenantID != "a" || tl.Tenants[0].ChargedBytes != 16 || tl.Tenants[0].Objects != 1 || tl.Tenants[0].RequestedQuotaBytes != 8<<20 {
		t.Fatalf("tenants -o json: %v %s", err, out)
	}
	if out := run(0, "store", "tenants"); !strings.Contains(out, "tenant") || !strings.Contains(out, "8.0 MiB") {
		t.Fatalf("tenants table: %s", out)
	}
	var st struct {
		Tenants []store.TenantQuota `json:"tenants"`
	}
	if out := run(0, "store", "stat", "-o", "json"); json.Unmarshal([]byte(out[:strings.LastIndex(out, "}")+1]), &st) != nil || len(st.Tenants) != 2 || st.Tenants[1].TenantID != "b" || st.Tenants[1].ChargedBytes != 22 {
		t.Fatalf("stat -o json tenants: %s", out)
	}
	if out := run(0, "store", "stat"); !strings.Contains(out, "over_quota") {
		t.Fatalf("stat has no tenants table: %s", out)
	}
	run(0, "store", "tenants", "set", "c", "2GB")
	if b, _ := os.ReadFile(pol); !strings.Contains(string(b), `name: "c"`) || !strings.Contains(string(b), "quota: 2147483648") {
		t.Fatalf("policy file after set: %s", b)
	}
	for _, bad := range [][]string{{"set", "c", "-1"}, {"set", "c", "lots"}, {"set", "c", "0"}, {"set", "_c", "1GB"}, {"set", "c"}, {"rm"}, {"frob"}} {
		run(64, append([]string{"store", "tenants"}, bad...)...)
	}
	if out := run(1, "store", "tenants", "rm", "a"); !strings.Contains(out, "TENANT_NOT_EMPTY") {
		t.Fatalf("rm of a tenant with objects: %s", out)
	}
	run(0, "store", "rm", "k", "--force", "--tenant", "a")
	run(0, "store", "tenants", "rm", "a")
	if out := run(1, "store", "put", "k2", va, "--tenant", "a"); !strings.Contains(out, "TENANT_NOT_REGISTERED") {
		t.Fatalf("put by a tenant whose policy was removed: %s", out)
	}
}

// On a master without tenants, the error says what to start it with.
// Before: "UNAVAILABLE_IN_CURRENT_MODE: UNAVAILABLE_IN_CURRENT_MODE".
func TestStoreTenantsNotEnabled(t *testing.T) {
	isolateEnv(t)
	rpc, admin, _, _ := startServeStore(t, "--segment-size", "8M")
	for _, args := range [][]string{{"store", "tenants"}, {"store", "tenants", "set", "team-a", "64MB"}} {
		_, errs, code := execMC(t, append(args, "--master", rpc, "--admin", admin)...)
		if code == 0 || !strings.Contains(errs, "--enable-multi-tenants") || strings.Count(errs, "UNAVAILABLE_IN_CURRENT_MODE") != 1 {
			t.Errorf("mc %v on a master without tenants: exit %d, %q; want the flag to start it with", args, code, errs)
		}
	}
}
