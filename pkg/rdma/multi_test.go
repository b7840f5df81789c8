package rdma_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

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
