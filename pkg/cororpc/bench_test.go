package cororpc

import (
	"context"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
)

// BenchmarkRoundTrip measures calls through Client and Server on one
// loopback connection, with 1 and 16 calls in flight. The baseline is the
// same frames ping-ponged over a bare TCP connection with no multiplexing,
// no handler dispatch and no goroutine hand-offs: compare ns/op against it
// within one run, not across machines.
func BenchmarkRoundTrip(b *testing.B) {
	const bodyLen = 64 // about a Ping request/response
	body := make([]byte, bodyLen)

	b.Run("baseline-raw-tcp", func(b *testing.B) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		defer ln.Close()
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			req := make([]byte, RequestHeaderLen+bodyLen)
			resp := append(ResponseHeader{Magic: Magic, Length: bodyLen}.AppendTo(nil), body...)
			for {
				if _, err := io.ReadFull(c, req); err != nil {
					return
				}
				if _, err := c.Write(resp); err != nil {
					return
				}
			}
		}()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		req := append(RequestHeader{Magic: Magic, Length: bodyLen}.AppendTo(nil), body...)
		resp := make([]byte, ResponseHeaderLen+bodyLen)
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			if _, err := c.Write(req); err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(c, resp); err != nil {
				b.Fatal(err)
			}
		}
	})

	s := NewServer(nil)
	fn, err := s.Register("bench::Echo", func(ctx context.Context, req *Request) ([]byte, error) {
		return req.Body, nil
	})
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go s.Serve(ln)
	defer s.Close()

	for _, inflight := range []int{1, 16} {
		b.Run("inflight="+strconv.Itoa(inflight), func(b *testing.B) {
			c, err := Dial(context.Background(), ln.Addr().String(), nil)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			var wg sync.WaitGroup
			work := make(chan struct{}, inflight)
			for range inflight {
				wg.Go(func() {
					for range work {
						if _, err := c.Call(ctx, fn, body); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			for b.Loop() {
				work <- struct{}{}
			}
			close(work)
			wg.Wait()
		})
	}
}
