package soft_test

import (
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/rdma"
	"github.com/kvcache-ops/mc/pkg/rdma/soft"
)

const benchBlock = 64 << 10

// BenchmarkSoftWrite measures 64 KiB RDMA WRITEs between two soft NICs in
// this process, 16 outstanding (the bytes cross a loopback socket).
func BenchmarkSoftWrite(b *testing.B) {
	p := newProvider(b, soft.Config{Devices: []soft.DeviceConfig{{Name: "soft0"}, {Name: "soft1"}}, RetryTimeout: 10 * time.Second})
	a := newSide(b, p, "soft0", 16*benchBlock, rdma.AccessAll)
	t := newSide(b, p, "soft1", 16*benchBlock, rdma.AccessAll)
	connectPair(b, a, t)
	wcs := make([]rdma.WC, 16)
	b.SetBytes(benchBlock)
	b.ResetTimer()
	inflight := 0
	for i := 0; i < b.N; i++ {
		for inflight >= 16 {
			n := a.cq.Poll(wcs)
			if n == 0 {
				<-a.cq.Notify()
			}
			for _, wc := range wcs[:n] {
				if wc.Status != rdma.WCSuccess {
					b.Fatal(wc)
				}
			}
			inflight -= n
		}
		off := uint64(i%16) * benchBlock
		if err := a.qp.PostSend(rdma.WR{ID: uint64(i), Op: rdma.OpWrite, Local: rdma.SGE{Addr: a.mr.Addr() + off, Length: benchBlock, LKey: a.mr.LKey()},
			RemoteAddr: t.mr.Addr() + off, RKey: t.mr.RKey()}); err != nil {
			b.Fatal(err)
		}
		inflight++
	}
	for inflight > 0 {
		n := a.cq.Poll(wcs)
		if n == 0 {
			<-a.cq.Notify()
		}
		inflight -= n
	}
}

// BenchmarkLoopbackTCP is the baseline for BenchmarkSoftWrite: 64 KiB
// writes on one loopback TCP connection, no framing or checks.
func BenchmarkLoopbackTCP(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	done := make(chan int64)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- 0
			return
		}
		n, _ := io.Copy(io.Discard, c)
		c.Close()
		done <- n
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, benchBlock)
	b.SetBytes(benchBlock)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	c.Close()
	<-done
}

// BenchmarkSoftWriteQPs: several QP pairs between the same two devices
// share one wire connection (the soft NIC multiplexes per device pair);
// compare with BenchmarkSoftWrite to see what the sharing costs.
func BenchmarkSoftWriteQPs(b *testing.B) {
	for _, nq := range []int{1, 4, 16} {
		b.Run("qps="+strconv.Itoa(nq), func(b *testing.B) {
			p := newProvider(b, soft.Config{Devices: []soft.DeviceConfig{{Name: "soft0"}, {Name: "soft1"}}, RetryTimeout: 10 * time.Second})
			pairs := make([][2]*side, nq)
			for i := range pairs {
				pairs[i] = [2]*side{newSide(b, p, "soft0", 4*benchBlock, rdma.AccessAll), newSide(b, p, "soft1", 4*benchBlock, rdma.AccessAll)}
				connectPair(b, pairs[i][0], pairs[i][1])
			}
			b.SetBytes(benchBlock)
			b.ResetTimer()
			var wg sync.WaitGroup
			for qi := range pairs {
				a, t := pairs[qi][0], pairs[qi][1]
				n := b.N / nq
				if qi == 0 {
					n += b.N % nq
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					wcs := make([]rdma.WC, 4)
					inflight := 0
					for i := 0; i < n || inflight > 0; {
						if i < n && inflight < 4 {
							off := uint64(i%4) * benchBlock
							if err := a.qp.PostSend(rdma.WR{ID: uint64(i), Op: rdma.OpWrite, Local: rdma.SGE{Addr: a.mr.Addr() + off, Length: benchBlock, LKey: a.mr.LKey()},
								RemoteAddr: t.mr.Addr() + off, RKey: t.mr.RKey()}); err != nil {
								panic(err)
							}
							inflight++
							i++
							continue
						}
						k := a.cq.Poll(wcs)
						if k == 0 {
							<-a.cq.Notify()
						}
						inflight -= k
					}
				}()
			}
			wg.Wait()
		})
	}
}
