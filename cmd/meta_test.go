package cmd

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/kvcache-ops/mc/pkg/engine"
	"github.com/kvcache-ops/mc/pkg/engine/meta"
)

// mc runs the CLI in-process and returns its exit status and output.
// In-process engines log through the logger Execute installs, from their
// own goroutines: hence the locked buffer.
func mc(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb syncBuffer
	code = Execute(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

// deadEngine registers what an engine leaves behind when it is killed: a
// descriptor and an rpc_meta whose ports refuse connections.
func deadEngine(t *testing.T, b meta.Backend, name string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	ctx := context.Background()
	d := &meta.SegmentDesc{Name: name, Protocol: meta.ProtocolTCP, TCPDataPort: port, TCPProtoVersion: 2,
		Buffers: []meta.BufferDesc{{Name: name, Addr: 0x7f0000000000, Length: 64 << 20}}}
	if err := b.PutSegment(ctx, d); err != nil {
		t.Fatal(err)
	}
	if err := b.PutRPCMeta(ctx, name, meta.RPCMeta{IPOrHostName: "127.0.0.1", RPCPort: port}); err != nil {
		t.Fatal(err)
	}
}

// httpMetadata serves h as an HTTP metadata server and opens a client.
func httpMetadata(t *testing.T, h http.Handler) (string, meta.Backend) {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	url := srv.URL + "/metadata"
	b, err := meta.Open(context.Background(), url, meta.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return url, b
}

func liveMetaEngine(t *testing.T, server, name, cluster string) {
	t.Helper()
	e, err := engine.New(context.Background(), engine.Config{LocalServerName: name, MetadataServer: server, ClusterID: cluster,
		BindAddress: "127.0.0.1", HandshakeAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	if _, err := e.RegisterMemory(context.Background(), 1<<20, "cpu:0", true); err != nil {
		t.Fatal(err)
	}
}

type metaLsJSON struct {
	Segments []segmentJSON `json:"segments"`
}

func TestMetaEtcd(t *testing.T) {
	isolateEnv(t)
	ee, err := meta.StartEtcd(context.Background(), meta.EtcdConfig{Listen: "127.0.0.1:0", NoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ee.Close()
	ep := ee.Endpoints()[0]
	// Everything in cluster "prod", read through MC_METADATA_CLUSTER_ID.
	t.Setenv("MC_METADATA_CLUSTER_ID", "prod")
	b, err := meta.Open(context.Background(), ep, meta.Options{ClusterID: "prod"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	liveMetaEngine(t, ep, "prefill-0", "prod")
	deadEngine(t, b, "decode-1")
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.Put(context.Background(), "mooncake/prod/ram/junk", "{not json"); err != nil {
		t.Fatal(err)
	}

	code, out, errs := mc(t, "meta", "ls", "--metadata-server", ep, "-o", "json")
	if code != 0 {
		t.Fatalf("ls: %d %s", code, errs)
	}
	var ls metaLsJSON
	if err := json.Unmarshal([]byte(out), &ls); err != nil {
		t.Fatalf("ls json: %v\n%s", err, out)
	}
	if len(ls.Segments) != 3 {
		t.Fatalf("ls: %s", out)
	}
	dec, junk, pre := ls.Segments[0], ls.Segments[1], ls.Segments[2]
	if dec.Name != "decode-1" || dec.State != "dead" || dec.RTTMicros != nil || dec.Bytes != 64<<20 || dec.Buffers != 1 ||
		dec.Protocol != "tcp" || dec.Key != "mooncake/prod/ram/decode-1" || !strings.Contains(dec.Error, "connection refused") {
		t.Fatalf("decode-1: %+v", dec)
	}
	if junk.Name != "junk" || junk.State != "invalid" || junk.Protocol != "" || !strings.Contains(junk.Error, "not valid descriptor JSON") {
		t.Fatalf("junk: %+v", junk)
	}
	if pre.Name != "prefill-0" || pre.State != "alive" || pre.RTTMicros == nil || *pre.RTTMicros <= 0 || pre.Devices == nil || pre.RPCAddress == "" {
		t.Fatalf("prefill-0: %+v", pre)
	}
	if !strings.Contains(out, `"devices": []`) {
		t.Fatalf("devices not an empty array:\n%s", out)
	}

	code, out, _ = mc(t, "meta", "ls", "--metadata-server", ep)
	if code != 0 || !strings.Contains(out, "│ decode-1 ") || !strings.Contains(out, "64.0 MiB") || !strings.Contains(out, "rpc address") {
		t.Fatalf("ls table: %d\n%s", code, out)
	}

	code, out, errs = mc(t, "meta", "gc", "--metadata-server", ep)
	if code != 1 || !strings.Contains(out, "would delete") || !strings.Contains(errs, "--yes") || !strings.Contains(errs, "--include-invalid") {
		t.Fatalf("gc dry run: %d\n%s\n%s", code, out, errs)
	}
	if _, err := b.GetSegment(context.Background(), "decode-1"); err != nil {
		t.Fatalf("dry run deleted: %v", err)
	}
	code, out, errs = mc(t, "meta", "gc", "--metadata-server", ep, "--yes")
	if code != 0 || !strings.Contains(out, "deleted") {
		t.Fatalf("gc --yes: %d\n%s\n%s", code, out, errs)
	}
	if _, err := b.GetSegment(context.Background(), "decode-1"); !errors.Is(err, meta.ErrNotFound) {
		t.Fatalf("decode-1 after gc: %v", err)
	}
	if _, err := b.GetRPCMeta(context.Background(), "decode-1"); !errors.Is(err, meta.ErrNotFound) {
		t.Fatalf("decode-1 rpc meta after gc: %v", err)
	}
	if _, err := b.GetSegment(context.Background(), "prefill-0"); err != nil {
		t.Fatalf("live segment deleted: %v", err)
	}
	if r, _ := cli.Get(context.Background(), "mooncake/prod/ram/junk"); len(r.Kvs) != 1 {
		t.Fatal("garbage deleted without --include-invalid")
	}
	code, out, _ = mc(t, "meta", "gc", "--metadata-server", ep, "--yes", "--include-invalid", "-o", "json")
	var gc struct {
		DryRun   bool `json:"dry_run"`
		Removals []struct {
			Name   string   `json:"name"`
			Keys   []string `json:"keys"`
			Action string   `json:"action"`
		} `json:"removals"`
	}
	if err := json.Unmarshal([]byte(out), &gc); err != nil || code != 0 || gc.DryRun || len(gc.Removals) != 1 ||
		gc.Removals[0].Name != "junk" || gc.Removals[0].Action != "deleted" || strings.Join(gc.Removals[0].Keys, ",") != "mooncake/prod/ram/junk" {
		t.Fatalf("gc --include-invalid: %d %v\n%s", code, err, out)
	}
	code, out, _ = mc(t, "meta", "gc", "--metadata-server", ep)
	if code != 0 || !strings.Contains(out, "nothing stale") {
		t.Fatalf("gc when clean: %d\n%s", code, out)
	}

	// show: the table and the stored JSON verbatim.
	code, out, _ = mc(t, "meta", "show", "prefill-0", "--metadata-server", ep)
	if code != 0 || !strings.Contains(out, "segment prefill-0") || !strings.Contains(out, "mooncake/prod/ram/prefill-0") ||
		!strings.Contains(out, "tcp data port") || !strings.Contains(out, "1048576") {
		t.Fatalf("show: %d\n%s", code, out)
	}
	code, out, _ = mc(t, "meta", "show", "prefill-0", "--metadata-server", ep, "-o", "json")
	r, _ := cli.Get(context.Background(), "mooncake/prod/ram/prefill-0")
	if code != 0 || len(r.Kvs) != 1 || out != string(r.Kvs[0].Value)+"\n" {
		t.Fatalf("show json: %d\n%s", code, out)
	}
	code, _, errs = mc(t, "meta", "show", "absent", "--metadata-server", ep)
	if code != 1 || errs != "mc: meta show: segment \"absent\" is not registered (no mooncake/prod/ram/absent)\n" {
		t.Fatalf("show absent: %d %q", code, errs)
	}
}

func TestMetaShowRDMA(t *testing.T) {
	isolateEnv(t)
	url, b := httpMetadata(t, meta.NewHTTPHandler())
	d := &meta.SegmentDesc{Name: "prefill-0", Protocol: meta.ProtocolRDMA,
		Devices: []meta.DeviceDesc{{Name: "mlx5_0", LID: 1, GID: "fe:80:00:00:00:00:00:00:00:00:00:00:00:00:00:01"}},
		Buffers: []meta.BufferDesc{{Name: "cpu:0", Addr: 0x7f0000000000, Length: 4096, Rkey: []uint32{77}, Lkey: []uint32{78}}}}
	if err := b.PutSegment(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	code, out, errs := mc(t, "meta", "show", "prefill-0", "--metadata-server", url, "--probe-timeout", "300ms")
	for _, want := range []string{"0x7f0000000000", "│ 77   │ 78   │", "mlx5_0", "fe:80:00:00:00:00:00:00:00:00:00:00:00:00:00:01", "│ unknown", "no rpc_meta/prefill-0"} {
		if !strings.Contains(out, want) {
			t.Errorf("show rdma lacks %q", want)
		}
	}
	if code != 0 || t.Failed() {
		t.Fatalf("show rdma: %d\n%s\n%s", code, out, errs)
	}
}

func TestMetaHTTP(t *testing.T) {
	isolateEnv(t)
	url, b := httpMetadata(t, meta.NewHTTPHandler())
	liveMetaEngine(t, url, "prefill-0", "")
	deadEngine(t, b, "decode-1")

	code, _, errs := mc(t, "meta", "ls", "--metadata-server", url)
	// Known from the address, a usage error (gc's 2 says its check
	// failed).
	if code != 64 || !strings.Contains(errs, "cannot list its segments") || !strings.Contains(errs, "--segment NAME") || strings.Count(errs, "\n") != 1 {
		t.Fatalf("ls over http without --segment: %d %q", code, errs)
	}
	code, _, errs = mc(t, "meta", "gc", "--metadata-server", url)
	if code != 64 || !strings.Contains(errs, "cannot list its segments") {
		t.Fatalf("gc over http without --segment: %d %q", code, errs)
	}
	code, out, errs := mc(t, "meta", "ls", "--metadata_server", url, "--segment", "prefill-0", "--segment", "decode-1", "--segment", "ghost")
	if code != 0 || !strings.Contains(out, "alive") || !strings.Contains(out, "dead") || !strings.Contains(errs, `segment "ghost" is not registered`) {
		t.Fatalf("ls over http: %d\n%s\n%s", code, out, errs)
	}
	code, out, errs = mc(t, "meta", "gc", "--metadata-server", url, "--segment", "prefill-0", "--segment", "decode-1", "--yes")
	if code != 0 || !strings.Contains(out, "deleted") || !strings.Contains(errs, "no conditional delete") {
		t.Fatalf("gc over http: %d\n%s\n%s", code, out, errs)
	}
	if _, err := b.GetSegment(context.Background(), "decode-1"); !errors.Is(err, meta.ErrNotFound) {
		t.Fatalf("decode-1 after gc: %v", err)
	}
	if _, err := b.GetSegment(context.Background(), "prefill-0"); err != nil {
		t.Fatalf("live segment deleted: %v", err)
	}
}

func TestMetaBadInput(t *testing.T) {
	isolateEnv(t)
	refused := func() string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		return "http://" + ln.Addr().String() + "/metadata"
	}()
	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "boom", http.StatusInternalServerError)
	}))
	defer broken.Close()
	cases := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"meta", "ls"}, 64, "mc: meta ls: --metadata-server is required"},
		{[]string{"meta", "gc"}, 64, "mc: meta gc: --metadata-server is required"},
		{[]string{"meta", "ls", "--metadata-server", "P2PHANDSHAKE"}, 1, "P2PHANDSHAKE stores no segments"},
		{[]string{"meta", "ls", "--metadata-server", "redis://127.0.0.1:6379"}, 64, "not supported"},
		{[]string{"meta", "ls", "--metadata-server", "127.0.0.1:2379", "--probe-timeout", "0s"}, 64, "--probe-timeout 0s must be positive"},
		{[]string{"meta", "ls", "--metadata-server", "127.0.0.1:2379", "--probe-concurrency", "-1"}, 64, "--probe-concurrency -1 is negative"},
		{[]string{"meta", "show", "--metadata-server", "127.0.0.1:2379"}, 64, "accepts 1 arg(s), received 0"},
		{[]string{"meta", "gc", "--metadata-server", refused, "--segment", "x"}, 2, "unreachable"},
		{[]string{"meta", "gc", "--metadata-server", broken.URL, "--segment", "x"}, 2, "500"},
	}
	for _, c := range cases {
		code, _, errs := mc(t, c.args...)
		if code != c.code || !strings.Contains(errs, c.want) || strings.Count(errs, "\n") != 1 || !strings.HasPrefix(errs, "mc: ") {
			t.Errorf("%v: exit %d %q, want exit %d containing %q", c.args, code, errs, c.code, c.want)
		}
	}
}

// TestMetaGCDeleteFails: a server that lists but refuses deletes makes gc
// exit 2.
func TestMetaGCDeleteFails(t *testing.T) {
	isolateEnv(t)
	store := meta.NewHTTPHandler()
	url, b := httpMetadata(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodDelete {
			http.Error(w, "read-only", http.StatusForbidden)
			return
		}
		store.ServeHTTP(w, r)
	}))
	deadEngine(t, b, "decode-1")
	code, out, errs := mc(t, "meta", "gc", "--metadata-server", url, "--segment", "decode-1", "--yes")
	if code != 2 || !strings.Contains(errs, "1 of 1 deletions failed") || !strings.Contains(errs, "403") || !strings.Contains(out, "failed") {
		t.Fatalf("gc with failing deletes: %d\n%s\n%s", code, out, errs)
	}
}

// An HTTP metadata server that requires MC_METADATA_HTTP_TOKEN (as mc
// serve metadata and Mooncake's do when it is set) answers every meta
// verb when the variable is set: ls, show and gc send it.
func TestMetaHTTPToken(t *testing.T) {
	isolateEnv(t)
	const token = "s3cret"
	srv := httptest.NewServer(meta.RequireToken(meta.NewHTTPHandler(), token))
	t.Cleanup(srv.Close)
	url := srv.URL + "/metadata"
	b, err := meta.Open(context.Background(), url, meta.Options{HTTPToken: token})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	deadEngine(t, b, "decode-1")
	deadEngine(t, b, "decode-2")

	t.Setenv("MC_METADATA_HTTP_TOKEN", token)
	code, out, errs := mc(t, "meta", "ls", "--metadata-server", url, "--segment", "decode-1")
	if code != 0 || !strings.Contains(out, "decode-1") || strings.Contains(errs, "401") {
		t.Fatalf("meta ls with the token set: %d\n%s\n%s", code, out, errs)
	}
	code, out, errs = mc(t, "meta", "show", "decode-1", "--metadata-server", url)
	if code != 0 || !strings.Contains(out, "decode-1") {
		t.Fatalf("meta show with the token set: %d\n%s\n%s", code, out, errs)
	}
	code, out, errs = mc(t, "meta", "gc", "--metadata-server", url, "--segment", "decode-1", "--yes")
	if code != 0 || !strings.Contains(out, "deleted") {
		t.Fatalf("meta gc with the token set: %d\n%s\n%s", code, out, errs)
	}
	if _, err := b.GetSegment(context.Background(), "decode-1"); !errors.Is(err, meta.ErrNotFound) {
		t.Fatalf("decode-1 after gc: %v", err)
	}

	t.Setenv("MC_METADATA_HTTP_TOKEN", "wrong")
	code, _, errs = mc(t, "meta", "show", "decode-2", "--metadata-server", url)
	if code == 0 || !strings.Contains(errs, "MC_METADATA_HTTP_TOKEN") {
		t.Fatalf("meta show with a wrong token: %d %q; want the variable named", code, errs)
	}
}
