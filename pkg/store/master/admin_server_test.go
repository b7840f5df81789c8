package master

import (
	"bufio"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"
)

// TestAdminServerDropsHeldConnections: the admin HTTP server closes a
// kept-alive connection left idle, and a request whose body drips in a
// byte at a time, once their bounds pass, instead of holding their
// connection and goroutine for as long as the client likes (before, 2000
// such connections stayed open on `mc serve store`'s admin port until the
// client left).
func TestAdminServerDropsHeldConnections(t *testing.T) {
	defer func(h, r, w, i time.Duration) {
		adminReadHeaderTimeout, adminReadTimeout, adminWriteTimeout, adminIdleTimeout = h, r, w, i
	}(adminReadHeaderTimeout, adminReadTimeout, adminWriteTimeout, adminIdleTimeout)
	adminReadHeaderTimeout, adminReadTimeout, adminWriteTimeout, adminIdleTimeout =
		200*time.Millisecond, 300*time.Millisecond, time.Second, 300*time.Millisecond

	m, _ := newTestMaster(t, Config{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewAdminServer(NewAdminHandler(m, AdminOptions{}), slog.New(slog.NewTextHandler(io.Discard, nil)))
	go srv.Serve(lis)
	defer srv.Close()

	// closedWithin reports whether the server closes c within d.
	closedWithin := func(c net.Conn, r *bufio.Reader, d time.Duration) bool {
		_ = c.SetReadDeadline(time.Now().Add(d))
		for {
			if _, err := r.ReadByte(); err != nil {
				var ne net.Error
				return !(errors.As(err, &ne) && ne.Timeout())
			}
		}
	}

	t.Run("idle keep-alive", func(t *testing.T) {
		c, err := net.Dial("tcp", lis.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := io.WriteString(c, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		r := bufio.NewReader(c)
		resp, err := http.ReadResponse(r, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /health: %s", resp.Status)
		}
		if !closedWithin(c, r, 3*time.Second) {
			t.Fatal("an idle kept-alive admin connection was still open 3 s after its answer (idle bound 300ms)")
		}
	})

	t.Run("dripped body", func(t *testing.T) {
		c, err := net.Dial("tcp", lis.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := io.WriteString(c, "POST /api/v1/drain_jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"); err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(50 * time.Millisecond):
					if _, err := io.WriteString(c, " "); err != nil {
						return
					}
				}
			}
		}()
		r := bufio.NewReader(c)
		if !closedWithin(c, r, 3*time.Second) {
			t.Fatal("a request body dripping a byte per 50ms held its admin connection 3 s (read bound 300ms)")
		}
	})
}
