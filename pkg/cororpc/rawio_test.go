//go:build linux

package cororpc

import (
	"bufio"
	"net"
	"testing"

	"github.com/kvcache-ops/mc/pkg/connlimit"
)

// TestRawIOThroughConnLimit: a connection accepted through a connection
// cap (connlimit's listener, as `mc serve store`'s master port is) and
// sniffed on a shared port (WithReader) keeps raw socket I/O. Before,
// newRawIO refused the wrapper type, and every master connection fell
// back to net.Conn's reads, each waking the runtime's monitor thread: a
// profile of Mooncake's Python client's puts showed cororpc's reads in
// syscall.Syscall and entersyscallWakeSysmon.
func TestRawIOThroughConnLimit(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lim := connlimit.New(100, 100).Listener(ln, "test")
	defer lim.Close()
	done := make(chan net.Conn, 1)
	go func() {
		c, err := lim.Accept()
		if err != nil {
			t.Error(err)
		}
		done <- c
	}()
	cc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	sc := <-done
	if sc == nil {
		t.FailNow()
	}
	defer sc.Close()
	if _, ok := sc.(*net.TCPConn); ok {
		t.Fatal("connlimit returned the bare connection: the test would not test the wrapper")
	}
	if newRawIO(sc) == nil {
		t.Error("no raw I/O for a connection admitted by connlimit")
	}
	br := bufio.NewReader(sc)
	if _, err := cc.Write([]byte{Magic, 1, 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := br.Peek(1); err != nil {
		t.Fatal(err)
	}
	raw := newRawIO(WithReader(sc, br))
	if raw == nil {
		t.Fatal("no raw I/O for a connlimit connection sniffed on a shared port")
	}
	// The sniffed bytes come first, then the socket's.
	if _, err := cc.Write([]byte{3}); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 0, 4)
	for len(got) < 4 {
		b := make([]byte, 4-len(got))
		n, err := raw.Read(b)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, b[:n]...)
	}
	if want := []byte{Magic, 1, 2, 3}; string(got) != string(want) {
		t.Fatalf("read %v, want %v", got, want)
	}
}
