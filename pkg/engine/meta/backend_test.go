package meta

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/kvcache-ops/mc/pkg/engine/handshake"
	"github.com/kvcache-ops/mc/pkg/topo"
)

func tcpDesc(name string) *SegmentDesc {
	return &SegmentDesc{
		Name: name, Protocol: "tcp", Timestamp: "2026-08-01 12:00:00.000001",
		TCPDataPort: 15432, TCPProtoVersion: 2,
		Buffers: []BufferDesc{{Name: name, Addr: 0x7f0000000000, Length: 1 << 20}},
	}
}

func rdmaDesc(name string) *SegmentDesc {
	return &SegmentDesc{
		Name: name, Protocol: "rdma", Timestamp: "2026-08-01 12:00:00.000002",
		TCPProtoVersion: 1,
		Devices: []DeviceDesc{
			{Name: "mlx5_0", LID: 1, GID: "fe:80:00:00:00:00:00:00:00:00:00:00:00:00:00:01"},
			{Name: "mlx5_1", LID: 2, GID: "fe:80:00:00:00:00:00:00:00:00:00:00:00:00:00:02"},
		},
		Buffers:        []BufferDesc{{Name: "cpu:0", Addr: 0x7f0000000000, Length: 4096, Rkey: []uint32{1, 2}, Lkey: []uint32{3, 4}}},
		PriorityMatrix: topo.Matrix{"cpu:0": {Preferred: []string{"mlx5_0"}, Accessible: []string{"mlx5_1"}}},
	}
}

// testStore runs the behaviour every storing backend shares.
func testStore(t *testing.T, b Backend) {
	ctx := context.Background()
	_, err := b.GetSegment(ctx, "absent")
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), `segment "absent"`) {
		t.Fatalf("missing segment: %v", err)
	}
	for _, d := range []*SegmentDesc{tcpDesc("node1"), rdmaDesc("prefill-0"), tcpDesc("nvmeof/x")} {
		if err := b.PutSegment(ctx, d); err != nil {
			t.Fatalf("put %s: %v", d.Name, err)
		}
		got, err := b.GetSegment(ctx, d.Name)
		if err != nil {
			t.Fatalf("get %s: %v", d.Name, err)
		}
		if !reflect.DeepEqual(got, d) {
			t.Fatalf("round trip %s:\n got %+v\nwant %+v", d.Name, got, d)
		}
	}
	// Overwrite.
	d := tcpDesc("node1")
	d.TCPDataPort = 16000
	if err := b.PutSegment(ctx, d); err != nil {
		t.Fatal(err)
	}
	if got, err := b.GetSegment(ctx, "node1"); err != nil || got.TCPDataPort != 16000 {
		t.Fatalf("overwrite: %+v %v", got, err)
	}
	// An invalid descriptor is never published.
	bad := tcpDesc("bad")
	bad.Buffers[0].Length = 0
	if err := b.PutSegment(ctx, bad); !errors.Is(err, ErrMalformed) {
		t.Fatalf("put invalid: %v", err)
	}
	if _, err := b.GetSegment(ctx, "bad"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("invalid descriptor stored: %v", err)
	}
	if err := b.DeleteSegment(ctx, "node1"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.GetSegment(ctx, "node1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}
	if err := b.DeleteSegment(ctx, "node1"); err != nil {
		t.Fatalf("delete absent: %v", err)
	}

	if _, err := b.GetRPCMeta(ctx, "node1"); !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), `"node1"`) {
		t.Fatalf("missing rpc meta: %v", err)
	}
	m := RPCMeta{IPOrHostName: "10.0.0.2", RPCPort: 15123}
	if err := b.PutRPCMeta(ctx, "node1", m); err != nil {
		t.Fatal(err)
	}
	if got, err := b.GetRPCMeta(ctx, "node1"); err != nil || got != m {
		t.Fatalf("rpc meta: %+v %v", got, err)
	}
	if err := b.PutRPCMeta(ctx, "node1", RPCMeta{IPOrHostName: "h"}); err == nil {
		t.Fatal("rpc meta with port 0 accepted")
	}
	if err := b.DeleteRPCMeta(ctx, "node1"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.GetRPCMeta(ctx, "node1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("rpc meta after delete: %v", err)
	}
}

func TestMemoryBackend(t *testing.T) {
	b := NewMemory()
	defer b.Close()
	testStore(t, b)
}

func TestMemoryConcurrent(t *testing.T) {
	b := NewMemory()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := tcpDesc("n")
			d.TCPDataPort = 1000 + i
			for range 50 {
				if err := b.PutSegment(context.Background(), d); err != nil {
					t.Error(err)
				}
				if _, err := b.GetSegment(context.Background(), "n"); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
}

func startEtcd(t *testing.T) *EmbeddedEtcd {
	t.Helper()
	ee, err := StartEtcd(context.Background(), EtcdConfig{Listen: "127.0.0.1:0", NoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ee.Close() })
	return ee
}

func rawEtcd(t *testing.T, ee *EmbeddedEtcd) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: ee.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func TestEtcdBackend(t *testing.T) {
	ee := startEtcd(t)
	ep := ee.Endpoints()[0]
	for _, server := range []string{ep, "etcd://" + ep, ep + "," + ep, "etcd://" + ep + ";" + ep} {
		t.Run(server, func(t *testing.T) {
			b, err := Open(context.Background(), server, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			testStore(t, b)
		})
	}
}

func TestEtcdKeysAndClusterID(t *testing.T) {
	ee := startEtcd(t)
	ctx := context.Background()
	raw := rawEtcd(t, ee)
	b, err := Open(ctx, ee.Endpoints()[0], Options{ClusterID: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.PutSegment(ctx, tcpDesc("node1")); err != nil {
		t.Fatal(err)
	}
	if err := b.PutRPCMeta(ctx, "node1", RPCMeta{IPOrHostName: "10.0.0.2", RPCPort: 15123}); err != nil {
		t.Fatal(err)
	}
	resp, err := raw.Get(ctx, "mooncake/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, kv := range resp.Kvs {
		got[string(kv.Key)] = string(kv.Value)
	}
	want := map[string]string{
		"mooncake/c1/ram/node1":      `{"name":"node1","protocol":"tcp","timestamp":"2026-08-01 12:00:00.000001","tcp_data_port":15432,"tcp_proto_version":2,"buffers":[{"name":"node1","addr":139637976727552,"length":1048576}]}`,
		"mooncake/c1/rpc_meta/node1": `{"ip_or_host_name":"10.0.0.2","rpc_port":15123}`,
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("etcd holds %v\nwant %v", got, want)
	}
	// Without the cluster id the same name is a different key.
	plain, err := Open(ctx, ee.Endpoints()[0], Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if _, err := plain.GetSegment(ctx, "node1"); !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "mooncake/ram/node1") {
		t.Fatalf("no cluster id: %v", err)
	}
	// A descriptor written by Mooncake (its key order, extra fields) reads.
	if _, err := raw.Put(ctx, "mooncake/ram/mooncake-node", string(readExample(t, "rdma_segment.json"))); err != nil {
		t.Fatal(err)
	}
	if d, err := plain.GetSegment(ctx, "mooncake-node"); err != nil || d.Name != "prefill-0" || len(d.Devices) != 2 {
		t.Fatalf("mooncake-written descriptor: %+v %v", d, err)
	}
	// A malformed one is reported with its key and field.
	if _, err := raw.Put(ctx, "mooncake/ram/broken", `{"name":"broken","protocol":"tcp","tcp_data_port":1,"buffers":[{"name":"b","addr":0,"length":1}]}`); err != nil {
		t.Fatal(err)
	}
	_, err = plain.GetSegment(ctx, "broken")
	if !errors.Is(err, ErrMalformed) || err.Error() != `mooncake/ram/broken: segment "broken": buffers[0].addr is 0` {
		t.Fatalf("malformed: %v", err)
	}
}

func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func TestEtcdUnreachable(t *testing.T) {
	addr := closedPort(t)
	b, err := Open(context.Background(), addr, Options{Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	start := time.Now()
	_, err = b.GetSegment(context.Background(), "x")
	if !errors.Is(err, ErrUnreachable) || !strings.Contains(err.Error(), "metadata server "+addr+" unreachable: ") {
		t.Fatalf("err = %v", err)
	}
	if errors.Is(err, ErrNotFound) {
		t.Fatal("unreachable reported as not found")
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("took %v with a 300ms timeout", d)
	}
	if err := b.PutSegment(context.Background(), tcpDesc("x")); !errors.Is(err, ErrUnreachable) {
		t.Fatalf("put: %v", err)
	}
	t.Logf("error line: %v", err)
}

// recorder wraps the HTTP metadata server and keeps what Mooncake's client
// side of the wire looks like.
type recorder struct {
	mu   sync.Mutex
	reqs []recorded
	next http.Handler
}

type recorded struct {
	method, path, rawQuery, contentType, body string
}

func (r *recorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	r.reqs = append(r.reqs, recorded{req.Method, req.URL.Path, req.URL.RawQuery, req.Header.Get("Content-Type"), string(body)})
	r.mu.Unlock()
	req.Body = io.NopCloser(strings.NewReader(string(body)))
	r.next.ServeHTTP(w, req)
}

func (r *recorder) take() []recorded {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.reqs
	r.reqs = nil
	return out
}

func TestHTTPBackend(t *testing.T) {
	srv := httptest.NewServer(NewHTTPHandler())
	defer srv.Close()
	b, err := Open(context.Background(), srv.URL+"/metadata", Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	testStore(t, b)
}

func TestHTTPWire(t *testing.T) {
	rec := &recorder{next: NewHTTPHandler()}
	srv := httptest.NewServer(rec)
	defer srv.Close()
	ctx := context.Background()
	b, err := Open(ctx, srv.URL+"/metadata", Options{ClusterID: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	d := tcpDesc("a b+c")
	want, _ := EncodeSegment(d)
	if err := b.PutSegment(ctx, d); err != nil {
		t.Fatal(err)
	}
	if _, err := b.GetSegment(ctx, "a b+c"); err != nil {
		t.Fatal(err)
	}
	if err := b.DeleteSegment(ctx, "a b+c"); err != nil {
		t.Fatal(err)
	}
	if err := b.PutRPCMeta(ctx, "node1", RPCMeta{IPOrHostName: "h", RPCPort: 2}); err != nil {
		t.Fatal(err)
	}
	key := "key=mooncake%2Fc1%2Fram%2Fa%20b%2Bc"
	exp := []recorded{
		{"PUT", "/metadata", key, "application/json", string(want)},
		{"GET", "/metadata", key, "", ""},
		{"DELETE", "/metadata", key, "", ""},
		{"PUT", "/metadata", "key=mooncake%2Fc1%2Frpc_meta%2Fnode1", "application/json", `{"ip_or_host_name":"h","rpc_port":2}`},
	}
	if got := rec.take(); !reflect.DeepEqual(got, exp) {
		t.Fatalf("wire:\n got %+v\nwant %+v", got, exp)
	}
}

func TestHTTPHandlerProtocol(t *testing.T) {
	srv := httptest.NewServer(NewHTTPHandler())
	defer srv.Close()
	do := func(method, query, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+"/metadata?"+query, strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	steps := []struct {
		method, query, body string
		code                int
		resp                string
	}{
		{"GET", "key=mooncake%2Fram%2Fx", "", 404, "metadata not found"},
		{"DELETE", "key=mooncake%2Fram%2Fx", "", 404, "metadata not found"},
		{"PUT", "key=mooncake%2Fram%2Fx", `{"v":1}`, 200, "metadata updated"},
		{"GET", "key=mooncake/ram/x", "", 200, `{"v":1}`},
		{"DELETE", "key=mooncake%2Fram%2Fx", "", 200, "metadata deleted"},
		{"GET", "key=mooncake%2Fram%2Fx", "", 404, "metadata not found"},
		{"GET", "", "", 400, "missing key"},
		{"POST", "key=k", "x", 405, "method not allowed"},
	}
	for _, s := range steps {
		code, body := do(s.method, s.query, s.body)
		if code != s.code || body != s.resp {
			t.Fatalf("%s ?%s: %d %q, want %d %q", s.method, s.query, code, body, s.code, s.resp)
		}
	}
}

func TestHTTPErrors(t *testing.T) {
	ctx := context.Background()
	t.Run("unreachable", func(t *testing.T) {
		addr := closedPort(t)
		b, err := Open(ctx, "http://"+addr+"/metadata", Options{Timeout: 300 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, err = b.GetSegment(ctx, "x")
		if !errors.Is(err, ErrUnreachable) || !strings.Contains(err.Error(), "metadata server "+addr+" unreachable: ") || errors.Is(err, ErrNotFound) {
			t.Fatalf("err = %v", err)
		}
		if time.Since(start) > 3*time.Second {
			t.Fatalf("took %v", time.Since(start))
		}
		t.Logf("error line: %v", err)
	})
	t.Run("silent server times out", func(t *testing.T) {
		block := make(chan struct{})
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-block }))
		defer srv.Close()
		defer close(block)
		b, _ := Open(ctx, srv.URL, Options{Timeout: 200 * time.Millisecond})
		_, err := b.GetSegment(ctx, "x")
		if !errors.Is(err, ErrUnreachable) || !strings.Contains(err.Error(), srv.Listener.Addr().String()) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("non-200 is failure", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "created")
		}))
		defer srv.Close()
		b, _ := Open(ctx, srv.URL, Options{})
		err := b.PutSegment(ctx, tcpDesc("x"))
		if err == nil || !strings.Contains(err.Error(), `answered 201 Created: "created"`) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("body limit", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, strings.Repeat("x", 2000))
		}))
		defer srv.Close()
		b, _ := Open(ctx, srv.URL, Options{MaxLength: 1000})
		_, err := b.GetSegment(ctx, "x")
		if err == nil || !strings.Contains(err.Error(), "exceeds 1000 bytes") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("malformed descriptor", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, `{"name":"x","protocol":"rdma","devices":[{"name":"","gid":"g"}],"buffers":[]}`)
		}))
		defer srv.Close()
		b, _ := Open(ctx, srv.URL, Options{})
		_, err := b.GetSegment(ctx, "x")
		if !errors.Is(err, ErrMalformed) || err.Error() != `mooncake/ram/x: segment "x": devices[0].name is empty` {
			t.Fatalf("err = %v", err)
		}
	})
}

func TestEscapeKey(t *testing.T) {
	for in, want := range map[string]string{
		"mooncake/ram/node1":        "mooncake%2Fram%2Fnode1",
		"mooncake/ram/10.0.0.1:123": "mooncake%2Fram%2F10.0.0.1%3A123",
		"a-b_c.d~e":                 "a-b_c.d~e",
		"a b+c&d=e?f#g%":            "a%20b%2Bc%26d%3De%3Ff%23g%25",
		"é":                         "%C3%A9",
	} {
		if got := EscapeKey(in); got != want {
			t.Errorf("EscapeKey(%q) = %q, want %q", in, got, want)
		}
	}
}

func listenHS(t *testing.T) *handshake.Server {
	t.Helper()
	s, err := handshake.Listen("127.0.0.1:0", handshake.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestP2PBackend(t *testing.T) {
	ctx := context.Background()
	hsA, hsB := listenHS(t), listenHS(t)
	a, err := Open(ctx, "P2PHANDSHAKE", Options{Handshake: hsA})
	if err != nil {
		t.Fatal(err)
	}
	bk, err := Open(ctx, "P2PHANDSHAKE", Options{Handshake: hsB, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer bk.Close()

	// Before A publishes, its listener has nothing to say.
	if _, err := bk.GetSegment(ctx, hsA.Addr()); !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), hsA.Addr()) {
		t.Fatalf("before publish: %v", err)
	}
	da := rdmaDesc(hsA.Addr())
	if err := a.PutSegment(ctx, da); err != nil {
		t.Fatal(err)
	}
	got, err := bk.GetSegment(ctx, hsA.Addr())
	if err != nil || !reflect.DeepEqual(got, da) {
		t.Fatalf("B reads A: %+v %v", got, err)
	}
	// A reads itself without a round trip.
	if got, err := a.GetSegment(ctx, hsA.Addr()); err != nil || !reflect.DeepEqual(got, da) {
		t.Fatalf("A reads itself: %v", err)
	}
	// Both ways.
	db := tcpDesc(hsB.Addr())
	if err := bk.PutSegment(ctx, db); err != nil {
		t.Fatal(err)
	}
	if got, err := a.GetSegment(ctx, hsB.Addr()); err != nil || !reflect.DeepEqual(got, db) {
		t.Fatalf("A reads B: %+v %v", got, err)
	}
	// The raw reply is Mooncake's descriptor JSON in a Metadata frame.
	raw, err := handshake.Request(ctx, hsB.Addr(), handshake.Metadata, []byte("{}"), 0)
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := EncodeSegment(db); string(raw) != string(want) {
		t.Fatalf("Metadata reply %s, want %s", raw, want)
	}
	// RPC meta in P2P mode is the name itself.
	if m, err := bk.GetRPCMeta(ctx, "10.1.2.3:15001"); err != nil || m != (RPCMeta{"10.1.2.3", 15001}) {
		t.Fatalf("rpc meta: %+v %v", m, err)
	}
	if _, err := bk.GetRPCMeta(ctx, "node1"); err == nil {
		t.Fatal("rpc meta of a non host:port name accepted")
	}
	// After A closes, it no longer answers.
	a.Close()
	if _, err := bk.GetSegment(ctx, hsA.Addr()); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after close: %v", err)
	}
}

func TestP2PErrors(t *testing.T) {
	ctx := context.Background()
	b, _ := Open(ctx, "P2PHANDSHAKE", Options{Timeout: 500 * time.Millisecond})
	if err := b.PutSegment(ctx, tcpDesc("x")); err == nil || !strings.Contains(err.Error(), "handshake listener") {
		t.Fatalf("put without listener: %v", err)
	}
	if _, err := b.GetSegment(ctx, "node1"); err == nil || !strings.Contains(err.Error(), `segment "node1": name is not host:port`) {
		t.Fatalf("bad name: %v", err)
	}
	addr := closedPort(t)
	_, err := b.GetSegment(ctx, addr)
	if !errors.Is(err, ErrUnreachable) || !strings.Contains(err.Error(), "peer "+addr+" unreachable") || errors.Is(err, ErrNotFound) {
		t.Fatalf("unreachable peer: %v", err)
	}
	t.Logf("error line: %v", err)
	// A Mooncake peer without a local segment answers "null\n".
	empty := listenHS(t)
	empty.Handle(handshake.Metadata, func(ctx context.Context, p []byte) ([]byte, error) { return []byte("null\n"), nil })
	if _, err := b.GetSegment(ctx, empty.Addr()); !errors.Is(err, ErrNotFound) {
		t.Fatalf("null reply: %v", err)
	}
	// A peer that answers garbage.
	hs := listenHS(t)
	hs.Handle(handshake.Metadata, func(ctx context.Context, p []byte) ([]byte, error) {
		return []byte(`{"name":"evil","protocol":"tcp","tcp_data_port":1,"buffers":[{"name":"e","addr":1,"length":0}]}`), nil
	})
	_, err = b.GetSegment(ctx, hs.Addr())
	if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), `segment "evil": buffers[0].length is 0`) {
		t.Fatalf("malformed reply: %v", err)
	}
}

func TestOpen(t *testing.T) {
	ctx := context.Background()
	good := []string{"P2PHANDSHAKE", "127.0.0.1:2379", "etcd://127.0.0.1:2379", "etcd://a:1;b:2", "a:1,b:2", "http://127.0.0.1:8080/metadata", " 127.0.0.1:2379 "}
	for _, s := range good {
		b, err := Open(ctx, s, Options{})
		if err != nil {
			t.Errorf("Open(%q): %v", s, err)
			continue
		}
		b.Close()
	}
	bad := map[string]string{
		"":                       "metadata server is empty",
		"redis://127.0.0.1:6379": `metadata server "redis://127.0.0.1:6379": metadata backend not supported: redis`,
		"zk://h:1":               `unknown scheme "zk"`,
		"localhost":              `etcd endpoint "localhost" is not host:port`,
		"etcd://":                "no etcd endpoint",
		"h:99999":                `port "99999" is not 1-65535`,
		"h:x":                    `port "x" is not 1-65535`,
		":2379":                  "has no host",
		"http://":                "is not a valid http URL",
		"p2phandshake":           `etcd endpoint "p2phandshake" is not host:port`,
	}
	for s, want := range bad {
		_, err := Open(ctx, s, Options{})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Open(%q) = %v, want %q", s, err, want)
		}
	}
	if _, err := Open(ctx, "redis://x:1", Options{}); !errors.Is(err, ErrUnsupported) {
		t.Errorf("redis: %v", err)
	}
}

func TestEmbeddedEtcdCloseTwiceAndBusyPort(t *testing.T) {
	ee, err := StartEtcd(context.Background(), EtcdConfig{Listen: "127.0.0.1:0", NoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	dir := ee.DataDir()
	// A second server on the same port fails with a clear error.
	if _, err := StartEtcd(context.Background(), EtcdConfig{Listen: ee.Endpoints()[0], NoFsync: true}); err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("busy port: %v", err)
	}
	if err := ee.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ee.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("temporary data dir kept: %v", err)
	}
	if _, err := StartEtcd(context.Background(), EtcdConfig{Listen: "nope"}); err == nil || !strings.Contains(err.Error(), `"nope" is not host:port`) {
		t.Fatalf("bad listen: %v", err)
	}
}

// MC_METADATA_HTTP_TOKEN: the backend sends the bearer token; a server
// that requires one refuses requests without it, in words that name the
// variable.
func TestHTTPToken(t *testing.T) {
	srv := httptest.NewServer(RequireToken(NewHTTPHandler(), "s3cret"))
	defer srv.Close()
	ctx := context.Background()
	b, err := Open(ctx, srv.URL+"/metadata", Options{HTTPToken: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	testStore(t, b)
	for _, token := range []string{"", "wrong"} {
		nb, _ := Open(ctx, srv.URL+"/metadata", Options{HTTPToken: token})
		_, err := nb.GetSegment(ctx, "x")
		if err == nil || !strings.Contains(err.Error(), "401 Unauthorized: set MC_METADATA_HTTP_TOKEN") {
			t.Fatalf("token %q: %v", token, err)
		}
		nb.Close()
	}
}
