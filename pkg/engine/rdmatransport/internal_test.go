package rdmatransport

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/rdma"
	"github.com/kvcache-ops/mc/pkg/rdma/soft"
	"github.com/kvcache-ops/mc/pkg/topo"
)

func TestSliceLengths(t *testing.T) {
	const sl, frag = 65536, 65536 + 16384
	cases := []struct {
		n    uint64
		want []uint64
	}{
		{1, []uint64{1}},
		{65536, []uint64{65536}},
		{frag, []uint64{frag}},             // tail up to slice+slice/4 kept whole
		{frag + 1, []uint64{65536, 16385}}, // one byte more: cut
		{3 * 65536, []uint64{65536, 65536, 65536}},
		{2*65536 + 100, []uint64{65536, 65636}},
	}
	for _, c := range cases {
		got := sliceLengths(c.n, sl, frag)
		if !slices.Equal(got, c.want) {
			t.Errorf("sliceLengths(%d) = %v, want %v", c.n, got, c.want)
		}
		var sum uint64
		for _, l := range got {
			sum += l
		}
		if sum != c.n {
			t.Errorf("sliceLengths(%d) sums to %d", c.n, sum)
		}
	}
}

// Mooncake's order: try 0 a preferred NIC (accessible only when no
// preferred is usable); try k>0 index (k-1) mod (|preferred|+|accessible|)
// over preferred then accessible, skipping unusable NICs and the one that
// just failed while another is usable.
func TestPickRetryOrder(t *testing.T) {
	e := topo.Entry{Preferred: []string{"p0", "p1"}, Accessible: []string{"a0"}}
	all := func(string) bool { return true }
	for rr := range uint64(8) {
		if n := pick(e, 0, rr, false, "", all); n != "p0" && n != "p1" {
			t.Fatalf("try 0 picked %q", n)
		}
	}
	if n := pick(e, 0, 3, true, "", all); n != "p1" {
		t.Errorf("round robin 3 picked %q", n)
	}
	for k, want := range map[int]string{1: "p0", 2: "p1", 3: "a0", 4: "p0", 6: "a0"} {
		if n := pick(e, k, 0, false, "", all); n != want {
			t.Errorf("try %d picked %q, want %q", k, n, want)
		}
	}
	noP0 := func(n string) bool { return n != "p0" }
	if n := pick(e, 1, 0, false, "", noP0); n != "p1" {
		t.Errorf("inactive p0 not skipped: %q", n)
	}
	if n := pick(e, 2, 0, false, "p1", all); n != "a0" {
		t.Errorf("failed p1 not avoided: %q", n)
	}
	onlyP1 := func(n string) bool { return n == "p1" }
	if n := pick(e, 0, 0, false, "p1", onlyP1); n != "p1" {
		t.Errorf("the only usable NIC refused because it failed last: %q", n)
	}
	if n := pick(e, 0, 0, false, "", func(string) bool { return false }); n != "" {
		t.Errorf("nothing usable, picked %q", n)
	}
	onlyA := func(n string) bool { return n == "a0" }
	if n := pick(e, 0, 0, false, "", onlyA); n != "a0" {
		t.Errorf("try 0 did not fall back to accessible: %q", n)
	}
}

func TestRailPause(t *testing.T) {
	tr := &Transport{cfg: Config{RailPause: 200 * time.Millisecond}.withDefaults(), rails: map[string]*rail{}}
	for range railErrors - 1 {
		tr.railError("peer@soft0")
	}
	if tr.railPaused("peer@soft0") {
		t.Fatal("paused after 4 errors")
	}
	tr.railError("peer@soft0")
	if !tr.railPaused("peer@soft0") || tr.railPaused("peer@soft1") {
		t.Fatal("5 errors in 5 s did not pause that rail alone")
	}
	time.Sleep(250 * time.Millisecond)
	if tr.railPaused("peer@soft0") {
		t.Fatal("pause did not lift by itself")
	}
}

// FuzzAcceptConnection feeds the handshake Connection handler arbitrary
// frames: it must answer valid JSON or refuse, never panic, and refuse
// every request that does not name one of its NICs.
func FuzzAcceptConnection(f *testing.F) {
	p, err := soft.New(soft.Config{Devices: []soft.DeviceConfig{{Name: "soft0", MaxQP: 64}}})
	if err != nil {
		f.Fatal(err)
	}
	defer p.Close()
	ctxs, err := rdma.OpenContexts(p, nil, rdma.Config{ServerName: "srv", MaxEndpoints: 4})
	if err != nil {
		f.Fatal(err)
	}
	defer func() {
		for _, c := range ctxs {
			c.Close()
		}
	}()
	tr := &Transport{ctxs: ctxs}
	f.Add([]byte(`{"local_nic_path":"peer@soft0","local_lid":1,"local_gid":"00:00:00:00:00:00:00:00:00:00:ff:ff:7f:00:00:01","peer_nic_path":"srv@soft0","qp_num":[1,2],"reply_msg":""}`))
	f.Add([]byte(`{"peer_nic_path":"other@soft9"}`))
	f.Add([]byte(`{"qp_num":[-1]}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, payload []byte) {
		out, err := tr.accept(context.Background(), payload)
		if err != nil {
			return
		}
		var req, reply rdma.ConnectionDesc
		if jerr := json.Unmarshal(out, &reply); jerr != nil {
			t.Fatalf("reply is not JSON: %v: %q", jerr, out)
		}
		json.Unmarshal(payload, &req)
		if req.PeerNICPath != "srv@soft0" && reply.ReplyMsg == "" {
			t.Fatalf("request for %q accepted: %+v", req.PeerNICPath, reply)
		}
	})
}
