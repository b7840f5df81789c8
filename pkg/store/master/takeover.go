package master

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// takeover holds puts while a new HA leader waits for the segments its op
// log knows to mount again: a put placed before then finds no segment
// (NO_AVAILABLE_HANDLE "no segment is mounted", every put of a takeover's
// first ~50 ms failed so) or crowds onto the first node back.
type takeover struct {
	waiting atomic.Bool
	mu      sync.Mutex
	expect  map[string]bool
	done    chan struct{}
}

// ExpectSegments makes puts wait until every named segment has mounted
// (by name: a node back as a new incarnation counts) or grace has passed,
// whichever comes first; a segment not back by then is taken for gone
// for this purpose (its objects follow the usual restored-mount grace).
func (m *Master) ExpectSegments(names []string, grace time.Duration) {
	t := &m.takeover
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expect = make(map[string]bool, len(names))
	for _, n := range names {
		t.expect[n] = true
	}
	for _, s := range m.space.list() {
		delete(t.expect, s.Info.Name)
	}
	if len(t.expect) == 0 {
		return
	}
	t.done = make(chan struct{})
	t.waiting.Store(true)
	done, start := t.done, time.Now()
	time.AfterFunc(grace, func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		if t.done == done && len(t.expect) > 0 {
			m.log.Warn(fmt.Sprintf("HA takeover: %d segment(s) of the op log not mounted again within %s (%v): serving puts on the %d that are", len(t.expect), time.Since(start).Round(time.Millisecond), keys(t.expect), len(m.space.list())))
			t.finishLocked()
		}
	})
}

func (t *takeover) mounted(name string) {
	if !t.waiting.Load() {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.expect, name)
	if len(t.expect) == 0 && t.done != nil {
		t.finishLocked()
	}
}

func (t *takeover) finishLocked() {
	if t.done != nil {
		close(t.done)
		t.done = nil
	}
	t.expect = nil
	t.waiting.Store(false)
}

// AwaitTakeover holds a put until the takeover is over, or ctx ends
// (then it returns ctx's error: the caller has given up, and a grant
// made now would be one nobody writes or ends).
func (m *Master) AwaitTakeover(ctx context.Context) error {
	t := &m.takeover
	if !t.waiting.Load() {
		return nil
	}
	t.mu.Lock()
	done := t.done
	t.mu.Unlock()
	if done == nil {
		return nil
	}
	select {
	case <-done:
	case <-m.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
