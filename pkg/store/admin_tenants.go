package store

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
)

// TenantQuota is a tenant's quota state, with the fields of Mooncake's
// /api/v1/tenant_quotas answers (mc adds objects).
type TenantQuota struct {
	TenantID            string `json:"tenant_id"`
	RequestedQuotaBytes uint64 `json:"requested_quota_bytes"`
	EffectiveQuotaBytes uint64 `json:"effective_quota_bytes"`
	ChargedBytes        uint64 `json:"charged_bytes"`
	AdmissionClosed     bool   `json:"admission_closed"`
	OverQuota           bool   `json:"over_quota"`
	HasExplicitPolicy   bool   `json:"has_explicit_policy"`
	// Objects is mc's: the tenant's objects (complete or being put); 0
	// from a mooncake_master.
	Objects uint64 `json:"objects"`
}

const tenantQuotasPath = "/api/v1/tenant_quotas"

// tenantQuotaCall sends one tenant quota call and decodes its data.
func (a *Admin) tenantQuotaCall(ctx context.Context, method, path string, body []byte, data any) error {
	var r *bytes.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	var b []byte
	var code int
	var err error
	if r != nil {
		b, code, err = a.do(ctx, method, path, r)
	} else {
		b, code, err = a.do(ctx, method, path, nil)
	}
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return adminError(a.base+path, code, b)
	}
	var out struct {
		Data json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return fmt.Errorf("admin API %s%s: %w", a.base, path, err)
	}
	if len(out.Data) == 0 || string(out.Data) == "null" {
		return nil
	}
	if err := json.Unmarshal(out.Data, data); err != nil {
		return fmt.Errorf("admin API %s%s: %w", a.base, path, err)
	}
	return nil
}

// TenantQuotas lists every tenant with a quota policy or objects.
func (a *Admin) TenantQuotas(ctx context.Context) ([]TenantQuota, error) {
	var out []TenantQuota
	err := a.tenantQuotaCall(ctx, http.MethodGet, tenantQuotasPath, nil, &out)
	return out, err
}

// SetTenantQuota sets tenant's quota in bytes (admin token).
func (a *Admin) SetTenantQuota(ctx context.Context, tenant string, bytes uint64) (TenantQuota, error) {
	var out TenantQuota
	body, _ := json.Marshal(map[string]uint64{"requested_quota_bytes": bytes})
	err := a.tenantQuotaCall(ctx, http.MethodPut, tenantQuotasPath+"?tenant_id="+queryValue(tenant), body, &out)
	return out, err
}

// DeleteTenantQuota removes tenant's quota policy (admin token); the
// answer is what is left of the tenant, nil for nothing.
func (a *Admin) DeleteTenantQuota(ctx context.Context, tenant string) (*TenantQuota, error) {
	var out TenantQuota
	out.TenantID = ""
	if err := a.tenantQuotaCall(ctx, http.MethodDelete, tenantQuotasPath+"?tenant_id="+queryValue(tenant), nil, &out); err != nil {
		return nil, err
	}
	if out.TenantID == "" {
		return nil, nil
	}
	return &out, nil
}
