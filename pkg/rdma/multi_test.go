package rdma_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/rdma"
	"github.com/kvcache-ops/mc/pkg/rdma/soft"
)

// TestOpenContextsAndAcceptOn: a target with two NICs answers connection
// requests for either through AcceptOn, as its handshake server will.
func TestOpenContextsAndAcceptOn(t *testing.T) {
	tp, err := soft.New(soft.Config{Devices: []soft.DeviceConfig{{Name: "t0"}, {Name: "t1"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Close()
	targets, err := rdma.OpenContexts(tp, nil, rdma.Config{ServerName: "decode"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range targets {
			c.Close()
		}
	}()
	if len(targets) != 2 || targets[1].NICPath() != "decode@t1" {
		t.Fatalf("contexts %v", targets)
	}
	exchange := func(_ context.Context, req rdma.ConnectionDesc) (rdma.ConnectionDesc, error) {
		return rdma.AcceptOn(targets, req), nil
	}
	ip, err := soft.New(soft.Config{Devices: []soft.DeviceConfig{{Name: "i0"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer ip.Close()
	inits, err := rdma.OpenContexts(ip, []string{"i0"}, rdma.Config{ServerName: "prefill", Exchange: exchange})
	if err != nil {
		t.Fatal(err)
	}
	defer inits[0].Close()
	if _, err := rdma.OpenContexts(ip, []string{"i0", "nosuch"}, rdma.Config{}); err == nil || !strings.Contains(err.Error(), "nosuch") {
		t.Fatalf("opening a missing device: %v", err)
	}
	src := register(t, inits[0], 1<<16)
	fill(src.buf, 8)
	for _, tc := range targets {
		dst := register(t, tc, 1<<16)
		e, err := inits[0].Endpoint(context.Background(), tc.NICPath())
		if err != nil {
			t.Fatal(err)
		}
		if wc := wait(t, post(t, e, rdma.OpWrite, src, 0, dst, 0, 1<<16)); wc.Status != rdma.WCSuccess || !bytes.Equal(dst.buf, src.buf) {
			t.Fatalf("write to %s: %+v", tc.NICPath(), wc)
		}
	}
	_, err = inits[0].Endpoint(context.Background(), "decode@t9")
	if err == nil || !strings.Contains(err.Error(), "no local NIC decode@t9") {
		t.Fatalf("unknown target NIC: %v", err)
	}
	if st := inits[0].Stats(); st.LiveEndpoints != 2 {
		t.Fatalf("the failed connection left an endpoint: %+v", st)
	}
}

// TestPostBackpressure: posts beyond MC_MAX_WR per QP, or beyond the CQ's
// depth for the context, fail with ErrQueueFull instead of overflowing.
func TestPostBackpressure(t *testing.T) {
	f := newFabric(t, soft.Config{Devices: []soft.DeviceConfig{{Name: "soft0"}, {Name: "soft1"}}, RetryTimeout: time.Hour})
	a := f.open(t, "init", "soft0", rdma.Config{MaxWR: 3, CQDepth: 10})
	b := f.open(t, "target", "soft1", rdma.Config{})
	la, rb := register(t, a, 1<<16), register(t, b, 1<<16)
	e1, err := a.Endpoint(context.Background(), "target@soft1")
	if err != nil {
		t.Fatal(err)
	}
	f.p.DropPeer("soft0", b.Port().LID) // nothing completes
	s := rdma.Slice{Op: rdma.OpWrite, LocalAddr: la.mr.Addr(), LKey: la.mr.LKey(), Length: 64, RemoteAddr: rb.mr.Addr(), RKey: rb.mr.RKey()}
	for i := 0; i < 6; i++ { // 2 QPs x MaxWR 3
		if err := e1.Post(s, nil); err != nil {
			t.Fatalf("post %d: %v", i, err)
		}
	}
	if err := e1.Post(s, nil); !errors.Is(err, rdma.ErrQueueFull) {
		t.Fatalf("7th post: %v, want ErrQueueFull", err)
	}
	f.mu.Lock()
	f.ctxs["other@soft1"] = b
	f.mu.Unlock()
	e2, err := a.Endpoint(context.Background(), "other@soft1")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ { // CQ depth 10: 6 + 4
		if err := e2.Post(s, nil); err != nil {
			t.Fatalf("post %d on the second endpoint: %v", i, err)
		}
	}
	if err := e2.Post(s, nil); !errors.Is(err, rdma.ErrQueueFull) || !strings.Contains(err.Error(), "completion queue") {
		t.Fatalf("11th post: %v, want a full completion queue", err)
	}
}
