package rdma_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/rdma"
	"github.com/kvcache-ops/mc/pkg/rdma/soft"
)

// TestShutdownLeavesNoGoroutines: closing contexts and the provider stops
// workers, monitors, wire listeners, readers, writers and watchdogs.
func TestShutdownLeavesNoGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()
	func() {
		p, err := soft.New(soft.Config{Devices: []soft.DeviceConfig{{Name: "soft0"}, {Name: "soft1"}}})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		f := &fabric{p: p, ctxs: map[string]*rdma.Context{}}
		mk := func(server, dev string) *rdma.Context {
			c, err := rdma.NewContext(p, dev, rdma.Config{ServerName: server, Exchange: f.exchange})
			if err != nil {
				t.Fatal(err)
			}
			f.ctxs[c.NICPath()] = c
			return c
		}
		a, b := mk("init", "soft0"), mk("target", "soft1")
		defer a.Close()
		defer b.Close()
		la, rb := register(t, a, 1<<16), register(t, b, 1<<16)
		e, err := a.Endpoint(context.Background(), "target@soft1")
		if err != nil {
			t.Fatal(err)
		}
		if wc := wait(t, post(t, e, rdma.OpWrite, la, 0, rb, 0, 1<<16)); wc.Status != rdma.WCSuccess {
			t.Fatal(wc)
		}
	}()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines before, %d after:\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(5 * time.Millisecond)
	}
}
