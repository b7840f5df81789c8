package tcp

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"testing"
)

// BenchmarkPerRequestRead is one caller reading a block over a new
// connection per request, as Mooncake's default client does (connect,
// header, reply, close): the event loop against a goroutine per
// connection, in the same run. ns/op is one request's latency.
//
//	go test ./pkg/engine/tcp -run '^$' -bench PerRequestRead -count 5
func BenchmarkPerRequestRead(b *testing.B) {
	for _, size := range []int{4 << 10, 1 << 20} {
		for _, mode := range []string{"loop", "goroutine"} {
			b.Run(fmt.Sprintf("%dK/%s", size>>10, mode), func(b *testing.B) {
				g := newGuarded(0x10000, size, 64)
				ln, err := Listen(b.Context(), "127.0.0.1:0")
				if err != nil {
					b.Fatal(err)
				}
				if mode == "goroutine" {
					ln = plainListener{ln}
				}
				s := NewServer(ln, g, ServerOptions{})
				defer s.Close()
				if (s.EventLoops() > 0) != (mode == "loop") {
					b.Fatalf("%s: %d event loops", mode, s.EventLoops())
				}
				hdr := AppendHeader(nil, Header{Addr: 0x10000, Size: uint64(size), V2: true})
				buf := make([]byte, StatusSize+size)
				b.SetBytes(int64(size))
				b.ResetTimer()
				for range b.N {
					c, err := net.Dial("tcp", s.Addr().String())
					if err != nil {
						b.Fatal(err)
					}
					if _, err := c.Write(hdr); err != nil {
						b.Fatal(err)
					}
					if _, err := io.ReadFull(c, buf); err != nil {
						b.Fatal(err)
					}
					if st := binary.LittleEndian.Uint64(buf); st != StatusOK {
						b.Fatalf("status %x", st)
					}
					c.Close()
				}
			})
		}
	}
}
