package master

import (
	"fmt"
	"slices"
	"sync"
	"testing"
)

type eventLog struct {
	mu  sync.Mutex
	got []string
}

func (l *eventLog) Stored(key, medium string)  { l.add("stored " + key + " " + medium) }
func (l *eventLog) Removed(key, medium string) { l.add("removed " + key + " " + medium) }
func (l *eventLog) add(s string) {
	l.mu.Lock()
	l.got = append(l.got, s)
	l.mu.Unlock()
}

func (l *eventLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.got
	l.got = nil
	return out
}

func TestEventsPutRemoveRegexRemoveAll(t *testing.T) {
	var ev eventLog
	m, _ := newTestMaster(t, Config{Events: &ev})
	mount(t, m, "node", "seg", "127.0.0.1", 0, 64*MiB)
	for _, k := range []string{"1234567", "0x1f2e", "plainkey"} {
		put(t, m, "w", k, 4096)
	}
	putStart(t, m, "w", "unfinished", 4096) // no event until it ends
	if err := remove(m, "1234567", false); err != nil {
		t.Fatal(err)
	}
	want := []string{"stored 1234567 cpu", "stored 0x1f2e cpu", "stored plainkey cpu", "removed 1234567 cpu"}
	if got := ev.take(); !slices.Equal(got, want) {
		t.Fatalf("events %q, want %q", got, want)
	}
	put(t, m, "w", "a1", 4096)
	put(t, m, "w", "a2", 4096)
	ev.take()
	if _, err := m.RemoveByRegex("^a", false, false); err != nil {
		t.Fatal(err)
	}
	got := ev.take()
	slices.Sort(got)
	if want := []string{"removed a1 cpu", "removed a2 cpu"}; !slices.Equal(got, want) {
		t.Fatalf("regex remove: events %q, want %q", got, want)
	}
	if n := m.RemoveAll(); n != 2 {
		t.Fatalf("remove_all removed %d, want 2", n)
	}
	got = ev.take()
	slices.Sort(got)
	if want := []string{"removed 0x1f2e cpu", "removed plainkey cpu"}; !slices.Equal(got, want) {
		t.Fatalf("remove_all: events %q, want %q", got, want)
	}
}

func TestEventsEviction(t *testing.T) {
	var ev eventLog
	m, clk := evictFixture(t, Config{Events: &ev}, 95)
	if got := ev.take(); len(got) != 95 {
		t.Fatalf("%d events for 95 puts", len(got))
	}
	clk.Advance(DefaultKVLeaseTTL)
	freed := m.EvictIfNeeded()
	got := ev.take()
	if n := int(freed / MiB); n == 0 || len(got) != n {
		t.Fatalf("%d objects evicted, %d events: %q", n, len(got), got)
	}
	for _, e := range got {
		var k string
		if _, err := fmt.Sscanf(e, "removed %s cpu", &k); err != nil {
			t.Fatalf("event %q: want a removal in cpu", e)
		}
		if present(m, k)[0] {
			t.Errorf("%s reported removed but still present", k)
		}
	}
}
