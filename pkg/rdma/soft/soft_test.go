package soft_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/rdma"
	"github.com/kvcache-ops/mc/pkg/rdma/soft"
)

func newProvider(t testing.TB, cfg soft.Config) *soft.Provider {
	t.Helper()
	if cfg.RetryTimeout == 0 {
		// Tests of anything but the retry limit: half a second without
		// progress was reached on a loaded 2-core machine (make test
		// beside a soak run: a plain write completed "transport retry
		// counter exceeded"). The retry tests set their own.
		cfg.RetryTimeout = 10 * time.Second
	}
	p, err := soft.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// side is one end of a connected QP: device, PD, CQ, QP and a registered
// buffer.
type side struct {
	dev  rdma.Device
	pd   rdma.PD
	cq   rdma.CQ
	qp   rdma.QP
	buf  []byte
	mr   rdma.MR
	port rdma.PortInfo
}

func newSide(t testing.TB, p rdma.Provider, name string, size int, access rdma.Access) *side {
	t.Helper()
	d, err := p.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	s := &side{dev: d, buf: make([]byte, size)}
	if s.pd, err = d.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if s.cq, err = d.CreateCQ(1024); err != nil {
		t.Fatal(err)
	}
	if s.mr, err = s.pd.RegMR(s.buf, access); err != nil {
		t.Fatal(err)
	}
	if s.qp, err = s.pd.CreateQP(rdma.QPInit{SendCQ: s.cq, RecvCQ: s.cq, MaxSendWR: 16}); err != nil {
		t.Fatal(err)
	}
	if s.port, err = d.QueryPort(1); err != nil {
		t.Fatal(err)
	}
	return s
}

func connectPair(t testing.TB, a, b *side) {
	t.Helper()
	if err := rdma.Connect(a.qp, 1, 4096, rdma.RemoteQP{LID: b.port.LID, GID: b.port.GID, QPN: b.qp.Num()}); err != nil {
		t.Fatal(err)
	}
	if err := rdma.Connect(b.qp, 1, 4096, rdma.RemoteQP{LID: a.port.LID, GID: a.port.GID, QPN: a.qp.Num()}); err != nil {
		t.Fatal(err)
	}
}

// waitWC polls cq until n completions arrived or the deadline passes.
func waitWC(t testing.TB, cq rdma.CQ, n int, within time.Duration) []rdma.WC {
	t.Helper()
	var out []rdma.WC
	buf := make([]rdma.WC, 16)
	deadline := time.After(within)
	for len(out) < n {
		k := cq.Poll(buf)
		out = append(out, buf[:k]...)
		if k > 0 {
			continue
		}
		select {
		case <-cq.Notify():
		case <-deadline:
			t.Fatalf("got %d of %d completions: %+v", len(out), n, out)
		}
	}
	return out
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) + seed
	}
	return b
}

func TestWriteAndReadCrossTheWire(t *testing.T) {
	p := newProvider(t, soft.Config{Devices: []soft.DeviceConfig{{Name: "soft0"}, {Name: "soft1"}}})
	a := newSide(t, p, "soft0", 1<<20, rdma.AccessAll)
	b := newSide(t, p, "soft1", 1<<20, rdma.AccessAll)
	if a.port.LID == b.port.LID || a.port.GID.Addr().String() != "127.0.0.1" {
		t.Fatalf("ports: %+v %+v", a.port, b.port)
	}
	connectPair(t, a, b)

	copy(a.buf[4096:], pattern(100000, 3))
	err := a.qp.PostSend(rdma.WR{ID: 1, Op: rdma.OpWrite,
		Local:      rdma.SGE{Addr: a.mr.Addr() + 4096, Length: 100000, LKey: a.mr.LKey()},
		RemoteAddr: b.mr.Addr() + 500, RKey: b.mr.RKey()})
	if err != nil {
		t.Fatal(err)
	}
	wc := waitWC(t, a.cq, 1, 5*time.Second)
	if wc[0].Status != rdma.WCSuccess || wc[0].WRID != 1 || wc[0].ByteLen != 100000 || wc[0].QPNum != a.qp.Num() {
		t.Fatalf("write completion %+v", wc[0])
	}
	if !bytes.Equal(b.buf[500:100500], pattern(100000, 3)) {
		t.Fatal("written bytes differ at the target")
	}

	copy(b.buf[200000:], pattern(65536, 9))
	err = a.qp.PostSend(rdma.WR{ID: 2, Op: rdma.OpRead,
		Local:      rdma.SGE{Addr: a.mr.Addr(), Length: 65536, LKey: a.mr.LKey()},
		RemoteAddr: b.mr.Addr() + 200000, RKey: b.mr.RKey()})
	if err != nil {
		t.Fatal(err)
	}
	wc = waitWC(t, a.cq, 1, 5*time.Second)
	if wc[0].Status != rdma.WCSuccess || wc[0].WRID != 2 || wc[0].Op != rdma.OpRead {
		t.Fatalf("read completion %+v", wc[0])
	}
	if !bytes.Equal(a.buf[:65536], pattern(65536, 9)) {
		t.Fatal("read bytes differ")
	}
}

func TestRemoteChecks(t *testing.T) {
	cases := []struct {
		name   string
		access rdma.Access // target MR
		rkey   func(b *side) uint32
		raddr  func(b *side) uint64
		length uint32
	}{
		{"bad rkey", rdma.AccessAll, func(b *side) uint32 { return b.mr.RKey() + 77 }, func(b *side) uint64 { return b.mr.Addr() }, 16},
		{"past the end", rdma.AccessAll, func(b *side) uint32 { return b.mr.RKey() }, func(b *side) uint64 { return b.mr.Addr() + 4090 }, 16},
		{"before the start", rdma.AccessAll, func(b *side) uint32 { return b.mr.RKey() }, func(b *side) uint64 { return b.mr.Addr() - 1 }, 16},
		{"no remote write", rdma.AccessLocalWrite | rdma.AccessRemoteRead, func(b *side) uint32 { return b.mr.RKey() }, func(b *side) uint64 { return b.mr.Addr() }, 16},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := newProvider(t, soft.Config{Devices: []soft.DeviceConfig{{Name: "soft0"}, {Name: "soft1"}}})
			a := newSide(t, p, "soft0", 4096, rdma.AccessAll)
			b := newSide(t, p, "soft1", 4096, tc.access)
			connectPair(t, a, b)
			copy(a.buf, pattern(4096, 1))
			wrs := []rdma.WR{
				{ID: 10, Op: rdma.OpWrite, Local: rdma.SGE{Addr: a.mr.Addr(), Length: tc.length, LKey: a.mr.LKey()}, RemoteAddr: tc.raddr(b), RKey: tc.rkey(b)},
				{ID: 11, Op: rdma.OpWrite, Local: rdma.SGE{Addr: a.mr.Addr(), Length: 8, LKey: a.mr.LKey()}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()},
			}
			if err := a.qp.PostSend(wrs...); err != nil {
				t.Fatal(err)
			}
			wc := waitWC(t, a.cq, 2, 5*time.Second)
			if wc[0].WRID != 10 || wc[0].Status != rdma.WCRemAccessErr {
				t.Fatalf("first completion %+v, want remote access error", wc[0])
			}
			if wc[1].WRID != 11 || wc[1].Status != rdma.WCWRFlushErr {
				t.Fatalf("second completion %+v, want flush", wc[1])
			}
			if a.qp.State() != rdma.QPStateErr || b.qp.State() != rdma.QPStateErr {
				t.Fatalf("states %v %v, want both ERR", a.qp.State(), b.qp.State())
			}
			if !bytes.Equal(b.buf, make([]byte, 4096)) {
				t.Fatal("target memory changed by a rejected write")
			}
			select {
			case ev := <-b.dev.Events():
				if ev.Type != rdma.EventQPAccessErr || ev.QPNum != b.qp.Num() {
					t.Fatalf("responder event %+v", ev)
				}
			case <-time.After(time.Second):
				t.Fatal("no access error event on the responder")
			}
			// Posting to a QP in ERR flushes.
			if err := a.qp.PostSend(wrs[1]); err != nil {
				t.Fatal(err)
			}
			if wc := waitWC(t, a.cq, 1, time.Second); wc[0].Status != rdma.WCWRFlushErr {
				t.Fatalf("post in ERR: %+v", wc[0])
			}
		})
	}
}

func TestLocalProtection(t *testing.T) {
	p := newProvider(t, soft.Config{Devices: []soft.DeviceConfig{{Name: "soft0"}, {Name: "soft1"}}})
	a := newSide(t, p, "soft0", 4096, rdma.AccessAll)
	b := newSide(t, p, "soft1", 4096, rdma.AccessAll)
	connectPair(t, a, b)
	err := a.qp.PostSend(rdma.WR{ID: 5, Op: rdma.OpWrite, Local: rdma.SGE{Addr: a.mr.Addr() + 4000, Length: 200, LKey: a.mr.LKey()}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()})
	if err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, a.cq, 1, time.Second); wc[0].Status != rdma.WCLocProtErr {
		t.Fatalf("got %+v, want local protection error", wc[0])
	}
	if a.qp.State() != rdma.QPStateErr {
		t.Fatalf("state %v", a.qp.State())
	}
}

func TestStateMachine(t *testing.T) {
	p := newProvider(t, soft.Config{Devices: []soft.DeviceConfig{{Name: "soft0"}}})
	a := newSide(t, p, "soft0", 64, rdma.AccessAll)
	if a.qp.State() != rdma.QPStateReset {
		t.Fatalf("new QP in %v", a.qp.State())
	}
	wr := rdma.WR{Op: rdma.OpWrite, Local: rdma.SGE{Addr: a.mr.Addr(), Length: 8, LKey: a.mr.LKey()}}
	if err := a.qp.PostSend(wr); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("post in RESET: %v", err)
	}
	if err := a.qp.Modify(rdma.QPAttr{State: rdma.QPStateRTS}); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("RESET -> RTS: %v", err)
	}
	if err := a.qp.Modify(rdma.QPAttr{State: rdma.QPStateRTR, Remote: rdma.RemoteQP{LID: 1, GID: a.port.GID, QPN: 9}}); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("RESET -> RTR: %v", err)
	}
	if err := a.qp.Modify(rdma.QPAttr{State: rdma.QPStateInit, Port: 1}); err != nil {
		t.Fatal(err)
	}
	if err := a.qp.PostSend(wr); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("post in INIT: %v", err)
	}
	if err := a.qp.Modify(rdma.QPAttr{State: rdma.QPStateErr}); err != nil {
		t.Fatal(err)
	}
	if err := a.qp.Modify(rdma.QPAttr{State: rdma.QPStateReset}); err != nil {
		t.Fatal(err)
	}
	if a.qp.State() != rdma.QPStateReset {
		t.Fatalf("state %v", a.qp.State())
	}
}

func TestQPPoolExhaustion(t *testing.T) {
	p := newProvider(t, soft.Config{Devices: []soft.DeviceConfig{{Name: "soft0", MaxQP: 3}, {Name: "soft1", MaxQP: 3}}})
	d, _ := p.Open("soft0")
	defer d.Close()
	pd, _ := d.AllocPD()
	cq, _ := d.CreateCQ(16)
	var qps []rdma.QP
	for i := 0; i < 3; i++ {
		q, err := pd.CreateQP(rdma.QPInit{SendCQ: cq})
		if err != nil {
			t.Fatal(err)
		}
		qps = append(qps, q)
	}
	_, err := pd.CreateQP(rdma.QPInit{SendCQ: cq})
	if !errors.Is(err, syscall.ENOMEM) {
		t.Fatalf("4th QP: %v, want ENOMEM", err)
	}
	// The other device's pool is separate.
	d1, _ := p.Open("soft1")
	defer d1.Close()
	pd1, _ := d1.AllocPD()
	cq1, _ := d1.CreateCQ(16)
	if _, err := pd1.CreateQP(rdma.QPInit{SendCQ: cq1}); err != nil {
		t.Fatalf("soft1: %v", err)
	}
	// Destroying frees a slot.
	qps[0].Destroy()
	if _, err := pd.CreateQP(rdma.QPInit{SendCQ: cq}); err != nil {
		t.Fatalf("after destroy: %v", err)
	}
	if n, _ := p.AllocatedQPs("soft0"); n != 3 {
		t.Fatalf("allocated %d", n)
	}
}

func TestMaxOutstandingWR(t *testing.T) {
	p := newProvider(t, soft.Config{Devices: []soft.DeviceConfig{{Name: "soft0"}, {Name: "soft1"}}, RetryTimeout: 200 * time.Millisecond})
	a := newSide(t, p, "soft0", 4096, rdma.AccessAll)
	b := newSide(t, p, "soft1", 4096, rdma.AccessAll)
	connectPair(t, a, b)
	// Hold responses back so WRs stay outstanding.
	if err := p.DropPeer("soft0", b.port.LID); err != nil {
		t.Fatal(err)
	}
	wr := rdma.WR{Op: rdma.OpWrite, Local: rdma.SGE{Addr: a.mr.Addr(), Length: 8, LKey: a.mr.LKey()}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}
	for i := 0; i < 16; i++ {
		wr.ID = uint64(i)
		if err := a.qp.PostSend(wr); err != nil {
			t.Fatalf("post %d: %v", i, err)
		}
	}
	if err := a.qp.PostSend(wr); !errors.Is(err, syscall.ENOMEM) {
		t.Fatalf("17th post: %v, want ENOMEM", err)
	}
	// A lost peer: the oldest WR exceeds the retry count, the rest flush.
	wc := waitWC(t, a.cq, 16, 5*time.Second)
	if wc[0].Status != rdma.WCRetryExcErr || wc[0].WRID != 0 {
		t.Fatalf("first %+v, want retry exceeded", wc[0])
	}
	for _, c := range wc[1:] {
		if c.Status != rdma.WCWRFlushErr {
			t.Fatalf("%+v, want flush", c)
		}
	}
}

func TestKilledPeerTimesOut(t *testing.T) {
	p := newProvider(t, soft.Config{Devices: []soft.DeviceConfig{{Name: "soft0"}, {Name: "soft1"}}, RetryTimeout: 100 * time.Millisecond})
	a := newSide(t, p, "soft0", 4096, rdma.AccessAll)
	b := newSide(t, p, "soft1", 4096, rdma.AccessAll)
	connectPair(t, a, b)
	if err := p.KillWire("soft1"); err != nil {
		t.Fatal(err)
	}
	wr := rdma.WR{ID: 3, Op: rdma.OpRead, Local: rdma.SGE{Addr: a.mr.Addr(), Length: 8, LKey: a.mr.LKey()}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}
	if err := a.qp.PostSend(wr); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, a.cq, 1, 5*time.Second); wc[0].Status != rdma.WCRetryExcErr {
		t.Fatalf("got %+v, want retry exceeded", wc[0])
	}
}

func TestPortDownFlushesAndRaisesEvents(t *testing.T) {
	p := newProvider(t, soft.Config{Devices: []soft.DeviceConfig{{Name: "soft0"}, {Name: "soft1"}}, RetryTimeout: 5 * time.Second})
	a := newSide(t, p, "soft0", 4096, rdma.AccessAll)
	b := newSide(t, p, "soft1", 4096, rdma.AccessAll)
	connectPair(t, a, b)
	p.DropPeer("soft0", b.port.LID) // keep WRs in flight
	wr := rdma.WR{ID: 1, Op: rdma.OpWrite, Local: rdma.SGE{Addr: a.mr.Addr(), Length: 8, LKey: a.mr.LKey()}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}
	a.qp.PostSend(wr)
	wr.ID = 2
	a.qp.PostSend(wr)
	if err := p.SetPortState("soft0", rdma.PortDown); err != nil {
		t.Fatal(err)
	}
	ev := <-a.dev.Events()
	if ev.Type != rdma.EventPortErr || ev.Port != 1 {
		t.Fatalf("event %+v", ev)
	}
	if pi, _ := a.dev.QueryPort(1); pi.State != rdma.PortDown {
		t.Fatalf("port %v", pi.State)
	}
	wc := waitWC(t, a.cq, 2, time.Second)
	for _, c := range wc {
		if c.Status != rdma.WCWRFlushErr {
			t.Fatalf("%+v, want flush", c)
		}
	}
	if a.qp.State() != rdma.QPStateErr {
		t.Fatalf("state %v", a.qp.State())
	}
	p.SetPortState("soft0", rdma.PortActive)
	if ev := <-a.dev.Events(); ev.Type != rdma.EventPortActive {
		t.Fatalf("event %+v", ev)
	}
}

func TestParseDevices(t *testing.T) {
	got, err := soft.ParseDevices("soft0, soft1:1:64:down,soft2::8")
	if err != nil {
		t.Fatal(err)
	}
	want := []soft.DeviceConfig{
		{Name: "soft0", NUMANode: -1, MaxQP: soft.DefaultMaxQP, PortState: rdma.PortActive},
		{Name: "soft1", NUMANode: 1, MaxQP: 64, PortState: rdma.PortDown},
		{Name: "soft2", NUMANode: -1, MaxQP: 8, PortState: rdma.PortActive},
	}
	if len(got) != len(want) {
		t.Fatalf("got %+v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("device %d: got %+v want %+v", i, got[i], want[i])
		}
	}
	for _, bad := range []string{"", ",", "a:x", "a:0:0", "a:0:-3", "a,a", ":1", "a:1:2:sideways", "a:1:2:up:5"} {
		if _, err := soft.ParseDevices(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestDeviceConfigJSON(t *testing.T) {
	var cfg soft.Config
	in := `{"Devices":[{"name":"soft0","numa_node":1,"max_qp":64,"port_state":"down","pci_addr":"0000:3b:00.0"}]}`
	if err := json.Unmarshal([]byte(in), &cfg); err != nil {
		t.Fatal(err)
	}
	want := soft.DeviceConfig{Name: "soft0", NUMANode: 1, MaxQP: 64, PortState: rdma.PortDown, PCIAddr: "0000:3b:00.0"}
	if cfg.Devices[0] != want {
		t.Fatalf("got %+v", cfg.Devices[0])
	}
	if err := json.Unmarshal([]byte(`{"Devices":[{"name":"x","port_state":"sideways"}]}`), &cfg); err == nil {
		t.Fatal("bad port state accepted")
	}
	p := newProvider(t, soft.Config{Devices: []soft.DeviceConfig{want}})
	devs, err := p.Devices()
	if err != nil {
		t.Fatal(err)
	}
	d := devs[0]
	if d.Name != "soft0" || d.NUMANode != 1 || d.MaxQP != 64 || d.PCIAddr != "0000:3b:00.0" || d.Ports[0].State != rdma.PortDown || d.Ports[0].LinkLayer != "Ethernet" {
		t.Fatalf("device %+v", d)
	}
}
