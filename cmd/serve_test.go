package cmd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine/meta"
)

// syncBuffer lets the test read what the server printed while it runs.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startServe runs `mc serve metadata` in-process until the returned stop
// is called; stop returns what the run function returned.
func startServe(t *testing.T, o serveMetadataOptions, format string) (serveMetadataInfo, *syncBuffer, func() error) {
	t.Helper()
	out := &syncBuffer{}
	p := &printer{Out: out, Err: &syncBuffer{}, format: format}
	ready := make(chan serveMetadataInfo, 1)
	o.ready = func(i serveMetadataInfo) { ready <- i }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- runServeMetadata(ctx, o, p) }()
	var info serveMetadataInfo
	select {
	case info = <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("serve metadata returned before ready: %v", err)
	case <-time.After(30 * time.Second):
		cancel()
		t.Fatal("serve metadata not ready after 30s")
	}
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(15 * time.Second):
			t.Fatal("serve metadata did not return after cancel")
			return nil
		}
	}
	t.Cleanup(func() { stop() })
	return info, out, stop
}

func useBackend(t *testing.T, server string) {
	t.Helper()
	ctx := context.Background()
	b, err := meta.Open(ctx, server, meta.Options{Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	d := &meta.SegmentDesc{Name: "node1", Protocol: "tcp", TCPDataPort: 15000, TCPProtoVersion: 2,
		Buffers: []meta.BufferDesc{{Name: "node1", Addr: 4096, Length: 4096}}}
	if err := b.PutSegment(ctx, d); err != nil {
		t.Fatal(err)
	}
	got, err := b.GetSegment(ctx, "node1")
	if err != nil || got.TCPDataPort != 15000 {
		t.Fatalf("get: %+v %v", got, err)
	}
}

// On every interface, the address printed for clients is one they can
// dial: before, "[::]:PORT", the listener's own.
func TestServeMetadataWildcardNamesAHostAddress(t *testing.T) {
	for _, backend := range []string{"etcd", "http"} {
		info, out, stop := startServe(t, serveMetadataOptions{Listen: "0.0.0.0:0", Backend: backend}, "table")
		host, _, _ := strings.Cut(strings.TrimPrefix(info.MetadataServer, "http://"), ":")
		if ip := net.ParseIP(host); strings.HasPrefix(host, "[") || ip != nil && ip.IsUnspecified() || !strings.HasPrefix(info.Listen, "0.0.0.0:") {
			t.Errorf("%s: listen %q, clients told %q:\n%s", backend, info.Listen, info.MetadataServer, out.String())
		}
		if backend == "etcd" {
			useBackend(t, info.MetadataServer)
		}
		if err := stop(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestServeMetadataEtcd(t *testing.T) {
	dir := t.TempDir()
	info, out, stop := startServe(t, serveMetadataOptions{Listen: "127.0.0.1:0", DataDir: dir, Backend: "etcd"}, "table")
	if info.Backend != "etcd" || info.MetadataServer != info.Listen || info.DataDir != dir || info.Temporary {
		t.Fatalf("info = %+v", info)
	}
	text := out.String()
	for _, want := range []string{"metadata server (etcd) listening on " + info.Listen, "clients: --metadata-server " + info.Listen, "data dir: " + dir + "\n"} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q:\n%s", want, text)
		}
	}
	useBackend(t, info.MetadataServer)
	if err := stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	// Stopped means stopped: the port no longer answers.
	if c, err := net.DialTimeout("tcp", info.Listen, time.Second); err == nil {
		c.Close()
		t.Fatal("etcd still listening after stop")
	}
	// The data dir is the user's: kept, with etcd's data in it.
	if entries, err := os.ReadDir(dir); err != nil || len(entries) == 0 {
		t.Fatalf("data dir after stop: %v %v", entries, err)
	}
	// Restarting on the same data dir keeps what was stored.
	info2, _, stop2 := startServe(t, serveMetadataOptions{Listen: "127.0.0.1:0", DataDir: dir, Backend: "etcd"}, "table")
	b, err := meta.Open(context.Background(), info2.MetadataServer, meta.Options{Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.GetSegment(context.Background(), "node1"); err != nil {
		t.Fatalf("after restart: %v", err)
	}
	b.Close()
	if err := stop2(); err != nil {
		t.Fatal(err)
	}
}

func TestServeMetadataTemporaryDataDir(t *testing.T) {
	info, _, stop := startServe(t, serveMetadataOptions{Listen: "127.0.0.1:0", Backend: "etcd"}, "json")
	if !info.Temporary || info.DataDir == "" {
		t.Fatalf("info = %+v", info)
	}
	if _, err := os.Stat(info.DataDir); err != nil {
		t.Fatal(err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(info.DataDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("temporary data dir left behind: %v", err)
	}
}

func TestServeMetadataHTTP(t *testing.T) {
	info, out, stop := startServe(t, serveMetadataOptions{Listen: "127.0.0.1:0", Backend: "http"}, "json")
	if info.Backend != "http" || info.MetadataServer != "http://"+info.Listen+"/metadata" {
		t.Fatalf("info = %+v", info)
	}
	var printed map[string]any
	if err := json.Unmarshal([]byte(out.String()), &printed); err != nil {
		t.Fatalf("json output: %v\n%s", err, out.String())
	}
	if printed["backend"] != "http" || printed["metadata_server"] != info.MetadataServer || printed["listen"] != info.Listen {
		t.Fatalf("json output: %v", printed)
	}
	useBackend(t, info.MetadataServer)
	if err := stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if c, err := net.DialTimeout("tcp", info.Listen, time.Second); err == nil {
		c.Close()
		t.Fatal("http still listening after stop")
	}
}

func TestServeMetadataBadInput(t *testing.T) {
	isolateEnv(t)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"serve", "metadata", "--backend", "redis"}, `invalid --backend "redis": want etcd or http`},
		{[]string{"serve", "metadata", "--listen", "nope"}, `invalid --listen "nope": want host:port`},
		{[]string{"serve", "metadata", "--backend", "http", "--data-dir", "/tmp/x"}, "--data-dir applies to --backend etcd only"},
		{[]string{"serve", "metadata", "--backend", "http", "--listen", busy.Addr().String()}, "address already in use"},
		{[]string{"serve", "metadata", "--listen", busy.Addr().String()}, "address already in use"},
		{[]string{"serve", "metadata", "extra"}, `unexpected argument "extra"`},
	}
	for _, c := range cases {
		_, _, err := runCmd(t, c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: err = %v, want one line containing %q", c.args, err, c.want)
		}
	}
}

// The cobra wiring: flags (including Mooncake's underscore spelling) reach
// the run function, and cancelling the command's context stops it.
func TestServeMetadataCommand(t *testing.T) {
	isolateEnv(t)
	out := &syncBuffer{}
	p := &printer{Out: out, Err: &syncBuffer{}}
	root := newRootCmd(p)
	root.SetArgs([]string{"serve", "metadata", "--backend", "http", "--listen", "127.0.0.1:0", "-o", "json"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	var info serveMetadataInfo
	for json.Unmarshal([]byte(out.String()), &info) != nil {
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("no start line: %q", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	useBackend(t, info.MetadataServer)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("command did not stop")
	}
}

// A --data-dir with no etcd data in it (a mistyped path) is warned of:
// etcd made the directory and started empty, silently. A directory that
// holds etcd's data is not.
func TestServeMetadataNewDataDirWarned(t *testing.T) {
	var logs syncBuffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logs, nil)))
	defer slog.SetDefault(old)
	dir := filepath.Join(t.TempDir(), "typo")
	_, _, stop := startServe(t, serveMetadataOptions{Listen: "127.0.0.1:0", DataDir: dir, Backend: "etcd"}, "table")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "holds no etcd data: starting a new, empty metadata store") {
		t.Errorf("no warning for a --data-dir without etcd data:\n%s", logs.String())
	}
	before := strings.Count(logs.String(), "holds no etcd data")
	_, _, stop = startServe(t, serveMetadataOptions{Listen: "127.0.0.1:0", DataDir: dir, Backend: "etcd"}, "table")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if strings.Count(logs.String(), "holds no etcd data") != before {
		t.Error("warned again for a --data-dir that holds etcd's data")
	}
}
