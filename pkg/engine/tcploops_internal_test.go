package engine

import (
	"context"
	"runtime"
	"testing"

	"github.com/kvcache-ops/mc/pkg/engine/tcp"
)

// Config.TCPEventLoops (--tcp-event-loops, MC_TCP_EVENT_LOOPS) reaches the
// TCP data server; 0 is the server's default.
func TestTCPEventLoopsReachTheServer(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("event loops are Linux-only")
	}
	for _, tc := range []struct{ set, want int }{{0, tcp.DefaultEventLoops()}, {3, 3}} {
		e, err := New(context.Background(), Config{LocalServerName: "loops", BindAddress: "127.0.0.1",
			HandshakeAddr: "127.0.0.1:0", TCPEventLoops: tc.set})
		if err != nil {
			t.Fatal(err)
		}
		got := e.Transport("tcp").(*tcpTransport).server.EventLoops()
		e.Close()
		if got != tc.want {
			t.Errorf("TCPEventLoops %d: %d loops, want %d", tc.set, got, tc.want)
		}
	}
}
