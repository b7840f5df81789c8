package store_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine"
	"github.com/kvcache-ops/mc/pkg/engine/meta"
	"github.com/kvcache-ops/mc/pkg/engine/rdmatransport"
	"github.com/kvcache-ops/mc/pkg/rdma/soft"
	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/ha"
	"github.com/kvcache-ops/mc/pkg/store/master"
)

// fenceTransport makes the engine configs of a node, a stalled writer and
// the clients that come after it, for one transport.
type fenceTransport struct {
	name string
	cfg  func(t *testing.T, who string) engine.Config
}

var softNICs atomic.Int64

func fenceTransports() []fenceTransport {
	return []fenceTransport{
		{"tcp", func(*testing.T, string) engine.Config { return engineConfig() }},
		{"rdma-soft", func(t *testing.T, who string) engine.Config {
			p, err := soft.New(soft.Config{Devices: []soft.DeviceConfig{{Name: fmt.Sprintf("fence%d", softNICs.Add(1))}}})
			if err != nil {
				t.Fatal(err)
			}
			cfg := engineConfig()
			cfg.Protocol = meta.ProtocolRDMA
			cfg.Transports = []engine.TransportFactory{rdmatransport.Factory(rdmatransport.Config{Provider: p})}
			return cfg
		}},
		{"shm", func(*testing.T, string) engine.Config {
			cfg := engineConfig()
			cfg.Protocol = engine.ProtocolSHM
			return cfg
		}},
	}
}

// stall makes w stop between the grant of a put of key and its transfer:
// granted closes when it stops, closing release lets it go on.
func stall(t *testing.T, w *store.Client, key string) (granted chan struct{}, release func()) {
	granted, released := make(chan struct{}), make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(released) }) }
	// A test that fails while the writer is held lets it go before the
	// writer's Close (cleanups run last-registered first), which waits
	// for its calls.
	t.Cleanup(release)
	store.SetAfterPutStart(w, func(keys []string) {
		if len(keys) == 1 && keys[0] == key {
			close(granted)
			<-released
		}
	})
	return granted, release
}

// clientMaker makes a client (a node with a segment size > 0).
type clientMaker func(segSize uint64, mod ...func(*store.Config)) *store.Client

// fenceScenario: a writer is granted a range of the node's segment and
// stalls; change() makes the master forget that grant (a restart, the
// node dropped); then another client fills the segment anew and the
// writer resumes. Its put must fail and every new object must read back
// its own bytes: the stalled writer's bytes never land on them.
//
// With HA the next leader has the grant from the op log and holds its
// range for the writer, so the writer may finish: then its object must
// read back its own bytes (carried says which outcome is expected).
func fenceScenario(t *testing.T, tr fenceTransport, mk clientMaker, carried bool, change func(node *store.Client) clientMaker) {
	ctx := context.Background()
	node := mk(16<<20, func(cfg *store.Config) { cfg.EngineConfig = tr.cfg(t, "node") })
	w := mk(0, func(cfg *store.Config) { cfg.EngineConfig = tr.cfg(t, "writer") })
	if seg, _ := node.Segment(); tr.name == "rdma-soft" && seg.Protocol != "rdma" {
		t.Fatalf("node's segment protocol %q, want rdma", seg.Protocol)
	}
	// Objects on the segment before the change: with HA the next leader
	// has them from the op log and takes the segment back as it is.
	const kept = 3
	for i := range kept {
		if err := w.Put(ctx, fmt.Sprintf("kept-%d", i), value(512<<10, byte(100+i))); err != nil {
			t.Fatalf("put kept-%d: %v", i, err)
		}
	}
	granted, release := stall(t, w, "stale")
	stale := bytes.Repeat([]byte{0xEE}, 4<<20)
	done := make(chan error, 1)
	go func() { done <- w.Put(ctx, "stale", stale) }()
	select {
	case <-granted:
	case err := <-done:
		t.Fatalf("stalled put ended before its grant: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no grant for the stalled put")
	}
	mk2 := change(node)
	r := mk2(0, func(cfg *store.Config) { cfg.EngineConfig = tr.cfg(t, "reader") })
	const n = 8
	for i := range n {
		if err := r.Put(ctx, fmt.Sprintf("new-%d", i), value(1<<20, byte(i+1))); err != nil {
			t.Fatalf("put new-%d after the change: %v", i, err)
		}
	}
	release()
	var staleErr error
	select {
	case staleErr = <-done:
		t.Logf("stalled writer: %v", staleErr)
	case <-time.After(30 * time.Second):
		t.Fatal("the stalled writer never finished")
	}
	switch {
	case staleErr == nil && !carried:
		t.Fatal("the stalled writer's put succeeded; want an error")
	case staleErr != nil && carried:
		t.Fatalf("the stalled writer's grant was carried over, but its put failed: %v", staleErr)
	}
	wrong := 0
	for i := range n {
		k := fmt.Sprintf("new-%d", i)
		got, err := r.Get(ctx, k)
		if err != nil {
			t.Errorf("get %s: %v", k, err)
			continue
		}
		if !bytes.Equal(got, value(1<<20, byte(i+1))) {
			wrong++
		}
	}
	if wrong > 0 {
		t.Fatalf("%d of %d objects read back another object's bytes", wrong, n)
	}
	if staleErr == nil {
		if got, err := r.Get(ctx, "stale"); err != nil || !bytes.Equal(got, stale) {
			t.Fatalf("get of the stalled writer's acknowledged object: %v (or wrong bytes)", err)
		}
	} else if ok, _ := r.Exist(ctx, "stale"); ok {
		t.Fatal("the stalled writer's put failed, yet its object exists")
	}
	// What survived the change reads back its own bytes too.
	for i := range kept {
		k := fmt.Sprintf("kept-%d", i)
		if got, err := r.Get(ctx, k); err == nil && !bytes.Equal(got, value(512<<10, byte(100+i))) {
			t.Fatalf("get %s: another object's bytes", k)
		}
	}
}

// haCluster is an embedded etcd and two HA candidates; client returns a
// client of the cluster through etcd://.
type haCluster struct {
	t       *testing.T
	direct  string
	cluster string
	eps     []string
	cands   []*ha.Candidate
}

func startHA(t *testing.T) *haCluster {
	e, err := meta.StartEtcd(context.Background(), meta.EtcdConfig{Listen: "127.0.0.1:0", NoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	h := &haCluster{t: t, eps: e.Endpoints(), direct: "etcd://" + strings.Join(e.Endpoints(), ";"), cluster: strings.ReplaceAll(t.Name(), "/", "_")}
	h.candidate()
	h.candidate()
	return h
}

func (h *haCluster) candidate() {
	c, err := ha.Start(context.Background(), ha.Config{
		Endpoints: h.eps, ClusterID: h.cluster, RPCAddress: "127.0.0.1:0", AdminAddress: "127.0.0.1:0",
		LeaseTTL: 2 * time.Second, Master: master.Config{RegionSize: 1 << 20},
	})
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(c.Close)
	h.cands = append(h.cands, c)
}

func (h *haCluster) leader() *ha.Candidate {
	h.t.Helper()
	var l *ha.Candidate
	waitFor(h.t, "an HA leader", 20*time.Second, func() bool {
		for _, c := range h.cands {
			if c.Leading() {
				l = c
				return true
			}
		}
		return false
	})
	return l
}

// kill kills candidate c and forgets it.
func (h *haCluster) kill(c *ha.Candidate) {
	h.cands = slices.DeleteFunc(h.cands, func(x *ha.Candidate) bool { return x == c })
	c.Kill()
}

func (h *haCluster) client(segSize uint64, mod ...func(*store.Config)) *store.Client {
	h.t.Helper()
	cfg := store.Config{Master: h.direct, ClusterID: h.cluster, EngineConfig: engineConfig(), SegmentSize: segSize,
		PingInterval: 50 * time.Millisecond, StagingSize: 8 << 20}
	for _, f := range mod {
		f(&cfg)
	}
	cl, err := store.New(context.Background(), cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		cl.Close(ctx)
	})
	return cl
}

// The HA leader is killed while a writer holds a grant; the next leader
// has the segment's objects from the op log and the node re-mounts with
// them.
func TestFenceHAFailover(t *testing.T) {
	for _, tr := range fenceTransports() {
		t.Run(tr.name, func(t *testing.T) {
			h := startHA(t)
			old := h.leader()
			fenceScenario(t, tr, h.client, true, func(node *store.Client) clientMaker {
				before := node.Stats().Remounts
				h.kill(old)
				next := h.leader()
				waitFor(t, "the node to re-mount on the next leader", 20*time.Second, func() bool {
					m := next.Master()
					return m != nil && len(m.Segments()) == 1 && node.Stats().Remounts > before
				})
				return h.client
			})
		})
	}
}

// A single master restarts while a writer holds a grant: the node renews
// its segment on re-mount, so the late write reaches nothing.
func TestFenceMasterRestart(t *testing.T) {
	for _, tr := range fenceTransports() {
		t.Run(tr.name, func(t *testing.T) {
			c := startMaster(t, master.Config{})
			fenceScenario(t, tr, c.client, false, func(node *store.Client) clientMaker {
				c.stop()
				c2 := startMasterOn(t, c.addr, master.Config{})
				waitFor(t, "the node to re-mount on the new master", 10*time.Second, func() bool {
					return len(c2.m.Segments()) == 1 && node.Stats().Renewals > 0
				})
				return c2.client
			})
		})
	}
}

// The master drops a node (here: it unregisters; in life: the node was
// silent past client_ttl) while a writer holds a grant in its segment;
// the node re-mounts with renewed memory.
func TestFenceNodeRemount(t *testing.T) {
	for _, tr := range fenceTransports() {
		t.Run(tr.name, func(t *testing.T) {
			c := startMaster(t, master.Config{})
			fenceScenario(t, tr, c.client, false, func(node *store.Client) clientMaker {
				if err := c.m.UnregisterClient(node.ID()); err != nil {
					t.Fatal(err)
				}
				waitFor(t, "the node to re-mount", 10*time.Second, func() bool {
					return len(c.m.Segments()) == 1 && node.Stats().Renewals > 0
				})
				return c.client
			})
		})
	}
}

// A reader stopped between its replica list and the end of its read for
// longer than its read lease: the object may have been evicted and its
// range given to another in between, so the get fails LEASE_EXPIRED
// instead of returning what it read (before, it returned the bytes of
// whatever had been put there since: here, another key's).
func TestGetPastLeaseNotReturned(t *testing.T) {
	c := startMaster(t, master.Config{KVLeaseTTL: 150 * time.Millisecond})
	c.client(16 << 20)
	reader := c.client(0)
	writer := c.client(0)
	ctx := context.Background()
	v := value(1<<20, 7)
	if err := writer.Put(ctx, "k", v); err != nil {
		t.Fatal(err)
	}
	var other []byte
	store.SetBeforeTransfer(reader, func() {
		// While the reader is stopped past its lease, k goes and another
		// object takes its range.
		time.Sleep(200 * time.Millisecond)
		if err := writer.Remove(ctx, "k", false); err != nil {
			t.Errorf("remove: %v", err)
		}
		other = value(1<<20, 8)
		if err := writer.Put(ctx, "other", other); err != nil {
			t.Errorf("put: %v", err)
		}
	})
	got, err := reader.Get(ctx, "k")
	if store.CodeOf(err) != store.LeaseExpired {
		same := "its own bytes"
		if !bytes.Equal(got, v) {
			same = "other bytes"
		}
		t.Fatalf("a get that outlived its lease: %v (returned %d bytes, %s); want LEASE_EXPIRED", err, len(got), same)
	}
	t.Logf("%v", err)
	store.SetBeforeTransfer(reader, nil)
	if got, err := reader.Get(ctx, "other"); err != nil || !bytes.Equal(got, other) {
		t.Fatalf("a get within its lease: %v", err)
	}
}
