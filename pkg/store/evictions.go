package store

import "sync"

// evictionFeed carries the keys the master evicted from this client's
// regions (it says so in ping responses) to whoever subscribed.
type evictionFeed struct {
	mu      sync.Mutex
	ch      chan []string
	backlog []string // keys the subscriber was too slow for
	closed  bool
	total   uint64
}

// Evictions returns a channel that receives, after each ping that brings
// some, the keys the master evicted from this client's regions (by the
// watermark loop or by another writer's put): a caller holding local
// state for them (an index of cached prefixes) drops it. A slow reader
// loses nothing: keys wait for the next ping. The channel is closed by
// Close. Every call returns the same channel.
func (c *Client) Evictions() <-chan []string {
	f := &c.evicted
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ch == nil {
		f.ch = make(chan []string, 16)
		if f.closed {
			close(f.ch)
		}
	}
	return f.ch
}

// deliver hands keys (possibly none) and any backlog to the subscriber.
func (f *evictionFeed) deliver(keys []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.total += uint64(len(keys))
	if f.ch == nil || f.closed {
		return
	}
	keys = append(f.backlog, keys...)
	if len(keys) == 0 {
		return
	}
	select {
	case f.ch <- keys:
		f.backlog = nil
	default:
		f.backlog = keys
	}
}

func (f *evictionFeed) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.closed && f.ch != nil {
		close(f.ch)
	}
	f.closed = true
}
