package master

import (
	"bufio"
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/kvcache-ops/mc/pkg/cororpc"
)

// sniffTimeout bounds how long a new connection may stay silent before
// its first byte says which protocol it speaks. Both kinds of client
// speak first (gRPC's preface, a coro_rpc request), so only a stuck or
// hostile peer waits this long.
const sniffTimeout = 10 * time.Second

// ServeShared serves the gRPC API and, with moon, Mooncake's coro_rpc on
// one listener, so Mooncake clients reach mc's master at the address they
// would give mooncake_master. The first byte of a connection tells them
// apart: coro_rpc's magic 0x15, against the 'P' that opens HTTP/2's
// client preface. It returns when lis fails or the server shuts down.
//
// mc's own client's Session calls are served on the coro_rpc side too
// (session_coro.go), through this server's gate.
func (s *GRPCServer) ServeShared(lis net.Listener, moon *cororpc.Server) error {
	if moon == nil {
		return s.Serve(lis)
	}
	if !s.noCoroSession {
		if err := s.registerSession(moon); err != nil {
			lis.Close()
			return err
		}
	}
	gl := &connListener{addr: lis.Addr(), conns: make(chan net.Conn), done: make(chan struct{})}
	s.mu.Lock()
	s.moon, s.shared = moon, lis
	s.mu.Unlock()
	go s.Serve(gl)
	defer gl.Close()
	for {
		c, err := lis.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(5 * time.Millisecond)
				continue
			}
			return err
		}
		go func() {
			br := bufio.NewReader(c)
			_ = c.SetReadDeadline(time.Now().Add(sniffTimeout))
			first, err := br.Peek(1)
			_ = c.SetReadDeadline(time.Time{})
			if err != nil {
				c.Close()
				return
			}
			conn := cororpc.WithReader(c, br)
			if first[0] == cororpc.Magic {
				_ = moon.ServeConn(conn)
				return
			}
			if !gl.hand(conn) {
				c.Close()
			}
		}()
	}
}

// connListener hands sniffed connections to the gRPC server.
type connListener struct {
	addr  net.Addr
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func (l *connListener) hand(c net.Conn) bool {
	select {
	case l.conns <- c:
		return true
	case <-l.done:
		return false
	}
}

func (l *connListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *connListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *connListener) Addr() net.Addr { return l.addr }

// shutdownShared stops the shared listener and the coro_rpc side (calls
// under way answered within timeout).
func (s *GRPCServer) shutdownShared(timeout time.Duration) {
	s.mu.Lock()
	moon, lis := s.moon, s.shared
	s.mu.Unlock()
	if lis != nil {
		lis.Close()
	}
	if moon != nil {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		if moon.Shutdown(ctx) != nil {
			moon.Close()
		}
	}
}

// Stop stops the server at once: the shared listener, the coro_rpc side
// and every gRPC connection.
func (s *GRPCServer) Stop() {
	s.shutdownShared(0)
	s.Server.Stop()
}
