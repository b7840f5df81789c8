package server

import (
	"context"
	"io"
	"log/slog"
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
