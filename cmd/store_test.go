package cmd

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvcache-ops/mc/pkg/engine/meta"
	"github.com/kvcache-ops/mc/pkg/store"
)

func freePort(t *testing.T) int {
	t.Helper()
	// Below the kernel's ephemeral range: a port taken from it and let go
	// is soon some other test's outgoing connection's (CI saw "address
	// already in use" when mc bound the port it was given).
	lo := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil && n > 12000 {
				lo = n
			}
		}
	}
	for range 100 {
		port := 10000 + rand.IntN(lo-10000)
		if l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port)); err == nil {
			l.Close()
			return port
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startServeStore runs `mc serve store ARGS` in-process, as a user types
// it, and waits until its admin API answers. stop ends it as SIGINT does
// and returns its exit status.
// serving waits for serve store's admin port to answer; false when it
// exited on a port taken meanwhile and retry allows another start.
func serving(t *testing.T, admin string, done chan int, cancel context.CancelFunc, out *syncBuffer, retry bool) bool {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get(admin + "/health")
		if err == nil {
			resp.Body.Close()
			// The banner comes just after the admin port answers: a
			// test reading it saw it cut short (CI:
			// TestStoreRDMASaysSoft).
			if o := out.String(); strings.Contains(o, "serving; SIGINT or SIGTERM stops") || strings.Contains(o, "\"role\"") && strings.Contains(o, "}\n") {
				return true
			}
		}
		select {
		case code := <-done:
			cancel()
			if retry && strings.Contains(out.String(), "address already in use") {
				return false
			}
			t.Fatalf("serve store exited %d before serving:\n%s", code, out.String())
		default:
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("serve store not serving after 20s:\n%s", out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func startServeStore(t *testing.T, args ...string) (rpc, admin string, out *syncBuffer, stop func() int) {
	t.Helper()
	var ctx context.Context
	var cancel context.CancelFunc
	var done chan int
	// The free ports are found by closing a listener, so another process
	// of a parallel test run may take one before serve store binds it
	// (CI saw "bind: address already in use" once): that start is
	// retried on other ports, at most twice.
	for attempt := 0; ; attempt++ {
		rpcPort, adminPort := freePort(t), freePort(t)
		rpc = "127.0.0.1:" + strconv.Itoa(rpcPort)
		admin = "http://127.0.0.1:" + strconv.Itoa(adminPort)
		out = &syncBuffer{}
		ctx, cancel = context.WithCancel(context.Background())
		done = make(chan int, 1)
		full := append([]string{"serve", "store", "--rpc_address", "127.0.0.1", "--rpc_port", strconv.Itoa(rpcPort),
			"--metrics_port", strconv.Itoa(adminPort), "--local-hostname", "127.0.0.1"}, args...)
		go func(ctx context.Context, done chan int, out *syncBuffer) { done <- Execute(ctx, full, out, out) }(ctx, done, out)
		if serving(t, admin, done, cancel, out, attempt < 2) {
			break
		}
	}
	stopped := false
	stop = func() int {
		if stopped {
			return 0
		}
		stopped = true
		cancel()
		select {
		case code := <-done:
			return code
		case <-time.After(15 * time.Second):
			t.Fatal("serve store did not stop within 15s of its signal")
			return -1
		}
	}
	t.Cleanup(func() { stop() })
	return rpc, admin, out, stop
}

func TestStoreCLIWalkthrough(t *testing.T) {
	isolateEnv(t)
	rpc, admin, _, stop := startServeStore(t, "--segment-size", "64M")
	m := []string{"--master", rpc, "--admin", admin}
	dir := t.TempDir()
	src := filepath.Join(dir, "block.bin")
	val := bytes.Repeat([]byte("kv-cache block "), 70000)
	if err := os.WriteFile(src, val, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, errs, code := execMC(t, append([]string{"store", "put", "prefix/0001", src, "--replicas", "1"}, m...)...); code != 0 || !strings.Contains(out, "1050000 bytes") {
		t.Fatalf("put: %d %q %q", code, out, errs)
	}
	dst := filepath.Join(dir, "out.bin")
	if _, errs, code := execMC(t, append([]string{"store", "get", "prefix/0001", "-o", dst}, m...)...); code != 0 {
		t.Fatalf("get -o FILE: %d %q", code, errs)
	}
	if got, _ := os.ReadFile(dst); !bytes.Equal(got, val) {
		t.Fatal("get -o FILE wrote other bytes")
	}
	if st, err := os.Stat(dst); err != nil || st.Mode().Perm() != 0o666&^umask() {
		t.Errorf("get -o FILE: mode %v, want 0666 less the umask (%o)", st.Mode().Perm(), 0o666&^umask())
	}
	out, _, code := execMC(t, append([]string{"store", "get", "prefix/0001"}, m...)...)
	if code != 0 || out != string(val) {
		t.Fatalf("get to stdout: %d, %d bytes", code, len(out))
	}
	out, _, _ = execMC(t, append([]string{"store", "get", "prefix/0001", "-o", "json"}, m...)...)
	var gj struct {
		Key   string `json:"key"`
		Size  int    `json:"size"`
		Value string `json:"value_base64"`
	}
	if err := json.Unmarshal([]byte(out), &gj); err != nil || gj.Size != len(val) || gj.Key != "prefix/0001" {
		t.Fatalf("get -o json: %v %+v", err, gj)
	}
	if _, _, code := execMC(t, append([]string{"store", "exists", "prefix/0001"}, m...)...); code != 0 {
		t.Fatalf("exists of a stored key: exit %d", code)
	}
	if _, _, code := execMC(t, append([]string{"store", "exists", "nope"}, m...)...); code != 1 {
		t.Fatalf("exists of an absent key: exit %d, want 1", code)
	}
	if _, errs, code := execMC(t, append([]string{"store", "get", "nope"}, m...)...); code != 1 || !strings.Contains(errs, "OBJECT_NOT_FOUND") || strings.Count(errs, "\n") != 1 {
		t.Fatalf("get of an unknown key: %d %q", code, errs)
	}
	if _, errs, code := execMC(t, append([]string{"store", "put", "prefix/0001", src}, m...)...); code != 1 || !strings.Contains(errs, "OBJECT_ALREADY_EXISTS") {
		t.Fatalf("duplicate put: %d %q", code, errs)
	}
	execMC(t, append([]string{"store", "put", "other/1", src}, m...)...)
	out, _, _ = execMC(t, append([]string{"store", "ls", "--prefix", "prefix/"}, m...)...)
	if out != "prefix/0001\n" {
		t.Fatalf("ls --prefix: %q", out)
	}
	out, _, _ = execMC(t, append([]string{"store", "ls", "-o", "json"}, m...)...)
	var lj struct{ Keys []string }
	if json.Unmarshal([]byte(out), &lj); len(lj.Keys) != 2 {
		t.Fatalf("ls -o json: %q", out)
	}
	out, _, code = execMC(t, append([]string{"store", "stat", "-o", "json"}, m...)...)
	var sj struct {
		Segments []struct {
			Name     string `json:"segment_name"`
			Used     uint64 `json:"allocator_used_bytes"`
			Capacity uint64 `json:"allocator_capacity_bytes"`
		} `json:"segments"`
		Keys   int    `json:"keys"`
		Used   uint64 `json:"used_bytes"`
		Role   string `json:"role"`
		Leader struct {
			Present bool `json:"present"`
		} `json:"leader"`
	}
	if err := json.Unmarshal([]byte(out), &sj); err != nil || code != 0 {
		t.Fatalf("stat -o json: %v %q", err, out)
	}
	if sj.Keys != 2 || len(sj.Segments) != 1 || sj.Segments[0].Capacity != 64<<20 || sj.Used != 2*uint64(len(val)) || sj.Role != "standalone" || sj.Leader.Present {
		t.Fatalf("stat: %+v", sj)
	}
	out, _, _ = execMC(t, append([]string{"store", "stat"}, m...)...)
	for _, want := range []string{"segments", "keys", "2.0 MiB / 64.0 MiB", "evicted keys", "standalone", "not an HA master"} {
		if !strings.Contains(out, want) {
			t.Fatalf("stat table lacks %q:\n%s", want, out)
		}
	}
	out, _, _ = execMC(t, append([]string{"store", "query", "prefix/0001", "-o", "json"}, m...)...)
	var qj struct {
		Replicas []struct {
			Endpoint string `json:"endpoint"`
			Size     uint64 `json:"size"`
		} `json:"replicas"`
	}
	if json.Unmarshal([]byte(out), &qj); len(qj.Replicas) != 1 || qj.Replicas[0].Size != uint64(len(val)) {
		t.Fatalf("query: %q", out)
	}
	// The gets above hold leases: rm refuses, rm --force removes.
	if _, errs, code := execMC(t, append([]string{"store", "rm", "prefix/0001"}, m...)...); code != 1 || !strings.Contains(errs, "OBJECT_HAS_LEASE") {
		t.Fatalf("rm while leased: %d %q", code, errs)
	}
	if _, errs, code := execMC(t, append([]string{"store", "rm", "--force", "prefix/0001"}, m...)...); code != 0 {
		t.Fatalf("rm --force: %d %q", code, errs)
	}
	if code := stop(); code != 0 {
		t.Fatalf("serve store exit %d after its signal", code)
	}
	// With the store gone, a client says which master it could not reach.
	if _, errs, code := execMC(t, append([]string{"store", "put", "x", src}, m...)...); code != 1 || !strings.Contains(errs, rpc) {
		t.Fatalf("put with no master: %d %q", code, errs)
	}
	if _, errs, code := execMC(t, append([]string{"store", "ls"}, m...)...); code != 1 || !strings.Contains(errs, "admin API") {
		t.Fatalf("ls with no master: %d %q", code, errs)
	}
}

// A node on a second process-equivalent mounts on an existing master,
// serves its own /metrics and /health, and unmounts at its signal.
func TestServeStoreNode(t *testing.T) {
	isolateEnv(t)
	rpc, admin, _, _ := startServeStore(t, "--segment-size", "0")
	_, nodeAdmin, _, stopNode := startServeStore(t, "--master", rpc, "--segment-size", "32M")
	m := []string{"--master", rpc, "--admin", admin}
	out, _, _ := execMC(t, append([]string{"store", "stat", "-o", "json"}, m...)...)
	var sj struct {
		Segments []struct {
			Capacity uint64 `json:"allocator_capacity_bytes"`
		} `json:"segments"`
	}
	if json.Unmarshal([]byte(out), &sj); len(sj.Segments) != 1 || sj.Segments[0].Capacity != 32<<20 {
		t.Fatalf("master sees %q, want the node's 32 MiB segment", out)
	}
	for path, want := range map[string]string{"/metrics": "mc_store_node_master_up", "/health": `"role":"node"`} {
		resp, err := http.Get(nodeAdmin + path)
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		b.ReadFrom(resp.Body)
		resp.Body.Close()
		if !strings.Contains(b.String(), want) {
			t.Fatalf("node %s lacks %s:\n%s", path, want, b.String())
		}
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "v")
	os.WriteFile(src, []byte("on the node"), 0o644)
	if _, errs, code := execMC(t, append([]string{"store", "put", "k", src}, m...)...); code != 0 {
		t.Fatalf("put to the node: %q", errs)
	}
	if code := stopNode(); code != 0 {
		t.Fatalf("node exit %d", code)
	}
	out, _, _ = execMC(t, append([]string{"store", "stat", "-o", "json"}, m...)...)
	if json.Unmarshal([]byte(out), &sj); len(sj.Segments) != 0 {
		t.Fatalf("segment still mounted after the node's graceful stop: %q", out)
	}
}

func TestServeStoreConfigPath(t *testing.T) {
	isolateEnv(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "master.json")
	os.WriteFile(cfg, []byte(`{"default_kv_lease_ttl": "250ms", "eviction_high_watermark_ratio": 0.8, "segment_size": "16M"}`), 0o644)
	_, admin, _, _ := startServeStore(t, "--config_path", cfg, "--segment-size", "8M")
	resp, err := http.Get(admin + "/get_segments_detail")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var d struct {
		Segments []struct {
			Size uint64 `json:"size_bytes"`
		} `json:"segments"`
	}
	json.NewDecoder(resp.Body).Decode(&d)
	if len(d.Segments) != 1 || d.Segments[0].Size != 8<<20 {
		t.Fatalf("segments %+v: the command line's --segment-size must win over the config file", d.Segments)
	}
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(bad, []byte(`{"rpc_prot": 1}`), 0o644)
	if _, errs, code := execMC(t, "serve", "store", "--config_path", bad); code != exitUsage || !strings.Contains(errs, `unknown setting "rpc_prot" (did you mean "rpc_port"?)`) {
		t.Fatalf("unknown config key: %d %q", code, errs)
	}
}

// mooncake_master's own master.json (Mooncake 3b5a594, testdata/README.md)
// starts mc: the keys mc has flags for are honoured, the others named in
// one warning, none refused.
func TestServeStoreMooncakeMasterJSON(t *testing.T) {
	isolateEnv(t)
	const path = "testdata/mooncake-master.json"
	_, admin, out, stop := startServeStore(t, "--config_path", path, "--segment-size", "8M")
	if resp, err := http.Get(admin + "/health"); err != nil {
		t.Fatal(err)
	} else {
		resp.Body.Close()
	}
	if code := stop(); code != 0 {
		t.Fatalf("serve store exited %d:\n%s", code, out.String())
	}
	var warn []string
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.Contains(l, "--config-path") {
			warn = append(warn, l)
		}
	}
	notApplicable := []string{"rpc_interface", "rpc_conn_timeout_seconds", "rpc_enable_tcp_no_delay",
		"dynamic_replication_mode", "enable_oplog", "root_fs_dir", "memory_allocator",
		"enable_http_metadata_server", "kv_events_model_name", "kv_events_tenant_id"}
	if len(warn) != 1 || !strings.HasPrefix(warn[0], "W") || !strings.Contains(warn[0], "do not apply to mc, ignored") {
		t.Fatalf("want one warning line about the config file, got %q", warn)
	}
	for _, k := range notApplicable {
		if !strings.Contains(warn[0], " "+k+",") && !strings.HasSuffix(warn[0], " "+k) {
			t.Errorf("the warning does not name %s: %q", k, warn[0])
		}
	}
	for _, k := range []string{"rpc_port", "metrics_port", "client_live_ttl_sec", "eviction_ratio", "cluster_id", "enable_ha",
		"enable_kv_events", "kv_events_bind_endpoint", "kv_events_backend_id", "kv_events_emit_object_key"} {
		if strings.Contains(warn[0], " "+k) {
			t.Errorf("the warning names %s, which mc honours: %q", k, warn[0])
		}
	}

	// Honoured: the file's values reach the flags (the command line's win).
	cmd := newServeStoreCmd(&printer{Out: &bytes.Buffer{}, Err: &bytes.Buffer{}})
	fs := cmd.Flags()
	if err := fs.Parse([]string{"--rpc-port", "6000"}); err != nil {
		t.Fatal(err)
	}
	vals, err := readMasterConfigFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := applyMasterConfigFile(fs, vals); err != nil {
		t.Fatal(err)
	}
	for flag, want := range map[string]string{"rpc-port": "6000", "metrics-port": "9003", "client-ttl": "1m",
		"default-kv-lease-ttl": "10s", "max-kv-soft-pin-ttl": "24h", "eviction-ratio": "0.1",
		"eviction-high-watermark-ratio": "1", "rpc-thread-num": "16", "cluster-id": "mooncake_cluster",
		"enable-metric-reporting": "true"} {
		if got := fs.Lookup(flag).Value.String(); got != want {
			t.Errorf("--%s = %s after master.json, want %s", flag, got, want)
		}
	}

	// Every setting mooncake_master takes at 3b5a594, and enable_gc of
	// older ones, is honoured or ignored, never refused.
	all := map[string]any{"enable_gc": false}
	for _, k := range mooncakeMasterKeys {
		all[k] = nil
	}
	ignored, err := applyMasterConfigFile(newServeStoreCmd(&printer{Out: &bytes.Buffer{}, Err: &bytes.Buffer{}}).Flags(), all)
	if err != nil {
		t.Fatalf("a mooncake_master key refused: %v", err)
	}
	if len(ignored) == 0 || len(ignored) >= len(all) {
		t.Errorf("ignored %d of %d keys: %v", len(ignored), len(all), ignored)
	}
}

func TestStoreBadInput(t *testing.T) {
	isolateEnv(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "store", "--segment-size", "lots"}, "--segment-size"},
		{[]string{"serve", "store", "--default_kv_lease_ttl", "10x"}, "--default-kv-lease-ttl"},
		{[]string{"serve", "store", "--allocation_strategy", "best"}, "--allocation-strategy \"best\""},
		{[]string{"serve", "store", "--eviction_high_watermark_ratio", "1.5"}, "eviction_high_watermark_ratio"},
		{[]string{"serve", "store", "--put_start_release_timeout_sec", "10"}, "must exceed"},
		{[]string{"serve", "store", "--master", "nohost"}, "--master"},
		{[]string{"serve", "store", "--master", "etcd://"}, "--master"},
		{[]string{"serve", "store", "--enable_ha"}, "--ha-backend-connstring"},
		{[]string{"serve", "store", "--enable_ha", "--ha_backend_connstring", "127.0.0.1"}, "--ha-backend-connstring"},
		{[]string{"serve", "store", "--enable_ha", "--ha_backend_connstring", "redis://127.0.0.1:6379"}, "the HA backend is etcd"},
		{[]string{"serve", "store", "--enable_ha", "--etcd_endpoints", "127.0.0.1:2379", "--ha-lease-ttl", "1"}, "--ha-lease-ttl"},
		{[]string{"serve", "store", "--protocol", "udp"}, "--protocol"},
		{[]string{"serve", "store", "--config_path", "/nonexistent/x.json"}, "--config-path"},
		{[]string{"store", "put"}, "store put: accepts between 1 and 2 arg(s), received 0: usage: mc store put KEY"},
		{[]string{"store", "get", "a", "b"}, "store get: accepts 1 arg(s)"},
		{[]string{"store", "replay"}, "store replay: --trace is required"},
		{[]string{"store", "get", "k", "--master", "nohost"}, "--master"},
		{[]string{"store", "put", "k", "/nonexistent/file"}, "value FILE: open /nonexistent/file"},
		{[]string{"store", "put", "k", "--replicas", "0"}, "--replicas"},
		{[]string{"store", "ls", "--admin", "ftp://x"}, "admin URL"},
	} {
		_, errs, code := execMC(t, c.args...)
		if code == 0 || !strings.Contains(errs, c.want) || strings.Count(errs, "\n") != 1 {
			t.Errorf("mc %s: exit %d, stderr %q; want one line naming %q", strings.Join(c.args, " "), code, errs, c.want)
		}
	}
}

// HA as a user runs it: two master candidates on one etcd, a node and the
// client commands following the leader through etcd://, a failover.
func TestServeStoreHA(t *testing.T) {
	isolateEnv(t)
	e, err := meta.StartEtcd(context.Background(), meta.EtcdConfig{Listen: "127.0.0.1:0", NoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	t.Setenv("MC_STORE_CLUSTER_ID", "cli-ha")
	conn := "etcd://" + e.Endpoints()[0]
	cand := []string{"--enable_ha", "--ha_backend_connstring", conn, "--segment-size", "0", "--ha-lease-ttl", "2"}
	_, adminA, _, stopA := startServeStore(t, cand...)
	// The other candidate as mooncake_master is told where etcd is: the
	// bare endpoints.
	cand[2] = e.Endpoints()[0]
	_, adminB, _, stopB := startServeStore(t, cand...)
	startServeStore(t, "--master", conn, "--segment-size", "32M")
	role := func(admin string) string {
		resp, err := http.Get(admin + "/role")
		if err != nil {
			return err.Error()
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		b.ReadFrom(resp.Body)
		return b.String()
	}
	leader, standby, stopLeader := adminA, adminB, stopA
	if role(adminA) != "leader" {
		leader, standby, stopLeader = adminB, adminA, stopB
	}
	if role(leader) != "leader" || role(standby) != "standby" {
		t.Fatalf("roles %q and %q, want a leader and a standby", role(adminA), role(adminB))
	}
	// Mooncake's snapshot metrics come from the HA candidate.
	types, _ := scrapeTypes(t, leader+"/metrics")
	for _, w := range mooncakeDashboardMetrics {
		if types[w.name] != w.typ {
			t.Errorf("HA leader: %s: type %q, want %s", w.name, types[w.name], w.typ)
		}
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "v")
	os.WriteFile(src, []byte("survives failover"), 0o644)
	if _, errs, code := execMC(t, "store", "put", "k", src, "--master", conn); code != 0 {
		t.Fatalf("put through etcd://: %q", errs)
	}
	out, errs, code := execMC(t, "store", "stat", "--master", conn, "--admin", leader)
	if code != 0 || !strings.Contains(out, "leader") || !strings.Contains(out, "(view ") {
		t.Fatalf("stat: %d %q %q: want the leader and its view version", code, out, errs)
	}
	// Without --admin: the admin address the leader publishes in etcd
	// (not port 9003, which nothing here listens on).
	out, errs, code = execMC(t, "store", "stat", "--master", conn, "-o", "json")
	if code != 0 || !strings.Contains(out, `"role": "leader"`) {
		t.Fatalf("stat without --admin: %d %q %q: want the leader's admin API found through etcd", code, out, errs)
	}
	if code := stopLeader(); code != 0 {
		t.Fatalf("leader exit %d", code)
	}
	// One-shot verbs during the failover wait for the next leader (within
	// their RPC timeout) instead of failing on the old one: no retry here.
	out, errs, code = execMC(t, "store", "get", "k", "--master", conn)
	if code != 0 || out != "survives failover" {
		t.Fatalf("get during the failover: %d %q %q", code, out, errs)
	}
	if role(standby) != "leader" {
		t.Fatalf("after failover: standby's role %q", role(standby))
	}
	out, errs, code = execMC(t, "store", "ls", "--master", conn)
	if code != 0 || !strings.Contains(out, "k") {
		t.Fatalf("ls after the failover, without --admin: %d %q %q", code, out, errs)
	}
}

// TestServeStoreTwoNodesOneHost: nodes serve no admin HTTP unless asked
// (--metrics_port), so two of them run on one host; they once both took
// the default 9003 and the second hung.
func TestServeStoreTwoNodesOneHost(t *testing.T) {
	isolateEnv(t)
	rpc, admin, _, _ := startServeStore(t, "--segment-size", "0")
	ctx, cancel := context.WithCancel(context.Background())
	var outs [2]syncBuffer
	done := make(chan int, 2)
	for i := range outs {
		go func() {
			done <- Execute(ctx, []string{"serve", "store", "--master", rpc, "--segment-size", "8M", "--local-hostname", "127.0.0.1"}, &outs[i], &outs[i])
		}()
	}
	defer func() {
		cancel()
		for range outs {
			<-done
		}
	}()
	// Polled over HTTP, not with execMC: another Execute in this process
	// while the nodes start would swap the process-wide logger (glog.Setup)
	// under them, and their lines would land in its buffer (a race).
	deadline := time.Now().Add(20 * time.Second)
	for {
		var out string
		if resp, err := http.Get(admin + "/get_all_segments"); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			out = string(b)
		}
		if len(strings.Fields(out)) == 2 {
			break
		}
		select {
		case code := <-done:
			t.Fatalf("a node exited %d:\n%s\n%s", code, outs[0].String(), outs[1].String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("two nodes not mounted after 20 s: %s\n%s\n%s", out, outs[0].String(), outs[1].String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	for i := range outs {
		if strings.Contains(outs[i].String(), "admin HTTP") {
			t.Fatalf("node %d serves admin HTTP without --metrics_port:\n%s", i, outs[i].String())
		}
	}
}

// Keys with the '/', ':' and '@' of KV-cache key schemes, and one with
// '&', read back through every admin verb; several keys in one query go
// through /batch_query_keys.
func TestStoreQueryKeySchemes(t *testing.T) {
	isolateEnv(t)
	rpc, admin, _, _ := startServeStore(t, "--segment-size", "16M")
	m := []string{"--master", rpc, "--admin", admin}
	keys := []string{"py/3", "model:llama@rank0/abc", "a&b c"}
	src := filepath.Join(t.TempDir(), "v")
	if err := os.WriteFile(src, []byte("value"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if _, errs, code := execMC(t, append([]string{"store", "put", k, src}, m...)...); code != 0 {
			t.Fatalf("put %q: %d %q", k, code, errs)
		}
	}
	for _, k := range keys {
		if out, errs, code := execMC(t, append([]string{"store", "query", k}, m...)...); code != 0 || !strings.Contains(out, k) {
			t.Errorf("query %q: %d %q %q", k, code, out, errs)
		}
		if out, errs, code := execMC(t, append([]string{"store", "ls", "--prefix", k}, m...)...); code != 0 || out != k+"\n" {
			t.Errorf("ls --prefix %q: %d %q %q", k, code, out, errs)
		}
	}
	out, errs, code := execMC(t, append(append([]string{"store", "query", "-o", "json", "missing"}, keys...), m...)...)
	var qj struct {
		Results []struct {
			Key      string `json:"key"`
			Replicas []any  `json:"replicas"`
			Error    string `json:"error"`
		} `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &qj); err != nil || code != 1 || len(qj.Results) != 4 || !strings.Contains(errs, `mc: store query: "missing": OBJECT_NOT_FOUND`) {
		t.Fatalf("query of four keys: %d %v %q %q", code, err, out, errs)
	}
	for i, r := range qj.Results[1:] {
		if r.Key != keys[i] || len(r.Replicas) != 1 || r.Error != "" {
			t.Errorf("batch query result %d: %+v", i, r)
		}
	}
}

// A key the master would refuse is refused before anything connects
// (issue #25: mc store put "" FILE dialled the master first), with one
// message shape for every verb.
func TestStoreKeysCheckedBeforeConnecting(t *testing.T) {
	isolateEnv(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var dials atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			dials.Add(1)
			c.Close()
		}
	}()
	var reqs atomic.Int32
	adm := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { reqs.Add(1) }))
	defer adm.Close()
	src := filepath.Join(t.TempDir(), "v")
	if err := os.WriteFile(src, []byte("value"), 0o644); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("k", store.MaxKeyLength+1)
	m := []string{"--master", ln.Addr().String(), "--admin", adm.URL}
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"put", "", src}, 64, `store put: invalid key "": empty key`},
		{[]string{"put", long, "-"}, 64, `store put: invalid key "` + long[:64] + `"...: key of 4097 bytes exceeds the limit of 4096`},
		{[]string{"get", ""}, 64, `store get: invalid key "": empty key`},
		{[]string{"get", "a\x00b"}, 64, `store get: invalid key "a\x00b": key contains a NUL byte at 1`},
		{[]string{"put", "a\nb", src}, 64, `store put: invalid key "a\nb": key contains control character '\n' at byte 1`},
		{[]string{"get", "bad\xff"}, 64, `store get: invalid key "bad\xff": key is not valid UTF-8 (byte 0xff at 3)`},
		{[]string{"exists", "tab\t"}, 64, `store exists: invalid key "tab\t": key contains control character '\t' at byte 3`},
		{[]string{"rm", "ok", "x\r"}, 64, `store rm: invalid key "x\r" (argument 2): key contains control character '\r' at byte 1`},
		{[]string{"exists", ""}, 64, `store exists: invalid key "": empty key`},
		{[]string{"rm", "ok", ""}, 64, `store rm: invalid key "" (argument 2): empty key`},
		{[]string{"query", long}, 64, `store query: invalid key "` + long[:64] + `"...: key of 4097 bytes`},
		{[]string{"query", "ok", ""}, 64, `store query: invalid key "" (argument 2): empty key`},
	} {
		_, errs, code := execMC(t, append(append([]string{"store"}, c.args...), m...)...)
		if code != c.code || !strings.HasPrefix(errs, "mc: "+c.want) || strings.Count(errs, "\n") != 1 {
			t.Errorf("mc store %s: exit %d, stderr %q; want %d and one line starting %q", c.args[0], code, errs, c.code, "mc: "+c.want)
		}
	}
	// A moment for a dial that was made to be accepted and counted.
	time.Sleep(100 * time.Millisecond)
	if n, r := dials.Load(), reqs.Load(); n != 0 || r != 0 {
		t.Errorf("bad keys still reached the master: %d connections, %d admin requests", n, r)
	}
}

// mc store ls prints each key on one line as it is, or Go-quoted when it
// is not a key mc would store (a mooncake_master accepts any bytes) or
// starts with a quote: a listing never shows one key as two (issue 34.6).
// The JSON output carries the keys as JSON strings.
func TestStoreLsQuotesKeys(t *testing.T) {
	isolateEnv(t)
	adm := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/get_all_keys" {
			http.NotFound(w, r)
			return
		}
		io.WriteString(w, "plain/key 1\n\"quoted\"\ntab\there\nbad\xff\nc1\u0085\n")
	}))
	defer adm.Close()
	out, errs, code := execMC(t, "store", "ls", "--admin", adm.URL)
	want := "\"\\\"quoted\\\"\"\n\"bad\\xff\"\n\"c1\\u0085\"\nplain/key 1\n\"tab\\there\"\n"
	if code != 0 || out != want {
		t.Fatalf("mc store ls: exit %d, stdout %q, stderr %q; want %q", code, out, errs, want)
	}
	out, _, code = execMC(t, "store", "ls", "--admin", adm.URL, "-o", "json")
	var got struct{ Keys []string }
	if err := json.Unmarshal([]byte(out), &got); code != 0 || err != nil || len(got.Keys) != 5 || got.Keys[4] != "tab\there" {
		t.Fatalf("mc store ls -o json: exit %d, %q (%v)", code, out, err)
	}
}

// One model's cache cleaned up by pattern, as an operator would: look,
// dry-run, remove, with the key being read kept until --force.
func TestStoreRegexLsAndRm(t *testing.T) {
	isolateEnv(t)
	rpc, admin, _, _ := startServeStore(t, "--segment-size", "16M")
	m := []string{"--master", rpc, "--admin", admin}
	src := filepath.Join(t.TempDir(), "v")
	if err := os.WriteFile(src, []byte("value"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"model:llama@rank0/a", "model:llama@rank1/a", "model:qwen@rank0/a"} {
		if _, errs, code := execMC(t, append([]string{"store", "put", k, src}, m...)...); code != 0 {
			t.Fatalf("put %q: %q", k, errs)
		}
	}
	if _, errs, code := execMC(t, append([]string{"store", "get", "model:llama@rank1/a"}, m...)...); code != 0 {
		t.Fatalf("get: %q", errs)
	}
	out, errs, code := execMC(t, append([]string{"store", "ls", "--regex", "^model:llama@"}, m...)...)
	if code != 0 || out != "model:llama@rank0/a\nmodel:llama@rank1/a\n" || errs != "2 key(s) match \"^model:llama@\"\n" {
		t.Fatalf("ls --regex: %d %q %q", code, out, errs)
	}
	out, errs, code = execMC(t, append([]string{"store", "rm", "--regex", "^model:llama@", "--dry-run"}, m...)...)
	if code != 0 || !strings.Contains(out, "would remove \"model:llama@rank0/a\"\n") ||
		!strings.Contains(out, "would keep \"model:llama@rank1/a\": OBJECT_HAS_LEASE") || !strings.Contains(out, "would remove 1 key(s), would keep 1") {
		t.Fatalf("rm --regex --dry-run: %d %q %q", code, out, errs)
	}
	out, errs, code = execMC(t, append([]string{"store", "rm", "--regex", "^model:llama@"}, m...)...)
	if code != 1 || !strings.Contains(out, "removed 1 key(s), kept 1") ||
		errs != "mc: store rm: --regex \"^model:llama@\": kept 1 of 2 matching key(s) (--force removes keys being read)\n" {
		t.Fatalf("rm --regex with a key being read: %d %q %q", code, out, errs)
	}
	out, errs, code = execMC(t, append([]string{"store", "rm", "--regex", "^model:llama@", "--force", "-o", "json"}, m...)...)
	var rj struct {
		Removed      []string `json:"removed"`
		RemovedCount int      `json:"removed_count"`
		RefusedCount int      `json:"refused_count"`
	}
	if err := json.Unmarshal([]byte(out), &rj); err != nil || code != 0 || rj.RemovedCount != 1 || rj.RefusedCount != 0 || rj.Removed[0] != "model:llama@rank1/a" {
		t.Fatalf("rm --regex --force -o json: %d %q %q", code, out, errs)
	}
	out, _, _ = execMC(t, append([]string{"store", "ls", "--regex", "model:", "-o", "json"}, m...)...)
	var lj struct {
		Keys    []string `json:"keys"`
		Matched int      `json:"matched"`
	}
	if err := json.Unmarshal([]byte(out), &lj); err != nil || lj.Matched != 1 || lj.Keys[0] != "model:qwen@rank0/a" {
		t.Fatalf("ls --regex -o json after: %q", out)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		// The master's answer, a pattern that does not compile: a usage
		// error (before, exit 1 as if the store had failed).
		{[]string{"rm", "--regex", "(unclosed"}, `mc: store rm: invalid --regex "(unclosed": INVALID_PARAMS: remove by regex: pattern "(unclosed": error parsing regexp`},
		{[]string{"ls", "--regex", "a{2,1}"}, `mc: store ls: invalid --regex "a{2,1}": INVALID_PARAMS`},
		{[]string{"rm", "k", "--regex", "x"}, "mc: store rm: give keys or --regex, not both"},
		{[]string{"rm", "k", "--dry-run"}, "mc: store rm: --dry-run goes with --regex"},
		{[]string{"rm"}, "mc: store rm: give the keys to remove, or --regex RE"},
		{[]string{"rm", "--regex", ""}, "mc: store rm: --regex needs a pattern"},
		{[]string{"ls", "--regex", "x", "--prefix", "y"}, "mc: store ls: give --prefix or --regex, not both"},
	} {
		_, errs, code := execMC(t, append(append([]string{"store"}, c.args...), m...)...)
		wantCode := exitUsage
		if code != wantCode || !strings.HasPrefix(errs, c.want) || strings.Count(errs, "\n") != 1 {
			t.Errorf("mc store %s: %d %q, want %d and one line starting %q", strings.Join(c.args, " "), code, errs, wantCode, c.want)
		}
	}
}

// The metrics of Mooncake's Grafana dashboard (monitoring/grafana/
// dashboards/mooncake.json) for features mc has, with Mooncake's names
// and types (issue #25, item 6). haOnly ones come from HA snapshots.
var mooncakeDashboardMetrics = []struct {
	name, typ string
	haOnly    bool
}{
	{"master_batch_exist_key_items_total", "counter", false},
	{"master_batch_get_replica_list_items_total", "counter", false},
	{"master_batch_put_start_items_total", "counter", false},
	{"master_batch_put_end_items_total", "counter", false},
	{"master_exist_key_failures_total", "counter", false},
	{"master_put_start_discarded_staging_size", "gauge", false},
	{"master_value_size_bytes", "histogram", false},
	{"master_attempted_evictions_mem", "counter", false},
	{"master_successful_evictions_mem", "counter", false},
	{"master_evicted_key_count_mem", "counter", false},
	{"master_evicted_size_bytes_mem", "counter", false},
	{"mem_cache_hit_nums_", "counter", false},
	{"mem_cache_nums_", "gauge", false},
	{"mem_cache_hit_bytes_total", "counter", false},
	{"valid_get_nums_", "counter", false},
	{"total_get_nums_", "counter", false},
	{"master_remove_by_regex_requests_total", "counter", false},
	{"master_remove_by_regex_failures_total", "counter", false},
	{"master_snapshot_success", "counter", true},
	{"master_snapshot_fail", "counter", true},
	{"master_snapshot_duration_ms", "histogram", true},
}

// scrapeTypes reads a /metrics page: each family's type and its samples
// by name (histograms by their _count).
func scrapeTypes(t *testing.T, url string) (map[string]string, map[string]float64) {
	t.Helper()
	types, vals, err := tryScrape(url)
	if err != nil {
		t.Fatal(err)
	}
	return types, vals
}

func tryScrape(url string) (map[string]string, map[string]float64, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", url, err)
	}
	types, vals := map[string]string{}, map[string]float64{}
	for name, f := range fams {
		types[name] = strings.ToLower(f.GetType().String())
		for _, m := range f.GetMetric() {
			switch {
			case m.Counter != nil:
				vals[name] += m.Counter.GetValue()
			case m.Gauge != nil:
				vals[name] += m.Gauge.GetValue()
			case m.Untyped != nil:
				vals[name] += m.Untyped.GetValue()
			case m.Histogram != nil:
				vals[name] += float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return types, vals, nil
}

// A running store exports them, and they count what happened: a put of
// 5 bytes, two gets (one of an absent key), an exist, a regex removal.
func TestServeStoreExportsMooncakeDashboardMetrics(t *testing.T) {
	isolateEnv(t)
	rpc, admin, _, _ := startServeStore(t, "--segment-size", "16M")
	m := []string{"--master", rpc, "--admin", admin}
	src := filepath.Join(t.TempDir(), "v")
	if err := os.WriteFile(src, []byte("value"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"put", "k", src}, {"get", "k"}, {"get", "absent"}, {"exists", "k"}, {"rm", "--regex", "^nothing-"}} {
		execMC(t, append(append([]string{"store"}, args...), m...)...)
	}
	types, vals := scrapeTypes(t, admin+"/metrics")
	for _, w := range mooncakeDashboardMetrics {
		if w.haOnly {
			continue
		}
		if types[w.name] != w.typ {
			t.Errorf("%s: type %q, want %s", w.name, types[w.name], w.typ)
		}
	}
	for name, want := range map[string]float64{
		"total_get_nums_": 2, "valid_get_nums_": 1, "mem_cache_hit_nums_": 1, "mem_cache_hit_bytes_total": 5,
		"mem_cache_nums_": 1, "master_value_size_bytes": 1, "master_batch_put_start_items_total": 1,
		"master_batch_put_end_items_total": 1, "master_batch_get_replica_list_items_total": 2,
		"master_batch_exist_key_items_total": 1, "master_exist_key_failures_total": 0,
		"master_remove_by_regex_requests_total": 1, "master_put_start_discarded_staging_size": 0,
	} {
		if vals[name] != want {
			t.Errorf("%s = %v, want %v", name, vals[name], want)
		}
	}
}

// A bench store row in which no operation succeeded is marked failed, its
// figures "-", the note says why, and the run exits 1 (issue 35.5: a put
// row that was all errors, on a store full of hard-pinned values, printed
// 0 ops/s and exited 0). A value larger than any segment is refused at
// once, before a row.
func TestBenchStoreRowThatMeasuredNothing(t *testing.T) {
	isolateEnv(t)
	rpc, admin, _, _ := startServeStore(t, "--segment-size", "16M")
	m := []string{"--master", rpc, "--admin", admin}
	src := filepath.Join(t.TempDir(), "v")
	if err := os.WriteFile(src, make([]byte, 4<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		_, errs, code := execMC(t, append([]string{"store", "put", "--hard-pin", fmt.Sprint("pinned/", i), src}, m...)...)
		if code != 0 {
			if i == 0 {
				t.Fatalf("put: %s", errs)
			}
			break
		}
	}
	// Sized to the store's room (issue 35.4), the row is refused at once:
	// the pinned values leave no room below the watermark.
	_, errs, code := execMC(t, append([]string{"bench", "store", "--value-size", "1M", "--op", "put", "--duration", "0.3"}, m...)...)
	if code != 1 || !strings.Contains(errs, "not enough room below the store's eviction watermark") {
		t.Fatalf("sized run on a full store: exit %d, stderr %q", code, errs)
	}
	// Allowed to evict, it runs the row, which measures nothing.
	out, errs, code := execMC(t, "bench", "store", "--master", rpc, "--allow-evict", "--value-size", "1M", "--op", "put", "--duration", "0.3")
	if code != 1 || !strings.Contains(out, "put (failed)") || !strings.Contains(out, "1M put x1: failed, measured nothing: all ") ||
		!strings.HasSuffix(errs, "mc: bench store: 1 of 1 row(s) measured nothing (1M put x1)\n") || !strings.Contains(errs, "row 1: 1M put x1: failed: ") {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr: %q", code, out, errs)
	}
	for _, op := range []string{"put", "get"} {
		t0 := time.Now()
		_, errs, code = execMC(t, append([]string{"bench", "store", "--value-size", "32M", "--op", op, "--duration", "0.3"}, m...)...)
		if code != 1 || !strings.HasPrefix(errs, "mc: bench store: value size 32M is larger than any segment of the store (the largest is 16M)") || time.Since(t0) > 3*time.Second {
			t.Fatalf("%s of a value larger than the segment: exit %d after %s, stderr %q", op, code, time.Since(t0), errs)
		}
		out, errs, code = execMC(t, "bench", "store", "--master", rpc, "--allow-evict", "--value-size", "32M", "--op", op, "--duration", "0.3")
		if code != 1 || strings.Contains(out, "│") || !strings.HasPrefix(errs, "mc: bench store: 32M "+op+" x1: value size 32M does not fit the store: NO_AVAILABLE_HANDLE") || time.Since(t0) > 6*time.Second {
			t.Fatalf("--allow-evict, %s of a value larger than the segment: exit %d after %s, stdout %q, stderr %q", op, code, time.Since(t0), out, errs)
		}
	}
}

// With --master etcd://... and etcd unreachable, mc store's verbs fail
// with one line naming the verb and what was waited for (issue 34.4: put
// and get panicked in the client's cleanup; ls, stat and query printed
// etcd's error without the verb).
func TestStoreEtcdUnreachable(t *testing.T) {
	isolateEnv(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "etcd://" + ln.Addr().String()
	ln.Close()
	src := filepath.Join(t.TempDir(), "v")
	if err := os.WriteFile(src, []byte("value"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"put", "k", src}, `mc: store put: "k": master ` + dead + `: no leader within 5s (is etcd up, and a master elected?): `},
		{[]string{"ls"}, "mc: store ls: master " + dead + ": no leader within 5s (is etcd up, and a master elected?): "},
	} {
		_, errs, code := execMC(t, append(append([]string{"store"}, c.args...), "--master", dead)...)
		if code != 1 || !strings.HasPrefix(errs, c.want) || strings.Count(errs, "\n") != 1 {
			t.Errorf("mc store %s: exit %d, stderr %q; want 1 and one line starting %q", c.args[0], code, errs, c.want)
		}
	}
}

// --soft-pin with --hard-pin is refused before anything is read or sent;
// --master at an HTTP port (the admin API's) says so, whichever wire.
func TestStorePutPinsAndHTTPMaster(t *testing.T) {
	isolateEnv(t)
	src := filepath.Join(t.TempDir(), "v")
	if err := os.WriteFile(src, []byte("value"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, errs, code := execMC(t, "store", "put", "k", src, "--soft-pin", "--hard-pin", "--master", "127.0.0.1:1")
	if code != exitUsage || errs != "mc: store put: --soft-pin and --hard-pin exclude each other: a hard-pinned object is never evicted, a soft-pinned one last\n" {
		t.Errorf("put --soft-pin --hard-pin: %d %q", code, errs)
	}
	admin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("OK")) }))
	defer admin.Close()
	addr := strings.TrimPrefix(admin.URL, "http://")
	for _, c := range [][]string{
		{"put", "k", src, "--master", addr},
		{"get", "k", "--master", addr},
		{"exists", "k", "--master", "mooncake://" + addr},
	} {
		_, errs, code := execMC(t, append([]string{"store"}, c...)...)
		want := "is an HTTP port (a master's admin API, --metrics_port?), not a master's RPC port: give the master's --rpc_port (default 50051)"
		if code == 0 || code == exitUsage || !strings.HasPrefix(errs, "mc: store "+c[0]+": ") || !strings.Contains(errs, want) || strings.Count(errs, "\n") != 1 {
			t.Errorf("store %s: %d %q; want one line saying %q", strings.Join(c, " "), code, errs, want)
		}
	}
}

// A put the store would not keep fails, and one that got fewer replicas
// than asked says so (issue 35, item 2).
func TestStorePutIsReadableWhenItSucceeds(t *testing.T) {
	isolateEnv(t)
	rpc, admin, _, _ := startServeStore(t, "--segment-size", "64M")
	m := []string{"--master", rpc, "--admin", admin}
	dir := t.TempDir()
	big := filepath.Join(dir, "w59")
	if err := os.WriteFile(big, make([]byte, 59<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errs, code := execMC(t, append([]string{"store", "put", "w59", big}, m...)...)
	if code == 0 || !strings.Contains(errs, "high watermark") || !strings.HasPrefix(errs, "mc: store put: \"w59\": ") || strings.Count(errs, "\n") != 1 {
		t.Fatalf("put above the watermark: exit %d, stdout %q, stderr %q; want a one-line error naming the watermark", code, out, errs)
	}
	if _, _, code := execMC(t, append([]string{"store", "exists", "w59"}, m...)...); code != 1 {
		t.Fatalf("exists after a refused put: exit %d, want 1", code)
	}
	small := filepath.Join(dir, "small")
	os.WriteFile(small, []byte("hello"), 0o644)
	out, errs, code = execMC(t, append([]string{"store", "put", "r3", small, "--replicas", "3"}, m...)...)
	if code != 0 || !strings.Contains(out, "1 replica(s)") || !strings.Contains(out, "fewer than the 3 asked") {
		t.Fatalf("--replicas 3 on one segment: exit %d, %q %q; want it to say it got fewer", code, out, errs)
	}
	out, _, code = execMC(t, append([]string{"store", "put", "r3j", small, "--replicas", "3", "-o", "json"}, m...)...)
	var j struct {
		Replicas  int    `json:"replicas"`
		Requested int    `json:"replicas_requested"`
		Warning   string `json:"warning"`
	}
	if err := json.Unmarshal([]byte(out), &j); err != nil || code != 0 || j.Replicas != 1 || j.Requested != 3 || j.Warning == "" {
		t.Fatalf("--replicas 3 -o json: exit %d %v %q", code, err, out)
	}
	// A put that fits only by evicting "old", the last evictable object,
	// would then be the next watermark round's only victim: refused,
	// naming the pinned objects, and "old" stays.
	v8 := filepath.Join(dir, "v8")
	os.WriteFile(v8, make([]byte, 8<<20), 0o644)
	for i := range 6 {
		if _, errs, code := execMC(t, append([]string{"store", "put", fmt.Sprint("pin", i), v8, "--hard-pin"}, m...)...); code != 0 {
			t.Fatalf("put pin%d: %d %q", i, code, errs)
		}
	}
	if _, errs, code := execMC(t, append([]string{"store", "put", "old", v8}, m...)...); code != 0 {
		t.Fatalf("put old: %d %q", code, errs)
	}
	v10 := filepath.Join(dir, "v10")
	os.WriteFile(v10, make([]byte, 10<<20), 0o644)
	out, errs, code = execMC(t, append([]string{"store", "put", "new", v10}, m...)...)
	if code != 1 || !strings.Contains(errs, "6 hard-pinned") || !strings.Contains(errs, "high watermark") || !strings.Contains(errs, "evicted nothing") {
		t.Fatalf("put that fits only by evicting the last evictable object: exit %d, %q %q; want it refused naming the pinned objects", code, out, errs)
	}
	if _, errs, code := execMC(t, append([]string{"store", "exists", "old"}, m...)...); code != 0 {
		t.Fatalf("old after a refused put: exit %d %q, want it kept", code, errs)
	}
}

// A store whose rdma bytes the software NIC moves says so: serve store's
// banner, put's line and -o json; a device that is not there is an error
// (issue 35, item 1).
func TestStoreRDMASaysSoft(t *testing.T) {
	isolateEnv(t)
	if _, errs, code := execMC(t, "serve", "store", "--protocol", "rdma", "--device-name", "mlx5_0", "--segment-size", "16M",
		"--rpc_address", "127.0.0.1", "--rpc_port", strconv.Itoa(freePort(t)), "--metrics_port", strconv.Itoa(freePort(t))); code == 0 ||
		!strings.Contains(errs, `"mlx5_0"`) || !strings.Contains(errs, "MC_RDMA_PROVIDER=soft") || strings.Count(errs, "\nmc: serve store: ") != 1 {
		t.Fatalf("serve store --device-name mlx5_0 on a host without it: exit %d, %q", code, errs)
	}
	rpc, admin, out, _ := startServeStore(t, "--segment-size", "16M", "--protocol", "rdma", "--device-name", "soft0")
	if !strings.Contains(out.String(), "rdma (soft) at ") {
		t.Fatalf("serve store banner does not say the soft NIC serves the segment:\n%s", out.String())
	}
	src := filepath.Join(t.TempDir(), "v")
	os.WriteFile(src, bytes.Repeat([]byte("x"), 100000), 0o644)
	m := []string{"--master", rpc, "--admin", admin, "--protocol", "rdma", "--device-name", "soft1"}
	got, errs, code := execMC(t, append([]string{"store", "put", "k", src}, m...)...)
	if code != 0 || !strings.HasSuffix(got, ", via rdma (soft)\n") {
		t.Fatalf("put over the soft NIC: exit %d, %q %q", code, got, errs)
	}
	got, _, code = execMC(t, append([]string{"store", "put", "k2", src, "-o", "json"}, m...)...)
	var j struct {
		Transport string `json:"transport"`
		Provider  string `json:"provider"`
	}
	if code != 0 || json.Unmarshal([]byte(got), &j) != nil || j.Transport != "rdma" || j.Provider != "soft" {
		t.Fatalf("put -o json over the soft NIC: exit %d, %q", code, got)
	}
	if _, errs, code := execMC(t, "store", "put", "k3", src, "--master", rpc, "--protocol", "rdma", "--device-name", "mlx5_0"); code == 0 || !strings.Contains(errs, "MC_RDMA_PROVIDER=soft") {
		t.Fatalf("put --device-name mlx5_0: exit %d, %q", code, errs)
	}
}

func TestBenchStoreRDMASaysSoft(t *testing.T) {
	isolateEnv(t)
	args := []string{"bench", "store", "--protocol", "rdma", "--device-name", "soft0", "--duration", "200ms", "--value-size", "64K",
		"--op", "put", "--segment-size", "16M"}
	out, errs, code := execMC(t, append(args, "-o", "json")...)
	var j struct {
		Results []struct {
			Transport string `json:"transport"`
			Provider  string `json:"provider"`
		} `json:"results"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &j) != nil || len(j.Results) != 1 || j.Results[0].Transport != "rdma" || j.Results[0].Provider != "soft" {
		t.Fatalf("bench store over the soft NIC -o json: exit %d, %q %q", code, out, errs)
	}
	out, _, code = execMC(t, args...)
	if code != 0 || !strings.Contains(out, "rdma (soft)") {
		t.Fatalf("bench store over the soft NIC: exit %d\n%s", code, out)
	}
	args[5] = "mlx5_0"
	if _, errs, code := execMC(t, args...); code == 0 || !strings.Contains(errs, "MC_RDMA_PROVIDER=soft") {
		t.Fatalf("bench store --device-name mlx5_0: exit %d, %q", code, errs)
	}
}

// store rm -o json lists every key given under "removed"; each row says
// whether that key went (a key not found was listed there as if removed,
// beside its error).
func TestStoreRmJSONSaysWhichWent(t *testing.T) {
	isolateEnv(t)
	rpc, admin, _, _ := startServeStore(t, "--segment-size", "8M")
	m := []string{"--master", rpc, "--admin", admin}
	src := filepath.Join(t.TempDir(), "v")
	os.WriteFile(src, []byte("v"), 0o644)
	if _, errs, code := execMC(t, append([]string{"store", "put", "k", src}, m...)...); code != 0 {
		t.Fatalf("put: %d %s", code, errs)
	}
	out, errs, code := execMC(t, append([]string{"store", "rm", "k", "nokey", "-o", "json"}, m...)...)
	var j struct {
		Removed []map[string]any `json:"removed"`
	}
	if err := json.Unmarshal([]byte(out), &j); err != nil || code != 1 || len(j.Removed) != 2 {
		t.Fatalf("rm k nokey -o json: exit %d, %v, %q %q", code, err, out, errs)
	}
	if j.Removed[0]["removed"] != true || j.Removed[0]["error"] != "" || j.Removed[1]["removed"] != false || j.Removed[1]["error"] == "" {
		t.Fatalf("rm rows: %v, want k removed and nokey not, with its error", j.Removed)
	}
}

// A feature's settings given while the feature is off are said to do
// nothing (a KV events endpoint without --enable-kv-events published
// nothing, silently; HA endpoints without --enable-ha likewise).
func TestServeStoreWarnsInertFlags(t *testing.T) {
	isolateEnv(t)
	_, _, out, _ := startServeStore(t, "--segment-size", "0", "--kv_events_bind_endpoint", "tcp://127.0.0.1:5557",
		"--kv-events-backend-id", "b", "--kv-events-pace", "2ms", "--etcd-endpoints", "127.0.0.1:2379",
		"--tenant-quota-connector-type", "file")
	for _, want := range []string{
		"--kv-events-bind-endpoint, --kv-events-backend-id, --kv-events-pace given without --enable-kv-events: ignored, no KV events are published",
		"--etcd-endpoints given without --enable-ha: ignored",
		"--tenant-quota-connector-type given without --enable-multi-tenants: ignored",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in:\n%s", want, out.String())
		}
	}
	_, _, out, _ = startServeStore(t, "--segment-size", "0")
	if strings.Contains(out.String(), "given without") {
		t.Errorf("warned with no such flag:\n%s", out.String())
	}
	// A node runs no master: the master's settings given to it are said
	// to do nothing (they did nothing, silently).
	rpc, _, _, _ := startServeStore(t, "--segment-size", "0")
	_, _, out, _ = startServeStore(t, "--master", rpc, "--segment-size", "8M", "--eviction-ratio", "0.3", "--default-kv-lease-ttl", "5000")
	if want := "--default-kv-lease-ttl, --eviction-ratio given with --master: this process is a node and runs no master; ignored"; !strings.Contains(out.String(), want) {
		t.Errorf("node given master settings: no %q in:\n%s", want, out.String())
	}
}
