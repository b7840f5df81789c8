package handshake

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// ErrNoReply is returned (wrapped) when the peer closes the connection
// without answering: it has no handler for the frame type or its handler
// failed.
var ErrNoReply = errors.New("peer closed the connection without a reply")

// Request dials addr, sends one frame of type t and returns the payload of
// the reply frame, which must have the same type. max bounds the reply's
// length field (<= 0: DefaultMaxLength). The exchange ends at ctx's
// deadline, or after DefaultTimeout when ctx has none.
func Request(ctx context.Context, addr string, t FrameType, payload []byte, max int) ([]byte, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("handshake with %s unreachable: %w", addr, err)
	}
	defer c.Close()
	dl, _ := ctx.Deadline()
	_ = c.SetDeadline(dl)
	// Cancellation before the deadline unblocks reads and writes too.
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	if err := WriteFrame(c, t, payload); err != nil {
		return nil, fmt.Errorf("handshake with %s: %w", addr, ctxErr(ctx, err))
	}
	rt, reply, err := ReadFrame(c, max)
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("handshake with %s: %v request: %w", addr, t, ErrNoReply)
		}
		return nil, fmt.Errorf("handshake with %s: read %v reply: %w", addr, t, ctxErr(ctx, err))
	}
	if rt != t {
		return nil, fmt.Errorf("handshake with %s: reply has type %v, want %v", addr, rt, t)
	}
	return reply, nil
}

// ctxErr prefers the context's reason over the socket's timeout error.
func ctxErr(ctx context.Context, err error) error {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		// The socket deadline is the context's: its Done may lag by a hair.
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
	if cerr := ctx.Err(); cerr != nil {
		return fmt.Errorf("%w (%v)", cerr, err)
	}
	return err
}
