package cmd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/store"
)

// A master with its own segment holds everything; a second node joins;
// `mc store drain --unmount --wait` moves it all there and unmounts.
func TestStoreDrainCLI(t *testing.T) {
	isolateEnv(t)
	rpc, admin, _, _ := startServeStore(t, "--segment-size", "32M")
	m := []string{"--master", rpc, "--admin", admin}
	dir := t.TempDir()
	vals := map[string][]byte{}
	for i := range 12 {
		k := fmt.Sprintf("blk/%02d", i)
		vals[k] = bytes.Repeat([]byte{byte(i), 'x', byte(i * 3)}, 50000+i)
		f := filepath.Join(dir, "v")
		os.WriteFile(f, vals[k], 0o644)
		if out, errs, code := execMC(t, append([]string{"store", "put", k, f}, m...)...); code != 0 {
			t.Fatalf("put: %d %s %s", code, out, errs)
		}
	}
	src := onlySegment(t, m)
	startServeStore(t, "--master", rpc, "--segment-size", "32M")

	// Refusals first: an unknown segment, and no segment at all.
	if _, errs, code := execMC(t, append([]string{"store", "drain", "no-such-seg"}, m...)...); code == 0 || !strings.Contains(errs, "SEGMENT_NOT_FOUND") && !strings.Contains(errs, "not mounted") {
		t.Fatalf("drain of an unknown segment: %d %q", code, errs)
	}
	out, errs, code := execMC(t, append([]string{"store", "drain", src, "--unmount", "--wait", "--interval", "100ms", "-o", "json"}, m...)...)
	var j store.DrainJobStatus
	if code != 0 || json.Unmarshal([]byte(out), &j) != nil {
		t.Fatalf("drain: %d %s %s", code, out, errs)
	}
	if j.StatusName != "SUCCEEDED" || j.SucceededUnits != 12 || !j.Unmounted || j.MigratedBytes == 0 {
		t.Fatalf("drain job: %+v", j)
	}
	for k, want := range vals {
		got := filepath.Join(dir, "got")
		if out, errs, code := execMC(t, append([]string{"store", "get", k, "-o", got}, m...)...); code != 0 {
			t.Fatalf("get %s after the drain: %d %s %s", k, code, out, errs)
		}
		if b, _ := os.ReadFile(got); !bytes.Equal(b, want) {
			t.Fatalf("%s after the drain: %d bytes, want %d", k, len(b), len(want))
		}
	}
	out, _, code = execMC(t, append([]string{"store", "drain", "--status", j.JobID}, m...)...)
	if code != 0 || !strings.Contains(out, "SUCCEEDED") || !strings.Contains(out, "12 / 12") {
		t.Fatalf("status table: %d\n%s", code, out)
	}
	if _, errs, code := execMC(t, append([]string{"store", "drain", "--cancel", j.JobID}, m...)...); code == 0 || !strings.Contains(errs, "ended") {
		t.Fatalf("cancel of an ended job: %d %q", code, errs)
	}
	var st struct {
		Segments []store.SegmentDetail `json:"segments"`
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		out, _, _ = execMC(t, append([]string{"store", "stat", "-o", "json"}, m...)...)
		if json.Unmarshal([]byte(out), &st) == nil && len(st.Segments) == 1 && st.Segments[0].Name != src {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("segments after drain --unmount: %s", out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Interrupting --wait stops the following, not the job, and says how to
// pick it up again.
func TestStoreDrainInterruptedWait(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"success":true,"job_id":"1-2","status":2,"status_name":"RUNNING","planned_units":10,"succeeded_units":3}`))
	}))
	defer srv.Close()
	a, err := store.NewAdmin(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	var out, errb bytes.Buffer
	err = runStoreDrain(ctx, storeDrainOptions{Status: "1-2", Wait: true, Interval: 50 * time.Millisecond}, a, nil, &printer{Out: &out, Err: &errb, format: "table"})
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 130 || !strings.Contains(err.Error(), "--status 1-2 --wait") || !strings.Contains(err.Error(), "--cancel 1-2") {
		t.Fatalf("interrupted wait: %v", err)
	}
	if !strings.Contains(errb.String(), "3/10 objects") {
		t.Fatalf("no progress line before the interrupt: %q", errb.String())
	}
}

// `mc store drain --undo SEGMENT` puts a drained segment back into
// service, and a put refused meanwhile says why (issue 40, item 7).
func TestStoreDrainUndoCLI(t *testing.T) {
	isolateEnv(t)
	rpc, admin, _, _ := startServeStore(t, "--segment-size", "16M", "--admin-token", "tok")
	m := []string{"--master", rpc, "--admin", admin}
	var st struct {
		Segments []store.SegmentDetail `json:"segments"`
	}
	out, errs, code := execMC(t, append([]string{"store", "stat", "-o", "json"}, m...)...)
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || len(st.Segments) != 1 {
		t.Fatalf("stat: %d %s %s", code, out, errs)
	}
	seg := st.Segments[0].Name
	t.Setenv("MC_ADMIN_TOKEN", "tok")
	if out, errs, code := execMC(t, append([]string{"store", "drain", seg, "--wait", "--interval", "100ms"}, m...)...); code != 0 {
		t.Fatalf("drain: %d %s %s", code, out, errs)
	}
	f := filepath.Join(t.TempDir(), "v")
	os.WriteFile(f, bytes.Repeat([]byte("x"), 1<<20), 0o644)
	_, errs, code = execMC(t, append([]string{"store", "put", "k", f}, m...)...)
	if code == 0 || !strings.Contains(errs, "1 segment is draining/drained ("+seg) || !strings.Contains(errs, "mc store drain --undo SEGMENT") {
		t.Fatalf("put into a drained store: %d %q", code, errs)
	}
	t.Setenv("MC_ADMIN_TOKEN", "")
	if _, errs, code := execMC(t, append([]string{"store", "drain", "--undo", seg}, m...)...); code != 1 || !strings.Contains(errs, "--admin-token") {
		t.Fatalf("undo without the token: %d %q", code, errs)
	}
	t.Setenv("MC_ADMIN_TOKEN", "tok")
	out, errs, code = execMC(t, append([]string{"store", "drain", "--undo", seg}, m...)...)
	if code != 0 || out != "segment "+seg+": DRAINED -> OK (back in service: takes new objects)\n" {
		t.Fatalf("undo: %d %q %q", code, out, errs)
	}
	if out, errs, code := execMC(t, append([]string{"store", "put", "k", f}, m...)...); code != 0 {
		t.Fatalf("put after undo: %d %s %s", code, out, errs)
	}
	out, _, code = execMC(t, append([]string{"store", "drain", "--undo", seg, "-o", "json"}, m...)...)
	var j map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &j) != nil || j["segment"] != seg || j["status"] != "OK" || j["previous_status"] != "OK" {
		t.Fatalf("undo of a segment in service, JSON: %d %s", code, out)
	}
	if _, errs, code := execMC(t, append([]string{"store", "drain", "--undo", seg, "--status", "1-2"}, m...)...); code != 64 || !strings.Contains(errs, "one of the four") {
		t.Fatalf("--undo with --status: %d %q", code, errs)
	}
}

// `mc store rm --all` sends the admin token (MC_ADMIN_TOKEN or
// --admin-token) that a master with one asks of RemoveAll over gRPC.
func TestStoreRmAllAdminToken(t *testing.T) {
	isolateEnv(t)
	rpc, _, _, _ := startServeStore(t, "--segment-size", "16M", "--admin-token", "tok")
	m := []string{"--master", rpc}
	f := filepath.Join(t.TempDir(), "v")
	os.WriteFile(f, []byte("value"), 0o644)
	for _, k := range []string{"a", "b"} {
		if out, errs, code := execMC(t, append([]string{"store", "put", k, f}, m...)...); code != 0 {
			t.Fatalf("put: %d %s %s", code, out, errs)
		}
	}
	if _, errs, code := execMC(t, append([]string{"store", "rm", "--all"}, m...)...); code != 1 || !strings.Contains(errs, "mc: store rm: --all: remove all:") || !strings.Contains(errs, "--admin-token") {
		t.Fatalf("rm --all without the token: %d %q", code, errs)
	}
	if out, _, code := execMC(t, append([]string{"store", "exists", "a"}, m...)...); code != 0 {
		t.Fatalf("a refused rm --all removed a key: %d %s", code, out)
	}
	if _, errs, code := execMC(t, append([]string{"store", "rm", "--all", "a"}, m...)...); code != 64 {
		t.Fatalf("rm --all with a key: %d %q", code, errs)
	}
	out, errs, code := execMC(t, append([]string{"store", "rm", "--all", "--admin-token", "tok"}, m...)...)
	if code != 0 || out != "removed 2 key(s) (keys being read are kept)\n" {
		t.Fatalf("rm --all with --admin-token: %d %q %q", code, out, errs)
	}
	t.Setenv("MC_ADMIN_TOKEN", "tok")
	out, errs, code = execMC(t, append([]string{"store", "rm", "--all", "-o", "json"}, m...)...)
	var j map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &j) != nil || j["removed_count"] != float64(0) {
		t.Fatalf("rm --all with MC_ADMIN_TOKEN, JSON: %d %q %q", code, out, errs)
	}
}

// A drain that fails (no other segment to take the objects) exits 1, and
// its -o json says success false. Before, the JSON was the admin API's
// query answer, success true (the query worked) for a FAILED job.
func TestStoreDrainFailedJSON(t *testing.T) {
	isolateEnv(t)
	rpc, admin, _, _ := startServeStore(t, "--segment-size", "32M")
	m := []string{"--master", rpc, "--admin", admin}
	f := filepath.Join(t.TempDir(), "v")
	os.WriteFile(f, bytes.Repeat([]byte("x"), 100_000), 0o644)
	if out, errs, code := execMC(t, append([]string{"store", "put", "k", f}, m...)...); code != 0 {
		t.Fatalf("put: %d %s %s", code, out, errs)
	}
	out, errs, code := execMC(t, append([]string{"store", "drain", onlySegment(t, m), "--wait", "--interval", "100ms", "-o", "json"}, m...)...)
	var j store.DrainJobStatus
	if err := json.Unmarshal([]byte(out), &j); err != nil {
		t.Fatalf("drain: exit %d, %v: %s %s", code, err, out, errs)
	}
	if j.StatusName != "FAILED" {
		t.Fatalf("drain of the only segment: %s, want FAILED (the test needs a failed job): %+v", j.StatusName, j)
	}
	if code != 1 || j.Success {
		t.Errorf("failed drain job: exit %d, success %v; want exit 1, success false", code, j.Success)
	}
	// The table wraps the job's message (it was one row ~250 columns
	// wide).
	out, _, _ = execMC(t, append([]string{"store", "drain", "--status", j.JobID}, m...)...)
	for _, line := range strings.Split(out, "\n") {
		if n := len([]rune(line)); n > 120 {
			t.Errorf("drain status table line of %d columns:\n%s", n, out)
			break
		}
	}
	if len(j.Message) < 100 {
		t.Logf("the job's message is short (%q): the width check is weak", j.Message)
	}
}

// onlySegment is the name of the one segment of the store m reaches
// (fails if it has another number of them).
func onlySegment(t *testing.T, m []string) string {
	t.Helper()
	var st struct {
		Segments []store.SegmentDetail `json:"segments"`
	}
	out, errs, code := execMC(t, append([]string{"store", "stat", "-o", "json"}, m...)...)
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || len(st.Segments) != 1 {
		t.Fatalf("stat: %d %s %s", code, out, errs)
	}
	return st.Segments[0].Name
}
