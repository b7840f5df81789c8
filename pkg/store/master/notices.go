package master

import (
	"slices"
	"sync"
	"sync/atomic"

	"github.com/kvcache-ops/mc/pkg/store"
)

const (
	// maxNoticesPerPing bounds one ping response; the rest waits for the
	// next ping.
	maxNoticesPerPing = 10000
	// maxPendingNotices bounds what one owner can make the master hold,
	// a silent one or one whose regions lose more than a ping carries a
	// second (a writer filling a full store: every put evicts); past it
	// the oldest keys are dropped (the owner then finds them gone on its
	// next get, as without notices). 64 Ki keys is about 6 s of pings,
	// some 5 MB; 1 Mi held 70 MB and more for each such writer.
	maxPendingNotices = 1 << 16
)

// notices holds, per region owner, the keys evicted from its regions that
// it has not been told about yet.
type notices struct {
	mu      sync.Mutex
	pending atomic.Int64 // keys held, so an idle ping takes no lock
	keys    map[store.UUID][]string
	dropped uint64
}

func (n *notices) add(owners []store.UUID, key string) {
	if len(owners) == 0 {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.keys == nil {
		n.keys = make(map[store.UUID][]string)
	}
	for _, o := range owners {
		l := n.keys[o]
		if len(l) >= maxPendingNotices {
			l = slices.Delete(l, 0, len(l)/2)
			n.dropped += uint64(maxPendingNotices / 2)
			n.pending.Add(-int64(maxPendingNotices / 2))
		}
		n.keys[o] = append(l, key)
		n.pending.Add(1)
	}
}

func (n *notices) take(owner store.UUID, limit int) []string {
	if n.pending.Load() == 0 {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	l := n.keys[owner]
	if len(l) <= limit {
		delete(n.keys, owner)
		n.pending.Add(-int64(len(l)))
		return l
	}
	out := slices.Clone(l[:limit])
	n.keys[owner] = l[limit:]
	n.pending.Add(-int64(limit))
	return out
}

func (n *notices) forget(owner store.UUID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.pending.Add(-int64(len(n.keys[owner])))
	delete(n.keys, owner)
}

// TakeEvictedKeys returns (and forgets) up to a ping's worth of the keys
// evicted from client's regions since it last asked: the owner drops its
// local state for them. The RPC Ping answers with them.
func (m *Master) TakeEvictedKeys(client store.UUID) []string {
	return m.space.notices.take(client, maxNoticesPerPing)
}

// freeEvicted frees an evicted object's replicas and queues its key for
// the owners of the regions it was in.
func (s *space) freeEvicted(key string, refs []replicaRef, size uint64) {
	var owners []store.UUID
	s.mu.Lock()
	for _, r := range refs {
		if in := r.reg.owner; in != nil && !slices.Contains(owners, in.id) {
			owners = append(owners, in.id)
		}
		s.freeOne(r, size)
	}
	s.mu.Unlock()
	s.notices.add(owners, key)
}
