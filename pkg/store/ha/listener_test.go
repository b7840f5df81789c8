package ha

import (
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// failOnce fails its first Accept as accept(2) does when the process is
// out of descriptors.
type failOnce struct {
	net.Listener
	failed atomic.Bool
}

func (l *failOnce) Accept() (net.Conn, error) {
	if !l.failed.Swap(true) {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: syscall.EMFILE}
	}
	return l.Listener.Accept()
}

// TestMuxListenerSurvivesAcceptFailure: a candidate's RPC port went on
// being bound but never accepted again after one failed accept (EMFILE
// under a connection flood), so the candidate, even as leader, served no
// one until restarted.
func TestMuxListenerSurvivesAcceptFailure(t *testing.T) {
	base, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := newMuxListener(&failOnce{Listener: base})
	defer l.Close()
	term := l.open()
	c, err := net.Dial("tcp", base.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got := make(chan net.Conn, 1)
	go func() {
		if sc, err := term.Accept(); err == nil {
			got <- sc
		}
	}()
	select {
	case sc := <-got:
		sc.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("no connection reached the term after one failed accept")
	}
}
