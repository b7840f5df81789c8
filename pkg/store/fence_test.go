package store_test

import (
	"bytes"
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine"
	"github.com/kvcache-ops/mc/pkg/engine/meta"
	"github.com/kvcache-ops/mc/pkg/engine/rdmatransport"
	"github.com/kvcache-ops/mc/pkg/rdma/soft"
	"github.com/kvcache-ops/mc/pkg/store"
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
func stall(w *store.Client, key string) (granted, release chan struct{}) {
	granted, release = make(chan struct{}), make(chan struct{})
	store.SetAfterPutStart(w, func(keys []string) {
		if len(keys) == 1 && keys[0] == key {
			close(granted)
			<-release
		}
	})
	return granted, release
}

// fenceScenario: a writer is granted a range of the node's segment and
// stalls; change() makes the master forget that grant (a restart, the
// node dropped); then another client fills the segment anew and the
// writer resumes. Its put must fail and every new object must read back
// its own bytes: the stalled writer's bytes never land on them.
func fenceScenario(t *testing.T, tr fenceTransport, c *cluster, change func(node *store.Client) *cluster) {
	ctx := context.Background()
	node := c.client(16<<20, func(cfg *store.Config) { cfg.EngineConfig = tr.cfg(t, "node") })
	w := c.client(0, func(cfg *store.Config) { cfg.EngineConfig = tr.cfg(t, "writer") })
	if seg, _ := node.Segment(); tr.name == "rdma-soft" && seg.Protocol != "rdma" {
		t.Fatalf("node's segment protocol %q, want rdma", seg.Protocol)
	}
	granted, release := stall(w, "stale")
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
	c2 := change(node)
	r := c2.client(0, func(cfg *store.Config) { cfg.EngineConfig = tr.cfg(t, "reader") })
	const n = 12
	for i := range n {
		if err := r.Put(ctx, fmt.Sprintf("new-%d", i), value(1<<20, byte(i+1))); err != nil {
			t.Fatalf("put new-%d after the change: %v", i, err)
		}
	}
	close(release)
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("the stalled writer's put succeeded; want an error")
		}
		t.Logf("stalled writer: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the stalled writer never finished")
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
	if ok, _ := r.Exist(ctx, "stale"); ok {
		t.Fatal("the stalled writer's object exists")
	}
}

// A single master restarts while a writer holds a grant: the node renews
// its segment on re-mount, so the late write reaches nothing.
func TestFenceMasterRestart(t *testing.T) {
	for _, tr := range fenceTransports() {
		t.Run(tr.name, func(t *testing.T) {
			c := startMaster(t, master.Config{})
			fenceScenario(t, tr, c, func(node *store.Client) *cluster {
				c.stop()
				c2 := startMasterOn(t, c.addr, master.Config{})
				waitFor(t, "the node to re-mount on the new master", 10*time.Second, func() bool {
					return len(c2.m.Segments()) == 1 && node.Stats().Renewals > 0
				})
				return c2
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
			fenceScenario(t, tr, c, func(node *store.Client) *cluster {
				if err := c.m.UnregisterClient(node.ID()); err != nil {
					t.Fatal(err)
				}
				waitFor(t, "the node to re-mount", 10*time.Second, func() bool {
					return len(c.m.Segments()) == 1 && node.Stats().Renewals > 0
				})
				return c
			})
		})
	}
}
