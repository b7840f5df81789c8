package master

import (
	"sync"
	"sync/atomic"
	"time"
)

// Drops of silent nodes, told to clients with their pings: a client whose
// transfer is in flight to a node that stopped (SIGSTOP, a hung host, a
// cut link) would otherwise wait out its transfer timeout (30 s) though
// the master dropped the node at client_ttl. With the drop in its next
// ping the client fails those transfers at once.
const (
	// dropKeep: a drop older than this is not told any more; a client
	// that has not pinged for that long has no transfer worth saving.
	dropKeep = time.Minute
	// dropCap bounds the log (and one ping's answer).
	dropCap = 1024
)

type dropEntry struct {
	seq      uint64
	at       time.Time
	endpoint string
}

// dropLog numbers drops from a start taken from the clock, so a client
// carrying a number from an earlier master (a restart, an HA leader
// before this one) is told this master's drops rather than none.
type dropLog struct {
	seq atomic.Uint64

	mu   sync.Mutex
	ents []dropEntry // oldest first
}

func newDropLog() *dropLog {
	d := &dropLog{}
	d.seq.Store(uint64(time.Now().UnixNano()))
	return d
}

func (d *dropLog) add(endpoint string, now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.ents) == dropCap {
		d.ents = append(d.ents[:0], d.ents[1:]...)
	}
	d.ents = append(d.ents, dropEntry{seq: d.seq.Add(1), at: now, endpoint: endpoint})
}

// since returns the current number and the endpoints dropped after seen
// (none for seen 0, a client's first ping). A seen this master never gave
// (above its number: another master's) gets every drop still kept.
func (d *dropLog) since(seen uint64, now time.Time) (uint64, []string) {
	cur := d.seq.Load()
	if seen == 0 || seen == cur {
		return cur, nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	cur = d.seq.Load()
	var out []string
	for _, e := range d.ents {
		if (e.seq > seen || seen > cur) && now.Sub(e.at) < dropKeep {
			out = append(out, e.endpoint)
		}
	}
	return cur, out
}

// DroppedSince is what a ping tells a client of the segments dropped
// because their owner went silent: the current drop number and the
// transfer endpoints dropped after seen.
func (m *Master) DroppedSince(seen uint64) (uint64, []string) {
	return m.drops.since(seen, time.Now())
}
