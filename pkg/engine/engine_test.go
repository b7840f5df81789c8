package engine_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine"
	"github.com/kvcache-ops/mc/pkg/engine/meta"
)

// newEngine starts an engine on loopback with P2P metadata.
func newEngine(t testing.TB, mod ...func(*engine.Config)) *engine.Engine {
	t.Helper()
	cfg := engine.Config{
		LocalServerName: "test",
		BindAddress:     "127.0.0.1",
		HandshakeAddr:   "127.0.0.1:0",
	}
	for _, f := range mod {
		f(&cfg)
	}
	e, err := engine.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func register(t testing.TB, e *engine.Engine, size int, remote bool) *engine.Memory {
	t.Helper()
	m, err := e.RegisterMemory(context.Background(), size, "cpu:0", remote)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func fill(b []byte, seed byte) {
	for i := range b {
		b[i] = byte(i*7) + seed
	}
}

// Example of the whole API: a target engine registers memory, an initiator
// opens the target's segment by name and writes then reads it back.
func ExampleEngine() {
	ctx := context.Background()
	cfg := engine.Config{BindAddress: "127.0.0.1", HandshakeAddr: "127.0.0.1:0", LocalServerName: "example"}
	target, _ := engine.New(ctx, cfg)
	defer target.Close()
	remote, _ := target.RegisterMemory(ctx, 1<<20, "cpu:0", true)

	initiator, _ := engine.New(ctx, cfg)
	defer initiator.Close()
	local, _ := initiator.RegisterMemory(ctx, 1<<20, "cpu:0", false)
	copy(local.Bytes(), "hello, segment")

	seg, err := initiator.OpenSegment(ctx, target.SegmentName())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer seg.Close()
	batch, _ := initiator.AllocateBatch(2)
	batch.Submit(engine.Request{Op: engine.Write, Source: local.Addr(), Segment: seg, Target: remote.Addr() + 4096, Length: 14})
	if err := batch.Wait(ctx); err != nil {
		fmt.Println(err)
		return
	}
	st, _ := batch.TaskStatus(0)
	fmt.Println(st.Status, st.Transferred, string(remote.Bytes()[4096:4096+14]))

	// Transfer is the blocking helper: submit and wait in one call.
	err = initiator.Transfer(ctx, engine.Request{Op: engine.Read, Source: local.Addr() + 100, Segment: seg, Target: remote.Addr() + 4096, Length: 5})
	fmt.Println(err, string(local.Bytes()[100:105]))
	fmt.Println(batch.Free())
	// Output:
	// COMPLETED 14 hello, segment
	// <nil> hello
	// <nil>
}

func TestTCPAndLocalByteExact(t *testing.T) {
	ctx := context.Background()
	target := newEngine(t)
	tm := register(t, target, 8<<20, true)
	fill(tm.Bytes(), 3)
	init := newEngine(t)
	lm := register(t, init, 8<<20, false)

	for _, name := range []string{"tcp", "local"} {
		t.Run(name, func(t *testing.T) {
			e, seg := init, (*engine.Segment)(nil)
			src := lm
			var err error
			if name == "local" {
				e, src = target, register(t, target, 8<<20, false)
				seg, err = e.OpenSegment(ctx, e.SegmentName())
			} else {
				seg, err = e.OpenSegment(ctx, target.SegmentName())
			}
			if err != nil {
				t.Fatal(err)
			}
			fill(tm.Bytes(), 3)
			// Sizes around the server's copy/writev threshold and odd ones.
			sizes := []uint64{1, 7, 4096, 16 << 10, 16<<10 + 1, 64 << 10, 1 << 20, 3<<20 + 5}
			b, _ := e.AllocateBatch(len(sizes))
			var off uint64
			for _, n := range sizes {
				b.Submit(engine.Request{Op: engine.Read, Source: src.Addr() + off, Segment: seg, Target: tm.Addr() + off + 11, Length: n})
				off += n
			}
			if err := b.Wait(ctx); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(src.Bytes()[:off], tm.Bytes()[11:11+off]) {
				t.Fatal("read: bytes differ")
			}
			for i := range sizes {
				st, _ := b.TaskStatus(i)
				if st.Status != engine.Completed || st.Transferred != sizes[i] {
					t.Fatalf("task %d: %+v", i, st)
				}
			}
			if err := b.Free(); err != nil {
				t.Fatal(err)
			}
			// Write a different pattern back at another offset.
			fill(src.Bytes()[:off], 99)
			want := append([]byte(nil), tm.Bytes()...)
			copy(want[1000:], src.Bytes()[:off])
			b, _ = e.AllocateBatch(len(sizes))
			off = 0
			for _, n := range sizes {
				b.Submit(engine.Request{Op: engine.Write, Source: src.Addr() + off, Segment: seg, Target: tm.Addr() + 1000 + off, Length: n})
				off += n
			}
			if err := b.Wait(ctx); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(want, tm.Bytes()) {
				t.Fatal("write: target bytes differ from expectation (neighbours touched?)")
			}
		})
	}
}

func TestOutOfRangeTargetFailsTaskCorruptsNothing(t *testing.T) {
	ctx := context.Background()
	target := newEngine(t)
	tm := register(t, target, 1<<20, true)
	fill(tm.Bytes(), 1)
	before := append([]byte(nil), tm.Bytes()...)
	init := newEngine(t)
	lm := register(t, init, 1<<20, false)
	seg, err := init.OpenSegment(ctx, target.SegmentName())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := init.AllocateBatch(4)
	b.Submit(
		engine.Request{Op: engine.Write, Source: lm.Addr(), Segment: seg, Target: tm.Addr() + 1<<20 - 10, Length: 11},
		engine.Request{Op: engine.Write, Source: lm.Addr(), Segment: seg, Target: tm.Addr() - 1, Length: 2},
		engine.Request{Op: engine.Write, Source: lm.Addr(), Segment: seg, Target: ^uint64(0) - 5, Length: 100},
		engine.Request{Op: engine.Write, Source: lm.Addr(), Segment: seg, Target: tm.Addr(), Length: 16},
	)
	err = b.Wait(ctx)
	if !errors.Is(err, engine.ErrOutOfRange) {
		t.Fatalf("Wait: %v", err)
	}
	for i := 0; i < 3; i++ {
		st, _ := b.TaskStatus(i)
		if st.Status != engine.Failed || !errors.Is(st.Err, engine.ErrOutOfRange) {
			t.Fatalf("task %d: %+v", i, st)
		}
		if !strings.Contains(st.Err.Error(), "not inside one registered buffer") {
			t.Fatalf("reason: %v", st.Err)
		}
	}
	if st, _ := b.TaskStatus(3); st.Status != engine.Completed {
		t.Fatalf("good task: %+v", st)
	}
	copy(before, lm.Bytes()[:16])
	if !bytes.Equal(before, tm.Bytes()) {
		t.Fatal("target memory changed outside the good request")
	}
}

func TestFreeRefusedWhilePendingAndCtxCancel(t *testing.T) {
	ctx := context.Background()
	// A "target" that accepts and never answers: tasks stay WAITING.
	be := silentPeer(t)
	init := newEngine(t, func(c *engine.Config) {
		c.Backend = be
		c.TCPStatusTimeout = 300 * time.Millisecond
	})
	lm := register(t, init, 1<<20, false)
	seg, err := init.OpenSegment(ctx, "silent")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := init.AllocateBatch(1)
	b.Submit(engine.Request{Op: engine.Read, Source: lm.Addr(), Segment: seg, Target: 0x10000, Length: 8})
	if err := b.Free(); !errors.Is(err, engine.ErrBatchPending) {
		t.Fatalf("Free while pending: %v", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := b.Wait(cctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait with cancelled ctx: %v", err)
	}
	// The status timeout then fails the task; it never hangs.
	start := time.Now()
	err = b.Wait(ctx)
	if err == nil || !strings.Contains(err.Error(), "MC_TCP_STATUS_TIMEOUT_SEC") {
		t.Fatalf("Wait: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("timeout took %v", d)
	}
	if err := b.Free(); err != nil {
		t.Fatal(err)
	}
}

func TestOpenSegmentErrorsOneLine(t *testing.T) {
	ctx := context.Background()
	be := meta.NewMemory()
	e := newEngine(t, func(c *engine.Config) { c.Backend = be })
	_, err := e.OpenSegment(ctx, "nobody")
	if !errors.Is(err, engine.ErrSegmentNotFound) {
		t.Fatalf("unknown segment: %v", err)
	}
	// A malformed descriptor stored under the key.
	e2 := newEngine(t) // P2P
	_, err = e2.OpenSegment(ctx, "127.0.0.1:1")
	if !errors.Is(err, meta.ErrUnreachable) {
		t.Fatalf("unreachable peer: %v", err)
	}
	for _, err := range []error{err} {
		if strings.Contains(err.Error(), "\n") {
			t.Fatalf("multi-line error: %q", err)
		}
	}
}

func TestUnregisterAndLocalRange(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t)
	m := register(t, e, 4096, true)
	seg, _ := e.OpenSegment(ctx, e.SegmentName())
	addr := m.Addr()
	// Registered first, so the unmapped range cannot be handed out again.
	other := register(t, e, 4096, true)
	if err := e.UnregisterMemory(ctx, m); err != nil {
		t.Fatal(err)
	}
	if d := e.Descriptor(); len(d.Buffers) != 1 || d.Buffers[0].Addr != other.Addr() {
		t.Fatalf("descriptor after unregister: %+v", d.Buffers)
	}
	err := e.Transfer(ctx, engine.Request{Op: engine.Read, Source: addr, Segment: seg, Target: other.Addr(), Length: 8})
	if !errors.Is(err, engine.ErrOutOfRange) {
		t.Fatalf("unregistered source: %v", err)
	}
}

func TestCloseLeavesNoGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		cfg := engine.Config{LocalServerName: "leak", BindAddress: "127.0.0.1", HandshakeAddr: "127.0.0.1:0"}
		a, err := engine.New(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := engine.New(ctx, cfg)
		am, _ := a.RegisterMemory(ctx, 1<<16, "cpu:0", true)
		bm, _ := b.RegisterMemory(ctx, 1<<16, "cpu:0", false)
		seg, err := b.OpenSegment(ctx, a.SegmentName())
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Transfer(ctx, engine.Request{Op: engine.Read, Source: bm.Addr(), Segment: seg, Target: am.Addr(), Length: 1 << 16}); err != nil {
			t.Fatal(err)
		}
		b.Close()
		a.Close()
	}
	deadline := time.Now().Add(3 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		buf := make([]byte, 1<<16)
		t.Fatalf("%d goroutines before, %d after Close:\n%s", before, n, buf[:runtime.Stack(buf, true)])
	}
}

// Polling, as Mooncake's getTransferStatus loop: each task is WAITING until
// it is COMPLETED or FAILED; a task whose target range is not registered
// fails with the reason and does not stop the others.
func ExampleBatch_TaskStatus() {
	ctx := context.Background()
	e, _ := engine.New(ctx, engine.Config{BindAddress: "127.0.0.1", HandshakeAddr: "127.0.0.1:0", LocalServerName: "poll"})
	defer e.Close()
	remote, _ := e.RegisterMemory(ctx, 8192, "cpu:0", true)
	local, _ := e.RegisterMemory(ctx, 8192, "cpu:0", false)
	seg, _ := e.OpenSegment(ctx, e.SegmentName()) // our own segment: memcpy

	b, _ := e.AllocateBatch(2)
	b.Submit(
		engine.Request{Op: engine.Read, Source: local.Addr(), Segment: seg, Target: remote.Addr(), Length: 4096},
		engine.Request{Op: engine.Read, Source: local.Addr(), Segment: seg, Target: remote.Addr() + 8000, Length: 4096},
	)
	for i := 0; i < b.Len(); i++ {
		st, _ := b.TaskStatus(i)
		for st.Status == engine.Waiting {
			st, _ = b.TaskStatus(i)
		}
		fmt.Println(i, st.Status, st.Transferred, errors.Is(st.Err, engine.ErrOutOfRange))
	}
	fmt.Println(b.Free())
	// Output:
	// 0 COMPLETED 4096 false
	// 1 FAILED 0 true
	// <nil>
}

// silentPeer publishes, in a fresh in-memory backend, a TCP segment named
// "silent" whose data port accepts connections and never answers, so
// transfers to it stay WAITING until the status timeout.
func silentPeer(t *testing.T) meta.Backend {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	ctx := context.Background()
	be := meta.NewMemory()
	if err := be.PutSegment(ctx, &meta.SegmentDesc{Name: "silent", Protocol: "tcp", TCPDataPort: ln.Addr().(*net.TCPAddr).Port, TCPProtoVersion: 2,
		Buffers: []meta.BufferDesc{{Name: "silent", Addr: 0x10000, Length: 1 << 20}}}); err != nil {
		t.Fatal(err)
	}
	if err := be.PutRPCMeta(ctx, "silent", meta.RPCMeta{IPOrHostName: "127.0.0.1", RPCPort: 1}); err != nil {
		t.Fatal(err)
	}
	return be
}
