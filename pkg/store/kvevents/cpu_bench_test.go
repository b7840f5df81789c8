package kvevents

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// BenchmarkEventCPU: the process's CPU time (user and system, getrusage)
// per event from queueing to a subscriber's read: 4 callers queue stored
// events of hex keys 32 at a time (a batched put's), waiting while more
// than 4096 are queued (the puts of a store are slower than its
// publisher: its queue stays short), and one subscriber reads every
// message whole without decoding it (BenchmarkKVEventsPut's subscriber).
// Other work on the machine moves the time an event takes more than the
// CPU it costs, so this is the figure to compare changes of the event
// path by.
func BenchmarkEventCPU(b *testing.B) {
	p, s := benchSubscribed(b, Config{Endpoint: "tcp://127.0.0.1:0", BackendID: "bench"})
	var msgs atomic.Uint64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			if _, _, err := s.NextRaw(); err != nil {
				return
			}
			msgs.Add(1)
		}
	}()
	const callers = 4
	keys := make([]string, 1<<16)
	for i := range keys {
		keys[i] = fmt.Sprintf("0x%x", 1<<40+i)
	}
	cpu := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			b.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	b.ResetTimer()
	cpu0 := cpu()
	var wg sync.WaitGroup
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := c; i < b.N; i += callers {
				if i%(32*callers) < callers {
					for p.Stats().QueueLength > 4096 {
						time.Sleep(50 * time.Microsecond)
					}
				}
				p.Stored(keys[i%len(keys)], MediumCPU)
			}
		}()
	}
	wg.Wait()
	for {
		st := p.Stats()
		if st.PublishedEvents == uint64(b.N) && msgs.Load()+st.SubscriberDrops == st.PublishedBatches {
			break
		}
		time.Sleep(100 * time.Microsecond)
	}
	used := cpu() - cpu0
	b.StopTimer()
	st := p.Stats()
	b.ReportMetric(float64(used.Nanoseconds())/float64(b.N), "cpu_ns/event")
	b.ReportMetric(float64(st.PublishedEvents)/float64(max(st.PublishedBatches, 1)), "events/msg")
	b.ReportMetric(float64(st.SubscriberDrops), "dropped_msgs")
	b.ReportMetric(float64(st.DroppedEvents), "dropped_events")
	s.Close()
	<-done
}

// BenchmarkEventCPUSteady: what events cost a store at its own rate
// rather than flat out (BenchmarkEventCPU): 4 callers each queue 32
// stored events (a batched put's) every 4 ms, 32,000 events/s, and one
// subscriber reads every message whole. At that rate the publisher sends
// once per pace interval, and what a send costs besides its bytes (the
// wake-ups of the publisher, of the subscriber's writer and of the
// subscriber, a context switch each on a busy machine) is most of what
// events cost. "off" runs the same callers with a no-op in place of
// Stored: on minus off is the events' CPU per event; csw/event counts
// the process's context switches (getrusage, voluntary and not).
func BenchmarkEventCPUSteady(b *testing.B) {
	for _, on := range []bool{false, true} {
		name := "off"
		if on {
			name = "on"
		}
		b.Run(name, func(b *testing.B) { benchSteady(b, on) })
	}
}

func benchSteady(b *testing.B, on bool) {
	stored := func(string, string) {}
	var p *Publisher
	var msgs atomic.Uint64
	done := make(chan struct{})
	if on {
		var s *Subscriber
		p, s = benchSubscribed(b, Config{Endpoint: "tcp://127.0.0.1:0", BackendID: "bench"})
		defer func() { s.Close(); <-done }()
		go func() {
			defer close(done)
			for {
				if _, _, err := s.NextRaw(); err != nil {
					return
				}
				msgs.Add(1)
			}
		}()
		stored = p.Stored
	}
	const callers, batch, every = 4, 32, 4 * time.Millisecond
	keys := make([]string, 1<<16)
	for i := range keys {
		keys[i] = fmt.Sprintf("0x%x", 1<<40+i)
	}
	usage := func() (time.Duration, int64) {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			b.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), ru.Nvcsw + ru.Nivcsw
	}
	b.ResetTimer()
	cpu0, csw0 := usage()
	per := (b.N + callers - 1) / callers
	paceCallers(callers, per, batch, every, func(c, i int) { stored(keys[(c*per+i)%len(keys)], MediumCPU) })
	n := per * callers
	for on {
		st := p.Stats()
		if st.PublishedEvents == uint64(n) && msgs.Load()+st.SubscriberDrops == st.PublishedBatches {
			break
		}
		time.Sleep(100 * time.Microsecond)
	}
	cpu1, csw1 := usage()
	b.StopTimer()
	b.ReportMetric(float64((cpu1-cpu0).Nanoseconds())/float64(n), "cpu_ns/event")
	b.ReportMetric(float64(csw1-csw0)/float64(n), "csw/event")
	if on {
		st := p.Stats()
		b.ReportMetric(float64(st.PublishedEvents)/float64(max(st.PublishedBatches, 1)), "events/msg")
		b.ReportMetric(float64(st.SubscriberDrops+st.DroppedEvents), "dropped")
	}
}

// BenchmarkEventWait: how long an event waits from Stored to a
// subscriber's read under BenchmarkEventCPUSteady's stream (32,000
// events/s in batches of 32), per pace interval: each key is the time it
// was queued, read back from the event's seq_hashes. The mean is about
// half the interval, the most about the interval (plus the machine's
// scheduling delays).
func BenchmarkEventWait(b *testing.B) {
	for _, pace := range []time.Duration{-1, 5 * time.Millisecond, 10 * time.Millisecond, 20 * time.Millisecond} {
		b.Run(fmt.Sprintf("pace=%v", pace), func(b *testing.B) { benchWait(b, pace) })
	}
}

func benchWait(b *testing.B, pace time.Duration) {
	p, s := benchSubscribed(b, Config{Endpoint: "tcp://127.0.0.1:0", BackendID: "bench", PaceInterval: pace})
	defer s.Close()
	const callers, batch, every = 4, 32, 4 * time.Millisecond
	base := time.Now()
	per := (b.N + callers - 1) / callers
	n := per * callers
	waits := make([]time.Duration, 0, n)
	done := make(chan error, 1)
	go func() {
		for len(waits) < n {
			m, err := s.Next()
			if err != nil {
				done <- err
				return
			}
			now := time.Since(base)
			for _, e := range m.Events {
				waits = append(waits, now-time.Duration(e.SeqHashes[0]))
			}
		}
		done <- nil
	}()
	b.ResetTimer()
	paceCallers(callers, per, batch, every, func(int, int) {
		p.Stored(fmt.Sprintf("0x%x", int64(time.Since(base))), MediumCPU)
	})
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	slices.Sort(waits)
	var sum time.Duration
	for _, w := range waits {
		sum += w
	}
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	b.ReportMetric(ms(sum/time.Duration(len(waits))), "mean_wait_ms")
	b.ReportMetric(ms(waits[len(waits)*99/100]), "p99_wait_ms")
	b.ReportMetric(ms(waits[len(waits)-1]), "max_wait_ms")
	st := p.Stats()
	b.ReportMetric(float64(st.PublishedEvents)/float64(max(st.PublishedBatches, 1)), "events/msg")
}

// paceCallers runs callers goroutines, each calling fn(caller, i) for i
// from 0 to per, batch calls every interval, the callers spread over it
// (a store's batched puts); it returns when all are done.
func paceCallers(callers, per, batch int, every time.Duration, fn func(c, i int)) {
	var wg sync.WaitGroup
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			next := time.Now().Add(time.Duration(c) * every / time.Duration(callers))
			for i := 0; i < per; {
				time.Sleep(time.Until(next))
				next = next.Add(every)
				for j := 0; j < batch && i < per; j++ {
					fn(c, i)
					i++
				}
			}
		}()
	}
	wg.Wait()
}

// benchSubscribed starts a publisher of cfg with one subscriber and waits
// until the publisher counts it; the publisher is closed at the end.
func benchSubscribed(b *testing.B, cfg Config) (*Publisher, *Subscriber) {
	b.Helper()
	p, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { p.Close() })
	s, err := Subscribe(context.Background(), p.Endpoint())
	if err != nil {
		b.Fatal(err)
	}
	for p.Stats().Subscribers == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	return p, s
}
