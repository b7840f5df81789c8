package engine_test

import (
	"context"
	"errors"
	"net"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine"
	"github.com/kvcache-ops/mc/pkg/engine/handshake"
	"github.com/kvcache-ops/mc/pkg/engine/meta"
	"github.com/kvcache-ops/mc/pkg/engine/tcp"
)

func oneLine(t *testing.T, err error) {
	t.Helper()
	if err == nil || strings.Contains(err.Error(), "\n") {
		t.Fatalf("want a one-line error, got %q", err)
	}
}

func TestKilledTargetFailsTasksQuickly(t *testing.T) {
	ctx := context.Background()
	target := newEngine(t)
	tm := register(t, target, 64<<20, true)
	init := newEngine(t, func(c *engine.Config) { c.TCPStatusTimeout = time.Second })
	lm := register(t, init, 64<<20, false)
	seg, err := init.OpenSegment(ctx, target.SegmentName())
	if err != nil {
		t.Fatal(err)
	}
	// Batches in flight while the target goes away.
	errc := make(chan error, 1)
	go func() {
		for {
			b, _ := init.AllocateBatch(64)
			for i := 0; i < 64; i++ {
				off := uint64(i) << 20
				b.Submit(engine.Request{Op: engine.Read, Source: lm.Addr() + off, Segment: seg, Target: tm.Addr() + off, Length: 1 << 20})
			}
			if err := b.Wait(ctx); err != nil {
				errc <- err
				return
			}
		}
	}()
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	target.Close()
	select {
	case err := <-errc:
		oneLine(t, err)
		t.Logf("after %v: %v", time.Since(start), err)
	case <-time.After(5 * time.Second):
		t.Fatal("initiator still waiting 5 s after the target closed")
	}
}

func TestOutOfRangeRawRequestRejectedByServer(t *testing.T) {
	// A peer that skips the client-side check (an old or hostile one)
	// still cannot touch memory outside the registered buffer.
	target := newEngine(t)
	tm := register(t, target, 4096, true)
	fill(tm.Bytes(), 5)
	before := append([]byte(nil), tm.Bytes()...)
	port := target.Descriptor().TCPDataPort
	c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req := tcp.AppendHeader(nil, tcp.Header{Size: 16, Addr: tm.Addr() + 4090, Write: true, V2: true})
	req = append(req, make([]byte, 16)...)
	c.Write(req)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	st := make([]byte, 8)
	if _, err := c.Read(st); err != nil {
		t.Fatal(err)
	}
	if err := tcp.CheckStatus(st); !errors.Is(err, tcp.ErrRejected) {
		t.Fatalf("status: %v", err)
	}
	// The server closes the connection after rejecting.
	if n, err := c.Read(st); err == nil {
		t.Fatalf("connection still open (%d bytes)", n)
	}
	if string(before) != string(tm.Bytes()) {
		t.Fatal("memory changed")
	}
}

func TestV1PeerDescriptor(t *testing.T) {
	// A descriptor without tcp_proto_version is a v1 (old Mooncake) peer:
	// the initiator speaks v1 (no status frames) and the mc server
	// accepts it.
	ctx := context.Background()
	be := meta.NewMemory()
	target := newEngine(t, func(c *engine.Config) { c.Backend = be; c.LocalServerName = "tgt" })
	tm := register(t, target, 1<<20, true)
	fill(tm.Bytes(), 9)
	d := target.Descriptor()
	d.TCPProtoVersion = 0
	if err := be.PutSegment(ctx, d); err != nil {
		t.Fatal(err)
	}
	init := newEngine(t, func(c *engine.Config) { c.Backend = be; c.LocalServerName = "init" })
	lm := register(t, init, 1<<20, false)
	seg, err := init.OpenSegment(ctx, "tgt")
	if err != nil {
		t.Fatal(err)
	}
	if err := init.Transfer(ctx, engine.Request{Op: engine.Read, Source: lm.Addr(), Segment: seg, Target: tm.Addr(), Length: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	if string(lm.Bytes()) != string(tm.Bytes()) {
		t.Fatal("v1 read: bytes differ")
	}
}

func TestMalformedDescriptorOneLine(t *testing.T) {
	ctx := context.Background()
	// A P2P peer whose Metadata answer breaks Mooncake's rules.
	hs, err := handshake.Listen("127.0.0.1:0", handshake.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer hs.Close()
	hs.Handle(handshake.Metadata, func(context.Context, []byte) ([]byte, error) {
		return []byte(`{"name":"bad","protocol":"tcp","tcp_data_port":0,"buffers":[]}`), nil
	})
	e := newEngine(t)
	_, err = e.OpenSegment(ctx, hs.Addr())
	oneLine(t, err)
	if !errors.Is(err, meta.ErrMalformed) || !strings.Contains(err.Error(), "tcp_data_port") {
		t.Fatalf("malformed descriptor: %v", err)
	}
}

func TestUnreachableMetadataServerOneLine(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	start := time.Now()
	_, err := engine.New(context.Background(), engine.Config{
		BindAddress: "127.0.0.1", HandshakeAddr: "127.0.0.1:0", LocalServerName: "x",
		MetadataServer: addr, MetadataTimeout: 500 * time.Millisecond,
	})
	oneLine(t, err)
	if !errors.Is(err, meta.ErrUnreachable) || !strings.Contains(err.Error(), addr) {
		t.Fatalf("unreachable etcd: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("took %v", d)
	}
}

func TestUnknownSegmentOneLine(t *testing.T) {
	srv := httptest.NewServer(meta.NewHTTPHandler())
	defer srv.Close()
	e := newEngine(t, func(c *engine.Config) { c.MetadataServer = srv.URL + "/metadata" })
	_, err := e.OpenSegment(context.Background(), "nobody")
	oneLine(t, err)
	if !errors.Is(err, engine.ErrSegmentNotFound) || !strings.Contains(err.Error(), `"nobody"`) {
		t.Fatalf("unknown segment: %v", err)
	}
}

func TestEtcdBackendEndToEnd(t *testing.T) {
	ctx := context.Background()
	etcd, err := meta.StartEtcd(ctx, meta.EtcdConfig{Listen: "127.0.0.1:0", NoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	// Cleanups run last-in first-out: the engines close before etcd.
	t.Cleanup(func() { etcd.Close() })
	ms := strings.ReplaceAll(strings.Join(etcd.Endpoints(), ","), "http://", "")
	target := newEngine(t, func(c *engine.Config) { c.MetadataServer = ms; c.LocalServerName = "node-a" })
	if target.SegmentName() != "node-a" {
		t.Fatalf("segment name %q", target.SegmentName())
	}
	tm := register(t, target, 1<<20, true)
	fill(tm.Bytes(), 4)
	init := newEngine(t, func(c *engine.Config) { c.MetadataServer = ms; c.LocalServerName = "node-b" })
	lm := register(t, init, 1<<20, false)
	seg, err := init.OpenSegment(ctx, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	if err := init.Transfer(ctx, engine.Request{Op: engine.Read, Source: lm.Addr(), Segment: seg, Target: tm.Addr(), Length: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	if string(lm.Bytes()) != string(tm.Bytes()) {
		t.Fatal("bytes differ")
	}
	target.Close()
	// Closing withdraws the segment.
	if _, err := init.OpenSegment(ctx, "node-a"); !errors.Is(err, engine.ErrSegmentNotFound) {
		t.Fatalf("after target close: %v", err)
	}
}

func TestUnregisterWaitsForTransfers(t *testing.T) {
	ctx := context.Background()
	// A peer that never answers keeps the task, and its local memory
	// pinned, until the status timeout.
	be := silentPeer(t)
	e := newEngine(t, func(c *engine.Config) {
		c.Backend = be
		c.TCPStatusTimeout = 2 * time.Second
		c.UnregisterGrace = 100 * time.Millisecond
	})
	lm := register(t, e, 4096, false)
	seg, err := e.OpenSegment(ctx, "silent")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := e.AllocateBatch(1)
	b.Submit(engine.Request{Op: engine.Read, Source: lm.Addr(), Segment: seg, Target: 0x10000, Length: 4096})
	if err := e.UnregisterMemory(ctx, lm); !errors.Is(err, engine.ErrBusy) {
		t.Fatalf("unregister under a transfer: %v", err)
	}
	if len(e.Memory()) != 1 {
		t.Fatal("refused unregister dropped the buffer")
	}
	b.Wait(ctx) // fails at the status timeout and unpins
	if err := e.UnregisterMemory(ctx, lm); err != nil {
		t.Fatalf("unregister after the transfer ended: %v", err)
	}
}

// closedPort is a loopback port nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// A metadata server that is down fails the start after one timeout, and
// the message names the time it took (it used to wait three timeouts,
// withdrawing keys it had never published).
func TestStartWithMetadataServerDown(t *testing.T) {
	addr := closedPort(t)
	start := time.Now()
	_, err := engine.New(context.Background(), engine.Config{LocalServerName: "down", BindAddress: "127.0.0.1",
		HandshakeAddr: "127.0.0.1:0", MetadataServer: addr, MetadataTimeout: 600 * time.Millisecond})
	took := time.Since(start)
	oneLine(t, err)
	if !errors.Is(err, meta.ErrUnreachable) || !strings.Contains(err.Error(), "no answer within 600ms") {
		t.Fatalf("err %v", err)
	}
	if took > 1100*time.Millisecond {
		t.Fatalf("took %v to fail with a 600ms metadata timeout", took)
	}
}

// Closing with the metadata server gone is bounded and says so in one
// line.
func TestCloseWithMetadataServerGone(t *testing.T) {
	ctx := context.Background()
	etcd, err := meta.StartEtcd(ctx, meta.EtcdConfig{Listen: "127.0.0.1:0", NoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	ms := strings.ReplaceAll(strings.Join(etcd.Endpoints(), ","), "http://", "")
	e, err := engine.New(ctx, engine.Config{LocalServerName: "gone", BindAddress: "127.0.0.1", HandshakeAddr: "127.0.0.1:0", MetadataServer: ms})
	if err != nil {
		t.Fatal(err)
	}
	register(t, e, 1<<20, true)
	etcd.Close()
	start := time.Now()
	err = e.Close()
	took := time.Since(start)
	t.Logf("close took %v: %v", took, err)
	oneLine(t, err)
	if !errors.Is(err, meta.ErrUnreachable) || !strings.Contains(err.Error(), "no answer within 2s") {
		t.Fatalf("err %v", err)
	}
	if took > 3500*time.Millisecond {
		t.Fatalf("close took %v with the metadata server gone", took)
	}
}

// TestNameWithPortKeepsClientsApart: two processes of one host with a
// defaulted name and HTTP metadata took the hostname both, and the second
// claimed the first's rpc_meta key (Mooncake's metadata server refuses
// it: "Duplicate rpc_meta key not allowed"; `mc store put` beside an `mc
// serve store` failed so). With NameWithPort each takes host:port.
func TestNameWithPortKeepsClientsApart(t *testing.T) {
	srv := httptest.NewServer(meta.NewHTTPHandler())
	defer srv.Close()
	named := newEngine(t, func(c *engine.Config) { c.MetadataServer = srv.URL + "/metadata"; c.LocalServerName = "" })
	if h, _ := os.Hostname(); named.SegmentName() != h {
		t.Fatalf("without NameWithPort the defaulted name is %q, want the hostname %q", named.SegmentName(), h)
	}
	var names []string
	for range 2 {
		e := newEngine(t, func(c *engine.Config) {
			c.MetadataServer = srv.URL + "/metadata"
			c.LocalServerName = ""
			c.NameWithPort = true
		})
		host, port, err := net.SplitHostPort(e.SegmentName())
		if err != nil || host == "" || port == "0" {
			t.Fatalf("name %q: want host:port", e.SegmentName())
		}
		names = append(names, e.SegmentName())
	}
	if names[0] == names[1] {
		t.Fatalf("two clients took one name %q", names[0])
	}
	// A name given is kept as given.
	given := newEngine(t, func(c *engine.Config) {
		c.MetadataServer = srv.URL + "/metadata"
		c.LocalServerName = "node-a"
		c.NameWithPort = true
	})
	if given.SegmentName() != "node-a" {
		t.Fatalf("given name became %q", given.SegmentName())
	}
}
