package metascan

import (
	"context"
	"errors"
	"fmt"
	"net"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/kvcache-ops/mc/pkg/engine"
	"github.com/kvcache-ops/mc/pkg/engine/handshake"
	"github.com/kvcache-ops/mc/pkg/engine/meta"
)

func TestClassify(t *testing.T) {
	type res struct {
		kind keyKind
		name string
	}
	cases := []struct {
		rest string
		root bool
		want res
	}{
		{"ram/node1", true, res{kindSegment, "node1"}},
		{"ram/10.0.0.1:15001", true, res{kindSegment, "10.0.0.1:15001"}},
		{"rpc_meta/node1", true, res{kindRPC, "node1"}},
		{"nvmeof/file0", true, res{kindSkip, ""}},
		{"c1/ram/node1", true, res{kindSkip, ""}},      // another cluster's key
		{"c1/rpc_meta/node1", true, res{kindSkip, ""}}, // another cluster's key
		{"c1/ram/node1", false, res{kindSegment, "c1/ram/node1"}},
		{"group/seg", true, res{kindSegment, "group/seg"}}, // a name with '/'
		{"garbage", true, res{kindStray, "garbage"}},
		{"ram/", true, res{kindStray, "ram/"}},
		{"rpc_meta/", true, res{kindStray, "rpc_meta/"}},
	}
	for _, c := range cases {
		k, n := classify(c.rest, c.root)
		if (res{k, n}) != c.want {
			t.Errorf("classify(%q, root=%v) = %v %q, want %v", c.rest, c.root, k, n, c.want)
		}
	}
}

// TestListEtcd puts Mooncake-shaped and broken keys into a real etcd and
// checks what List reports, with and without a cluster id.
func TestListEtcd(t *testing.T) {
	ep := startEtcd(t)
	ctx := context.Background()
	raw, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	root, rootSt := open(t, ep, "")
	c1, c1St := open(t, ep, "c1")
	for _, d := range []*meta.SegmentDesc{tcpDesc("a", 16000), tcpDesc("group/seg", 16001)} {
		if err := root.PutSegment(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	if err := root.PutRPCMeta(ctx, "a", meta.RPCMeta{IPOrHostName: "127.0.0.1", RPCPort: 15001}); err != nil {
		t.Fatal(err)
	}
	if err := c1.PutSegment(ctx, tcpDesc("b", 16002)); err != nil {
		t.Fatal(err)
	}
	if err := c1.PutRPCMeta(ctx, "b", meta.RPCMeta{IPOrHostName: "127.0.0.1", RPCPort: 15002}); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{
		"mooncake/ram/junk":      "not json at all",
		"mooncake/stray":         `{"name":"stray"}`,
		"mooncake/":              "the prefix itself",
		"mooncake/nvmeof/file0":  `{"buffers":[]}`,
		"mooncake/ram/wrongname": `{"name":"other","protocol":"tcp","tcp_data_port":1,"buffers":[]}`,
		"mooncakex/ram/outside":  "outside the prefix",
	} {
		if _, err := raw.Put(ctx, k, v); err != nil {
			t.Fatal(err)
		}
	}

	segs, err := List(ctx, rootSt)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range segs {
		names = append(names, s.Name)
	}
	// The prefix itself as a key is listed by its key (it was listed
	// with no name at all).
	if want := []string{"a", "group/seg", "junk", "mooncake/", "stray", "wrongname"}; !reflect.DeepEqual(names, want) {
		t.Fatalf("root listing %v, want %v", names, want)
	}
	m := byName(t, segs)
	if a := m["a"]; a.Invalid != nil || a.RPC == nil || a.Buffers() != 1 || a.Bytes() != 1<<20 || a.Record.Revision == 0 {
		t.Fatalf("a: %+v", a)
	}
	if addr, err := m["a"].RPCAddress(); addr != "127.0.0.1:15001" || err != nil {
		t.Fatalf("a's rpc address %q %v", addr, err)
	}
	if !errors.Is(m["junk"].Invalid, meta.ErrMalformed) || string(m["junk"].Record.Value) != "not json at all" {
		t.Fatalf("junk: %+v", m["junk"])
	}
	if m["stray"].Invalid == nil || !strings.Contains(m["stray"].Invalid.Error(), "mooncake/ram/<name>") {
		t.Fatalf("stray: %v", m["stray"].Invalid)
	}
	if m["wrongname"].Invalid == nil || !strings.Contains(m["wrongname"].Invalid.Error(), `names segment "other"`) {
		t.Fatalf("wrongname: %v", m["wrongname"].Invalid)
	}

	segs, err = List(ctx, c1St)
	if err != nil {
		t.Fatal(err)
	}
	if len(segs) != 1 || segs[0].Name != "b" || segs[0].RPC == nil || segs[0].Record.Key != "mooncake/c1/ram/b" {
		t.Fatalf("cluster c1 listing: %+v", segs)
	}
}

// TestProbeEtcd probes engines of every kind registered in a real etcd.
func TestProbeEtcd(t *testing.T) {
	ep := startEtcd(t)
	ctx := context.Background()
	b, st := open(t, ep, "")

	liveEngine(t, ep, "live", "")
	killed := startChild(t, ep, "killed", "")
	killed.kill(t)

	// A P2P engine answers Metadata frames with its descriptor: stored
	// as is it matches, altered or under another name it does not.
	p2p, err := engine.New(ctx, engine.Config{BindAddress: "127.0.0.1", HandshakeAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer p2p.Close()
	if _, err := p2p.RegisterMemory(ctx, 1<<20, "cpu:0", true); err != nil {
		t.Fatal(err)
	}
	same := p2p.Descriptor()
	if err := b.PutSegment(ctx, same); err != nil {
		t.Fatal(err)
	}
	other := liveEngine(t, ep, "other", "")
	grown := other.Descriptor()
	grown.Buffers[0].Length *= 2
	if err := b.PutSegment(ctx, grown); err != nil {
		t.Fatal(err)
	}
	// "other" is an etcd-mode engine: answer its rpc_meta with the P2P
	// engine to get a comparable, different descriptor.
	hp := p2p.HandshakeAddr()
	host, port, _ := net.SplitHostPort(hp)
	pn, _ := strconv.Atoi(port)
	if err := b.PutRPCMeta(ctx, "other", meta.RPCMeta{IPOrHostName: host, RPCPort: pn}); err != nil {
		t.Fatal(err)
	}

	silent := newSilentPeer(t)
	if err := b.PutSegment(ctx, tcpDesc(silent.ln.Addr().String(), 1)); err != nil {
		t.Fatal(err)
	}
	if err := b.PutSegment(ctx, tcpDesc("nowhere", 1)); err != nil {
		t.Fatal(err)
	}

	segs, err := List(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	Probe(ctx, segs, ProbeOptions{Timeout: 500 * time.Millisecond, Concurrency: 4})
	t.Logf("probed %d segments in %v", len(segs), time.Since(start))
	m := byName(t, segs)
	check := func(name string, want State, detail string) {
		t.Helper()
		s := m[name]
		if s == nil {
			t.Fatalf("%s not listed", name)
		}
		got := fmt.Sprintf("%v %v", s.Probe.Err, s.Probe.Note)
		if s.Probe.State != want || !strings.Contains(got, detail) {
			t.Errorf("%s: %s (%s), want %s containing %q", name, s.Probe.State, got, want, detail)
		}
		if (want == Alive || want == Mismatch) != (s.Probe.RTT > 0) {
			t.Errorf("%s: rtt %v in state %s", name, s.Probe.RTT, s.Probe.State)
		}
	}
	// An mc engine in etcd mode answers with its live descriptor, so it is
	// compared, and matches.
	check("live", Alive, "<nil> ")
	check("killed", Dead, "connection refused")
	check(hp, Alive, "<nil> ")
	check("other", Mismatch, `describes segment "`+hp+`", not "other"`)
	check(silent.ln.Addr().String(), Unknown, "no answer within 500ms")
	check("nowhere", Unknown, "no rpc_meta/nowhere")

	// The same P2P engine under its own name, with a stored copy that
	// lists a bigger buffer.
	grownP2P := p2p.Descriptor()
	grownP2P.Buffers[0].Length *= 2
	if err := b.PutSegment(ctx, grownP2P); err != nil {
		t.Fatal(err)
	}
	one, missing, err := Lookup(ctx, st, []string{hp, "absent"})
	if err != nil || len(one) != 1 || !reflect.DeepEqual(missing, []string{"absent"}) {
		t.Fatalf("lookup: %v %v %v", one, missing, err)
	}
	Probe(ctx, one, ProbeOptions{})
	if one[0].Probe.State != Mismatch || !strings.Contains(one[0].Probe.Err.Error(), "1 buffers (1048576 bytes), stored 1 (2097152 bytes)") {
		t.Fatalf("grown p2p: %+v", one[0].Probe)
	}
}

// TestProbeTCPDataPortFallback: a refused handshake port is not enough to
// call a TCP engine dead while its data port accepts.
func TestProbeTCPDataPortFallback(t *testing.T) {
	data, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer data.Close()
	dp := data.Addr().(*net.TCPAddr).Port
	segs := []Segment{
		{Name: "127.0.0.1:" + strconv.Itoa(closedPort(t)), Desc: tcpDesc("x", dp)},
		{Name: "127.0.0.1:" + strconv.Itoa(closedPort(t)), Desc: tcpDesc("y", closedPort(t))},
	}
	Probe(context.Background(), segs, ProbeOptions{Timeout: time.Second})
	if segs[0].Probe.State != Alive || !strings.Contains(segs[0].Probe.Note, "TCP data port") {
		t.Fatalf("data port accepts: %+v", segs[0].Probe)
	}
	if segs[1].Probe.State != Dead || !strings.Contains(segs[1].Probe.Err.Error(), "(tcp data)") {
		t.Fatalf("both refused: %+v", segs[1].Probe)
	}
}

func TestProbeCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	segs := []Segment{{Name: "127.0.0.1:1", Desc: tcpDesc("x", 1)}}
	Probe(ctx, segs, ProbeOptions{})
	if segs[0].Probe.State != Unknown || !errors.Is(segs[0].Probe.Err, context.Canceled) {
		t.Fatalf("canceled: %+v", segs[0].Probe)
	}
}

// TestProbeBoundsConcurrency: peers that never answer hold one socket per
// probe; no more than Concurrency are ever open, and all end unknown.
func TestProbeBoundsConcurrency(t *testing.T) {
	peer := newSilentPeer(t)
	var inFlight, peak atomic.Int64
	request = func(ctx context.Context, addr string, ft handshake.FrameType, payload []byte, max int) ([]byte, error) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		return handshake.Request(ctx, addr, ft, payload, max)
	}
	defer func() { request = handshake.Request }()
	const n, c = 120, 12
	segs := make([]Segment, n)
	for i := range segs {
		segs[i] = Segment{Name: fmt.Sprintf("s%d", i), Desc: tcpDesc(fmt.Sprintf("s%d", i), 1),
			RPC: &meta.KeyValue{Value: []byte(fmt.Sprintf(`{"ip_or_host_name":"127.0.0.1","rpc_port":%d}`, peer.ln.Addr().(*net.TCPAddr).Port))}}
	}
	Probe(context.Background(), segs, ProbeOptions{Timeout: 150 * time.Millisecond, Concurrency: c})
	for _, s := range segs {
		if s.Probe.State != Unknown {
			t.Fatalf("%s: %+v", s.Name, s.Probe)
		}
	}
	if p := peak.Load(); p > c || p < 2 {
		t.Fatalf("peak of %d probes in flight, bound %d", p, c)
	}
}

// TestProbeThousandDeadPeers: 1,000 segments whose engines are gone
// (closed ports on 1,000 loopback addresses) are all found dead.
func TestProbeThousandDeadPeers(t *testing.T) {
	st, segs := fakeDeadPeers(t, 1000)
	if len(segs) != 1000 {
		t.Fatalf("listed %d", len(segs))
	}
	start := time.Now()
	Probe(context.Background(), segs, ProbeOptions{Concurrency: 64})
	t.Logf("1000 dead peers probed in %v", time.Since(start))
	for _, s := range segs {
		if s.Probe.State != Dead {
			t.Fatalf("%s: %+v", s.Name, s.Probe)
		}
	}
	rep := GC(context.Background(), st, segs, GCOptions{Delete: true})
	if len(rep.Removals) != 1000 || rep.Remaining() != 0 {
		t.Fatalf("gc: %d removals, %d remaining", len(rep.Removals), rep.Remaining())
	}
	if left, _ := st.ListKeys(context.Background(), st.Prefix()); len(left) != 0 {
		t.Fatalf("%d keys left", len(left))
	}
}

// fakeDeadPeers registers n tcp segments in a memory store whose
// handshake and data ports refuse connections, each on its own loopback
// address, and lists them.
func fakeDeadPeers(t testing.TB, n int) (meta.Store, []Segment) {
	ctx := context.Background()
	b := meta.NewMemory()
	st, _ := meta.StoreOf(b)
	port := closedPort(t)
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("dead-%04d", i)
		if err := b.PutSegment(ctx, tcpDesc(name, port)); err != nil {
			t.Fatal(err)
		}
		ip := fmt.Sprintf("127.1.%d.%d", i/250, i%250+1)
		if err := b.PutRPCMeta(ctx, name, meta.RPCMeta{IPOrHostName: ip, RPCPort: port}); err != nil {
			t.Fatal(err)
		}
	}
	segs, err := List(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	return st, segs
}

// BenchmarkProbeDead probes 1,000 dead peers one at a time (the baseline)
// and with the default bound.
func BenchmarkProbeDead(b *testing.B) {
	_, segs := fakeDeadPeers(b, 1000)
	for _, c := range []int{1, DefaultProbeConcurrency} {
		b.Run(fmt.Sprintf("peers=1000/concurrency=%d", c), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				Probe(context.Background(), segs, ProbeOptions{Concurrency: c})
			}
		})
	}
}

// BenchmarkProbeSilent probes 1,000 peers that accept and never answer,
// the worst case: each probe lasts the whole timeout.
func BenchmarkProbeSilent(b *testing.B) {
	peer := newSilentPeer(b)
	port := peer.ln.Addr().(*net.TCPAddr).Port
	segs := make([]Segment, 1000)
	for i := range segs {
		segs[i] = Segment{Name: fmt.Sprintf("s%d", i), Desc: tcpDesc(fmt.Sprintf("s%d", i), 1),
			RPC: &meta.KeyValue{Value: []byte(fmt.Sprintf(`{"ip_or_host_name":"127.0.0.1","rpc_port":%d}`, port))}}
	}
	for i := 0; i < b.N; i++ {
		Probe(context.Background(), segs, ProbeOptions{Timeout: DefaultProbeTimeout, Concurrency: DefaultProbeConcurrency})
	}
}

// FuzzClassifyDecode: any key and value under the prefix is either left
// out or becomes a segment that has exactly one of a descriptor and a
// reason it is invalid.
func FuzzClassifyDecode(f *testing.F) {
	f.Add("ram/node1", []byte(`{"name":"node1","protocol":"tcp","tcp_data_port":1,"buffers":[]}`))
	f.Add("group/seg", []byte(`{"name":"group/seg","protocol":"rdma","devices":[]}`))
	f.Add("rpc_meta/x", []byte(`{"ip_or_host_name":"h","rpc_port":1}`))
	f.Add("c1/ram/x", []byte("garbage"))
	f.Add("ram/", []byte{0xff, 0x00})
	f.Fuzz(func(t *testing.T, rest string, value []byte) {
		kind, name := classify(rest, true)
		switch kind {
		case kindSkip:
			return
		case kindRPC:
			if name == "" {
				t.Fatalf("%q: rpc meta without a name", rest)
			}
			return
		}
		if kind == kindStray {
			// Named by its key when rest is empty (the scan does it).
			return
		}
		if name == "" {
			t.Fatalf("%q: segment without a name", rest)
		}
		s := decode(name, meta.KeyValue{Key: "mooncake/" + rest, Value: value})
		if (s.Desc == nil) == (s.Invalid == nil) {
			t.Fatalf("%q %q: desc %v invalid %v", rest, value, s.Desc, s.Invalid)
		}
		if s.Desc != nil && s.Desc.Name != name {
			t.Fatalf("%q: descriptor of %q accepted", rest, s.Desc.Name)
		}
	})
}
