package server

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine"
	"github.com/kvcache-ops/mc/pkg/store/kvevents"
)

// The KV events port taken: Start fails at once, naming the endpoint,
// before the master listens.
func TestKVEventsPortTaken(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ep := "tcp://" + ln.Addr().String()
	_, err = Start(context.Background(), Config{RPCAddress: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler),
		KVEvents: &kvevents.Config{Endpoint: ep, BackendID: "b"}})
	if !errors.Is(err, syscall.EADDRINUSE) || !strings.Contains(err.Error(), ep) {
		t.Fatalf("Start = %v, want address in use naming %s", err, ep)
	}
}

// A master with events on: a put and a remove through a client reach a
// subscriber as a stored then a removed event of the key.
func TestKVEventsPutRemove(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Start(ctx, Config{RPCAddress: "127.0.0.1:0", SegmentSize: 16 << 20, Engine: engine.Config{BindAddress: "127.0.0.1", HandshakeAddr: "127.0.0.1:0"}, Logger: slog.New(slog.DiscardHandler),
		KVEvents: &kvevents.Config{Endpoint: "tcp://127.0.0.1:0", BackendID: "pool"}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	sub, err := kvevents.Subscribe(ctx, s.KVEvents.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	for s.KVEvents.Stats().Subscribers == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	if err := s.Node.Put(ctx, "0x2a", []byte("value")); err != nil {
		t.Fatal(err)
	}
	if err := s.Node.Remove(ctx, "0x2a", false); err != nil {
		t.Fatal(err)
	}
	var got []string
	for len(got) < 2 {
		b, err := sub.Next()
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range b.Events {
			got = append(got, e.Type+" "+e.ObjectKey+" "+e.Medium+" "+e.BackendID)
			if len(e.SeqHashes) != 1 || e.SeqHashes[0] != 42 {
				t.Errorf("seq_hashes %v, want [42]", e.SeqHashes)
			}
		}
	}
	if want := "stored 0x2a cpu pool,removed 0x2a cpu pool"; strings.Join(got, ",") != want {
		t.Fatalf("events %q, want %s", got, want)
	}
}
