package server

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine"
	"github.com/kvcache-ops/mc/pkg/store/master"
)

// TestAdminPortTakenFailsAtOnce: a node whose admin port is taken (two
// nodes on one host) must fail Start with an error naming the listener,
// not hang in its own shutdown as it once did.
func TestAdminPortTakenFailsAtOnce(t *testing.T) {
	ctx := context.Background()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	eng := engine.Config{BindAddress: "127.0.0.1", HandshakeAddr: "127.0.0.1:0"}
	m, err := Start(ctx, Config{RPCAddress: "127.0.0.1:0", AdminAddress: "127.0.0.1:0", Logger: quiet, Engine: eng})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(ctx)
	type result struct {
		s   *Server
		err error
	}
	done := make(chan result, 1)
	go func() {
		s, err := Start(ctx, Config{MasterAddr: m.RPCAddr, AdminAddress: m.AdminAddr, SegmentSize: 4 << 20,
			PingInterval: 50 * time.Millisecond, Logger: quiet, Engine: eng})
		done <- result{s, err}
	}()
	select {
	case r := <-done:
		if r.err == nil {
			r.s.Close(ctx)
			t.Fatalf("a node started on the master's admin address %s", m.AdminAddr)
		}
		if !strings.Contains(r.err.Error(), "admin HTTP listener") {
			t.Fatalf("error %q does not name the admin listener", r.err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Start with a taken admin port did not return within 15 s")
	}
	if segs := m.Master.Segments(); len(segs) != 0 {
		t.Fatalf("the failed node left segments mounted: %+v", segs)
	}
}

// TestAdminWarnsWhenOpen: a master whose admin API listens beyond
// loopback without a token logs one warning at start; on loopback, or
// with a token, none (issue 40).
func TestAdminWarnsWhenOpen(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		admin, token string
		warn         bool
	}{
		{"0.0.0.0:0", "", true},
		{"127.0.0.1:0", "", false},
		{"0.0.0.0:0", "tok", false},
	} {
		var logs strings.Builder
		log := slog.New(slog.NewTextHandler(&logs, nil))
		s, err := Start(ctx, Config{RPCAddress: "127.0.0.1:0", AdminAddress: c.admin, Logger: log,
			Master: master.Config{AdminToken: c.token}})
		if err != nil {
			t.Fatal(err)
		}
		s.Close(ctx)
		if n := strings.Count(logs.String(), "has no token"); (n == 1) != c.warn || n > 1 {
			t.Fatalf("admin %s token %q: %d warnings, want warn=%v; logs:\n%s", c.admin, c.token, n, c.warn, logs.String())
		}
	}
}

// TestAdminServerBounded: the admin HTTP server Start opens closes idle
// and slow connections and exports the process's goroutines (before, a
// kept-alive connection stayed open for as long as its client liked, and
// /metrics had no go_goroutines to see that with).
func TestAdminServerBounded(t *testing.T) {
	ctx := context.Background()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	eng := engine.Config{BindAddress: "127.0.0.1", HandshakeAddr: "127.0.0.1:0"}
	s, err := Start(ctx, Config{RPCAddress: "127.0.0.1:0", AdminAddress: "127.0.0.1:0", Logger: quiet, Engine: eng})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	if s.admin.ReadTimeout <= 0 || s.admin.WriteTimeout <= 0 || s.admin.IdleTimeout <= 0 {
		t.Fatalf("admin server unbounded: read %s, write %s, idle %s", s.admin.ReadTimeout, s.admin.WriteTimeout, s.admin.IdleTimeout)
	}
	resp, err := http.Get("http://" + s.AdminAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, name := range []string{"go_goroutines ", "process_open_fds "} {
		if !strings.Contains(string(b), "\n"+name) {
			t.Errorf("admin /metrics has no %s", name)
		}
	}
}
