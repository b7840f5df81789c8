package coll

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine"
	"github.com/kvcache-ops/mc/pkg/engine/meta"
)

// testCluster is n ranks in one process: each its own engine on loopback
// TCP, all sharing one metadata backend (which is also the rendezvous).
type testCluster struct {
	t    testing.TB
	be   meta.Backend
	st   meta.Store
	name string
	cfg  Config
	// protocols[r] is rank r's engine.Config.Protocol ("": tcp).
	protocols []string
	engines   []*engine.Engine
	groups    []*Group
}

var clusterSeq sync.Mutex
var clusterN int

// small test geometry: slots of 256 bytes, so a few hundred elements
// already cross slots and take the ring.
func testConfig() Config {
	return Config{Slots: 2, SlotSize: 256, SmallSize: 128, Timeout: 5 * time.Second}
}

func newCluster(t testing.TB, be meta.Backend, world, maxWorld int, cfg Config) *testCluster {
	t.Helper()
	return newClusterOver(t, be, world, maxWorld, cfg, nil)
}

// newClusterOver is newCluster with rank r's engine under protocols[r]
// (missing or "": tcp).
func newClusterOver(t testing.TB, be meta.Backend, world, maxWorld int, cfg Config, protocols []string) *testCluster {
	t.Helper()
	st, err := meta.StoreOf(be)
	if err != nil {
		t.Fatal(err)
	}
	clusterSeq.Lock()
	clusterN++
	name := fmt.Sprintf("%s-%d", t.Name(), clusterN)
	clusterSeq.Unlock()
	c := &testCluster{t: t, be: be, st: st, name: name, cfg: cfg, protocols: protocols}
	c.engines = make([]*engine.Engine, maxWorld)
	c.groups = make([]*Group, maxWorld)
	for r := 0; r < world; r++ {
		c.engines[r] = c.newEngine(r)
	}
	errs := c.parallel(world, func(r int) error {
		g, err := New(context.Background(), c.config(r, world, maxWorld))
		c.groups[r] = g
		return err
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	t.Cleanup(c.close)
	return c
}

func (c *testCluster) config(r, world, maxWorld int) Config {
	cfg := c.cfg
	cfg.Group, cfg.Rank, cfg.WorldSize, cfg.MaxWorldSize = c.name, r, world, maxWorld
	cfg.Engine, cfg.Store = c.engines[r], c.st
	return cfg
}

var engineSeq int
var engineMu sync.Mutex

func (c *testCluster) newEngine(r int) *engine.Engine {
	c.t.Helper()
	engineMu.Lock()
	engineSeq++
	name := fmt.Sprintf("%s-r%d-%d", c.name, r, engineSeq)
	engineMu.Unlock()
	proto := ""
	if r < len(c.protocols) {
		proto = c.protocols[r]
	}
	e, err := engine.New(context.Background(), engine.Config{
		LocalServerName: name, Backend: nopClose{c.be},
		BindAddress: "127.0.0.1", HandshakeAddr: "127.0.0.1:0", TCPStatusTimeout: 5 * time.Second,
		Protocol: proto,
	})
	if err != nil {
		c.t.Fatal(err)
	}
	return e
}

// nopClose keeps the shared backend open when one engine closes.
type nopClose struct{ meta.Backend }

func (nopClose) Close() error { return nil }

// kill closes rank r's engine: its listeners go, its segment is withdrawn.
func (c *testCluster) kill(r int) {
	c.engines[r].Close()
	c.groups[r] = nil
}

func (c *testCluster) close() {
	for r, g := range c.groups {
		if g != nil {
			g.Close()
		}
		if c.engines[r] != nil {
			c.engines[r].Close()
		}
	}
}

// parallel runs f for ranks [0, n) at once and returns their errors.
func (c *testCluster) parallel(n int, f func(r int) error) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := 0; r < n; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = f(r)
		}()
	}
	wg.Wait()
	return errs
}

// each runs f on every live group at once and fails the test on an error.
func (c *testCluster) each(f func(r int, g *Group) error) {
	c.t.Helper()
	errs := c.parallel(len(c.groups), func(r int) error {
		if c.groups[r] == nil {
			return nil
		}
		return f(r, c.groups[r])
	})
	for r, err := range errs {
		if err != nil {
			c.t.Fatalf("rank %d: %v", r, err)
		}
	}
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}
