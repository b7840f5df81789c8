package rdma

import (
	"sync/atomic"
	"syscall"
)

// Test hooks for the external tests in package rdma_test.

// WithReclaimAfterInsertOnly makes a context reclaim the way Mooncake
// did before v0.3.11 (only after an insert on a cache miss), to show the
// leak that mc's monitor-driven reclaim prevents.
func WithReclaimAfterInsertOnly(c Config) Config {
	c.reclaimAfterInsertOnly = true
	return c
}

// Ticks counts completed monitor ticks.
func (c *Context) Ticks() uint64 { return c.ticks.Load() }

// BusyWaiting counts retired endpoints that still have work requests
// outstanding.
func (s *EndpointStore) BusyWaiting() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	n := 0
	for _, e := range s.waiting {
		if e.Outstanding() > 0 {
			n++
		}
	}
	return n
}

type atomicInt32s = atomic.Int32

var errnoENOMEM = syscall.ENOMEM

// PauseWorkers stalls completion processing until resume is called, so
// posted slices stay in flight (their endpoints stay busy).
func (c *Context) PauseWorkers() (resume func()) {
	c.hold.Lock()
	return c.hold.Unlock
}
