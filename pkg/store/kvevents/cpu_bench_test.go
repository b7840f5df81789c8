package kvevents

import (
	"context"
	"fmt"
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
	p, err := New(Config{Endpoint: "tcp://127.0.0.1:0", BackendID: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	s, err := Subscribe(context.Background(), p.Endpoint())
	if err != nil {
		b.Fatal(err)
	}
	for p.Stats().Subscribers == 0 {
		time.Sleep(5 * time.Millisecond)
	}
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
