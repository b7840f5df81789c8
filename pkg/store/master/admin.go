package master

import (
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvcache-ops/mc/pkg/store"
)

// HAState is what the admin API reports about roles and the leader view.
// Without HA a master is the leader and serving, with no view.
type HAState struct {
	Role        string // leader | standby
	State       string // starting | standby | candidate | recovering | catching_up | leader_warmup | serving
	Ready       bool   // the service plane is active
	Leader      string // leader address, "" when there is no view
	ViewVersion uint64
	HasView     bool
}

// AdminOptions configures the admin handler.
type AdminOptions struct {
	// HA reports roles (nil: leader, serving, no view).
	HA func() HAState
}

// NewAdminHandler serves the Mooncake master's admin HTTP API for m, with
// its paths and shapes, so scripts and dashboards written for
// mooncake_master work unchanged. Admin reads never grant leases.
func NewAdminHandler(m *Master, o AdminOptions) http.Handler {
	a := &admin{m: m, ha: o.HA}
	if a.ha == nil {
		a.ha = func() HAState { return HAState{Role: "leader", State: "serving", Ready: true} }
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.m.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /metrics/summary", a.summary)
	mux.HandleFunc("GET /health", a.health)
	mux.HandleFunc("GET /role", a.role)
	mux.HandleFunc("GET /ha_status", a.haStatus)
	mux.HandleFunc("GET /leader", a.leader)
	mux.HandleFunc("GET /get_all_keys", a.serving(a.allKeys))
	mux.HandleFunc("GET /get_all_segments", a.serving(a.allSegments))
	mux.HandleFunc("GET /get_segments_detail", a.serving(a.segmentsDetail))
	mux.HandleFunc("GET /query_segment", a.serving(a.querySegment))
	mux.HandleFunc("GET /query_key", a.serving(a.queryKey))
	mux.HandleFunc("GET /batch_query_keys", a.serving(a.batchQueryKeys))
	mux.HandleFunc("GET /api/v1/segments/status", a.serving(a.segmentsStatus))
	mux.HandleFunc("POST /api/v1/segments/undrain", a.serving(a.undrainSegment))
	mux.HandleFunc("POST /api/v1/remove_all", a.serving(a.removeAll))
	mux.HandleFunc("GET /api/v1/tiers", a.serving(a.tiers))
	mux.HandleFunc("GET /api/v1/tenant_quotas", a.serving(a.getTenantQuotas))
	mux.HandleFunc("PUT /api/v1/tenant_quotas", a.serving(a.putTenantQuota))
	mux.HandleFunc("DELETE /api/v1/tenant_quotas", a.serving(a.deleteTenantQuota))
	mux.HandleFunc("POST /api/v1/drain_jobs", a.serving(a.createDrain))
	mux.HandleFunc("GET /api/v1/drain_jobs", a.serving(a.listDrains))
	mux.HandleFunc("GET /api/v1/drain_jobs/query", a.serving(a.queryDrain))
	mux.HandleFunc("POST /api/v1/drain_jobs/cancel", a.serving(a.cancelDrain))
	return RequireAdminToken(mux, m.cfg.AdminToken)
}

// RequireAdminToken guards h's state-changing calls: with a token, a
// request of any method but GET and HEAD must carry
// "Authorization: Bearer <token>" or is answered 401 with a JSON error
// in the admin API's shape. Reads stay open, as Mooncake's are. An empty
// token guards nothing (Mooncake's master has no token).
func RequireAdminToken(h http.Handler, token string) http.Handler {
	if token == "" {
		return h
	}
	want := []byte("Bearer " + token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			h.ServeHTTP(w, r)
			return
		}
		got := []byte(r.Header.Get("Authorization"))
		if subtle.ConstantTimeCompare(got, want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="mc admin"`)
			msg := "admin token required: send Authorization: Bearer TOKEN (mc: --admin-token or MC_ADMIN_TOKEN)"
			if len(got) > 0 {
				msg = "admin token refused"
			}
			writeJSON(w, http.StatusUnauthorized, errorBody{Code: int32(store.InvalidParams), Message: msg})
			return
		}
		h.ServeHTTP(w, r)
	})
}

type admin struct {
	m  *Master
	ha func() HAState
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func writeText(w http.ResponseWriter, s string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte(s))
}

type errorBody struct {
	Success bool   `json:"success"`
	Code    int32  `json:"error_code"`
	Message string `json:"error_message"`
}

func writeErr(w http.ResponseWriter, status int, err error) {
	writeJSON(w, status, errorBody{Code: int32(store.CodeOf(err)), Message: err.Error()})
}

// serving answers data endpoints with 503 on a master whose service plane
// is not active (a standby), as Mooncake's does.
func (a *admin) serving(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !a.ha().Ready {
			writeJSON(w, http.StatusServiceUnavailable, errorBody{Code: int32(store.UnavailableInCurrentMode), Message: "service plane is not active"})
			return
		}
		h(w, r)
	}
}

func (a *admin) summary(w http.ResponseWriter, _ *http.Request) {
	writeText(w, a.m.Summary()+"\n")
}

// Summary is the one-line state the admin API and the metric reporting
// loop print.
func (m *Master) Summary() string {
	s := m.Stats()
	return fmt.Sprintf("Master Metrics: Storage: %s / %s | Keys: %d (soft-pinned: %d, hard-pinned: %d, writing: %d) | Clients: %d | Segments: %d | Eviction: keys=%d size=%s",
		fmtBytes(s.Used), fmtBytes(s.Capacity), s.Keys, s.SoftPinned, s.HardPinned, s.Processing, s.Clients, s.Segments, s.EvictedKeys, fmtBytes(s.EvictedBytes))
}

func (a *admin) health(w http.ResponseWriter, _ *http.Request) {
	h := a.ha()
	body := map[string]any{
		"status": "ok", "role": h.Role, "ha_state": h.State, "service_ready": h.Ready,
		"leader_address": nil, "view_version": nil,
	}
	if h.HasView {
		body["leader_address"], body["view_version"] = h.Leader, h.ViewVersion
	}
	writeJSON(w, http.StatusOK, body)
}

func (a *admin) role(w http.ResponseWriter, _ *http.Request)     { writeText(w, a.ha().Role) }
func (a *admin) haStatus(w http.ResponseWriter, _ *http.Request) { writeText(w, a.ha().State) }

func (a *admin) leader(w http.ResponseWriter, _ *http.Request) {
	h := a.ha()
	body := map[string]any{"present": h.HasView, "leader_address": nil, "view_version": nil}
	if h.HasView {
		body["leader_address"], body["view_version"] = h.Leader, h.ViewVersion
	}
	writeJSON(w, http.StatusOK, body)
}

func (a *admin) allKeys(w http.ResponseWriter, r *http.Request) {
	t, all, ok := a.tenant(w, r)
	if !ok {
		return
	}
	var b strings.Builder
	if all {
		// Every tenant's keys, one "TENANT<TAB>KEY" a line (neither a
		// tenant id nor a key holds a tab).
		a.m.KeysIn("", queryParam(r, "prefix", false), func(k string, _ uint64) bool {
			tt, u := store.SplitKey(k)
			b.WriteString(tt)
			b.WriteByte('\t')
			b.WriteString(u)
			b.WriteByte('\n')
			return true
		})
		writeText(w, b.String())
		return
	}
	a.m.KeysIn(t, queryParam(r, "prefix", false), func(k string, _ uint64) bool {
		b.WriteString(k)
		b.WriteByte('\n')
		return true
	})
	writeText(w, b.String())
}

// tenant is the tenant an admin read is for: ?tenant_id= (default
// "default", the only one mooncake_master's admin reads see), or every
// tenant with ?all_tenants=true (/get_all_keys only). Without
// multi-tenant mode both are ignored.
func (a *admin) tenant(w http.ResponseWriter, r *http.Request) (t string, all, ok bool) {
	if !a.m.MultiTenant() {
		return store.DefaultTenant, false, true
	}
	if v := queryParam(r, "all_tenants", false); v == "true" || v == "1" {
		return "", true, true
	}
	t, err := a.m.ReadTenant(queryParam(r, "tenant_id", false))
	if err != nil {
		writeErr(w, http.StatusBadRequest, fmt.Errorf("tenant_id: %w", err))
		return "", false, false
	}
	return t, false, true
}

func (a *admin) allSegments(w http.ResponseWriter, _ *http.Request) {
	var b strings.Builder
	for _, s := range a.m.Segments() {
		b.WriteString(s.Info.Name)
		b.WriteByte('\n')
	}
	writeText(w, b.String())
}

// SegmentDetail is one entry of /get_segments_detail.
type SegmentDetail struct {
	Name         string  `json:"segment_name"`
	ID           string  `json:"segment_id"`
	ClientID     string  `json:"client_id"`
	Base         string  `json:"base_address"`
	Size         uint64  `json:"size_bytes"`
	SizeHuman    string  `json:"size_human"`
	Endpoint     string  `json:"te_endpoint"`
	Protocol     string  `json:"protocol"`
	Status       string  `json:"status"`
	Used         uint64  `json:"allocator_used_bytes"`
	Capacity     uint64  `json:"allocator_capacity_bytes"`
	UsagePercent float64 `json:"allocator_usage_percent"`
}

// SegmentsDetail is the body of /get_segments_detail.
type SegmentsDetail struct {
	Total    int             `json:"total_segments"`
	Segments []SegmentDetail `json:"segments"`
}

func (a *admin) segmentsDetail(w http.ResponseWriter, _ *http.Request) {
	segs := a.m.Segments()
	out := SegmentsDetail{Total: len(segs), Segments: make([]SegmentDetail, 0, len(segs))}
	for _, s := range segs {
		pct := 0.0
		if s.Capacity > 0 {
			pct = float64(s.Used) * 100 / float64(s.Capacity)
		}
		out.Segments = append(out.Segments, SegmentDetail{
			Name: s.Info.Name, ID: s.Info.ID.String(), ClientID: s.Client.String(),
			Base: fmt.Sprintf("0x%x", s.Info.Base), Size: s.Info.Size,
			SizeHuman: strconv.FormatFloat(float64(s.Info.Size)/(1<<30), 'f', -1, 64) + " GiB",
			Endpoint:  s.Info.Endpoint, Protocol: s.Info.Protocol, Status: s.Status.String(),
			Used: s.Used, Capacity: s.Capacity, UsagePercent: pct,
		})
	}
	sort.Slice(out.Segments, func(i, j int) bool { return out.Segments[i].Name < out.Segments[j].Name })
	writeJSON(w, http.StatusOK, out)
}

func (a *admin) querySegment(w http.ResponseWriter, r *http.Request) {
	name := queryParam(r, "segment", false)
	if name == "" {
		writeErr(w, http.StatusBadRequest, store.Errorf(store.InvalidParams, "missing ?segment=NAME"))
		return
	}
	for _, s := range a.m.Segments() {
		if s.Info.Name == name {
			writeText(w, fmt.Sprintf("%s\nUsed(bytes): %d\nCapacity(bytes) : %d\n", name, s.Used, s.Capacity))
			return
		}
	}
	writeErr(w, http.StatusNotFound, store.Errorf(store.SegmentNotFound, "segment %q is not mounted", name))
}

// BufferDesc is a memory replica as Mooncake's admin API prints it.
type BufferDesc struct {
	Size     uint64 `json:"size_"`
	Addr     uint64 `json:"buffer_address_"`
	Protocol string `json:"protocol_"`
	Endpoint string `json:"transport_endpoint_"`
}

func bufferDescs(reps []store.Replica) []BufferDesc {
	out := make([]BufferDesc, len(reps))
	for i, r := range reps {
		out[i] = BufferDesc{Size: r.Len, Addr: r.Addr, Protocol: r.Protocol, Endpoint: r.Endpoint}
	}
	return out
}

func (a *admin) queryKey(w http.ResponseWriter, r *http.Request) {
	key := queryParam(r, "key", false)
	t, _, ok := a.tenant(w, r)
	if !ok {
		return
	}
	res := a.m.BatchQuery([]string{store.ScopeKey(t, key)})[0]
	if res.Err != nil {
		writeErr(w, http.StatusNotFound, res.Err)
		return
	}
	out := map[string]any{"success": true, "data": bufferDescs(res.Replicas)}
	if res.Disk != nil {
		// Mooncake's /query_key lists memory replicas only; the disk one
		// goes beside them, in /batch_query_keys' shape.
		out["local_disk_values"] = localDiskDescs(res.Disk)
	}
	writeJSON(w, http.StatusOK, out)
}

// KeyResult is one key of /batch_query_keys.
type KeyResult struct {
	OK     bool         `json:"ok"`
	Values []BufferDesc `json:"values,omitempty"`
	// LocalDiskValues is the replica on a node's disk tier (Mooncake's
	// LOCAL_DISK replicas).
	LocalDiskValues []store.AdminDiskReplica `json:"local_disk_values,omitempty"`
	Error           string                   `json:"error,omitempty"`
}

func (a *admin) batchQueryKeys(w http.ResponseWriter, r *http.Request) {
	raw := queryParam(r, "keys", true)
	if raw == "" {
		writeJSON(w, http.StatusBadRequest, map[string]any{"success": false, "error": "no keys given: use ?keys=key1,key2,..."})
		return
	}
	keys := strings.Split(raw, ",")
	if len(keys) > store.MaxBatchSize {
		writeJSON(w, http.StatusBadRequest, map[string]any{"success": false, "error": fmt.Sprintf("%d keys exceed the batch limit of %d", len(keys), store.MaxBatchSize)})
		return
	}
	data := make(map[string]KeyResult, len(keys))
	t, _, ok := a.tenant(w, r)
	if !ok {
		return
	}
	for i, res := range a.m.BatchQuery(store.ScopeKeys(t, keys)) {
		if res.Err != nil {
			data[keys[i]] = KeyResult{Error: store.CodeOf(res.Err).String()}
		} else {
			data[keys[i]] = KeyResult{OK: true, Values: bufferDescs(res.Replicas), LocalDiskValues: localDiskDescs(res.Disk)}
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"success": true, "data": data})
}

// SegmentStatusBody is the body of GET /api/v1/segments/status?segment=NAME
// (Mooncake's HttpSegmentStatusResponse: status numbered as its
// SegmentStatus enum).
type SegmentStatusBody struct {
	Success      bool   `json:"success"`
	Segment      string `json:"segment"`
	Status       int    `json:"status"`
	StatusName   string `json:"status_name"`
	ErrorCode    int32  `json:"error_code"`
	ErrorMessage string `json:"error_message"`
}

// UndrainBody is the body of POST /api/v1/segments/undrain: the
// segment's status now (OK) and the one it had.
type UndrainBody struct {
	SegmentStatusBody
	PreviousStatus     int    `json:"previous_status"`
	PreviousStatusName string `json:"previous_status_name"`
}

// segmentsStatus answers ?segment=NAME as mooncake_master does (one
// segment's status); without it, mc lists every segment (Mooncake
// answers 400 there).
func (a *admin) segmentsStatus(w http.ResponseWriter, r *http.Request) {
	if name := queryParam(r, "segment", false); name != "" {
		st, err := a.m.SegmentStatusOf(name)
		if err != nil {
			writeErr(w, httpStatusOf(err), err)
			return
		}
		writeJSON(w, http.StatusOK, SegmentStatusBody{Success: true, Segment: name, Status: st.MooncakeCode(), StatusName: st.String()})
		return
	}
	type seg struct {
		Name     string `json:"segment_name"`
		Status   string `json:"status"`
		Used     uint64 `json:"used_bytes"`
		Capacity uint64 `json:"capacity_bytes"`
	}
	segs := a.m.Segments()
	out := make([]seg, 0, len(segs))
	for _, s := range segs {
		out = append(out, seg{s.Info.Name, s.Status.String(), s.Used, s.Capacity})
	}
	writeJSON(w, http.StatusOK, map[string]any{"success": true, "segments": out})
}

// undrainSegment returns ?segment=NAME to service (mc store drain
// --undo): an mc extension in Mooncake's shapes.
func (a *admin) undrainSegment(w http.ResponseWriter, r *http.Request) {
	name := queryParam(r, "segment", false)
	if name == "" {
		writeErr(w, http.StatusBadRequest, store.Errorf(store.InvalidParams, "Missing segment query parameter: POST /api/v1/segments/undrain?segment=NAME"))
		return
	}
	prev, err := a.m.UndrainSegment(name)
	if err != nil {
		writeErr(w, httpStatusOf(err), err)
		return
	}
	writeJSON(w, http.StatusOK, UndrainBody{
		SegmentStatusBody: SegmentStatusBody{Success: true, Segment: name, Status: SegOK.MooncakeCode(), StatusName: SegOK.String()},
		PreviousStatus:    prev.MooncakeCode(), PreviousStatusName: prev.String()})
}

func (a *admin) removeAll(w http.ResponseWriter, r *http.Request) {
	// As mooncake_master's: no tenant_id clears every tenant.
	t := ""
	if raw := queryParam(r, "tenant_id", false); raw != "" {
		var err error
		if t, err = a.m.ReadTenant(raw); err != nil {
			writeErr(w, http.StatusBadRequest, fmt.Errorf("tenant_id: %w", err))
			return
		}
	}
	n := a.m.RemoveAllIn(t)
	a.m.m.Op("remove_all", false)
	writeJSON(w, http.StatusOK, map[string]any{"success": true, "removed": n})
}

// queryParam is the value of the query parameter name, read so that the
// raw form mooncake_master's clients send (curl '/query_key?key=py/3',
// keys with '+', ';' or a lone '%' as they are) and the percent-encoded
// form (key=py%2F3) both find the key. mooncake_master reads /query_key's
// value without decoding it and decodes /batch_query_keys' (with '+' as a
// space); mc decodes every valid %XX escape, keeps anything else as sent,
// and reads '+' as a space only where mooncake_master does (plusIsSpace):
// elsewhere a client encodes a space as %20, as RFC 3986 has it.
// Go's url.ParseQuery would turn a raw '+' into a space and drop a pair
// with ';' or a bad escape, so a key stored as "ab+cd" or "50%off" could
// not be read back raw.
func queryParam(r *http.Request, name string, plusIsSpace bool) string {
	for pair := range strings.SplitSeq(r.URL.RawQuery, "&") {
		k, v, _ := strings.Cut(pair, "=")
		if unescapeQuery(k, true) == name {
			return unescapeQuery(v, plusIsSpace)
		}
	}
	return ""
}

// unescapeQuery decodes the valid %XX escapes of s, and '+' to a space
// when plusIsSpace; everything else stays as it is.
func unescapeQuery(s string, plusIsSpace bool) string {
	if !strings.ContainsRune(s, '%') && !(plusIsSpace && strings.ContainsRune(s, '+')) {
		return s
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]):
			b = append(b, unhex(s[i+1])<<4|unhex(s[i+2]))
			i += 2
		case c == '+' && plusIsSpace:
			b = append(b, ' ')
		default:
			b = append(b, c)
		}
	}
	return string(b)
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}

// tenantQuotaStatus is mooncake_master's HTTP status for a tenant quota
// call's error.
func tenantQuotaStatus(err error) int {
	switch store.CodeOf(err) {
	case store.InvalidParams:
		return http.StatusBadRequest
	case store.ObjectNotFound, store.TenantNotRegistered:
		return http.StatusNotFound
	case store.UnavailableInCurrentMode, store.UnavailableInCurrentStatus, store.TenantNotEmpty:
		return http.StatusConflict
	}
	return http.StatusInternalServerError
}

// writeQuotaErr answers as mooncake_master: the code and, for the
// master's own errors, its name as the message.
func writeQuotaErr(w http.ResponseWriter, err error) {
	c := store.CodeOf(err)
	writeJSON(w, tenantQuotaStatus(err), errorBody{Code: int32(c), Message: c.String()})
}

// quotaTenant reads ?tenant_id=, refused (400, INVALID_PARAMS, msg) when
// missing or invalid.
func quotaTenant(w http.ResponseWriter, r *http.Request, msg string) (string, bool) {
	t := queryParam(r, "tenant_id", false)
	if t == "" || store.CheckTenant(t) != nil {
		writeJSON(w, http.StatusBadRequest, errorBody{Code: int32(store.InvalidParams), Message: msg})
		return "", false
	}
	return t, true
}

func (a *admin) getTenantQuotas(w http.ResponseWriter, r *http.Request) {
	if queryParam(r, "tenant_id", false) == "" {
		qs, err := a.m.TenantQuotas()
		if err != nil {
			writeQuotaErr(w, err)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"success": true, "data": qs})
		return
	}
	t, ok := quotaTenant(w, r, "Invalid tenant_id")
	if !ok {
		return
	}
	q, err := a.m.TenantQuotaOf(t)
	if err != nil {
		writeQuotaErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"success": true, "data": q})
}

func (a *admin) putTenantQuota(w http.ResponseWriter, r *http.Request) {
	t, ok := quotaTenant(w, r, "Missing or invalid tenant_id")
	if !ok {
		return
	}
	var body struct {
		Requested uint64 `json:"requested_quota_bytes"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&body); err != nil {
		writeJSON(w, http.StatusBadRequest, errorBody{Code: int32(store.InvalidParams), Message: "Invalid JSON body: " + err.Error()})
		return
	}
	if body.Requested == 0 || body.Requested > maxQuota {
		writeJSON(w, http.StatusBadRequest, errorBody{Code: int32(store.InvalidParams), Message: "Tenant quota must be in [1, 2^63 - 1] bytes"})
		return
	}
	q, err := a.m.SetTenantQuota(t, body.Requested)
	if err != nil {
		writeQuotaErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"success": true, "data": q})
}

func (a *admin) deleteTenantQuota(w http.ResponseWriter, r *http.Request) {
	t, ok := quotaTenant(w, r, "Missing or invalid tenant_id")
	if !ok {
		return
	}
	q, err := a.m.DeleteTenantQuota(t)
	if err != nil {
		writeQuotaErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"success": true, "data": q})
}
