package connlimit

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestAdmitCaps(t *testing.T) {
	l := New(5, 3)
	a, b := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	var slots []Slot
	for i := range 3 {
		s, ok := l.Admit("rpc", a)
		if !ok {
			t.Fatalf("connection %d from a refused under its cap", i)
		}
		slots = append(slots, s)
	}
	if _, ok := l.Admit("rpc", a); ok {
		t.Fatal("a 4th connection from one host admitted over --max-connections-per-host 3")
	}
	for i := range 2 {
		if _, ok := l.Admit("data", b); !ok {
			t.Fatalf("connection %d from another host refused", i)
		}
	}
	if _, ok := l.Admit("data", netip.MustParseAddr("10.0.0.3")); ok {
		t.Fatal("a 6th connection admitted over --max-connections 5")
	}
	st := l.Stats()
	if st["rpc"].Open != 3 || st["rpc"].RefusedHost != 1 || st["data"].Open != 2 || st["data"].RefusedProcess != 1 {
		t.Fatalf("stats = %+v", st)
	}
	slots[0].Release()
	slots[0].Release() // a second release gives nothing back twice
	if _, ok := l.Admit("rpc", a); !ok {
		t.Fatal("a connection refused after one of its host's was released")
	}
	if _, ok := l.Admit("rpc", a); ok {
		t.Fatal("a double Release freed two slots")
	}
	// IPv4-mapped IPv6 is the same host.
	if _, ok := l.Admit("rpc", netip.MustParseAddr("::ffff:10.0.0.1")); ok {
		t.Fatal("an IPv4-mapped address escaped its host's cap")
	}
	var nilL *Limiter
	if _, ok := nilL.Admit("x", a); !ok {
		t.Fatal("a nil Limiter refused")
	}
	Slot{}.Release()
}

func TestDefaultLimits(t *testing.T) {
	for _, c := range []struct {
		nofile       uint64
		max, perHost int
	}{
		{1024, 512, 128},
		{4096, 3072, 768},
		{20000, 16000, 4000},
		{1 << 20, 838861, 209715},
		{100, 50, 50},
	} {
		m, p := DefaultLimits(c.nofile)
		if m != c.max || p != c.perHost {
			t.Errorf("DefaultLimits(%d) = %d, %d; want %d, %d", c.nofile, m, p, c.max, c.perHost)
		}
	}
	n, err := NoFile()
	if err != nil || n == 0 {
		t.Fatalf("NoFile() = %d, %v", n, err)
	}
}

// TestListenerRefusesOverCap: a connection over the cap is reset at once
// (not left hanging in the backlog), the held ones keep working, and a
// closed one frees its slot.
func TestListenerRefusesOverCap(t *testing.T) {
	l := New(0, 2)
	base, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := l.Listener(base, "echo")
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	echo := func(c net.Conn) error {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte("x")); err != nil {
			return err
		}
		var b [1]byte
		_, err := io.ReadFull(c, b[:])
		return err
	}
	c1, c2 := dial(), dial()
	if err := echo(c1); err != nil {
		t.Fatal(err)
	}
	if err := echo(c2); err != nil {
		t.Fatal(err)
	}
	// The reset may come before the dial returns.
	if c3, err := net.Dial("tcp", ln.Addr().String()); err == nil {
		if err := echo(c3); !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, io.EOF) {
			t.Fatalf("third connection over a cap of 2: %v, want a reset", err)
		}
		c3.Close()
	} else if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("third connection over a cap of 2: dial: %v, want a reset", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for l.Stats()["echo"].RefusedHost != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("refusals %+v, want 1", l.Stats()["echo"])
		}
		time.Sleep(time.Millisecond)
	}
	if err := echo(c1); err != nil {
		t.Fatalf("a held connection broke when another was refused: %v", err)
	}
	c1.Close()
	deadline = time.Now().Add(5 * time.Second)
	for l.Stats()["echo"].Open != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("open = %d after one of two closed", l.Stats()["echo"].Open)
		}
		time.Sleep(5 * time.Millisecond)
	}
	c4 := dial()
	defer c4.Close()
	if err := echo(c4); err != nil {
		t.Fatalf("a connection after one was closed: %v", err)
	}
	c2.Close()
	if st := l.Stats()["echo"]; st.RefusedHost != 1 {
		t.Fatalf("refused = %+v, want 1 by host", st)
	}
	want := `
# HELP mc_connections_refused_total inbound connections refused (closed with a reset at accept) because a cap was reached: reason host (--max-connections-per-host) or process (--max-connections)
# TYPE mc_connections_refused_total counter
mc_connections_refused_total{listener="echo",reason="host"} 1
mc_connections_refused_total{listener="echo",reason="process"} 0
`
	if err := testutil.CollectAndCompare(l, strings.NewReader(want), "mc_connections_refused_total"); err != nil {
		t.Fatal(err)
	}
}

// TestWrapKeepsTCPInterfaces: servers reach the socket through interfaces
// (SyscallConn for raw I/O, CloseWrite), which the wrapper must keep.
func TestWrapKeepsTCPInterfaces(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	if _, ok := Wrap(a, Slot{}).(syscall.Conn); ok {
		t.Fatal("a pipe gained SyscallConn")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err == nil {
			defer c.Close()
			io.Copy(io.Discard, c)
		}
	}()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	w := Wrap(c, Slot{})
	defer w.Close()
	if _, ok := w.(syscall.Conn); !ok {
		t.Error("wrapped TCP connection lost SyscallConn")
	}
	if _, ok := w.(interface{ CloseWrite() error }); !ok {
		t.Error("wrapped TCP connection lost CloseWrite")
	}
	if _, ok := w.(io.ReaderFrom); !ok {
		t.Error("wrapped TCP connection lost ReadFrom")
	}
}
