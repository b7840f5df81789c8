package master

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
)

// GET /api/v1/segments/status?segment=NAME answers in mooncake_master's
// shape (status numbered as its SegmentStatus enum), and POST
// /api/v1/segments/undrain?segment=NAME returns a DRAINED segment to
// service, behind the admin token as every state-changing call (issue
// 40, item 7).
func TestAdminSegmentStatusAndUndrain(t *testing.T) {
	m, _ := newTestMaster(t, Config{AdminToken: "s3cret"})
	mount(t, m, "node", "seg-a", "127.0.0.1", 1<<40, 64*MiB)
	m.space.mu.Lock()
	m.space.byName["seg-a"].status = SegDrained
	m.space.mu.Unlock()
	srv := httptest.NewServer(NewAdminHandler(m, AdminOptions{}))
	defer srv.Close()
	call := func(method, path, auth string) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, nil)
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
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatalf("%s %s: %v in %s", method, path, err, b)
		}
		return resp.StatusCode, v
	}
	keys := func(v map[string]any) []string {
		var out []string
		for k := range v {
			out = append(out, k)
		}
		slices.Sort(out)
		return out
	}
	code, v := call("GET", "/api/v1/segments/status?segment=seg-a", "")
	want := []string{"error_code", "error_message", "segment", "status", "status_name", "success"}
	if code != 200 || !slices.Equal(keys(v), want) || v["status"] != float64(3) || v["status_name"] != "DRAINED" || v["segment"] != "seg-a" || v["success"] != true {
		t.Fatalf("segment status: %d %v; want 200, Mooncake's fields %v, status 3 DRAINED", code, v, want)
	}
	if code, v := call("GET", "/api/v1/segments/status?segment=nope", ""); code != 404 || v["error_code"] != float64(-101) {
		t.Fatalf("status of an unknown segment: %d %v, want 404 SEGMENT_NOT_FOUND", code, v)
	}
	if code, v := call("POST", "/api/v1/segments/undrain?segment=seg-a", ""); code != 401 {
		t.Fatalf("undrain without the token: %d %v, want 401", code, v)
	}
	if st, _ := m.SegmentStatusOf("seg-a"); st != SegDrained {
		t.Fatalf("a refused undrain changed the segment: %v", st)
	}
	code, v = call("POST", "/api/v1/segments/undrain?segment=seg-a", "Bearer s3cret")
	if code != 200 || v["status_name"] != "OK" || v["status"] != float64(1) || v["previous_status_name"] != "DRAINED" || v["previous_status"] != float64(3) {
		t.Fatalf("undrain: %d %v", code, v)
	}
	if st, _ := m.SegmentStatusOf("seg-a"); st != SegOK {
		t.Fatalf("seg-a is %v after undrain, want OK", st)
	}
	put(t, m, "w", "k1", 4096) // placed again
	if code, v := call("POST", "/api/v1/segments/undrain?segment=nope", "Bearer s3cret"); code != 404 || !strings.Contains(v["error_message"].(string), "nope") {
		t.Fatalf("undrain of an unknown segment: %d %v", code, v)
	}
	if code, v := call("POST", "/api/v1/segments/undrain", "Bearer s3cret"); code != 400 || v["error_code"] != float64(-600) {
		t.Fatalf("undrain without ?segment: %d %v", code, v)
	}
}
