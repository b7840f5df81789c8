package ha_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/store/ha"
	"github.com/kvcache-ops/mc/pkg/store/kvevents"
)

// eventLog is what one subscriber (kvevents.Follow) received.
type eventLog struct {
	mu        sync.Mutex
	batches   []kvevents.Batch
	restarts  []uint64
	connected chan struct{}
	once      sync.Once
}

func follow(t *testing.T, endpoint string) *eventLog {
	t.Helper()
	l := &eventLog{connected: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		_ = kvevents.Follow(ctx, endpoint, kvevents.Follower{
			Connected: func() { l.once.Do(func() { close(l.connected) }) },
			Batch: func(b kvevents.Batch, _ uint64) {
				l.mu.Lock()
				l.batches = append(l.batches, b)
				l.mu.Unlock()
			},
			Restarted: func(seq uint64) {
				l.mu.Lock()
				l.restarts = append(l.restarts, seq)
				l.mu.Unlock()
			},
		})
	}()
	select {
	case <-l.connected:
	case <-time.After(5 * time.Second):
		t.Fatalf("no connection to the KV events publisher %s", endpoint)
	}
	return l
}

// kind is "stored" or "removed".
func kind(e kvevents.Event) string {
	if strings.Contains(strings.ToLower(e.Type), "remov") {
		return "removed"
	}
	return "stored"
}

// events lists "stored KEY" / "removed KEY" from batch from on, and the
// sequence number of that first batch.
func (l *eventLog) since(from int) (evs []string, firstSeq uint64, n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, b := range l.batches[from:] {
		if i == 0 {
			firstSeq = b.Seq
		}
		for _, e := range b.Events {
			evs = append(evs, kind(e)+" "+e.ObjectKey)
		}
	}
	return evs, firstSeq, len(l.batches)
}

func (l *eventLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.batches)
}

// waitEvents waits until l received want (in order) from batch from on.
func (l *eventLog) waitEvents(t *testing.T, who string, from int, want ...string) uint64 {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, seq, _ := l.since(from)
		if strings.Join(got, ", ") == strings.Join(want, ", ") {
			return seq
		}
		if len(got) > len(want) || time.Now().After(deadline) {
			t.Fatalf("%s published [%s], want [%s]", who, strings.Join(got, ", "), strings.Join(want, ", "))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Issue 38 item 3: with HA only the leader publishes KV events; after a
// failover the new leader publishes from its own endpoint, starting its
// sequence at 1, and a leader elected again restarts its sequence too, so
// a consumer of either endpoint can tell; nothing acknowledged before a
// failover is reported removed unless it was removed.
func TestKVEventsAcrossFailover(t *testing.T) {
	h := newHarness(t)
	var pubs []*kvevents.Publisher
	h.cfg = func(cfg *ha.Config) {
		p, err := kvevents.New(kvevents.Config{Endpoint: "tcp://127.0.0.1:0", BackendID: "pool-ha"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		pubs = append(pubs, p)
		cfg.Master.Events = p
	}
	// Each candidate reaches etcd through its own proxy, to be cut alone.
	var proxies []*proxy
	var cands []*ha.Candidate
	for range 2 {
		p := newProxy(t, h.ee.Endpoints()[0])
		h.etcd = []string{p.lis.Addr().String()}
		proxies = append(proxies, p)
		cands = append(cands, h.candidate())
	}
	logs := []*eventLog{follow(t, pubs[0].Endpoint()), follow(t, pubs[1].Endpoint())}
	first := 0
	if h.leader(10*time.Second) == cands[1] {
		first = 1
	}
	other := 1 - first
	h.client(16 << 20)
	cl := h.client(0)
	ctx := context.Background()
	put := func(k string) {
		t.Helper()
		deadline := time.Now().Add(3*testLease + 5*time.Second)
		for {
			err := cl.Put(ctx, k, value(k, 4096))
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("put %s: %v", k, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	remove := func(k string) {
		t.Helper()
		if err := cl.Remove(ctx, k, false); err != nil {
			t.Fatalf("remove %s: %v", k, err)
		}
	}
	// failover cuts the leader off etcd until another leads, then lets
	// it back as a standby.
	failover := func(from, to int) {
		t.Helper()
		proxies[from].setCut(true)
		for cut := time.Now(); cands[from].Leading(); time.Sleep(10 * time.Millisecond) {
			if time.Since(cut) > 2*testLease {
				t.Fatalf("the leader still leads %s after losing etcd", time.Since(cut))
			}
		}
		if l := h.leader(4*testLease + 5*time.Second); l != cands[to] {
			t.Fatalf("the candidate cut off etcd leads again")
		}
		proxies[from].setCut(false)
	}

	for _, k := range []string{"11", "12", "13", "14"} {
		put(k)
	}
	remove("11")
	logs[first].waitEvents(t, "first leader", 0, "stored 11", "stored 12", "stored 13", "stored 14", "removed 11")
	if n := logs[other].count(); n != 0 {
		t.Fatalf("the standby published %d messages", n)
	}

	failover(first, other)
	mark := logs[first].count()
	put("15")
	remove("12")
	if seq := logs[other].waitEvents(t, "the new leader", 0, "stored 15", "removed 12"); seq != 1 {
		t.Errorf("the new leader's first message has sequence number %d, want 1", seq)
	}

	// The first leader leads again: its consumers must see the sequence
	// restart, or they cannot tell that another leader changed the pool
	// while their stream stood still.
	failover(other, first)
	put("16")
	remove("13")
	seq := logs[first].waitEvents(t, "the first leader, elected again", mark, "stored 16", "removed 13")
	if seq != 1 {
		t.Errorf("the first leader's first message of its second term has sequence number %d, want 1", seq)
	}
	logs[first].mu.Lock()
	restarts := fmt.Sprint(logs[first].restarts)
	logs[first].mu.Unlock()
	if restarts != "[1]" {
		t.Errorf("the first leader's consumer saw the sequence restart at %s, want [1]", restarts)
	}
	for _, k := range []string{"14", "15", "16"} {
		if _, err := cl.Get(ctx, k); err != nil {
			t.Errorf("get %s: %v", k, err)
		}
	}
}
