package bench

import (
	"context"
	"fmt"
	"io"
	"net"
	"time"
)

// StreamThroughput measures the ceiling the engine's TCP transport is
// compared with: one persistent loopback TCP connection, a writer sending
// blocks of size block back to back and a reader io.ReadFull-ing them, for
// d. It returns bytes per second as seen by the reader.
func StreamThroughput(ctx context.Context, block int64, d time.Duration) (float64, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("stream ceiling: %w", err)
	}
	defer ln.Close()
	type result struct {
		bytes int64
		dur   time.Duration
		err   error
	}
	res := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			res <- result{err: err}
			return
		}
		defer c.Close()
		buf := make([]byte, block)
		var n int64
		start := time.Now()
		for {
			if _, err := io.ReadFull(c, buf); err != nil {
				res <- result{bytes: n, dur: time.Since(start)}
				return
			}
			n += block
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		return 0, fmt.Errorf("stream ceiling: %w", err)
	}
	buf := make([]byte, block)
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if _, err := c.Write(buf); err != nil {
			c.Close()
			return 0, fmt.Errorf("stream ceiling: %w", err)
		}
	}
	c.Close()
	r := <-res
	if r.err != nil {
		return 0, fmt.Errorf("stream ceiling: %w", r.err)
	}
	return float64(r.bytes) / r.dur.Seconds(), nil
}
