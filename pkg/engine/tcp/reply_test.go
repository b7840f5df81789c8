package tcp

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"testing"
	"testing/iotest"
)

// Sizes on both sides of directReadMin, so that buffered and direct reads
// (client replies, server WRITE payloads) follow each other on one
// connection, in both directions, with v2 and v1.
func TestMixedSizesKeepFrames(t *testing.T) {
	sizes := []int{1, 7, 4096, directReadMin - 1, directReadMin, directReadMin + 1, 64 << 10, 64<<10 + 3, 1 << 20, 24}
	total := 0
	for _, s := range sizes {
		total += s
	}
	for _, v2 := range []bool{true, false} {
		g := newGuarded(0x10000, total*4, 64)
		s := startServer(t, g)
		// One lane: every frame of a Submit follows the last on the wire.
		cl := NewClient(ClientOptions{Lanes: 1})
		local := make([]byte, total*4)
		rng := rand.New(rand.NewPCG(1, 2))
		for i := range local {
			local[i] = byte(rng.Uint32())
		}
		mk := func(write bool, buf []byte) (*result, []*Op) {
			var r result
			var list []*Op
			off := 0
			for round := range 4 {
				for i, sz := range sizes {
					// Rotate the order so each size follows every other.
					sz = sizes[(i+round)%len(sizes)]
					list = append(list, &Op{Write: write, Addr: 0x10000 + uint64(off), Buf: buf[off : off+sz], Done: doneOp{&r}})
					off += sz
				}
			}
			r.wg.Add(len(list))
			return &r, list
		}
		r, w := mk(true, local)
		cl.Submit(t.Context(), s.Addr().String(), v2, w)
		r.wg.Wait()
		back := make([]byte, len(local))
		r2, rd := mk(false, back)
		cl.Submit(t.Context(), s.Addr().String(), v2, rd)
		r2.wg.Wait()
		for _, err := range append(r.errs, r2.errs...) {
			if err != nil {
				t.Fatalf("v2=%v: %v", v2, err)
			}
		}
		cl.Close()
		s.Close()
		if !bytes.Equal(g.region(), local) {
			t.Fatalf("v2=%v: target memory differs from what was written", v2)
		}
		if !bytes.Equal(back, local) {
			t.Fatalf("v2=%v: read back differs from what was written", v2)
		}
		g.check(t)
	}
}

func frames(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

func TestReplyReaderEdges(t *testing.T) {
	ok, rej := statusBytes(StatusOK), statusBytes(StatusRejected)
	big := bytes.Repeat([]byte{7}, 3*directReadMin)
	small := []byte("0123456789")
	for _, tc := range []struct {
		name string
		wire []byte
		want []int // data sizes of the frames to read, v2
		errs []error
	}{
		{"small then big then small", frames(ok, small, ok, big, ok, small), []int{10, len(big), 10}, []error{nil, nil, nil}},
		{"clean end between frames", frames(ok, small), []int{10, 10}, []error{nil, io.EOF}},
		{"end inside the status word", frames(ok, small, ok[:3]), []int{10, 10}, []error{nil, io.ErrUnexpectedEOF}},
		{"end inside big data", frames(ok, big[:directReadMin+5]), []int{len(big)}, []error{io.ErrUnexpectedEOF}},
		{"end inside small data", frames(ok, small[:4]), []int{10}, []error{io.ErrUnexpectedEOF}},
		// A rejection is seen without waiting for data that never comes.
		{"rejected big read", rej, []int{len(big)}, []error{ErrRejected}},
	} {
		for _, how := range []string{"tcp", "one byte at a time"} {
			t.Run(tc.name+"/"+how, func(t *testing.T) {
				var r io.Reader
				if how == "tcp" {
					r = tcpWith(t, tc.wire)
				} else {
					r = iotest.OneByteReader(bytes.NewReader(tc.wire))
				}
				rr := newReplyReader(r, 64<<10)
				off := 0
				for i, n := range tc.want {
					var st [StatusSize]byte
					data := make([]byte, n)
					err := rr.readFrame(st[:], data)
					if !errors.Is(err, tc.errs[i]) {
						t.Fatalf("frame %d: err %v, want %v", i, err, tc.errs[i])
					}
					if err != nil {
						return
					}
					off += StatusSize
					if !bytes.Equal(data, tc.wire[off:off+n]) {
						t.Fatalf("frame %d: data differs", i)
					}
					off += n
				}
			})
		}
	}
}

// tcpWith is the reading end of a loopback connection whose peer writes
// wire and closes.
func tcpWith(t *testing.T, wire []byte) net.Conn {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			return
		}
		c.Write(wire)
		c.Close()
	}()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
