//go:build linux

package cmd

import (
	"bytes"
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
	if !strings.Contains(nodeOut.String(), "tcp at 127.0.0.1") {
		t.Fatalf("node output does not give its segment's protocol as tcp:\n%s", nodeOut.String())
	}
	m := []string{"--master", rpc, "--admin", admin}
	dir := t.TempDir()
	src := filepath.Join(dir, "v")
	val := bytes.Repeat([]byte("same host "), 100003)
	if err := os.WriteFile(src, val, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, errs, code := execMC(t, append([]string{"store", "put", "k", src, "--protocol", "shm"}, m...)...); code != 0 {
		t.Fatalf("put --protocol shm to a same-host node: %q", errs)
	}
	for _, proto := range []string{"shm", "auto", "tcp"} {
		dst := filepath.Join(dir, "out-"+proto)
		if _, errs, code := execMC(t, append([]string{"store", "get", "k", "-o", dst, "--protocol", proto}, m...)...); code != 0 {
			t.Fatalf("get --protocol %s: %q", proto, errs)
		}
		if got, _ := os.ReadFile(dst); !bytes.Equal(got, val) {
			t.Fatalf("get --protocol %s wrote other bytes", proto)
		}
	}
	out, _, _ := execMC(t, append([]string{"store", "stat"}, m...)...)
	if !strings.Contains(out, "│ tcp ") {
		t.Fatalf("stat does not list the node's segment as tcp:\n%s", out)
	}
	// A node without shared memory: --protocol shm says why it cannot.
	_, _, _, _ = startServeStore(t, "--master", rpc, "--segment-size", "32M")
	_, errs, code := execMC(t, append([]string{"store", "put", "k2", src, "--protocol", "shm", "--replicas", "2"}, m...)...)
	if code == 0 || !strings.Contains(errs, "advertises no shared memory") {
		t.Fatalf("put --protocol shm with a replica on a tcp-only node: exit %d %q", code, errs)
	}
}
