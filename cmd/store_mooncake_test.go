package cmd

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestStoreOverMooncakeWire: the store verbs with --master mooncake://,
// against mc's master answering Mooncake's wire on its RPC port, with a
// node that joins under mooncake_client's flag names.
func TestStoreOverMooncakeWire(t *testing.T) {
	isolateEnv(t)
	rpc, admin, _, _ := startServeStore(t, "--segment-size", "0")
	moon := "mooncake://" + rpc
	_, _, nodeOut, stopNode := startServeStore(t, "--master_server_address", moon, "--global_segment_size", "32 MB",
		"--host", "127.0.0.1", "--metadata_server", "P2PHANDSHAKE")
	m := []string{"--master", moon, "--admin", admin}
	out, _, _ := execMC(t, append([]string{"store", "stat", "-o", "json"}, m...)...)
	var sj struct {
		Segments []struct {
			Capacity uint64 `json:"allocator_capacity_bytes"`
		} `json:"segments"`
	}
	if json.Unmarshal([]byte(out), &sj); len(sj.Segments) != 1 || sj.Segments[0].Capacity != 32<<20 {
		t.Fatalf("master sees %q, want the node's 32 MiB segment (node said %s)", out, nodeOut.String())
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "v")
	val := bytes.Repeat([]byte("moon "), 50000)
	os.WriteFile(src, val, 0o644)
	if _, errs, code := execMC(t, append([]string{"store", "put", "model:x@r0/1", src}, m...)...); code != 0 {
		t.Fatalf("put: %q", errs)
	}
	if out, errs, code := execMC(t, append([]string{"store", "get", "model:x@r0/1"}, m...)...); code != 0 || out != string(val) {
		t.Fatalf("get: %d, %d bytes, %q", code, len(out), errs)
	}
	if _, _, code := execMC(t, append([]string{"store", "exists", "model:x@r0/1"}, m...)...); code != 0 {
		t.Fatalf("exists: exit %d", code)
	}
	if out, _, code := execMC(t, append([]string{"store", "query", "model:x@r0/1"}, m...)...); code != 0 || !strings.Contains(out, "tcp") {
		t.Fatalf("query: %d %q", code, out)
	}
	if _, errs, code := execMC(t, append([]string{"store", "get", "nope"}, m...)...); code != 1 || !strings.Contains(errs, "OBJECT_NOT_FOUND") {
		t.Fatalf("get of a missing key: %d %q", code, errs)
	}
	if _, errs, code := execMC(t, append([]string{"store", "rm", "model:x@r0/1", "--force"}, m...)...); code != 0 {
		t.Fatalf("rm: %q", errs)
	}
	if _, errs, code := execMC(t, "bench", "store", "--master", moon, "--admin", admin, "--value-size", "4K", "--op", "put,get", "--keys", "64", "--duration", "1", "--verify"); code != 0 {
		t.Fatalf("bench store over the Mooncake wire: %q", errs)
	}
	if code := stopNode(); code != 0 {
		t.Fatalf("node exit %d", code)
	}
	out, _, _ = execMC(t, append([]string{"store", "stat", "-o", "json"}, m...)...)
	if json.Unmarshal([]byte(out), &sj); len(sj.Segments) != 0 {
		t.Fatalf("segment still mounted after the node's SIGTERM: %q", out)
	}
}
