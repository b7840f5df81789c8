package store_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/master"
)

// Keys as KV-cache key schemes write them: '/', ':' and '@' (model
// names, ranks, hashes), and the characters a query value must escape.
var adminKeys = []string{"py/3", "model:llama@rank0/abc", "a&b", "c#d e+f%g", "键/0"}

// requestLog records the request URIs a handler sees.
type requestLog struct {
	mu   sync.Mutex
	uris []string
}

func (l *requestLog) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		l.mu.Lock()
		l.uris = append(l.uris, r.RequestURI)
		l.mu.Unlock()
		h.ServeHTTP(w, r)
	})
}

func (l *requestLog) last() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.uris[len(l.uris)-1]
}

// The admin client escapes only what a query value must: against
// mooncake_master, whose /query_key reads its value undecoded, a key
// with '/' is found (issue #25: py%2F3 was looked up literally).
func TestAdminQueryEscapesMinimally(t *testing.T) {
	// mooncake_master's /query_key: the raw value is the key.
	stored := map[string]bool{"py/3": true, "model:llama@rank0/abc": true}
	var log requestLog
	srv := httptest.NewServer(log.wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, raw, _ := strings.Cut(r.URL.RawQuery, "key=")
		if !stored[raw] {
			w.WriteHeader(http.StatusNotFound)
			w.Write([]byte(`{"success":false,"error_code":-704,"error_message":"OBJECT_NOT_FOUND"}`))
			return
		}
		w.Write([]byte(`{"success":true,"data":[{"size_":5,"buffer_address_":4096,"protocol_":"tcp","transport_endpoint_":"10.0.0.1:15000"}]}`))
	})))
	defer srv.Close()
	a, err := store.NewAdmin(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	for k := range stored {
		reps, err := a.QueryKey(context.Background(), k)
		if err != nil || len(reps) != 1 || reps[0].Size != 5 {
			t.Errorf("QueryKey(%q) against a non-decoding server: %v, %v", k, reps, err)
		}
	}
	for key, want := range map[string]string{
		"py/3":                  "/query_key?key=py/3",
		"model:llama@rank0/abc": "/query_key?key=model:llama@rank0/abc",
		"a&b":                   "/query_key?key=a%26b",
		"c#d e+f%g":             "/query_key?key=c%23d%20e%2Bf%25g",
		"键/0":                   "/query_key?key=%E9%94%AE/0",
		"tab\there":             "/query_key?key=tab%09here",
	} {
		a.QueryKey(context.Background(), key)
		if got := log.last(); got != want {
			t.Errorf("QueryKey(%q) sent %s, want %s", key, got, want)
		}
	}
}

// Against mc's own admin server every key reads back through /query_key,
// /get_all_keys?prefix= and /batch_query_keys.
func TestAdminKeysAgainstMCAdmin(t *testing.T) {
	m, err := master.New(master.Config{RegionSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	owner := store.NewUUID()
	seg := store.SegmentInfo{ID: store.NewUUID(), Name: "seg-a", Base: 1 << 20, Size: 64 << 20, Endpoint: "127.0.0.1:15000", Protocol: "tcp"}
	if err := m.MountSegment(owner, seg); err != nil {
		t.Fatal(err)
	}
	for _, k := range adminKeys {
		if r := m.BatchPutStart(owner, "", []master.PutItem{{Key: k, Size: 100}}, store.ReplicateConfig{ReplicaNum: 1})[0]; r.Err != nil {
			t.Fatalf("put start %q: %v", k, r.Err)
		}
		if err := m.BatchPutEnd(owner, []string{k})[0]; err != nil {
			t.Fatalf("put end %q: %v", k, err)
		}
	}
	var log requestLog
	srv := httptest.NewServer(log.wrap(master.NewAdminHandler(m, master.AdminOptions{})))
	defer srv.Close()
	a, err := store.NewAdmin(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, k := range adminKeys {
		if reps, err := a.QueryKey(ctx, k); err != nil || len(reps) != 1 {
			t.Errorf("QueryKey(%q) = %v, %v", k, reps, err)
		}
		if got, err := a.Keys(ctx, k); err != nil || !slices.Equal(got, []string{k}) {
			t.Errorf("Keys(prefix %q) = %q, %v (sent %s)", k, got, err, log.last())
		}
	}
	res, err := a.BatchQuery(ctx, append(adminKeys, "missing"))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range adminKeys {
		if r := res[k]; !r.OK || len(r.Replicas) != 1 {
			t.Errorf("BatchQuery: %q = %+v (sent %s)", k, r, log.last())
		}
	}
	if r := res["missing"]; r.OK || r.Error != "OBJECT_NOT_FOUND" {
		t.Errorf("BatchQuery: missing = %+v", r)
	}
	if want := "/batch_query_keys?keys=py/3,model:llama@rank0/abc,a%26b,"; !strings.HasPrefix(log.last(), want) {
		t.Errorf("BatchQuery sent %s, want it to start %s", log.last(), want)
	}
	if _, err := a.BatchQuery(ctx, []string{"a,b"}); err == nil || !strings.Contains(err.Error(), "commas") {
		t.Errorf("BatchQuery of a key with a comma: %v", err)
	}
}
