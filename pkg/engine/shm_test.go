//go:build linux

package engine_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine"
	"github.com/kvcache-ops/mc/pkg/engine/meta"
	"github.com/kvcache-ops/mc/pkg/engine/shm"
)

// childTargetEnv makes the test binary a target engine with the same-host
// transport in its own process (for the SIGKILL test): it prints its
// segment name and the buffer's address and serves until killed or stdin
// closes.
const childTargetEnv = "MC_ENGINE_TEST_SHM_TARGET"

func TestMain(m *testing.M) {
	if os.Getenv(childTargetEnv) != "" {
		os.Exit(runChildTarget())
	}
	os.Exit(m.Run())
}

func runChildTarget() int {
	ctx := context.Background()
	e, err := engine.New(ctx, engine.Config{LocalServerName: "child", BindAddress: "127.0.0.1", HandshakeAddr: "127.0.0.1:0", Protocol: engine.ProtocolAuto})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	m, err := e.RegisterMemory(ctx, 64<<20, "cpu:0", true)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fmt.Println(e.SegmentName(), m.Addr())
	bufio.NewReader(os.Stdin).ReadString('\n')
	e.Close()
	return 0
}

func withProtocol(p string) func(*engine.Config) {
	return func(c *engine.Config) { c.Protocol = p }
}

func openSeg(t *testing.T, e *engine.Engine, name string) *engine.Segment {
	t.Helper()
	s, err := e.OpenSegment(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestSHMByteExactAtOddSizesAndOffsets(t *testing.T) {
	ctx := context.Background()
	target := newEngine(t, withProtocol(engine.ProtocolAuto))
	const size = 8<<20 + 12345
	tm := register(t, target, size, true)
	fill(tm.Bytes(), 3)
	init := newEngine(t, withProtocol(engine.ProtocolSHM))
	lm := register(t, init, size, false)
	seg := openSeg(t, init, target.SegmentName())
	if seg.Transport() != engine.ProtocolSHM {
		t.Fatalf("same-host segment opened over %q, want shm", seg.Transport())
	}
	// Sizes and offsets that straddle pages and word boundaries; the
	// 3 MiB+ ones make a batch big enough to be cut between goroutines
	// in the middle of a task.
	type span struct{ local, remote, n uint64 }
	spans := []span{{0, 0, 1}, {1, 7, 3}, {4093, 4095, 4097}, {12345, 99, 65537}, {65537 + 12345, 1 << 20, 3<<20 + 17}, {5<<20 + 1, 5<<20 + 3, 3<<20 - 5}}
	// Read: local gets exactly the target's bytes, nothing around them.
	clear(lm.Bytes())
	b, _ := init.AllocateBatch(len(spans))
	for _, s := range spans {
		b.Submit(engine.Request{Op: engine.Read, Source: lm.Addr() + s.local, Segment: seg, Target: tm.Addr() + s.remote, Length: s.n})
	}
	if err := b.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, size)
	for _, s := range spans {
		copy(want[s.local:s.local+s.n], tm.Bytes()[s.remote:s.remote+s.n])
	}
	if i := firstDiff(lm.Bytes(), want); i >= 0 {
		t.Fatalf("read: local byte %d is %d, want %d", i, lm.Bytes()[i], want[i])
	}
	for i := range spans {
		if st, _ := b.TaskStatus(i); st.Status != engine.Completed || st.Transferred != spans[i].n {
			t.Fatalf("task %d: %+v", i, st)
		}
	}
	// Write: the target changes exactly in the spans.
	fill(lm.Bytes(), 101)
	want = append(want[:0], tm.Bytes()...)
	b2, _ := init.AllocateBatch(len(spans))
	for _, s := range spans {
		b2.Submit(engine.Request{Op: engine.Write, Source: lm.Addr() + s.local, Segment: seg, Target: tm.Addr() + s.remote, Length: s.n})
		copy(want[s.remote:s.remote+s.n], lm.Bytes()[s.local:s.local+s.n])
	}
	if err := b2.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if i := firstDiff(tm.Bytes(), want); i >= 0 {
		t.Fatalf("write: target byte %d is %d, want %d", i, tm.Bytes()[i], want[i])
	}
	// Ranges are checked against the peer's registered buffers.
	b3, _ := init.AllocateBatch(2)
	b3.Submit(engine.Request{Op: engine.Write, Source: lm.Addr(), Segment: seg, Target: tm.Addr() + size - 10, Length: 11},
		engine.Request{Op: engine.Read, Source: lm.Addr(), Segment: seg, Target: tm.Addr() - 1, Length: 2})
	b3.Wait(ctx)
	for i := range 2 {
		if st, _ := b3.TaskStatus(i); st.Status != engine.Failed || !errors.Is(st.Err, engine.ErrOutOfRange) {
			t.Fatalf("out-of-range task %d: %+v", i, st)
		}
	}
}

func firstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return len(a)
}

func TestSHMDescriptorAdvertisesTheHostAndBuffers(t *testing.T) {
	target := newEngine(t, withProtocol(engine.ProtocolAuto))
	tm := register(t, target, 1<<20, true)
	register(t, target, 4096, false)
	d := target.Descriptor()
	if d.Protocol != meta.ProtocolTCP || d.TCPDataPort == 0 {
		t.Fatalf("auto engine publishes %q port %d, want tcp beside shm", d.Protocol, d.TCPDataPort)
	}
	// What a store node tells its master: the published protocol.
	if p := target.Config().Protocol; p != meta.ProtocolTCP {
		t.Fatalf("Config().Protocol of an auto engine = %q, want the published tcp", p)
	}
	if target.Transport(engine.ProtocolSHM) == nil {
		t.Fatal("auto engine has no shm transport")
	}
	boot, _ := shm.BootID("")
	if d.SHM == nil || d.SHM.BootID != boot || d.SHM.PID != os.Getpid() || d.SHM.UID != os.Geteuid() || len(d.SHM.Token) != 32 {
		t.Fatalf("mc_shm = %+v, want this host (%s), pid %d, uid %d and a token", d.SHM, boot, os.Getpid(), os.Geteuid())
	}
	if len(d.SHM.Buffers) != 1 || d.SHM.Buffers[0].Addr != tm.Addr() {
		t.Fatalf("mc_shm buffers %+v, want the one remote buffer at 0x%x", d.SHM.Buffers, tm.Addr())
	}
	link, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", d.SHM.Buffers[0].FD))
	if err != nil || !strings.HasPrefix(link, "/memfd:") {
		t.Fatalf("advertised fd is %q (%v), want a memfd", link, err)
	}
	if _, err := meta.EncodeSegment(d); err != nil {
		t.Fatalf("descriptor does not encode: %v", err)
	}
	plain := newEngine(t)
	register(t, plain, 4096, true)
	if plain.Descriptor().SHM != nil {
		t.Fatal("a tcp engine advertises shm")
	}
}

// fakeProc is a procfs tree holding only a boot id: an engine started
// on it advertises another host.
func fakeProc(t *testing.T, bootID string) string {
	root := t.TempDir()
	dir := filepath.Join(root, "sys", "kernel", "random")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "boot_id"), []byte(bootID+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}

func TestSHMSegmentOfAnotherHostUsesTCP(t *testing.T) {
	ctx := context.Background()
	target := newEngine(t, withProtocol(engine.ProtocolAuto), func(c *engine.Config) {
		c.ProcFS = fakeProc(t, "11111111-2222-4333-8444-555555555555")
	})
	tm := register(t, target, 1<<20, true)
	auto := newEngine(t, withProtocol(engine.ProtocolAuto))
	lm := register(t, auto, 1<<20, false)
	seg := openSeg(t, auto, target.SegmentName())
	if seg.Transport() != meta.ProtocolTCP {
		t.Fatalf("segment of another host opened over %q, want tcp", seg.Transport())
	}
	copy(lm.Bytes(), "over tcp")
	if err := auto.Transfer(ctx, engine.Request{Op: engine.Write, Source: lm.Addr(), Segment: seg, Target: tm.Addr() + 5, Length: 8}); err != nil {
		t.Fatal(err)
	}
	if got := string(tm.Bytes()[5:13]); got != "over tcp" {
		t.Fatalf("target holds %q", got)
	}
	forced := newEngine(t, withProtocol(engine.ProtocolSHM))
	_, err := forced.OpenSegment(ctx, target.SegmentName())
	if !errors.Is(err, engine.ErrNoSHM) || !errors.Is(err, shm.ErrOtherHost) || !strings.Contains(err.Error(), "11111111-2222-4333-8444-555555555555") {
		t.Fatalf("--protocol shm to another host: %v, want ErrNoSHM/ErrOtherHost naming the boot id", err)
	}
	oneLine(t, err)
}

func TestSHMSegmentWithoutSHM(t *testing.T) {
	ctx := context.Background()
	target := newEngine(t) // tcp only
	register(t, target, 4096, true)
	auto := newEngine(t, withProtocol(engine.ProtocolAuto))
	if seg := openSeg(t, auto, target.SegmentName()); seg.Transport() != meta.ProtocolTCP {
		t.Fatalf("tcp-only segment opened over %q", seg.Transport())
	}
	forced := newEngine(t, withProtocol(engine.ProtocolSHM))
	_, err := forced.OpenSegment(ctx, target.SegmentName())
	if !errors.Is(err, engine.ErrNoSHM) || !strings.Contains(err.Error(), "advertises no shared memory") {
		t.Fatalf("--protocol shm to a tcp-only target: %v", err)
	}
	// And a tcp engine never maps a peer, even one that offers shm.
	shmTarget := newEngine(t, withProtocol(engine.ProtocolAuto))
	register(t, shmTarget, 4096, true)
	plain := newEngine(t)
	if seg := openSeg(t, plain, shmTarget.SegmentName()); seg.Transport() != meta.ProtocolTCP {
		t.Fatalf("--protocol tcp engine opened a segment over %q", seg.Transport())
	}
	if seg := openSeg(t, plain, plain.SegmentName()); seg.Transport() != engine.ProtocolLocal {
		t.Fatalf("own segment over %q, want local", seg.Transport())
	}
}

// A descriptor claiming another user (as one from another uid's engine
// would): refused under shm, tcp under auto. The file-owner check behind
// it is pkg/engine/shm's TestOpenRefusesAnotherUser.
func TestSHMPeerOfAnotherUserRefused(t *testing.T) {
	ctx := context.Background()
	be := meta.NewMemory()
	target := newEngine(t, withProtocol(engine.ProtocolAuto), func(c *engine.Config) { c.Backend = be; c.LocalServerName = "target" })
	register(t, target, 4096, true)
	d, err := be.GetSegment(ctx, "target")
	if err != nil {
		t.Fatal(err)
	}
	d.SHM.UID = os.Geteuid() + 1
	if err := be.PutSegment(ctx, d); err != nil {
		t.Fatal(err)
	}
	forced := newEngine(t, withProtocol(engine.ProtocolSHM), func(c *engine.Config) { c.Backend = be; c.LocalServerName = "forced" })
	_, err = forced.OpenSegment(ctx, "target")
	want := fmt.Sprintf("runs as uid %d, this engine as uid %d", os.Geteuid()+1, os.Geteuid())
	if !errors.Is(err, shm.ErrOtherUser) || !strings.Contains(err.Error(), want) {
		t.Fatalf("peer of another uid: %v, want ErrOtherUser saying %q", err, want)
	}
	auto := newEngine(t, withProtocol(engine.ProtocolAuto), func(c *engine.Config) { c.Backend = be; c.LocalServerName = "auto" })
	if seg := openSeg(t, auto, "target"); seg.Transport() != meta.ProtocolTCP {
		t.Fatalf("peer of another uid opened over %q under auto, want tcp", seg.Transport())
	}
}

// The reuse hazard: a peer keeps its mapping of a buffer the target
// unregistered, and the target registers new memory (at the same address
// when the kernel hands it back). The peer's copies into the old buffer
// fail, and not one byte reaches the new memory.
func TestSHMUnregisteredWhileMapped(t *testing.T) {
	ctx := context.Background()
	target := newEngine(t, withProtocol(engine.ProtocolAuto))
	const size = 1 << 20
	old := register(t, target, size, true)
	oldAddr := old.Addr()
	init := newEngine(t, withProtocol(engine.ProtocolAuto))
	lm := register(t, init, size, false)
	fill(lm.Bytes(), 9)
	seg := openSeg(t, init, target.SegmentName())
	if seg.Transport() != engine.ProtocolSHM {
		t.Fatalf("opened over %q", seg.Transport())
	}
	// Writers keep going while the buffer is unregistered under them.
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var mu sync.Mutex
	var otherErr error
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				err := init.Transfer(ctx, engine.Request{Op: engine.Write, Source: lm.Addr(), Segment: seg, Target: oldAddr, Length: size})
				if err != nil && !errors.Is(err, shm.ErrRetired) {
					mu.Lock()
					otherErr = err
					mu.Unlock()
				}
			}
		}()
	}
	time.Sleep(20 * time.Millisecond)
	if err := target.UnregisterMemory(ctx, old); err != nil {
		t.Fatal(err)
	}
	// After UnregisterMemory returned, every copy into the old buffer
	// fails.
	err := init.Transfer(ctx, engine.Request{Op: engine.Write, Source: lm.Addr(), Segment: seg, Target: oldAddr, Length: size})
	if !errors.Is(err, shm.ErrRetired) || !strings.Contains(err.Error(), "open the segment again") {
		t.Fatalf("write into an unregistered buffer: %v, want ErrRetired", err)
	}
	fresh := register(t, target, size, true)
	t.Logf("old buffer at 0x%x, new at 0x%x", oldAddr, fresh.Addr())
	time.Sleep(20 * time.Millisecond)
	close(stop)
	wg.Wait()
	if otherErr != nil {
		t.Fatalf("a writer failed otherwise: %v", otherErr)
	}
	if i := firstDiff(fresh.Bytes(), make([]byte, size)); i >= 0 {
		t.Fatalf("byte %d of the new buffer is %d: a late write reached reused memory", i, fresh.Bytes()[i])
	}
	// A fresh handle reaches the new buffer.
	seg2 := openSeg(t, init, target.SegmentName())
	if err := init.Transfer(ctx, engine.Request{Op: engine.Write, Source: lm.Addr(), Segment: seg2, Target: fresh.Addr(), Length: size}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(fresh.Bytes(), lm.Bytes()) {
		t.Fatal("write through a fresh handle did not land")
	}
}

func TestSHMSegmentCloseUnmapsAfterCopies(t *testing.T) {
	ctx := context.Background()
	target := newEngine(t, withProtocol(engine.ProtocolAuto))
	tm := register(t, target, 4<<20, true)
	init := newEngine(t, withProtocol(engine.ProtocolAuto))
	lm := register(t, init, 4<<20, false)
	seg, err := init.OpenSegment(ctx, target.SegmentName())
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				err := init.Transfer(ctx, engine.Request{Op: engine.Read, Source: lm.Addr(), Segment: seg, Target: tm.Addr(), Length: 4 << 20})
				if err != nil && !errors.Is(err, engine.ErrSegmentClosed) {
					t.Errorf("read racing Close: %v", err)
					return
				}
			}
		}()
	}
	time.Sleep(5 * time.Millisecond)
	if err := seg.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	err = init.Transfer(ctx, engine.Request{Op: engine.Read, Source: lm.Addr(), Segment: seg, Target: tm.Addr(), Length: 1})
	if !errors.Is(err, engine.ErrSegmentClosed) {
		t.Fatalf("read on a closed segment: %v", err)
	}
	// Segment.Close and the engine's close unmap the peer's memory:
	// mappings of a region are counted in /proc/self/maps.
	mapped := func() int { b, _ := os.ReadFile("/proc/self/maps"); return bytes.Count(b, []byte("/memfd:mc-shm")) }
	base := mapped()
	seg2, err := init.OpenSegment(ctx, target.SegmentName())
	if err != nil {
		t.Fatal(err)
	}
	if n := mapped(); n != base+1 {
		t.Fatalf("%d region mappings after opening the segment, want %d", n, base+1)
	}
	// A second handle on the same peer shares the mapping; it goes with
	// the last handle.
	seg3, err := init.OpenSegment(ctx, target.SegmentName())
	if err != nil {
		t.Fatal(err)
	}
	if n := mapped(); n != base+1 {
		t.Fatalf("%d region mappings with two handles open, want %d (shared)", n, base+1)
	}
	seg2.Close()
	if err := init.Transfer(ctx, engine.Request{Op: engine.Read, Source: lm.Addr(), Segment: seg3, Target: tm.Addr(), Length: 4 << 20}); err != nil {
		t.Fatalf("read through the handle left open: %v", err)
	}
	seg3.Close()
	if n := mapped(); n != base {
		t.Fatalf("%d region mappings after closing both handles, want %d", n, base)
	}
	if _, err := init.OpenSegment(ctx, target.SegmentName()); err != nil {
		t.Fatal(err)
	}
	b, _ := init.AllocateBatch(1)
	init.Close()
	if n := mapped(); n != base {
		t.Fatalf("%d region mappings after closing the engine, want %d", n, base)
	}
	b.Submit(engine.Request{Op: engine.Read, Source: lm.Addr(), Segment: seg2, Target: tm.Addr(), Length: 1})
	if err := b.Wait(ctx); !errors.Is(err, engine.ErrEngineClosed) {
		t.Fatalf("request after the engine closed: %v", err)
	}
}

// The target is another process, SIGKILLed while batches are in flight:
// the outstanding tasks fail (never a hang, never a fault) well within
// the status timeout, and so does everything after.
func TestSHMTargetKilledMidBatch(t *testing.T) {
	ctx := context.Background()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childTargetEnv+"=1")
	cmd.Stderr = os.Stderr
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close(); cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("child target: %v", err)
	}
	var name string
	var addr uint64
	if _, err := fmt.Sscan(line, &name, &addr); err != nil {
		t.Fatalf("child said %q: %v", line, err)
	}
	const timeout = 2 * time.Second
	init := newEngine(t, withProtocol(engine.ProtocolSHM), func(c *engine.Config) { c.TCPStatusTimeout = timeout })
	lm := register(t, init, 64<<20, false)
	seg := openSeg(t, init, name)
	if seg.Transport() != engine.ProtocolSHM {
		t.Fatalf("child's segment opened over %q", seg.Transport())
	}
	errc := make(chan error, 2)
	var batches sync.WaitGroup
	for g := range 2 {
		batches.Add(1)
		go func() {
			defer batches.Done()
			op := engine.Opcode(g)
			for {
				b, _ := init.AllocateBatch(32)
				for i := range 32 {
					off := uint64(i) << 20
					b.Submit(engine.Request{Op: op, Source: lm.Addr() + off, Segment: seg, Target: addr + off, Length: 1 << 20})
				}
				wctx, cancel := context.WithTimeout(ctx, timeout)
				err := b.Wait(wctx)
				cancel()
				if err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	cmd.Process.Signal(syscall.SIGKILL)
	for range 2 {
		select {
		case err := <-errc:
			if !errors.Is(err, shm.ErrPeerExited) {
				t.Fatalf("after the kill: %v, want ErrPeerExited", err)
			}
			oneLine(t, err)
			t.Logf("after %v: %v", time.Since(start), err)
		case <-time.After(timeout + time.Second):
			t.Fatal("a batch still waiting past the status timeout after the target was killed")
		}
	}
	batches.Wait()
	err = init.Transfer(ctx, engine.Request{Op: engine.Write, Source: lm.Addr(), Segment: seg, Target: addr, Length: 1})
	if !errors.Is(err, shm.ErrPeerExited) {
		t.Fatalf("write to a dead target: %v", err)
	}
	// Opening it again fails: the process is gone.
	if _, err := init.OpenSegment(ctx, name); err == nil {
		t.Fatal("opened the segment of a killed target")
	}
}
