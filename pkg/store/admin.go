package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc/metadata"
)

// Admin reads a master's admin HTTP API (Mooncake's paths and shapes), so
// it works against mc's master and a real mooncake_master alike. It never
// takes leases.
type Admin struct {
	base   string
	hc     *http.Client
	token  string
	tenant string
}

// SetTenant makes the key reads (Keys, QueryKey, BatchQuery) read tenant's
// keys on a master in multi-tenant mode (mc's ?tenant_id=; mooncake_master's
// admin reads see the default tenant only); "" reads the default tenant's.
func (a *Admin) SetTenant(tenant string) { a.tenant = tenant }

// tenantParam is "&tenant_id=T" for a tenant set, else "".
func (a *Admin) tenantParam() string {
	if a.tenant == "" {
		return ""
	}
	return "&tenant_id=" + queryValue(a.tenant)
}

// SetToken makes every request carry "Authorization: Bearer token" (a
// master with an admin token refuses state-changing calls without it);
// "" sends none.
func (a *Admin) SetToken(token string) { a.token = token }

// ErrAdminUnauthorized is a state-changing admin call (admin HTTP API, or
// RemoveAll over gRPC) refused for want of the master's admin token.
var ErrAdminUnauthorized = errors.New("the master wants its admin token and none, or another, was sent: give --admin-token, MC_ADMIN_TOKEN or --admin-token-file")

// NewAdmin returns a reader of the admin API at base ("http://host:9003").
func NewAdmin(base string) (*Admin, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("admin URL %q: want http://host:port", base)
	}
	return &Admin{base: strings.TrimRight(base, "/"), hc: &http.Client{Timeout: 10 * time.Second}}, nil
}

// maxAdminBody bounds what is read from the admin API (a key listing of
// millions of keys fits).
const maxAdminBody = 1 << 30

func (a *Admin) get(ctx context.Context, path string) ([]byte, int, error) {
	return a.do(ctx, http.MethodGet, path, nil)
}

// do sends one request and reads the answer (bounded).
func (a *Admin) do(ctx context.Context, method, path string, body io.Reader) ([]byte, int, error) {
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, body)
	if err != nil {
		return nil, 0, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	resp, err := a.hc.Do(req)
	if err != nil {
		return nil, 0, fmt.Errorf("admin API %s: %w", a.base, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAdminBody))
	if err != nil {
		return nil, resp.StatusCode, fmt.Errorf("admin API %s%s: %w", a.base, path, err)
	}
	return b, resp.StatusCode, nil
}

func (a *Admin) getOK(ctx context.Context, path string) ([]byte, error) {
	b, code, err := a.get(ctx, path)
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, adminError(a.base+path, code, b)
	}
	return b, nil
}

func adminError(where string, code int, body []byte) error {
	var e struct {
		Code    int32  `json:"error_code"`
		Message string `json:"error_message"`
	}
	ok := json.Unmarshal(body, &e) == nil
	if code == http.StatusUnauthorized {
		// The master has an admin token: the caller sent none, or
		// another one.
		return fmt.Errorf("admin API %s: HTTP 401: %w", where, ErrAdminUnauthorized)
	}
	if ok && e.Code != 0 {
		return resultErr(e.Code, e.Message)
	}
	msg := strings.TrimSpace(string(body))
	if len(msg) > 200 {
		msg = msg[:200] + "..."
	}
	return fmt.Errorf("admin API %s: HTTP %d: %s", where, code, msg)
}

// Keys lists the stored keys with the given prefix, sorted.
func (a *Admin) Keys(ctx context.Context, prefix string) ([]string, error) {
	b, err := a.getOK(ctx, "/get_all_keys?prefix="+queryValue(prefix)+a.tenantParam())
	if err != nil {
		return nil, err
	}
	var keys []string
	for _, k := range strings.Split(string(b), "\n") {
		if k != "" && strings.HasPrefix(k, prefix) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return keys, nil
}

// SegmentDetail is one segment of /get_segments_detail.
type SegmentDetail struct {
	Name         string  `json:"segment_name"`
	ID           string  `json:"segment_id"`
	ClientID     string  `json:"client_id"`
	Base         string  `json:"base_address"`
	Size         uint64  `json:"size_bytes"`
	Endpoint     string  `json:"te_endpoint"`
	Protocol     string  `json:"protocol"`
	Status       string  `json:"status"`
	Used         uint64  `json:"allocator_used_bytes"`
	Capacity     uint64  `json:"allocator_capacity_bytes"`
	UsagePercent float64 `json:"allocator_usage_percent"`
}

// Segments reads /get_segments_detail.
func (a *Admin) Segments(ctx context.Context) ([]SegmentDetail, error) {
	b, err := a.getOK(ctx, "/get_segments_detail")
	if err != nil {
		return nil, err
	}
	var d struct {
		Segments []SegmentDetail `json:"segments"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("admin API %s/get_segments_detail: %w", a.base, err)
	}
	return d.Segments, nil
}

// AdminReplica is a memory replica as /query_key reports it.
type AdminReplica struct {
	Size     uint64 `json:"size_"`
	Addr     uint64 `json:"buffer_address_"`
	Protocol string `json:"protocol_"`
	Endpoint string `json:"transport_endpoint_"`
}

// QueryKey reads /query_key: the key's replicas, no lease.
func (a *Admin) QueryKey(ctx context.Context, key string) ([]AdminReplica, error) {
	b, code, err := a.get(ctx, "/query_key?key="+queryValue(key)+a.tenantParam())
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, adminError(a.base+"/query_key", code, b)
	}
	var d struct {
		Success bool           `json:"success"`
		Data    []AdminReplica `json:"data"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("admin API %s/query_key: %w", a.base, err)
	}
	return d.Data, nil
}

// AdminKeyResult is one key of /batch_query_keys.
type AdminKeyResult struct {
	OK       bool           `json:"ok"`
	Replicas []AdminReplica `json:"values"`
	Error    string         `json:"error"` // Mooncake's code name, OBJECT_NOT_FOUND
}

// BatchQuery reads /batch_query_keys: each key's replicas, no lease, by
// key. The server splits the list at commas after decoding it, so a key
// with a comma cannot be asked this way (QueryKey can).
func (a *Admin) BatchQuery(ctx context.Context, keys []string) (map[string]AdminKeyResult, error) {
	if len(keys) == 0 {
		return map[string]AdminKeyResult{}, nil
	}
	vals := make([]string, len(keys))
	for i, k := range keys {
		if strings.Contains(k, ",") {
			return nil, fmt.Errorf("batch query of key %q: /batch_query_keys splits keys at commas; query it alone", k)
		}
		vals[i] = queryValue(k)
	}
	b, err := a.getOK(ctx, "/batch_query_keys?keys="+strings.Join(vals, ",")+a.tenantParam())
	if err != nil {
		return nil, err
	}
	var d struct {
		Data map[string]AdminKeyResult `json:"data"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("admin API %s/batch_query_keys: %w", a.base, err)
	}
	return d.Data, nil
}

// queryValue escapes s as a query value as little as it must: '&', '#',
// '%', '+', space, control and non-ASCII bytes. mooncake_master's HTTP
// server does not decode /query_key's value, so a key escaped beyond
// that (url.QueryEscape's py%2F3 for py/3) is looked up as written and not
// found; the '/', ':' and '@' of KV-cache key schemes (model names, ranks,
// hashes) go as they are, and mc's own admin server reads both forms.
func queryValue(s string) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c <= ' ' || c >= 0x7f || c == '&' || c == '#' || c == '%' || c == '+':
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// LeaderInfo is /leader.
type LeaderInfo struct {
	Present     bool    `json:"present"`
	Address     *string `json:"leader_address"`
	ViewVersion *uint64 `json:"view_version"`
}

// Leader reads /leader.
func (a *Admin) Leader(ctx context.Context) (LeaderInfo, error) {
	var l LeaderInfo
	b, err := a.getOK(ctx, "/leader")
	if err != nil {
		return l, err
	}
	if err := json.Unmarshal(b, &l); err != nil {
		return l, fmt.Errorf("admin API %s/leader: %w", a.base, err)
	}
	return l, nil
}

// Role reads /role (leader or standby).
func (a *Admin) Role(ctx context.Context) (string, error) {
	b, err := a.getOK(ctx, "/role")
	return strings.TrimSpace(string(b)), err
}

// Metrics reads /metrics and returns each unlabelled sample by name, and
// labelled ones as name{label="value"}.
func (a *Admin) Metrics(ctx context.Context) (map[string]float64, error) {
	b, err := a.getOK(ctx, "/metrics")
	if err != nil {
		return nil, err
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(b)))
	if err != nil {
		return nil, fmt.Errorf("admin API %s/metrics: %w", a.base, err)
	}
	out := make(map[string]float64)
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			key := name
			if len(m.GetLabel()) > 0 {
				var ls []string
				for _, l := range m.GetLabel() {
					ls = append(ls, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
				}
				key += "{" + strings.Join(ls, ",") + "}"
			}
			switch {
			case m.GetCounter() != nil:
				out[key] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				out[key] = m.GetGauge().GetValue()
			case m.GetUntyped() != nil:
				out[key] = m.GetUntyped().GetValue()
			}
		}
	}
	return out, nil
}

// WithAdminToken returns ctx carrying the admin token for the master's
// admin operations over gRPC (RemoveAll), as gRPC metadata
// "authorization: Bearer token"; "" returns ctx as it is.
func WithAdminToken(ctx context.Context, token string) context.Context {
	if token == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

// TenantKey is a key with its tenant.
type TenantKey struct {
	Tenant string `json:"tenant"`
	Key    string `json:"key"`
}

// KeysAllTenants lists every tenant's keys with the given prefix, sorted
// by tenant and key (mc's master in multi-tenant mode:
// /get_all_keys?all_tenants=true).
func (a *Admin) KeysAllTenants(ctx context.Context, prefix string) ([]TenantKey, error) {
	b, err := a.getOK(ctx, "/get_all_keys?all_tenants=true&prefix="+queryValue(prefix))
	if err != nil {
		return nil, err
	}
	var out []TenantKey
	for _, l := range strings.Split(string(b), "\n") {
		if l == "" {
			continue
		}
		t, k, ok := strings.Cut(l, "\t")
		if !ok {
			// A master without the mode lists plain keys: all the
			// default tenant's.
			t, k = DefaultTenant, l
		}
		if strings.HasPrefix(k, prefix) {
			out = append(out, TenantKey{Tenant: t, Key: k})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Tenant != out[j].Tenant {
			return out[i].Tenant < out[j].Tenant
		}
		return out[i].Key < out[j].Key
	})
	return out, nil
}
