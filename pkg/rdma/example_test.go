package rdma_test

import (
	"bytes"
	"context"
	"fmt"

	"github.com/kvcache-ops/mc/pkg/rdma"
	"github.com/kvcache-ops/mc/pkg/rdma/soft"
)

// Example shows what a transfer engine does with this package: one
// Context per NIC, connection requests carried to the peer (here a direct
// call; the engine sends them as handshake Connection frames and the
// peer's handshake server answers with Context.Accept), memory
// registered per NIC, and slices posted on endpoints with a completion
// callback.
func Example() {
	p, _ := soft.New(soft.Config{Devices: []soft.DeviceConfig{{Name: "soft0"}, {Name: "soft1"}}})
	defer p.Close()

	var target *rdma.Context
	exchange := func(_ context.Context, req rdma.ConnectionDesc) (rdma.ConnectionDesc, error) {
		return target.Accept(req), nil // over the handshake socket in the engine
	}
	target, _ = rdma.NewContext(p, "soft1", rdma.Config{ServerName: "decode-0"})
	defer target.Close()
	local, _ := rdma.NewContext(p, "soft0", rdma.Config{ServerName: "prefill-0", Exchange: exchange})
	defer local.Close()

	src := bytes.Repeat([]byte("kv"), 1<<15)
	dst := make([]byte, len(src))
	srcMR, _ := local.RegisterMemory(src)
	dstMR, _ := target.RegisterMemory(dst) // its addr and rkey travel in the segment descriptor

	ep, err := local.Endpoint(context.Background(), "decode-0@soft1")
	if err != nil {
		fmt.Println(err)
		return
	}
	done := make(chan rdma.WC, 1)
	err = ep.Post(rdma.Slice{
		Op: rdma.OpWrite, LocalAddr: srcMR.Addr(), LKey: srcMR.LKey(), Length: uint32(len(src)),
		RemoteAddr: dstMR.Addr(), RKey: dstMR.RKey(),
	}, func(wc rdma.WC) { done <- wc })
	if err != nil {
		fmt.Println(err)
		return
	}
	wc := <-done
	fmt.Println(wc.Status, bytes.Equal(src, dst))
	st := local.Stats()
	fmt.Println(st.LiveEndpoints, st.Waiting, st.AllocatedQPs)
	// Output:
	// success true
	// 1 0 2
}
