package tcp

import (
	"context"
	"net"
	"syscall"
)

// Listen opens a data listener on addr tuned for short connections: most
// Mooncake initiators open one connection per request (their pool is
// opt-in), so the accept path is the hot path. Accepted connections get
// no TCP keepalive (four setsockopt calls per accept; the server's idle
// timeout already bounds a silent peer), and where the kernel supports it
// accept waits until the first request has arrived, saving a park and a
// wake-up before the header can be read.
func Listen(ctx context.Context, addr string) (net.Listener, error) {
	lc := net.ListenConfig{
		KeepAlive: -1,
		Control: func(_, _ string, c syscall.RawConn) error {
			return c.Control(func(fd uintptr) { deferAccept(fd) })
		},
	}
	return lc.Listen(ctx, "tcp", addr)
}
