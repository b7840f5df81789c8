//go:build linux

package cmd

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A node with --protocol auto and a client on its host: the client's
// --protocol shm refuses every transport but shared memory, so a put and
// get that succeed moved their bytes through it. A default (tcp) client
// still reaches the same node, and the master records the node under
// the descriptor protocol, tcp.
func TestStoreSameHostSHM(t *testing.T) {
	isolateEnv(t)
	rpc, admin, _, _ := startServeStore(t, "--segment-size", "0")
	_, _, nodeOut, _ := startServeStore(t, "--master", rpc, "--segment-size", "32M", "--protocol", "auto")
	// The table comes after the admin API answers, which is when
	// startServeStore returns.
	waitUntil(t, "the node's table giving its segment's protocol as tcp", func() bool {
		return strings.Contains(nodeOut.String(), "tcp at 127.0.0.1")
	})
	m := []string{"--master", rpc, "--admin", admin}
	dir := t.TempDir()
	src := filepath.Join(dir, "v")
	val := bytes.Repeat([]byte("same host "), 100003)
	if err := os.WriteFile(src, val, 0o644); err != nil {
		t.Fatal(err)
	}
	out, errs, code := execMC(t, append([]string{"store", "put", "k", src, "--protocol", "shm"}, m...)...)
	if code != 0 {
		t.Fatalf("put --protocol shm to a same-host node: %q", errs)
	}
	if !strings.Contains(out, "via shm\n") {
		t.Fatalf("put --protocol shm does not say shm moved the bytes: %q", out)
	}
	// The transport printed is the one the client's engine counted: auto
	// picks shm for this node, tcp stays tcp.
	for _, c := range []struct{ proto, via string }{{"shm", "shm"}, {"auto", "shm"}, {"tcp", "tcp"}} {
		proto := c.proto
		dst := filepath.Join(dir, "out-"+proto)
		_, errs, code := execMC(t, append([]string{"store", "get", "k", "-o", dst, "--protocol", proto}, m...)...)
		if code != 0 {
			t.Fatalf("get --protocol %s: %q", proto, errs)
		}
		if !strings.HasSuffix(errs, "via "+c.via+"\n") {
			t.Fatalf("get --protocol %s: %q, want the bytes moved via %s", proto, errs, c.via)
		}
		if got, _ := os.ReadFile(dst); !bytes.Equal(got, val) {
			t.Fatalf("get --protocol %s wrote other bytes", proto)
		}
	}
	out, _, _ = execMC(t, append([]string{"store", "stat"}, m...)...)
	if !strings.Contains(out, "│ tcp ") {
		t.Fatalf("stat does not list the node's segment as tcp:\n%s", out)
	}
	// A node without shared memory: --protocol shm says why it cannot
	// write the replica there, and the put keeps the one it wrote.
	_, _, _, _ = startServeStore(t, "--master", rpc, "--segment-size", "32M")
	out, errs, code = execMC(t, append([]string{"store", "put", "k2", src, "--protocol", "shm", "--replicas", "2"}, m...)...)
	if code != 0 || !strings.Contains(errs, "advertises no shared memory") || !strings.Contains(out, "1 replica(s) (fewer than the 2 asked") {
		t.Fatalf("put --protocol shm with a replica on a tcp-only node: exit %d %q %q", code, out, errs)
	}
}

// mc bench store against a node of this host started with --protocol
// auto: the default (auto) client's rows say shm, a --protocol tcp
// client's say tcp, each as its engine counted the bytes; --vs-tcp gives
// both rows in one run with the ratio; and a tcp row next to itself is
// refused.
func TestBenchStoreSameHostTransport(t *testing.T) {
	isolateEnv(t)
	rpc, admin, _, _ := startServeStore(t, "--segment-size", "0")
	startServeStore(t, "--master", rpc, "--segment-size", "64M", "--protocol", "auto")
	bench := func(args ...string) []map[string]any {
		t.Helper()
		args = append([]string{"bench", "store", "--master", rpc, "--admin", admin, "--value-size", "64K", "--op", "get", "--keys", "32",
			"--duration", "300ms", "--verify", "-o", "json"}, args...)
		out, errs, code := execMC(t, args...)
		if code != 0 {
			t.Fatalf("mc %s: exit %d: %s", strings.Join(args, " "), code, errs)
		}
		var j struct {
			Results []map[string]any `json:"results"`
		}
		if err := json.Unmarshal([]byte(out), &j); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		return j.Results
	}
	if r := bench(); len(r) != 1 || r[0]["transport"] != "shm" || r[0]["errors"] != 0.0 {
		t.Fatalf("default client on the node's host: %v, want one row via shm", r)
	}
	if r := bench("--protocol", "tcp"); len(r) != 1 || r[0]["transport"] != "tcp" {
		t.Fatalf("--protocol tcp: %v, want one row via tcp", r)
	}
	r := bench("--vs-tcp")
	if len(r) != 2 || r[0]["transport"] != "tcp" || r[1]["transport"] != "shm" || r[0]["vs_tcp"] != nil {
		t.Fatalf("--vs-tcp: %v, want a tcp row then a shm row", r)
	}
	if v, _ := r[1]["vs_tcp"].(float64); v != r[1]["gb_per_sec"].(float64)/r[0]["gb_per_sec"].(float64) {
		t.Fatalf("--vs-tcp: ratio %v of %v", r[1]["vs_tcp"], r)
	}
	_, errs, code := execMC(t, "bench", "store", "--master", rpc, "--vs-tcp", "--protocol", "tcp")
	if code == 0 || !strings.Contains(errs, "--vs-tcp compares shared memory with tcp") {
		t.Fatalf("--vs-tcp --protocol tcp: exit %d %q", code, errs)
	}
}

// mc bench store against a running store: each finished row is a line on
// stderr when stdout is not a terminal (issue 40.4: 22 s of silence), and
// the run ends with one line saying what it did to the store, whose own
// key it leaves alone (issue 35.4); a row that cannot fit is refused,
// naming --allow-evict.
func TestBenchStoreRunningStoreLines(t *testing.T) {
	isolateEnv(t)
	rpc, admin, _, _ := startServeStore(t, "--segment-size", "0")
	startServeStore(t, "--master", rpc, "--segment-size", "32M", "--protocol", "tcp")
	dir := t.TempDir()
	src := filepath.Join(dir, "v")
	os.WriteFile(src, bytes.Repeat([]byte("u"), 4<<20), 0o644)
	m := []string{"--master", rpc, "--admin", admin}
	if _, errs, code := execMC(t, append([]string{"store", "put", "user/key", src}, m...)...); code != 0 {
		t.Fatalf("put: %q", errs)
	}
	out, errs, code := execMC(t, append([]string{"bench", "store", "--value-size", "1M", "--op", "put,get", "--duration", "500ms", "--protocol", "tcp"}, m...)...)
	if code != 0 {
		t.Fatalf("bench store: exit %d: %s", code, errs)
	}
	if !strings.Contains(errs, "row 1: 1M put x1 batch 1: ") || !strings.Contains(errs, "row 2: 1M get x1 batch 1: ") {
		t.Fatalf("stderr has no line per row:\n%s", errs)
	}
	if !strings.Contains(out, `bench store: wrote under "bench/`) || !strings.Contains(out, "the store evicted 0 keys meanwhile") {
		t.Fatalf("stdout does not say what the run did:\n%s", out)
	}
	if _, errs, code := execMC(t, append([]string{"store", "exists", "user/key"}, m...)...); code != 0 {
		t.Fatalf("user/key gone after the run: exit %d %s", code, errs)
	}
	_, errs, code = execMC(t, append([]string{"bench", "store", "--value-size", "16M", "--op", "put", "--concurrency", "2", "--duration", "200ms", "--protocol", "tcp"}, m...)...)
	if code != 1 || !strings.Contains(errs, "not enough room below the store's eviction watermark") || !strings.Contains(errs, "--allow-evict") {
		t.Fatalf("a row larger than the room: exit %d %q", code, errs)
	}
}
