package rdma_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/diag"
	"github.com/kvcache-ops/mc/pkg/diag/glog"
	"github.com/kvcache-ops/mc/pkg/rdma"
	"github.com/kvcache-ops/mc/pkg/rdma/soft"
)

// syncBuffer is a log sink shared by goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func captureLogs(t testing.TB) *syncBuffer {
	t.Helper()
	return captureLogsAt(t, slog.LevelInfo)
}

func captureLogsAt(t testing.TB, level slog.Level) *syncBuffer {
	t.Helper()
	buf := &syncBuffer{}
	old := slog.Default()
	glog.Setup(buf, level)
	t.Cleanup(func() { slog.SetDefault(old) })
	return buf
}

// fabric is a set of soft NICs in this process and the contexts opened on
// them; its Exchange delivers connection requests to the context that
// owns the target NIC path, as the handshake socket would.
type fabric struct {
	p    *soft.Provider
	mu   sync.Mutex
	ctxs map[string]*rdma.Context
}

func newFabric(t testing.TB, cfg soft.Config) *fabric {
	t.Helper()
	p, err := soft.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return &fabric{p: p, ctxs: map[string]*rdma.Context{}}
}

func (f *fabric) exchange(_ context.Context, req rdma.ConnectionDesc) (rdma.ConnectionDesc, error) {
	f.mu.Lock()
	c := f.ctxs[req.PeerNICPath]
	f.mu.Unlock()
	if c == nil {
		return rdma.ConnectionDesc{}, fmt.Errorf("no NIC %s", req.PeerNICPath)
	}
	req.PeerNICPath = c.NICPath() // aliases: several names, one NIC
	return c.Accept(req), nil
}

func (f *fabric) open(t testing.TB, server, dev string, cfg rdma.Config) *rdma.Context {
	t.Helper()
	cfg.ServerName = server
	cfg.Exchange = f.exchange
	c, err := rdma.NewContext(f.p, dev, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	f.mu.Lock()
	f.ctxs[c.NICPath()] = c
	f.mu.Unlock()
	return c
}

// region is registered memory on one context.
type region struct {
	buf []byte
	mr  rdma.MR
}

func register(t testing.TB, c *rdma.Context, size int) region {
	t.Helper()
	buf := make([]byte, size)
	mr, err := c.RegisterMemory(buf)
	if err != nil {
		t.Fatal(err)
	}
	return region{buf, mr}
}

// post posts one slice and returns a channel with its completion.
func post(t testing.TB, e *rdma.Endpoint, op rdma.Opcode, local region, loff int, remote region, roff int, n int) <-chan rdma.WC {
	t.Helper()
	ch := make(chan rdma.WC, 1)
	err := e.Post(rdma.Slice{Op: op, LocalAddr: local.mr.Addr() + uint64(loff), LKey: local.mr.LKey(), Length: uint32(n),
		RemoteAddr: remote.mr.Addr() + uint64(roff), RKey: remote.mr.RKey()}, func(wc rdma.WC) { ch <- wc })
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

func wait(t testing.TB, ch <-chan rdma.WC) rdma.WC {
	t.Helper()
	select {
	case wc := <-ch:
		return wc
	case <-time.After(10 * time.Second):
		t.Fatal("no completion")
	}
	return rdma.WC{}
}

func fill(b []byte, seed byte) {
	for i := range b {
		b[i] = byte(i*13) ^ seed
	}
}

// eventually polls cond until it holds or fails the test.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestEndpointWriteReadVerify(t *testing.T) {
	// Debug: the store line of a type already announced is at debug.
	logs := captureLogsAt(t, slog.LevelDebug)
	f := newFabric(t, soft.Config{Devices: []soft.DeviceConfig{{Name: "soft0"}, {Name: "soft1"}}})
	a := f.open(t, "init", "soft0", rdma.Config{})
	b := f.open(t, "target", "soft1", rdma.Config{StoreType: rdma.FIFO})
	la, rb := register(t, a, 1<<20), register(t, b, 1<<20)
	fill(la.buf, 1)
	fill(rb.buf, 2)
	want := bytes.Clone(rb.buf)
	e, err := a.Endpoint(context.Background(), "target@soft1")
	if err != nil {
		t.Fatal(err)
	}
	// 16 slices of 64 KiB: WRITE the first half, READ the second half.
	var chs []<-chan rdma.WC
	for i := 0; i < 8; i++ {
		chs = append(chs, post(t, e, rdma.OpWrite, la, i<<16, rb, i<<16, 1<<16))
		chs = append(chs, post(t, e, rdma.OpRead, la, (8+i)<<16, rb, (8+i)<<16, 1<<16))
	}
	for _, ch := range chs {
		if wc := wait(t, ch); wc.Status != rdma.WCSuccess {
			t.Fatalf("completion %+v", wc)
		}
	}
	if !bytes.Equal(rb.buf[:512<<10], la.buf[:512<<10]) {
		t.Fatal("written half differs")
	}
	if !bytes.Equal(la.buf[512<<10:], want[512<<10:]) {
		t.Fatal("read half differs")
	}
	if e.Outstanding() != 0 {
		t.Fatalf("outstanding %d", e.Outstanding())
	}
	// The passive side has an endpoint to the initiator's NIC, paired
	// (connected once it posts itself).
	if pe := b.Store().Get("init@soft0"); pe == nil || !pe.Paired() {
		t.Fatal("no passive endpoint on the target")
	}
	if st := a.Stats(); st.LiveEndpoints != 1 || st.AllocatedQPs != 2 || !st.Active {
		t.Fatalf("stats %+v", st)
	}
	l := logs.String()
	if !strings.Contains(l, "] Using SIEVE endpoint store local_nic=soft0\n") || !strings.Contains(l, "] Using FIFO endpoint store local_nic=soft1\n") {
		t.Fatalf("store lines missing:\n%s", l)
	}
}

func TestMaxEndpointsClamped(t *testing.T) {
	f := newFabric(t, soft.Config{Devices: []soft.DeviceConfig{{Name: "soft0", MaxQP: 10}}})
	c := f.open(t, "s", "soft0", rdma.Config{QPsPerEndpoint: 3})
	if got := c.Stats().MaxEndpoints; got != 3 {
		t.Fatalf("max endpoints %d, want 10/3 = 3", got)
	}
}

// incident replays the production failure: a peer keeps failing, so
// slices to it time out, evictions and error-path deletions continue,
// and then inserts stop.
type incident struct {
	f        *fabric
	a        *rdma.Context
	target   region
	local    region
	peerLID  uint16
	maxEP    int
	finished chan struct{}
}

const (
	incMaxEP   = 4
	incPeers   = 20
	incQPPerEP = 2
	incTick    = 40 * time.Millisecond
)

func startIncident(t *testing.T, leaky bool) *incident {
	// The pool holds exactly (max endpoints + busy endpoints) x QPs per
	// endpoint: every endpoint below stays busy until the slices fail.
	pool := (incMaxEP + incPeers - incMaxEP) * incQPPerEP
	f := newFabric(t, soft.Config{
		Devices:      []soft.DeviceConfig{{Name: "soft0", MaxQP: pool}, {Name: "soft1"}},
		RetryTimeout: 800 * time.Millisecond,
	})
	cfg := rdma.Config{MaxEndpoints: incMaxEP, QPsPerEndpoint: incQPPerEP, MonitorInterval: incTick}
	if leaky {
		cfg = rdma.WithReclaimAfterInsertOnly(cfg)
	}
	a := f.open(t, "prefill", "soft0", cfg)
	// One target context accepts for many peer names: each "peerN@soft1"
	// is routed to it, as if N servers shared that NIC name.
	b := f.open(t, "decode", "soft1", rdma.Config{})
	f.mu.Lock()
	for i := 0; i < incPeers+1; i++ {
		f.ctxs[fmt.Sprintf("peer%d@soft1", i)] = b
	}
	f.mu.Unlock()
	inc := &incident{f: f, a: a, target: register(t, b, 1<<20), local: register(t, a, 1<<20), peerLID: b.Port().LID, maxEP: incMaxEP, finished: make(chan struct{}, incPeers)}
	return inc
}

func (inc *incident) run(t *testing.T) {
	a := inc.a
	// The peer starts failing: its NIC stops answering. Completion
	// workers are busy elsewhere, so retired endpoints stay busy: their
	// flushed slices are not processed yet.
	if err := inc.f.p.DropPeer("soft0", inc.peerLID); err != nil {
		t.Fatal(err)
	}
	resume := a.PauseWorkers()
	check := func(step string) {
		t.Helper()
		st := a.Stats()
		busy := a.Store().BusyWaiting()
		nic, _ := inc.f.p.AllocatedQPs("soft0")
		if st.AllocatedQPs != nic || st.AllocatedQPs != (st.LiveEndpoints+st.Waiting)*incQPPerEP {
			t.Fatalf("%s: accounting: context %d QPs, NIC %d, endpoints %d live + %d waiting", step, st.AllocatedQPs, nic, st.LiveEndpoints, st.Waiting)
		}
		if limit := (inc.maxEP + busy) * incQPPerEP; st.AllocatedQPs > limit {
			t.Fatalf("%s: %d QPs allocated, bound (max %d + busy %d) x %d = %d", step, st.AllocatedQPs, inc.maxEP, busy, incQPPerEP, limit)
		}
	}
	for i := 0; i < incPeers; i++ {
		path := fmt.Sprintf("peer%d@soft1", i)
		e, err := a.Endpoint(context.Background(), path)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		err = e.Post(rdma.Slice{Op: rdma.OpWrite, LocalAddr: inc.local.mr.Addr(), LKey: inc.local.mr.LKey(), Length: 4096,
			RemoteAddr: inc.target.mr.Addr(), RKey: inc.target.mr.RKey()}, func(wc rdma.WC) {
			if wc.Status != rdma.WCSuccess {
				a.DeleteEndpoint(e) // error path: delete, silently
			}
			inc.finished <- struct{}{}
		})
		if err != nil {
			t.Fatal(err)
		}
		if i%3 == 2 {
			a.DeleteEndpoint(e) // e.g. a failed handshake elsewhere
		}
		check(path)
	}
	st := a.Stats()
	if st.Evictions == 0 || st.Waiting != incPeers-incMaxEP || st.AllocatedQPs != incPeers*incQPPerEP {
		t.Fatalf("scenario did not fill the pool with busy endpoints: %+v", st)
	}
	// Inserts stop. Workers catch up, the failing peer's slices time out
	// and their endpoints are deleted on the error path.
	resume()
	for i := 0; i < incPeers; i++ {
		select {
		case <-inc.finished:
		case <-time.After(10 * time.Second):
			t.Fatalf("only %d of %d slices finished", i, incPeers)
		}
	}
	if busy := a.Store().BusyWaiting(); busy != 0 {
		t.Fatalf("%d endpoints still busy after every slice finished", busy)
	}
}

// TestIncidentReclaimDrivenByMonitor: with inserts stopped, the monitor
// alone reclaims every retired endpoint within two ticks of the last slice
// finishing, so the NIC's QP pool is free again for healthy peers.
func TestIncidentReclaimDrivenByMonitor(t *testing.T) {
	logs := captureLogs(t)
	inc := startIncident(t, false)
	inc.run(t)
	t0 := inc.a.Ticks()
	eventually(t, "two monitor ticks", func() bool { return inc.a.Ticks() >= t0+2 })
	st := inc.a.Stats()
	if st.Waiting != 0 || st.LiveEndpoints != 0 || st.AllocatedQPs != 0 {
		t.Fatalf("two ticks after the slices finished: %+v", st)
	}
	if n, _ := inc.f.p.AllocatedQPs("soft0"); n != 0 {
		t.Fatalf("NIC still has %d QPs", n)
	}
	// A healthy peer can be reached again.
	inc.f.p.RestorePeer("soft0", inc.peerLID)
	e, err := inc.a.Endpoint(context.Background(), fmt.Sprintf("peer%d@soft1", incPeers))
	if err != nil {
		t.Fatal(err)
	}
	fill(inc.local.buf[:4096], 42)
	if wc := wait(t, post(t, e, rdma.OpWrite, inc.local, 0, inc.target, 8192, 4096)); wc.Status != rdma.WCSuccess {
		t.Fatalf("healthy write: %+v", wc)
	}
	if !bytes.Equal(inc.target.buf[8192:12288], inc.local.buf[:4096]) {
		t.Fatal("healthy write bytes differ")
	}
	l := logs.String()
	if n := strings.Count(l, " evicted local_nic=soft0\n"); uint64(n) != st.Evictions {
		t.Fatalf("%d eviction lines for %d evictions", n, st.Evictions)
	}
	if !strings.Contains(l, "Worker: Process failed for slice (opcode: 1, ") || !strings.Contains(l, "local_nic: soft0, peer_nic: peer15@soft1") ||
		!strings.Contains(l, "): transport retry counter exceeded\n") {
		t.Fatalf("slice failure lines missing:\n%s", l)
	}
	if strings.Contains(l, "Failed to create QP") {
		t.Fatalf("QP pool ran out:\n%s", l)
	}
}

// TestIncidentLeaksWhenReclaimFollowsInserts documents the invariant the
// monitor restores: with reclaim only after inserts (Mooncake before
// v0.3.11), the same scenario leaves every retired endpoint and its QPs
// allocated after the slices finished, and the next insert, even to a
// healthy peer, fails with ENOMEM, so reclaim never runs again.
func TestIncidentLeaksWhenReclaimFollowsInserts(t *testing.T) {
	// Debug: both contexts' store lines, whatever was announced before.
	logs := captureLogsAt(t, slog.LevelDebug)
	inc := startIncident(t, true)
	inc.run(t)
	t0 := inc.a.Ticks()
	eventually(t, "five monitor ticks", func() bool { return inc.a.Ticks() >= t0+5 })
	st := inc.a.Stats()
	if st.Waiting != incPeers || st.AllocatedQPs != incPeers*incQPPerEP {
		t.Fatalf("expected the leak (all %d endpoints waiting, %d QPs): %+v", incPeers, incPeers*incQPPerEP, st)
	}
	inc.f.p.RestorePeer("soft0", inc.peerLID)
	for i := 0; i < 3; i++ {
		_, err := inc.a.Endpoint(context.Background(), fmt.Sprintf("peer%d@soft1", incPeers))
		if !errors.Is(err, syscall.ENOMEM) {
			t.Fatalf("insert %d to a healthy peer: %v, want ENOMEM", i, err)
		}
	}
	if n := strings.Count(logs.String(), "] Failed to create QP: Cannot allocate memory [12] local_nic=soft0\n"); n != 3 {
		t.Fatalf("%d QP creation failure lines, want 3:\n%s", n, logs)
	}
	if st := inc.a.Stats(); st.Waiting != incPeers {
		t.Fatalf("waiting list changed without a successful insert: %+v", st)
	}

	// mc diag qp-leak reads mc's own log of the incident as it reads
	// Mooncake's: evictions attributed to the NIC, then ENOMEM.
	sc := diag.NewLogScanner()
	if err := sc.Scan(strings.NewReader(logs.String()), "mc.log"); err != nil {
		t.Fatal(err)
	}
	sum := sc.Summary()
	ds := sum.Stats
	if ds.Evictions != int(st.Evictions) || ds.QPCreateENOMEM != 3 || ds.EvictionsBeforeFirstQPFailure != int(st.Evictions) ||
		ds.SliceFailures != incMaxEP || ds.StoreTypes["SIEVE"] != 2 || ds.Unrecognised != 0 {
		t.Fatalf("diag read %+v; context saw %+v", ds, st)
	}
	if n := sum.NICs["soft0"]; n == nil || n.Evictions != int(st.Evictions) || n.QPCreateFailures != 3 || sum.UnattributedEvictions != 0 {
		t.Fatalf("diag NIC attribution %+v (unattributed %d)", n, sum.UnattributedEvictions)
	}
}

func TestPortDownFlushesAndReenables(t *testing.T) {
	logs := captureLogs(t)
	f := newFabric(t, soft.Config{
		Devices:      []soft.DeviceConfig{{Name: "soft0"}, {Name: "soft1"}, {Name: "soft2"}},
		RetryTimeout: 5 * time.Second,
	})
	cfg := rdma.Config{MonitorInterval: 20 * time.Millisecond, ReenableDelay: 400 * time.Millisecond}
	a0 := f.open(t, "init", "soft0", cfg)
	a1 := f.open(t, "init", "soft1", cfg)
	b := f.open(t, "target", "soft2", rdma.Config{})
	l0, l1, rb := register(t, a0, 1<<20), register(t, a1, 1<<20), register(t, b, 1<<20)
	e0, err := a0.Endpoint(context.Background(), "target@soft2")
	if err != nil {
		t.Fatal(err)
	}
	// Hold soft0's requests on the wire so they are in flight when the
	// port goes down.
	f.p.DropPeer("soft0", b.Port().LID)
	var chs []<-chan rdma.WC
	for i := 0; i < 6; i++ {
		chs = append(chs, post(t, e0, rdma.OpWrite, l0, i<<16, rb, i<<16, 1<<16))
	}
	if err := f.p.SetPortState("soft0", rdma.PortDown); err != nil {
		t.Fatal(err)
	}
	for _, ch := range chs {
		if wc := wait(t, ch); wc.Status != rdma.WCWRFlushErr {
			t.Fatalf("in-flight slice: %+v, want flush error", wc)
		}
	}
	eventually(t, "context inactive", func() bool { return !a0.Active() })
	eventually(t, "endpoints reclaimed", func() bool {
		st := a0.Stats()
		return st.LiveEndpoints == 0 && st.Waiting == 0 && st.AllocatedQPs == 0
	})
	if _, err := a0.Endpoint(context.Background(), "target@soft2"); !errors.Is(err, rdma.ErrContextInactive) {
		t.Fatalf("endpoint on a down NIC: %v", err)
	}
	// The other NIC carries the traffic meanwhile.
	e1, err := a1.Endpoint(context.Background(), "target@soft2")
	if err != nil {
		t.Fatal(err)
	}
	fill(l1.buf, 5)
	for i := 0; i < 6; i++ {
		if wc := wait(t, post(t, e1, rdma.OpWrite, l1, i<<16, rb, i<<16, 1<<16)); wc.Status != rdma.WCSuccess {
			t.Fatalf("soft1: %+v", wc)
		}
	}
	if !bytes.Equal(rb.buf[:6<<16], l1.buf[:6<<16]) {
		t.Fatal("bytes over soft1 differ")
	}

	// Port back up: the context waits ReenableDelay before taking traffic.
	f.p.RestorePeer("soft0", b.Port().LID)
	up := time.Now()
	f.p.SetPortState("soft0", rdma.PortActive)
	eventually(t, "context re-enabled", a0.Active)
	if d := time.Since(up); d < 400*time.Millisecond {
		t.Fatalf("re-enabled after %v, before the 400ms delay", d)
	}
	e0, err = a0.Endpoint(context.Background(), "target@soft2")
	if err != nil {
		t.Fatal(err)
	}
	fill(l0.buf, 9)
	if wc := wait(t, post(t, e0, rdma.OpRead, l0, 0, rb, 0, 1<<16)); wc.Status != rdma.WCSuccess {
		t.Fatalf("after port up: %+v", wc)
	}
	if !bytes.Equal(l0.buf[:1<<16], rb.buf[:1<<16]) {
		t.Fatal("read after port up differs")
	}
	l := logs.String()
	if !strings.Contains(l, "Received context async event port error for context soft0") {
		t.Fatalf("no port error line:\n%s", l)
	}
}

func TestQPPoolExhaustedOnOneNIC(t *testing.T) {
	logs := captureLogs(t)
	f := newFabric(t, soft.Config{Devices: []soft.DeviceConfig{{Name: "soft0", MaxQP: 6}, {Name: "soft1"}, {Name: "soft2"}}})
	a0 := f.open(t, "init", "soft0", rdma.Config{})
	a1 := f.open(t, "init", "soft1", rdma.Config{})
	b := f.open(t, "target", "soft2", rdma.Config{})
	// Something else (another process, leaked endpoints) holds most of
	// soft0's pool.
	d, _ := f.p.Open("soft0")
	defer d.Close()
	pd, _ := d.AllocPD()
	cq, _ := d.CreateCQ(8)
	for i := 0; i < 5; i++ {
		if _, err := pd.CreateQP(rdma.QPInit{SendCQ: cq}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := a0.Endpoint(context.Background(), "target@soft2")
	if !errors.Is(err, syscall.ENOMEM) {
		t.Fatalf("endpoint on the exhausted NIC: %v, want ENOMEM", err)
	}
	if !strings.Contains(err.Error(), "soft0") {
		t.Fatalf("error does not name the NIC: %v", err)
	}
	if st := a0.Stats(); st.AllocatedQPs != 0 || st.QPCreateFails != 1 {
		t.Fatalf("half-built endpoint leaked QPs: %+v", st)
	}
	if !strings.Contains(logs.String(), "] Failed to create QP: Cannot allocate memory [12] local_nic=soft0\n") {
		t.Fatalf("no QP failure line:\n%s", logs)
	}
	// The other NIC still works.
	l1, rb := register(t, a1, 1<<16), register(t, b, 1<<16)
	fill(l1.buf, 3)
	e, err := a1.Endpoint(context.Background(), "target@soft2")
	if err != nil {
		t.Fatal(err)
	}
	if wc := wait(t, post(t, e, rdma.OpWrite, l1, 0, rb, 0, 1<<16)); wc.Status != rdma.WCSuccess || !bytes.Equal(rb.buf, l1.buf) {
		t.Fatalf("write on soft1: %+v", wc)
	}
}

func TestCloseReclaimsEverything(t *testing.T) {
	f := newFabric(t, soft.Config{Devices: []soft.DeviceConfig{{Name: "soft0"}, {Name: "soft1"}}, RetryTimeout: time.Hour})
	a := f.open(t, "init", "soft0", rdma.Config{MonitorInterval: time.Hour})
	b := f.open(t, "target", "soft1", rdma.Config{})
	la, rb := register(t, a, 1<<16), register(t, b, 1<<16)
	e, err := a.Endpoint(context.Background(), "target@soft1")
	if err != nil {
		t.Fatal(err)
	}
	f.p.DropPeer("soft0", b.Port().LID)
	ch := post(t, e, rdma.OpWrite, la, 0, rb, 0, 4096)
	a.Close() // no tick will ever run: Close itself must reclaim
	if wc := wait(t, ch); wc.Status != rdma.WCWRFlushErr {
		t.Fatalf("in-flight slice at close: %+v", wc)
	}
	if n, _ := f.p.AllocatedQPs("soft0"); n != 0 {
		t.Fatalf("%d QPs left after Close", n)
	}
}

// An engine opens one context per NIC; the store line is at info once per
// process (mc diag and operators read it), then at debug per NIC.
func TestStoreLineOncePerProcess(t *testing.T) {
	f := newFabric(t, soft.Config{Devices: []soft.DeviceConfig{{Name: "s0"}, {Name: "s1"}, {Name: "s2"}, {Name: "s3"}, {Name: "s4"}}})
	count := func(buf *syncBuffer) int { return strings.Count(buf.String(), "Using SIEVE endpoint store") }
	info := captureLogs(t)
	for _, dev := range []string{"s0", "s1", "s2"} {
		f.open(t, "srv", dev, rdma.Config{StoreType: rdma.SIEVE})
	}
	// Another test may have announced SIEVE already: at most one.
	if n := count(info); n > 1 {
		t.Fatalf("%d store lines at info for 3 NICs, want at most 1:\n%s", n, info)
	}
	debug := captureLogsAt(t, slog.LevelDebug)
	for _, dev := range []string{"s3", "s4"} {
		f.open(t, "srv", dev, rdma.Config{StoreType: rdma.SIEVE})
	}
	if n := count(debug); n != 2 || !strings.Contains(debug.String(), "local_nic=s4") {
		t.Fatalf("%d store lines at debug for 2 NICs, want 2:\n%s", n, debug)
	}
}
