package server

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine"
	"github.com/kvcache-ops/mc/pkg/store/kvevents"
)

// childEnv names the KV events endpoint of a child master (TestMain).
const childEnv = "MC_KVEVENTS_TEST_CHILD_ENDPOINT"

func TestMain(m *testing.M) {
	if ep := os.Getenv(childEnv); ep != "" {
		os.Exit(childMaster(ep))
	}
	if os.Getenv(capChildEnv) != "" {
		os.Exit(capChild())
	}
	os.Exit(m.Run())
}

// childMaster runs a master publishing on ep; once a subscriber is
// there it puts 0x1, 0x2 and 0x3, then waits to be killed.
func childMaster(ep string) int {
	ctx := context.Background()
	s, err := Start(ctx, Config{RPCAddress: "127.0.0.1:0", SegmentSize: 16 << 20, Engine: engine.Config{BindAddress: "127.0.0.1", HandshakeAddr: "127.0.0.1:0"},
		Logger: slog.New(slog.DiscardHandler), KVEvents: &kvevents.Config{Endpoint: ep, BackendID: "pool"}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	for s.KVEvents.Stats().Subscribers == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	for _, k := range []string{"0x1", "0x2", "0x3"} {
		if err := s.Node.Put(ctx, k, []byte("v")); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	select {}
}

// The master SIGKILLed and restarted on the same endpoint: a subscriber
// sees the publisher go, reconnects by itself, and the new master's
// sequence starts again at 1.
func TestKVEventsMasterKilledAndRestarted(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ep := "tcp://" + ln.Addr().String()
	ln.Close()
	var mu sync.Mutex
	var log []string
	add := func(s string) { mu.Lock(); log = append(log, s); mu.Unlock() }
	text := func() string { mu.Lock(); defer mu.Unlock(); return strings.Join(log, "; ") }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- kvevents.Follow(ctx, ep, kvevents.Follower{
			Waiting:   func(error) { add("waiting") },
			Restarted: func(seq uint64) { add(fmt.Sprintf("restarted at %d", seq)) },
			Batch: func(b kvevents.Batch, lost uint64) {
				if b.Seq == 1 {
					add("seq 1")
				}
				for _, e := range b.Events { // batches may hold several
					add(e.Type + " " + e.ObjectKey)
				}
			},
		})
	}()
	start := func() *exec.Cmd {
		c := exec.Command(os.Args[0], "-test.run=^$")
		c.Env = append(os.Environ(), childEnv+"="+ep)
		c.Stderr = os.Stderr
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Process.Kill(); c.Wait() })
		return c
	}
	wait := func(what, suffix string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !strings.HasSuffix(text(), suffix) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s: %q", what, text())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	child := start()
	first := "waiting; seq 1; stored 0x1; stored 0x2; stored 0x3"
	wait("the first master's events", first)
	if err := child.Process.Kill(); err != nil { // SIGKILL
		t.Fatal(err)
	}
	child.Wait()
	wait("the subscriber to see the master go", first+"; waiting")
	start()
	wait("the restarted master's events", first+"; waiting; restarted at 1; seq 1; stored 0x1; stored 0x2; stored 0x3")
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
