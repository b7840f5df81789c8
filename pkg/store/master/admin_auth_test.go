package master

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestAdminTokenGuardsWrites: with an admin token, remove_all and the
// drain job calls (every method but GET/HEAD) answer 401 with a JSON
// error unless they carry the bearer token; reads stay open. Without a
// token everything is open, as on mooncake_master (issue 40: remove_all
// answered from anywhere).
func TestAdminTokenGuardsWrites(t *testing.T) {
	m, _ := newTestMaster(t, Config{AdminToken: "s3cret"})
	mount(t, m, "node", "seg-a", "127.0.0.1", 1<<40, 64*MiB)
	put(t, m, "w", "k1", 4096)
	srv := httptest.NewServer(NewAdminHandler(m, AdminOptions{}))
	defer srv.Close()
	call := func(method, path, auth, body string) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var v map[string]any
		if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
			if err := json.Unmarshal(b, &v); err != nil {
				t.Fatalf("%s %s: %v in %s", method, path, err, b)
			}
		}
		return resp.StatusCode, v
	}
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/api/v1/remove_all", ""},
		{"POST", "/api/v1/drain_jobs", `{"segments":["seg-a"]}`},
		{"POST", "/api/v1/drain_jobs/cancel?job_id=x", ""},
		{"DELETE", "/api/v1/drain_jobs", ""},
	} {
		for _, auth := range []string{"", "Bearer wrong", "s3cret"} {
			code, v := call(c.method, c.path, auth, c.body)
			if code != http.StatusUnauthorized || v["success"] != false || v["error_message"] == nil {
				t.Fatalf("%s %s with %q: %d %v, want 401 and a JSON error", c.method, c.path, auth, code, v)
			}
		}
	}
	if s := m.Stats(); s.Keys != 1 {
		t.Fatalf("refused calls changed the store: %+v", s)
	}
	for _, path := range []string{"/get_all_keys", "/get_segments_detail", "/health", "/api/v1/drain_jobs", "/metrics"} {
		if code, _ := call("GET", path, "", ""); code != http.StatusOK {
			t.Fatalf("GET %s without a token: %d, want 200 (reads stay open)", path, code)
		}
	}
	code, v := call("POST", "/api/v1/remove_all", "Bearer s3cret", "")
	if code != http.StatusOK || v["removed"] != float64(1) {
		t.Fatalf("remove_all with the token: %d %v", code, v)
	}

	open, _ := newTestMaster(t, Config{})
	osrv := httptest.NewServer(NewAdminHandler(open, AdminOptions{}))
	defer osrv.Close()
	resp, err := http.Post(osrv.URL+"/api/v1/remove_all", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("remove_all without a configured token: %d, want 200 (Mooncake's behaviour)", resp.StatusCode)
	}
}
