package store

import (
	"context"
	"sync/atomic"
	"time"
)

// DefaultReadShare is the most of a node's time its disk reads take while
// DRAM puts into its segment are under way (TierConfig.ReadShare).
const DefaultReadShare = 0.25

// readPacer makes a node's staged disk reads background work while the
// master says DRAM puts into its segment are under way (WRITES): then
// they go one at a time, each followed by a pause, so that they hold at
// most share of the node's time (a read that took d lets the next start
// d*(1-share)/share after it ended) and leave the CPU to the puts. The
// rest of the time they run as they come.
type readPacer struct {
	share float64
	turn  chan struct{}
	next  time.Time // when the next paced read may start (held by turn)
	// until is when the last WRITES ends (unix nanos).
	until atomic.Int64
	// paced counts the reads that went paced.
	paced atomic.Uint64
}

// yielding says puts are under way: reads go paced now.
func (p *readPacer) yielding() bool { return time.Now().UnixNano() < p.until.Load() }

func newReadPacer(share float64) *readPacer {
	if share <= 0 || share > 1 {
		share = DefaultReadShare
	}
	return &readPacer{turn: make(chan struct{}, 1), share: share}
}

// writes notes the master's WRITES: puts go on for d from now.
func (p *readPacer) writes(d time.Duration) {
	until := time.Now().Add(d).UnixNano()
	for {
		old := p.until.Load()
		if old >= until || p.until.CompareAndSwap(old, until) {
			return
		}
	}
}

// acquire returns at once while no puts are under way; otherwise it
// waits for the reads' turn and the pause after the last paced read
// (until ctx ends). done ends the read.
func (p *readPacer) acquire(ctx context.Context) (done func(), err error) {
	if !p.yielding() {
		return func() {}, nil
	}
	p.paced.Add(1)
	select {
	case p.turn <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if wait := time.Until(p.next); wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			<-p.turn
			return nil, ctx.Err()
		}
	}
	start := time.Now()
	return func() {
		end := time.Now()
		p.next = end.Add(time.Duration(float64(end.Sub(start)) * (1 - p.share) / p.share))
		<-p.turn
	}, nil
}
