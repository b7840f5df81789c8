package cmd

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/kvcache-ops/mc/pkg/engine"
	"github.com/kvcache-ops/mc/pkg/engine/meta"
)

// With P2PHANDSHAKE a segment is named host:port by its handshake port.
// --local-hostname host:port made that "[host:port]:port", a name no peer
// parses back; the port given is now the handshake port, so the segment
// is named as written.
func TestLocalHostnameWithPortUnderP2P(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	want := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	o := storeDataOptions{Protocol: "tcp", LocalHostname: want, MetadataServer: meta.P2PHandshake}
	cfg, err := o.engineConfig("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if got := e.SegmentName(); got != want {
		t.Fatalf("segment name %q, want %q", got, want)
	}
	for _, bad := range []string{"127.0.0.1:x", "127.0.0.1:0", "127.0.0.1:70000"} {
		o.LocalHostname = bad
		if _, err := o.engineConfig("127.0.0.1"); err == nil || !strings.Contains(err.Error(), "--local-hostname") {
			t.Errorf("--local-hostname %s: %v, want an error naming the flag", bad, err)
		}
	}
}
