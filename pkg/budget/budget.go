// Package budget bounds the bytes a server holds for requests in flight.
// A Budget is a weighted semaphore over bytes: a server acquires what a
// request will cost before it allocates for it (the announced body of a
// coro_rpc frame, a decoded gRPC message) and releases it when the answer
// is written, so that callers who pin memory (huge batches, bodies
// announced and never sent) get refused instead of growing the process
// until the kernel kills it.
package budget

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"
)

// ErrExhausted is wrapped by the errors of a request refused because the
// budget was spent.
var ErrExhausted = errors.New("request budget exhausted")

// Budget is a limit on request bytes in flight. The zero value and a nil
// *Budget are unlimited.
type Budget struct {
	limit int64
	sem   *semaphore.Weighted
	name  string
}

// New returns a budget of limit bytes (<= 0: unlimited). name says where
// it is set (a flag), for the errors of refused requests.
func New(limit int64, name string) *Budget {
	b := &Budget{limit: limit, name: name}
	if limit > 0 {
		b.sem = semaphore.NewWeighted(limit)
	}
	return b
}

// Limit is the budget's size in bytes (0: unlimited).
func (b *Budget) Limit() int64 {
	if b == nil || b.sem == nil {
		return 0
	}
	return b.limit
}

// clamp lets a request larger than the whole budget run alone instead of
// never: the message size limit, not the budget, bounds one request.
func (b *Budget) clamp(n int64) int64 {
	return max(0, min(n, b.limit))
}

// TryAcquire takes n bytes if they are free now and returns what it took
// (to hand back to Release), or an error wrapping ErrExhausted.
func (b *Budget) TryAcquire(n int64) (int64, error) {
	if b == nil || b.sem == nil || n <= 0 {
		return 0, nil
	}
	n = b.clamp(n)
	if !b.sem.TryAcquire(n) {
		return 0, b.refusal(n)
	}
	return n, nil
}

// Acquire takes n bytes, waiting for them until ctx ends, and returns what
// it took. A wait cut short returns an error wrapping ErrExhausted.
func (b *Budget) Acquire(ctx context.Context, n int64) (int64, error) {
	if b == nil || b.sem == nil || n <= 0 {
		return 0, nil
	}
	n = b.clamp(n)
	if err := b.sem.Acquire(ctx, n); err != nil {
		return 0, fmt.Errorf("%w (waited: %v)", b.refusal(n), err)
	}
	return n, nil
}

// Release hands back what TryAcquire or Acquire returned.
func (b *Budget) Release(n int64) {
	if b == nil || b.sem == nil || n <= 0 {
		return
	}
	b.sem.Release(n)
}

func (b *Budget) refusal(n int64) error {
	return fmt.Errorf("%w: a request of %d bytes does not fit the %d-byte budget for requests in flight (%s); retry later, or raise it", ErrExhausted, n, b.limit, b.name)
}

var lastReturn atomic.Int64

// ReturnMemory hands freed memory back to the system now, in the
// background, at most once a second however often it is called: after a
// server dropped a big request whose peer left or stalled, an idle server
// might otherwise not collect for minutes and keep the pages resident.
func ReturnMemory() {
	now := time.Now().UnixNano()
	last := lastReturn.Load()
	if now-last < int64(time.Second) || !lastReturn.CompareAndSwap(last, now) {
		return
	}
	// Shortly after: the caller's goroutine is still unwinding what it
	// dropped. Two collections: the first moves buffers pooled with
	// sync.Pool (gRPC's) to the victim cache, the second frees them.
	time.AfterFunc(200*time.Millisecond, func() {
		runtime.GC()
		debug.FreeOSMemory()
	})
}
