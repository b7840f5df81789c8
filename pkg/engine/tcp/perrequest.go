package tcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// submitPerRequest is Mooncake's default client (no
// MC_TCP_ENABLE_CONNECTION_POOL): every request opens its own connection,
// sends one header (and payload), takes one reply and closes. It is how
// most Mooncake initiators reach a target, so mc can drive a target that
// way too and measure its accept path.
func (c *Client) submitPerRequest(ctx context.Context, addr string, v2 bool, ops []*Op) {
	for _, op := range ops {
		go func() {
			defer c.requests.Done()
			op.Done.OpDone(c.oneRequest(ctx, addr, v2, op))
		}()
	}
}

func (c *Client) oneRequest(ctx context.Context, addr string, v2 bool, op *Op) error {
	if c.stop.Err() != nil {
		return ErrClosed
	}
	d := net.Dialer{Timeout: c.opts.DialTimeout}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("connect to tcp data port %s: %w", addr, err)
	}
	defer conn.Close()
	stop := context.AfterFunc(c.stop, func() { conn.Close() })
	defer stop()
	conn.SetDeadline(time.Now().Add(c.opts.StatusTimeout))
	var hdr [HeaderSize]byte
	PutHeader(hdr[:], Header{Size: uint64(len(op.Buf)), Addr: op.Addr, Write: op.Write, V2: v2})
	bufs := net.Buffers{hdr[:]}
	if op.Write {
		bufs = append(bufs, op.Buf)
	}
	if _, err := bufs.WriteTo(conn); err != nil {
		return fmt.Errorf("send to %s: %w", addr, err)
	}
	l := lane{conn: conn, v2: v2, timeout: c.opts.StatusTimeout}
	var st [StatusSize]byte
	if err := l.readReply(conn, op, st[:]); err != nil {
		if errors.Is(err, ErrRejected) {
			return err
		}
		return l.describe(err)
	}
	if !v2 && op.Write {
		// v1 has no status: wait for the server to finish reading before
		// closing, so the close cannot cut the payload short.
		conn.(*net.TCPConn).CloseWrite()
		io.Copy(io.Discard, conn)
	}
	return nil
}
