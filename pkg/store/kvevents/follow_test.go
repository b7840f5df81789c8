package kvevents

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// followLog records what Follow reports, as lines.
type followLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *followLog) add(format string, a ...any) {
	l.mu.Lock()
	l.lines = append(l.lines, fmt.Sprintf(format, a...))
	l.mu.Unlock()
}

func (l *followLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "; ")
}

func (l *followLog) follower() Follower {
	return Follower{
		Batch: func(b Batch, lost uint64) {
			var keys []string
			for _, e := range b.Events {
				keys = append(keys, e.ObjectKey)
			}
			l.add("seq %d lost %d keys %s", b.Seq, lost, strings.Join(keys, ","))
		},
		Waiting:   func(error) { l.add("waiting") },
		Connected: func() { l.add("connected") },
		Restarted: func(seq uint64) { l.add("restarted at %d", seq) },
	}
}

func freeEndpoint(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ep := "tcp://" + ln.Addr().String()
	ln.Close()
	return ep
}

// publishNow sends what is queued, as the publisher goroutine would.
func publishNow(p *Publisher) { p.drain(make([]pending, 0, p.cfg.MaxBatch)) }

// Follow waits for a publisher that is not there yet (saying so once),
// counts the events lost to a full queue (sequence skips) and to a
// message dropped for the subscriber (event_id skips), and sees a
// publisher restarted on the same endpoint start again at 1.
func TestFollow(t *testing.T) {
	ep := freeEndpoint(t)
	var log followLog
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Follow(ctx, ep, log.follower()) }()
	time.Sleep(350 * time.Millisecond) // several reconnect attempts
	if got := log.String(); got != "waiting" {
		t.Fatalf("before the publisher: %q, want one waiting", got)
	}
	p := newTestPublisher(t, Config{Endpoint: ep, QueueCapacity: 3})
	waitFor(t, "the follower to connect", func() bool { return p.Stats().Subscribers == 1 })
	p.Stored("1", MediumCPU)
	publishNow(p) // seq 1
	for i := 2; i <= 6; i++ {
		p.Stored(fmt.Sprint(i), MediumCPU) // 2 and 3 dropped: seq skips 2
	}
	publishNow(p) // seq 4
	p.nextSeq.Add(1)
	p.nextEventID.Add(5) // a message of 5 events dropped for this subscriber
	p.Stored("7", MediumCPU)
	publishNow(p) // seq 6
	want := "waiting; connected; seq 1 lost 0 keys 1; seq 4 lost 2 keys 4,5,6; seq 6 lost 5 keys 7"
	waitFor(t, "three messages", func() bool { return log.String() == want })

	go p.run() // Close waits for it
	p.Close()
	waitFor(t, "the follower to see the publisher go", func() bool { return strings.HasSuffix(log.String(), "; waiting") })
	p2 := newTestPublisher(t, Config{Endpoint: ep})
	go p2.run()
	waitFor(t, "the follower to reconnect", func() bool { return p2.Stats().Subscribers == 1 })
	p2.Removed("8", MediumCPU)
	want += "; waiting; connected; restarted at 1; seq 1 lost 0 keys 8"
	waitFor(t, "the restarted publisher's message", func() bool { return log.String() == want })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Follow after cancel: %v", err)
	}
}

// A peer that answers but is no ZMTP publisher is an error, not a wait;
// a malformed endpoint too.
func TestFollowNotAPublisher(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n"))
			c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = Follow(ctx, "tcp://"+ln.Addr().String(), Follower{})
	if err == nil || !strings.Contains(err.Error(), "ZMTP") {
		t.Fatalf("Follow of an HTTP server: %v, want an error saying it is no ZMTP peer", err)
	}
	if err := Follow(ctx, "127.0.0.1:5557", Follower{}); err == nil || !strings.Contains(err.Error(), "want tcp://") {
		t.Fatalf("Follow of a malformed endpoint: %v", err)
	}
}

// BenchmarkPublisher: events per second one publisher sends to one
// subscriber reading them (events queued as fast as one caller can);
// "delivered" is the share that reached the subscriber (the rest were
// dropped for it falling 10000 messages behind).
func BenchmarkPublisher(b *testing.B) {
	p, s := benchSubscribed(b, Config{Endpoint: "tcp://127.0.0.1:0", BackendID: "bench", QueueCapacity: -1})
	var n, last atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			m, err := s.Next()
			if err != nil {
				return
			}
			n.Add(int64(len(m.Events)))
			last.Store(time.Now().UnixNano())
		}
	}()
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = fmt.Sprintf("0x%x", i+1)
	}
	b.ResetTimer()
	t0 := time.Now()
	for i := range b.N {
		p.Stored(keys[i%len(keys)], MediumCPU)
	}
	for p.Stats().PublishedEvents < uint64(b.N) {
		time.Sleep(time.Millisecond)
	}
	b.ReportMetric(float64(b.N)/time.Since(t0).Seconds(), "published/s")
	for prev := int64(-1); n.Load() < int64(b.N) && n.Load() != prev; {
		prev = n.Load()
		time.Sleep(300 * time.Millisecond) // nothing more for 300 ms: the rest was dropped
	}
	b.StopTimer()
	s.Close()
	<-done
	got := n.Load()
	b.ReportMetric(float64(got)/(time.Duration(last.Load()-t0.UnixNano())).Seconds(), "received/s")
	b.ReportMetric(float64(got)/float64(b.N), "delivered")
}
