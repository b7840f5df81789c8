package kvevents

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"
	"time"
)

// Follower receives what Follow reads. Every function may be nil.
type Follower struct {
	// Batch is a message; lost is how many events were published
	// between the previous message and this one and never arrived (a
	// full queue at the publisher, or this subscriber falling
	// behind). It is a lower bound when both happened at once.
	Batch func(b Batch, lost uint64)
	// Waiting says the publisher cannot be reached (once per outage:
	// at the start, or when it goes away); Follow goes on trying, as a
	// ZMQ SUB socket does.
	Waiting func(err error)
	// Connected says a connection to the publisher is up.
	Connected func()
	// Restarted says the sequence started again (from seq): the
	// publisher restarted, or another (an HA failover) took over.
	Restarted func(seq uint64)
}

// Reconnect intervals of Follow (ZMQ's ZMQ_RECONNECT_IVL is 100 ms).
const (
	followRetryMin = 100 * time.Millisecond
	followRetryMax = time.Second
)

// Follow subscribes to endpoint and reads batches until ctx ends (then
// it returns nil), reconnecting whenever the publisher cannot be
// reached or goes away. It returns an error when the endpoint is
// malformed or the peer answers but is no KV event publisher.
func Follow(ctx context.Context, endpoint string, f Follower) error {
	if _, _, err := ParseEndpoint(endpoint); err != nil {
		return err
	}
	var (
		seen      bool   // a message arrived from some publisher
		lastSeq   uint64 // of the last message
		nextID    uint64 // event_id expected next
		haveIDs   bool
		waiting   bool
		retry     = followRetryMin
		connected bool
	)
	for ctx.Err() == nil {
		sub, err := Subscribe(ctx, endpoint)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			var nerr net.Error
			if !errors.As(err, &nerr) && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, syscall.ECONNRESET) {
				return err // it answered, but not as a publisher
			}
			if !waiting && f.Waiting != nil {
				f.Waiting(err)
			}
			waiting = true
			select {
			case <-ctx.Done():
			case <-time.After(retry):
			}
			retry = min(2*retry, followRetryMax)
			continue
		}
		waiting, retry, connected = false, followRetryMin, true
		if f.Connected != nil {
			f.Connected()
		}
		stop := context.AfterFunc(ctx, func() { _ = sub.Close() })
		for {
			b, err := sub.Next()
			if err != nil {
				_ = sub.Close()
				stop()
				if ctx.Err() == nil && connected && f.Waiting != nil {
					f.Waiting(err)
					waiting = true
				}
				connected = false
				break
			}
			var lost uint64
			switch {
			case !seen:
				// Joined late: what went before was never ours to see.
			case b.Seq <= lastSeq:
				if f.Restarted != nil {
					f.Restarted(b.Seq)
				}
				haveIDs = false
			case b.Seq > lastSeq+1:
				lost = b.Seq - lastSeq - 1
			}
			if id, ok := firstID(b); ok {
				if haveIDs && seen && b.Seq > lastSeq && id > nextID {
					lost = max(lost, id-nextID)
				}
				nextID, haveIDs = id+uint64(len(b.Events)), true
			}
			seen, lastSeq = true, b.Seq
			if f.Batch != nil {
				f.Batch(b, lost)
			}
		}
	}
	return nil
}

// firstID is the event_id of b's first event, when it has one.
func firstID(b Batch) (uint64, bool) {
	if len(b.Events) == 0 {
		return 0, false
	}
	_, ok := b.Events[0].Fields["event_id"]
	return b.Events[0].ID, ok
}
