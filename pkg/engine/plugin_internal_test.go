package engine

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/kvcache-ops/mc/pkg/engine/meta"
)

// fakeNIC stands in for an RDMA fabric inside one process: a transport
// that registers memory ("keys"), describes devices, and moves bytes by
// looking the target engine up by segment name. It exercises the plug-in
// points a real rdma transport uses: Config.Transports, Config.Protocol,
// MemoryRegistrar, Describe/DescribeBuffer and Dial/Route.
type fakeNIC struct {
	mu      sync.Mutex
	engines map[string]*Engine
}

type fakeTransport struct {
	nic  *fakeNIC
	e    *Engine
	mu   sync.Mutex
	keys map[uint64]uint32
	next uint32
	regs int
}

func (n *fakeNIC) factory(e *Engine) (Transport, error) {
	return &fakeTransport{nic: n, e: e, keys: make(map[uint64]uint32), next: 100}, nil
}

func (t *fakeTransport) Protocol() string { return meta.ProtocolRDMA }

func (t *fakeTransport) Describe(d *meta.SegmentDesc) {
	d.Devices = []meta.DeviceDesc{{Name: "soft0", LID: 1, GID: "fe:80:00:00:00:00:00:00:00:00:00:00:00:00:00:01"}}
}

func (t *fakeTransport) DescribeBuffer(m *Memory) meta.BufferDesc {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := t.keys[m.Addr()]
	return meta.BufferDesc{Name: m.Location(), Addr: m.Addr(), Length: uint64(m.Len()), Rkey: []uint32{k}, Lkey: []uint32{k}}
}

func (t *fakeTransport) RegisterMemory(m *Memory) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.next++
	t.keys[m.Addr()] = t.next
	t.regs++
	return nil
}

func (t *fakeTransport) UnregisterMemory(m *Memory) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.keys[m.Addr()]; !ok {
		return fmt.Errorf("memory 0x%x was never registered", m.Addr())
	}
	delete(t.keys, m.Addr())
	t.regs--
	return nil
}

func (t *fakeTransport) Dial(ctx context.Context, s SegmentInfo) (Route, error) {
	t.nic.mu.Lock()
	defer t.nic.mu.Unlock()
	peer := t.nic.engines[s.Name]
	if peer == nil {
		return nil, fmt.Errorf("no such peer %q on the fake fabric", s.Name)
	}
	return &fakeRoute{peer: peer}, nil
}

func (t *fakeTransport) Close() error { return nil }

type fakeRoute struct{ peer *Engine }

func (r *fakeRoute) Submit(tasks []*Task) {
	for _, t := range tasks {
		buf, ref, err := r.peer.reg.Acquire(t.Request().Target, t.Request().Length)
		if err != nil {
			t.Complete(err)
			continue
		}
		if t.Request().Op == Write {
			copy(buf, t.LocalBytes())
		} else {
			copy(t.LocalBytes(), buf)
		}
		ref.Release()
		t.Complete(nil)
	}
}

func (r *fakeRoute) Close() error { return nil }

func TestTransportPlugIn(t *testing.T) {
	ctx := context.Background()
	nic := &fakeNIC{engines: make(map[string]*Engine)}
	be := meta.NewMemory()
	start := func(name string) *Engine {
		e, err := New(ctx, Config{LocalServerName: name, Backend: be, BindAddress: "127.0.0.1", HandshakeAddr: "127.0.0.1:0",
			Protocol: meta.ProtocolRDMA, Transports: []TransportFactory{nic.factory}})
		if err != nil {
			t.Fatal(err)
		}
		nic.mu.Lock()
		nic.engines[name] = e
		nic.mu.Unlock()
		return e
	}
	a, b := start("a"), start("b")
	defer b.Close()
	am, _ := a.RegisterMemory(ctx, 4096, "cpu:1", true)
	bm, _ := b.RegisterMemory(ctx, 4096, "cpu:0", false)
	copy(am.Bytes(), "rdma-ish")

	// a published an rdma descriptor with the transport's devices and keys.
	d, err := be.GetSegment(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if d.Protocol != "rdma" || len(d.Devices) != 1 || len(d.Buffers) != 1 || d.Buffers[0].Name != "cpu:1" || d.Buffers[0].Rkey[0] == 0 {
		t.Fatalf("descriptor: %+v", d)
	}
	seg, err := b.OpenSegment(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Transfer(ctx, Request{Op: Read, Source: bm.Addr(), Segment: seg, Target: am.Addr(), Length: 8}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(bm.Bytes()[:8], []byte("rdma-ish")) {
		t.Fatalf("read %q", bm.Bytes()[:8])
	}
	ft := a.transports["rdma"].(*fakeTransport)
	if err := a.UnregisterMemory(ctx, am); err != nil {
		t.Fatal(err)
	}
	if ft.regs != 0 {
		t.Fatalf("%d registrations left after unregister", ft.regs)
	}
	a.RegisterMemory(ctx, 4096, "cpu:0", true)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if ft.regs != 0 {
		t.Fatalf("%d registrations left after Close", ft.regs)
	}

	// A protocol nobody serves is refused at start.
	if _, err := New(ctx, Config{LocalServerName: "c", Backend: meta.NewMemory(), BindAddress: "127.0.0.1", HandshakeAddr: "127.0.0.1:0",
		Protocol: "rdma"}); err == nil {
		t.Fatal("rdma without a transport accepted")
	}
}
