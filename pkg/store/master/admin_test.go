package master

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/kvcache-ops/mc/pkg/store"
)

type adminFixture struct {
	t   *testing.T
	m   *Master
	srv *httptest.Server
}

func newAdminFixture(t *testing.T, ha func() HAState) *adminFixture {
	m, _ := newTestMaster(t, Config{})
	srv := httptest.NewServer(NewAdminHandler(m, AdminOptions{HA: ha}))
	t.Cleanup(srv.Close)
	return &adminFixture{t, m, srv}
}

func (f *adminFixture) do(method, path string) (int, string, string) {
	f.t.Helper()
	req, err := http.NewRequest(method, f.srv.URL+path, nil)
	if err != nil {
		f.t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		f.t.Fatal(err)
	}
	return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
}

// getJSON fetches path and decodes its JSON body into a generic value.
func (f *adminFixture) getJSON(method, path string, wantStatus int) map[string]any {
	f.t.Helper()
	code, ct, body := f.do(method, path)
	if code != wantStatus || !strings.HasPrefix(ct, "application/json") {
		f.t.Fatalf("%s %s: %d %q %s, want %d JSON", method, path, code, ct, body, wantStatus)
	}
	var v map[string]any
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		f.t.Fatalf("%s: %v in %s", path, err, body)
	}
	return v
}

func (f *adminFixture) text(path string) string {
	f.t.Helper()
	code, ct, body := f.do("GET", path)
	if code != 200 || !strings.HasPrefix(ct, "text/plain") {
		f.t.Fatalf("GET %s: %d %q %s, want 200 text/plain", path, code, ct, body)
	}
	return body
}

func fieldNames(v map[string]any) []string {
	var out []string
	for k := range v {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func wantFields(t *testing.T, what string, v map[string]any, names ...string) {
	t.Helper()
	sort.Strings(names)
	if got := fieldNames(v); !slices.Equal(got, names) {
		t.Fatalf("%s fields %v, want %v", what, got, names)
	}
}

func TestAdminRolesAndHealth(t *testing.T) {
	f := newAdminFixture(t, nil)
	h := f.getJSON("GET", "/health", 200)
	wantFields(t, "/health", h, "status", "role", "ha_state", "service_ready", "leader_address", "view_version")
	if h["status"] != "ok" || h["role"] != "leader" || h["ha_state"] != "serving" || h["service_ready"] != true || h["leader_address"] != nil || h["view_version"] != nil {
		t.Fatalf("/health without HA: %v", h)
	}
	if r := f.text("/role"); r != "leader" {
		t.Fatalf("/role %q", r)
	}
	if r := f.text("/ha_status"); r != "serving" {
		t.Fatalf("/ha_status %q", r)
	}
	l := f.getJSON("GET", "/leader", 200)
	wantFields(t, "/leader", l, "present", "leader_address", "view_version")
	if l["present"] != false || l["leader_address"] != nil || l["view_version"] != nil {
		t.Fatalf("/leader without HA: %v", l)
	}

	f = newAdminFixture(t, func() HAState {
		return HAState{Role: "leader", State: "serving", Ready: true, Leader: "127.0.0.1:50051", ViewVersion: 7, HasView: true}
	})
	h = f.getJSON("GET", "/health", 200)
	if h["leader_address"] != "127.0.0.1:50051" || h["view_version"] != float64(7) {
		t.Fatalf("/health with a view: %v", h)
	}
	l = f.getJSON("GET", "/leader", 200)
	if l["present"] != true || l["leader_address"] != "127.0.0.1:50051" || l["view_version"] != float64(7) {
		t.Fatalf("/leader with a view: %v", l)
	}
}

func TestAdminStandbyRefusesDataEndpoints(t *testing.T) {
	f := newAdminFixture(t, func() HAState {
		return HAState{Role: "standby", State: "standby", Leader: "127.0.0.1:50051", ViewVersion: 3, HasView: true}
	})
	mount(t, f.m, "n", "a", "127.0.0.1", 0, 64*MiB)
	put(t, f.m, "w", "k", 10)
	for _, p := range []struct{ method, path string }{
		{"GET", "/get_all_keys"}, {"GET", "/get_all_segments"}, {"GET", "/get_segments_detail"},
		{"GET", "/query_segment?segment=a"}, {"GET", "/query_key?key=k"}, {"GET", "/batch_query_keys?keys=k"},
		{"GET", "/api/v1/segments/status"}, {"POST", "/api/v1/remove_all"},
	} {
		v := f.getJSON(p.method, p.path, 503)
		wantFields(t, p.path, v, "success", "error_code", "error_message")
		if v["success"] != false || v["error_code"] != float64(-1011) || v["error_message"] != "service plane is not active" {
			t.Fatalf("%s on a standby: %v", p.path, v)
		}
	}
	if f.m.Stats().Keys != 1 {
		t.Fatal("remove_all ran on a standby")
	}
	if r := f.text("/role"); r != "standby" {
		t.Fatalf("/role %q", r)
	}
	if r := f.text("/ha_status"); r != "standby" {
		t.Fatalf("/ha_status %q", r)
	}
	if h := f.getJSON("GET", "/health", 200); h["service_ready"] != false || h["role"] != "standby" {
		t.Fatalf("/health on a standby: %v", h)
	}
}

func TestAdminDataEndpoints(t *testing.T) {
	f := newAdminFixture(t, nil)
	m := f.m
	b := mount(t, m, "node-b", "seg-b", "127.0.0.2", 0x7f0000000000, 512*MiB)
	a := mount(t, m, "node-a", "seg-a", "127.0.0.1", 0x10000, 64*MiB)
	repsK1 := put(t, m, "w", "k1", 1000, store.ReplicateConfig{ReplicaNum: 2})
	put(t, m, "w", "k2", 2000, store.ReplicateConfig{ReplicaNum: 1, PreferredSegments: []string{"seg-a"}})
	putStart(t, m, "w", "writing", 10, store.ReplicateConfig{ReplicaNum: 1, PreferredSegments: []string{"seg-a"}})

	keys := strings.Split(strings.TrimSuffix(f.text("/get_all_keys"), "\n"), "\n")
	sort.Strings(keys)
	if !slices.Equal(keys, []string{"k1", "k2"}) {
		t.Fatalf("/get_all_keys %q, want k1 and k2 (complete keys only)", keys)
	}
	segs := strings.Split(strings.TrimSuffix(f.text("/get_all_segments"), "\n"), "\n")
	sort.Strings(segs)
	if !slices.Equal(segs, []string{"seg-a", "seg-b"}) {
		t.Fatalf("/get_all_segments %q", segs)
	}

	d := f.getJSON("GET", "/get_segments_detail", 200)
	wantFields(t, "/get_segments_detail", d, "total_segments", "segments")
	list := d["segments"].([]any)
	if d["total_segments"] != float64(2) || len(list) != 2 {
		t.Fatalf("/get_segments_detail: %v", d)
	}
	usedA := 1000 + 2000 + 10
	usedB := 1000
	for i, want := range []struct {
		info  store.SegmentInfo
		owner string
		human string
		used  int
	}{{a, "node-a", "0.0625 GiB", usedA}, {b, "node-b", "0.5 GiB", usedB}} {
		s := list[i].(map[string]any)
		wantFields(t, "segment", s, "segment_name", "segment_id", "client_id", "base_address", "size_bytes", "size_human",
			"te_endpoint", "protocol", "status", "allocator_used_bytes", "allocator_capacity_bytes", "allocator_usage_percent")
		exp := map[string]any{
			"segment_name": want.info.Name, "segment_id": want.info.ID.String(), "client_id": uuidOf(want.owner).String(),
			"base_address": fmt.Sprintf("0x%x", want.info.Base), "size_bytes": float64(want.info.Size), "size_human": want.human,
			"te_endpoint": want.info.Endpoint, "protocol": "tcp", "status": "OK",
			"allocator_used_bytes": float64(want.used), "allocator_capacity_bytes": float64(want.info.Size),
			"allocator_usage_percent": float64(want.used) * 100 / float64(want.info.Size),
		}
		for k, v := range exp {
			if s[k] != v {
				t.Errorf("segment %d %s = %v, want %v", i, k, s[k], v)
			}
		}
	}
	if got := f.text("/query_segment?segment=seg-a"); got != fmt.Sprintf("seg-a\nUsed(bytes): %d\nCapacity(bytes) : %d\n", usedA, 64*MiB) {
		t.Fatalf("/query_segment: %q", got)
	}
	v := f.getJSON("GET", "/query_segment?segment=nope", 404)
	if v["success"] != false || v["error_code"] != float64(store.SegmentNotFound) {
		t.Fatalf("/query_segment of an unknown segment: %v", v)
	}

	q := f.getJSON("GET", "/query_key?key=k1", 200)
	wantFields(t, "/query_key", q, "success", "data")
	data := q["data"].([]any)
	if q["success"] != true || len(data) != 2 {
		t.Fatalf("/query_key: %v", q)
	}
	var gotAddrs []uint64
	for _, x := range data {
		r := x.(map[string]any)
		wantFields(t, "buffer", r, "size_", "buffer_address_", "protocol_", "transport_endpoint_")
		if r["size_"] != float64(1000) || r["protocol_"] != "tcp" || !strings.HasPrefix(r["transport_endpoint_"].(string), "127.0.0.") {
			t.Fatalf("/query_key replica: %v", r)
		}
		gotAddrs = append(gotAddrs, uint64(r["buffer_address_"].(float64)))
	}
	slices.Sort(gotAddrs)
	if !slices.Equal(gotAddrs, addrs(repsK1)) {
		t.Fatalf("/query_key addresses %v, want %v", gotAddrs, addrs(repsK1))
	}
	for _, key := range []string{"missing", "writing"} {
		e := f.getJSON("GET", "/query_key?key="+key, 404)
		wantFields(t, "/query_key error", e, "success", "error_code", "error_message")
		if e["success"] != false || e["error_message"] == "" {
			t.Fatalf("/query_key?key=%s: %v", key, e)
		}
	}
	if e := f.getJSON("GET", "/query_key?key=missing", 404); e["error_code"] != float64(store.ObjectNotFound) {
		t.Fatalf("unknown key: %v", e)
	}

	bq := f.getJSON("GET", "/batch_query_keys?keys=k1,k2,missing", 200)
	if bq["success"] != true {
		t.Fatalf("/batch_query_keys: %v", bq)
	}
	bd := bq["data"].(map[string]any)
	k2 := bd["k2"].(map[string]any)
	if k2["ok"] != true || len(k2["values"].([]any)) != 1 || len(bd["k1"].(map[string]any)["values"].([]any)) != 2 {
		t.Fatalf("/batch_query_keys data: %v", bd)
	}
	if miss := bd["missing"].(map[string]any); miss["ok"] != false || miss["error"] != "OBJECT_NOT_FOUND" {
		t.Fatalf("/batch_query_keys missing key: %v", miss)
	}
	f.getJSON("GET", "/batch_query_keys", 400)

	// Admin reads grant no lease: removes right after succeed.
	if err := remove(m, "k1", false); err != nil {
		t.Fatalf("remove after admin queries: %v", err)
	}

	st := f.getJSON("GET", "/api/v1/segments/status", 200)
	if st["success"] != true || len(st["segments"].([]any)) != 2 {
		t.Fatalf("/api/v1/segments/status: %v", st)
	}
	seg0 := st["segments"].([]any)[0].(map[string]any)
	wantFields(t, "segments/status entry", seg0, "segment_name", "status", "used_bytes", "capacity_bytes")

	if code, _, _ := f.do("GET", "/api/v1/remove_all"); code != http.StatusMethodNotAllowed {
		t.Fatalf("GET /api/v1/remove_all: %d, want 405", code)
	}
	ra := f.getJSON("POST", "/api/v1/remove_all", 200)
	if ra["success"] != true || ra["removed"] != float64(1) {
		t.Fatalf("remove_all: %v", ra)
	}
	if s := m.Stats(); s.Keys != 0 || s.Processing != 1 {
		t.Fatalf("after remove_all: %+v, want only the put in progress left", s)
	}
	if got := f.text("/get_all_keys"); got != "" {
		t.Fatalf("/get_all_keys after remove_all: %q", got)
	}
	if s := f.text("/metrics/summary"); !strings.HasPrefix(s, "Master Metrics: ") || !strings.HasSuffix(s, "\n") {
		t.Fatalf("/metrics/summary %q", s)
	}
}

// Every metric name store.md lists for the Mooncake master.
var mooncakeMetrics = []string{
	"master_allocated_bytes", "master_total_capacity_bytes", `segment_allocated_bytes{segment="seg-a"}`,
	"master_key_count", "master_put_start_requests_total", "master_get_replica_list_requests_total",
	"master_successful_evictions_total", "master_attempted_evictions_total", "master_evicted_key_count",
	"master_evicted_size_bytes", "master_active_clients", "master_soft_pin_key_count",
	"master_put_start_alloc_failures_total", "master_put_start_discard_cnt", "master_put_start_release_cnt",
	`segment_total_capacity_bytes{segment="seg-a"}`,
	// per RPC master_<op>_requests_total / master_<op>_failures_total
	"master_put_start_failures_total", "master_get_replica_list_failures_total",
	"master_batch_put_start_requests_total", "master_batch_put_start_failures_total",
	"master_batch_get_replica_list_requests_total", "master_remove_requests_total", "master_remove_failures_total",
	"master_mount_segment_requests_total", "master_unmount_segment_requests_total", "master_ping_requests_total",
	"master_exist_key_requests_total", "master_remove_all_requests_total",
}

func TestAdminMetrics(t *testing.T) {
	f := newAdminFixture(t, nil)
	mount(t, f.m, "n", "seg-a", "127.0.0.1", 0, 64*MiB)
	put(t, f.m, "w", "k", 1000, store.ReplicateConfig{ReplicaNum: 1, SoftPin: true})
	get(f.m, "k")
	f.m.BatchPutStart(uuidOf("w"), "", []PutItem{{"huge", GiB}}, one())
	body := f.text("/metrics")
	for _, name := range mooncakeMetrics {
		if !strings.Contains(body, "\n"+name+" ") {
			t.Errorf("/metrics has no %s", name)
		}
	}
	for _, want := range []string{
		"\nmaster_allocated_bytes 1000\n", "\nmaster_total_capacity_bytes 6.7108864e+07\n", "\nmaster_key_count 1\n",
		`segment_allocated_bytes{segment="seg-a"} 1000`, "\nmaster_put_start_requests_total 2\n",
		"\nmaster_put_start_alloc_failures_total 1\n", "\nmaster_get_replica_list_requests_total 1\n",
		"\nmaster_soft_pin_key_count 1\n", "\nmaster_active_clients 2\n",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", strings.TrimSpace(want))
		}
	}
}

// Keys as KV-cache key schemes write them (model names, ranks, hashes,
// base64) read back through the admin API both as mooncake_master's
// clients send them (raw, curl '/query_key?key=py/3') and
// percent-encoded (key=py%2F3), on every endpoint that takes a key.
func TestAdminKeysRawAndPercentEncoded(t *testing.T) {
	f := newAdminFixture(t, nil)
	mount(t, f.m, "node-a", "seg-a", "127.0.0.1", 0x10000, 64*MiB)
	keys := []string{"py/3", "model:llama@rank0/abc", "ab+cd/ef==", "50%off", "a;b", "a&b c#d", "键/0"}
	for _, k := range keys {
		put(t, f.m, "w", k, 100)
	}
	for _, k := range keys {
		// Percent-encoded as RFC 3986 has it: a space is %20, as in
		// /query_key '+' is itself, as mooncake_master reads it.
		forms := map[string]string{"percent-encoded": strings.ReplaceAll(url.QueryEscape(k), "+", "%20"), "minimal": strings.NewReplacer("&", "%26", "#", "%23", "%", "%25", "+", "%2B", " ", "%20").Replace(k)}
		if !strings.ContainsAny(k, "&# ") { // what a raw query cannot carry
			forms["raw"] = k
		}
		for form, v := range forms {
			if q := f.getJSON("GET", "/query_key?key="+v, 200); len(q["data"].([]any)) != 1 {
				t.Errorf("/query_key %s %q: %v", form, v, q)
			}
			if got := f.text("/get_all_keys?prefix=" + v); got != k+"\n" {
				t.Errorf("/get_all_keys?prefix= %s %q: %q, want %q", form, v, got, k)
			}
		}
	}
	// batch_query_keys decodes as mooncake_master's does ('+' is a
	// space there), then splits at commas.
	raw := "py/3,model:llama@rank0/abc,50%off,a;b"
	for _, v := range []string{raw, url.QueryEscape(raw), url.QueryEscape("ab+cd/ef==") + "," + url.QueryEscape("a&b c#d")} {
		bq := f.getJSON("GET", "/batch_query_keys?keys="+v, 200)
		for k, r := range bq["data"].(map[string]any) {
			if r.(map[string]any)["ok"] != true {
				t.Errorf("/batch_query_keys?keys=%s: %q not found: %v", v, k, bq)
			}
		}
	}
}

// FuzzUnescapeQuery: any query value decodes without panic, and a key
// percent-encoded (RFC 3986, as url.QueryEscape with %20 for a space)
// decodes back to itself in either '+' mode.
func FuzzUnescapeQuery(f *testing.F) {
	for _, s := range []string{"py/3", "py%2F3", "50%off", "%", "%4", "%zz", "a+b", "键", "a;b&c=d"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		unescapeQuery(s, false)
		unescapeQuery(s, true)
		enc := strings.ReplaceAll(url.QueryEscape(s), "+", "%20")
		for _, plus := range []bool{false, true} {
			if got := unescapeQuery(enc, plus); got != s {
				t.Fatalf("unescapeQuery(%q, %v) = %q, want %q", enc, plus, got, s)
			}
		}
	})
}
