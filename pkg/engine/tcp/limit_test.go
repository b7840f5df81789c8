//go:build linux

package tcp

import (
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/connlimit"
)

// plainListener hides *net.TCPListener, so the server takes the
// goroutine-per-connection accept loop instead of the event loops.
type plainListener struct{ net.Listener }

// TestDataPortConnectionCap: a host over its cap is refused at accept
// with a reset while its held connections go on being served, and every
// way a connection ends (per-request close, hand-over to a handler, the
// server's Close) gives its slot back. Without the cap a client holding
// thousands of idle connections took every descriptor of the process.
func TestDataPortConnectionCap(t *testing.T) {
	for _, inline := range []bool{true, false} {
		name := "event-loops"
		if !inline {
			name = "per-connection"
		}
		t.Run(name, func(t *testing.T) { dataPortCap(t, inline) })
	}
}

func dataPortCap(t *testing.T, inline bool) {
	g := newGuarded(0x10000, 4096, 64)
	for i := range g.region() {
		g.region()[i] = byte(i*7 + 3)
	}
	var ln net.Listener
	ln, err := Listen(t.Context(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if !inline {
		ln = plainListener{ln}
	}
	lim := connlimit.New(0, 3)
	s := NewServer(ln, g, ServerOptions{Limiter: lim})
	if (s.EventLoops() > 0) != inline {
		t.Fatalf("EventLoops() = %d", s.EventLoops())
	}
	open := func() int64 { return lim.Stats()[limiterName].Open }
	waitOpen := func(want int64) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for open() != want {
			if time.Now().After(deadline) {
				t.Fatalf("%d connections held, want %d", open(), want)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	read := func(c net.Conn, off uint64) {
		t.Helper()
		st, data := request(t, c, Header{Addr: 0x10000 + off, Size: 16}, nil)
		if st != StatusOK || data[0] != g.region()[off] {
			t.Fatalf("read at %d: status %x, byte %d", off, st, data[0])
		}
	}
	held := make([]net.Conn, 3)
	for i := range held {
		held[i] = dial(t, s)
		read(held[i], uint64(i))
	}
	// The reset may come before the dial returns.
	if over, err := net.Dial("tcp", s.Addr().String()); err == nil {
		defer over.Close()
		over.SetDeadline(time.Now().Add(5 * time.Second))
		over.Write(AppendHeader(nil, Header{Addr: 0x10000, Size: 16, V2: true}))
		var b [8]byte
		if _, err := io.ReadFull(over, b[:]); !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, io.EOF) {
			t.Fatalf("a 4th connection over a cap of 3 per host: %v, want a reset", err)
		}
	} else if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("a 4th connection over a cap of 3 per host: dial: %v, want a reset", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for lim.Stats()[limiterName].RefusedHost != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v, want one refused by host", lim.Stats()[limiterName])
		}
		time.Sleep(time.Millisecond)
	}
	read(held[0], 100) // the held ones are still served
	held[2].Close()
	waitOpen(2)
	// Connection per request (Mooncake's default client): each one's
	// slot comes back when it closes.
	for i := range 40 {
		c := dial(t, s)
		read(c, uint64(200+i))
		c.Close()
		waitOpen(2)
	}
	// Pipelining: handed over to a handler (on the event loops), whose
	// end gives the slot back.
	c := dial(t, s)
	two := append(AppendHeader(nil, Header{Addr: 0x10000, Size: 8, V2: true}), AppendHeader(nil, Header{Addr: 0x10008, Size: 8, V2: true})...)
	if _, err := c.Write(two); err != nil {
		t.Fatal(err)
	}
	var reply [2 * (StatusSize + 8)]byte
	if _, err := io.ReadFull(c, reply[:]); err != nil {
		t.Fatalf("pipelined reads: %v", err)
	}
	waitOpen(3)
	c.Close()
	waitOpen(2)
	s.Close()
	waitOpen(0)
}
