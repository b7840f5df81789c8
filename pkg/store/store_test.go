package store_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine"
	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/master"
)

// cluster is a master on a loopback port plus nodes and clients, all real
// sockets.
type cluster struct {
	t    testing.TB
	m    *master.Master
	addr string
	stop func()
}

func startMaster(t testing.TB, cfg master.Config) *cluster {
	t.Helper()
	return startMasterOn(t, "127.0.0.1:0", cfg)
}

func startMasterOn(t testing.TB, addr string, cfg master.Config) *cluster {
	t.Helper()
	m, lis := listeningMaster(t, addr, cfg)
	srv := master.Serve(m, lis)
	c := &cluster{t: t, m: m, addr: lis.Addr().String()}
	var once sync.Once
	c.stop = func() {
		once.Do(func() {
			srv.Stop()
			m.Close()
		})
	}
	t.Cleanup(c.stop)
	return c
}

// listeningMaster is a started master of cfg and a listener on addr for
// it to be served on.
func listeningMaster(t testing.TB, addr string, cfg master.Config) (*master.Master, net.Listener) {
	t.Helper()
	m, err := master.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	m.Start()
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		m.Close()
		t.Fatal(err)
	}
	return m, lis
}

func engineConfig() engine.Config {
	return engine.Config{BindAddress: "127.0.0.1", HandshakeAddr: "127.0.0.1:0"}
}

func (c *cluster) client(segSize uint64, mod ...func(*store.Config)) *store.Client {
	c.t.Helper()
	cfg := store.Config{Master: c.addr, EngineConfig: engineConfig(), SegmentSize: segSize, PingInterval: 50 * time.Millisecond, StagingSize: 8 << 20}
	for _, f := range mod {
		f(&cfg)
	}
	cl, err := store.New(context.Background(), cfg)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { cl.Close(context.Background()) })
	return cl
}

func value(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) ^ seed
	}
	return b
}

func TestPutGetOverTCP(t *testing.T) {
	c := startMaster(t, master.Config{})
	c.client(64 << 20)
	c.client(64 << 20)
	cl := c.client(0)
	ctx := context.Background()
	for _, n := range []int{1, 4096, 1 << 20, 3<<20 + 5} {
		key := fmt.Sprintf("k-%d", n)
		v := value(n, byte(n))
		if err := cl.Put(ctx, key, v, store.WithReplicas(2)); err != nil {
			t.Fatalf("put %d bytes: %v", n, err)
		}
		got, err := cl.Get(ctx, key)
		if err != nil {
			t.Fatalf("get %d bytes: %v", n, err)
		}
		if !bytes.Equal(got, v) {
			t.Fatalf("get %q: bytes differ", key)
		}
		reps, err := cl.Query(ctx, key)
		if err != nil || len(reps) != 2 || reps[0].Segment == reps[1].Segment {
			t.Fatalf("query %q: %+v, %v; want 2 replicas on distinct segments", key, reps, err)
		}
	}
	if ok, err := cl.Exist(ctx, "k-1"); !ok || err != nil {
		t.Fatalf("exist k-1 = %v, %v", ok, err)
	}
	if ok, err := cl.Exist(ctx, "nope"); ok || err != nil {
		t.Fatalf("exist nope = %v, %v", ok, err)
	}
	if _, err := cl.Get(ctx, "nope"); !errors.Is(err, store.ErrObjectNotFound) {
		t.Fatalf("get unknown key: %v, want OBJECT_NOT_FOUND", err)
	}
	if err := cl.Put(ctx, "k-1", []byte("x")); !errors.Is(err, store.ErrObjectAlreadyExists) {
		t.Fatalf("duplicate put: %v, want OBJECT_ALREADY_EXISTS", err)
	}
	// The get above holds a read lease: a plain remove is refused, a
	// forced one goes through.
	if err := cl.Remove(ctx, "k-1", false); !errors.Is(err, store.ErrObjectHasLease) {
		t.Fatalf("remove while leased: %v, want OBJECT_HAS_LEASE", err)
	}
	if err := cl.Remove(ctx, "k-1", true); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Get(ctx, "k-1"); !errors.Is(err, store.ErrObjectNotFound) {
		t.Fatalf("get removed key: %v", err)
	}
}

// TestSegmentPopulatedLoggedAtInfo: operators and the latency benchmark
// (scripts/bench-mooncake-latency.sh) wait for this line before they
// measure, since puts compete with the faulting until then (issue 39).
func TestSegmentPopulatedLoggedAtInfo(t *testing.T) {
	c := startMaster(t, master.Config{})
	var buf syncBuffer
	cl := c.client(8<<20, func(cfg *store.Config) {
		cfg.Logger = slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := cl.WaitPopulated(ctx); err != nil {
		t.Fatal(err)
	}
	want := regexp.MustCompile(`level=INFO msg="segment of 8388608 bytes populated in [0-9.]+(µs|ms|s)"|level=INFO msg="segment pages will fault in on first use: `)
	if !want.MatchString(buf.String()) {
		t.Fatalf("log has no INFO line saying the segment is populated:\n%s", buf.String())
	}
}

// syncBuffer is a bytes.Buffer safe for a logger and a reader at once.
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
