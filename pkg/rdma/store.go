package rdma

import (
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// EndpointStore maps peer NIC paths to endpoints for one context, with
// Mooncake's FIFO or SIEVE eviction (rdma.md):
//
//   - Get sets the entry's visited bit (SIEVE).
//   - Insert returns an existing entry, or constructs one, evicts while
//     the map is full, and inserts it (SIEVE: visited).
//   - An evicted or deleted endpoint is retired: marked inactive, its QPs
//     moved to ERR, and parked in the waiting list.
//   - Reclaim destroys waiting endpoints once quiescent (no outstanding
//     work request), or after the grace period, forced with a warning.
//
// Retirement is two-stage because in-flight slices still reference an
// endpoint's per-QP depth counters: it may only be destroyed when no slice
// can observe it. The Context calls Reclaim from its monitor tick and at
// Close, independent of inserts.
type EndpointStore struct {
	kind     StoreType
	max      int
	grace    time.Duration
	build    func(path string) (*Endpoint, error)
	destroy  func(e *Endpoint)
	now      func() time.Time
	leaky    bool   // reclaim only after inserts (test-only contrast)
	device   string // logged as local_nic= so mc diag can attribute lines
	evicted  func()
	reclaims func(n int)

	mu      sync.RWMutex
	m       map[string]*Endpoint
	newest  *Endpoint // list head: inserts go here
	oldest  *Endpoint // list tail: FIFO evicts here, SIEVE's hand starts here
	hand    *Endpoint // nil: start at oldest
	waiting []*Endpoint
}

func newEndpointStore(kind StoreType, max int, grace time.Duration, build func(string) (*Endpoint, error), destroy func(*Endpoint)) *EndpointStore {
	if max < 1 {
		max = 1
	}
	return &EndpointStore{kind: kind, max: max, grace: grace, build: build, destroy: destroy, now: time.Now, m: map[string]*Endpoint{}}
}

// Max is the store's capacity (MC_MAX_EP_PER_CTX after clamping).
func (s *EndpointStore) Max() int { return s.max }

// Get returns the endpoint for path, or nil.
func (s *EndpointStore) Get(path string) *Endpoint {
	s.mu.RLock()
	e := s.m[path]
	s.mu.RUnlock()
	if e != nil && s.kind == SIEVE {
		e.visited.Store(true)
	}
	return e
}

// Insert returns the endpoint for path, constructing it on a miss.
func (s *EndpointStore) Insert(path string) (*Endpoint, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.m[path]; e != nil {
		if s.kind == SIEVE {
			e.visited.Store(true)
		}
		return e, nil
	}
	if !s.leaky && len(s.waiting) > 0 {
		// Reclaiming here too keeps the pool free under heavy churn
		// between monitor ticks; it is not what bounds the leak.
		s.reclaimLocked(false)
	}
	e, err := s.build(path)
	if err != nil {
		return nil, err
	}
	for len(s.m) >= s.max {
		s.evictLocked()
	}
	s.m[path] = e
	e.visited.Store(s.kind == SIEVE)
	s.pushNewest(e)
	if s.leaky {
		s.reclaimLocked(false)
	}
	return e, nil
}

// Delete retires the endpoint for path (error paths; silent). It reports
// whether there was one.
func (s *EndpointStore) Delete(path string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.m[path]
	if e == nil {
		return false
	}
	s.removeLocked(e)
	return true
}

// Remove retires e if it is still the store's endpoint for its path, so a
// caller holding a stale endpoint cannot retire its replacement.
func (s *EndpointStore) Remove(e *Endpoint) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m[e.peer] != e {
		return false
	}
	s.removeLocked(e)
	return true
}

// DeleteAll retires every endpoint (context going inactive or closing).
func (s *EndpointStore) DeleteAll() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(s.m)
	for s.oldest != nil {
		s.removeLocked(s.oldest)
	}
	return n
}

// Len is the number of endpoints in the map.
func (s *EndpointStore) Len() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.m)
}

// Waiting is the number of retired endpoints not yet destroyed.
func (s *EndpointStore) Waiting() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.waiting)
}

// Reclaim destroys quiescent waiting endpoints, and those retired longer
// than the grace period ago (with a warning). It returns how many it
// destroyed.
func (s *EndpointStore) Reclaim() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reclaimLocked(false)
}

// reclaimAll destroys every waiting endpoint, quiescent or not (the grace
// period ran out at shutdown).
func (s *EndpointStore) reclaimAll() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reclaimLocked(true)
}

func (s *EndpointStore) reclaimLocked(force bool) int {
	if len(s.waiting) == 0 {
		return 0
	}
	now := s.now()
	kept := s.waiting[:0]
	n := 0
	for _, e := range s.waiting {
		switch {
		case e.quiescent():
		case force || now.Sub(e.retiredAt) >= s.grace:
			slog.Warn(fmt.Sprintf("Forcibly destroying endpoint %s with %d outstanding work requests, %v after it was retired",
				e.peer, e.Outstanding(), now.Sub(e.retiredAt).Round(time.Millisecond)))
		default:
			kept = append(kept, e)
			continue
		}
		s.destroy(e)
		n++
	}
	clear(s.waiting[len(kept):])
	s.waiting = kept
	if s.reclaims != nil && n > 0 {
		s.reclaims(n)
	}
	return n
}

// evictLocked picks a victim by policy and retires it.
func (s *EndpointStore) evictLocked() {
	if s.oldest == nil {
		return
	}
	var victim *Endpoint
	if s.kind == FIFO {
		victim = s.oldest
	} else {
		// SIEVE: walk from the hand toward the newest, clearing visited
		// bits and wrapping to the oldest; the first unvisited entry is
		// the victim, and the hand stays at its newer neighbour.
		cur := s.hand
		if cur == nil {
			cur = s.oldest
		}
		for cur.visited.Load() {
			cur.visited.Store(false)
			cur = cur.newer
			if cur == nil {
				cur = s.oldest
			}
		}
		victim = cur
	}
	next := victim.newer
	s.removeLocked(victim)
	if s.kind == SIEVE {
		s.hand = next
	}
	if s.device != "" {
		slog.Info(victim.peer+" evicted", "local_nic", s.device)
	} else {
		slog.Info(victim.peer + " evicted")
	}
	if s.evicted != nil {
		s.evicted()
	}
}

// removeLocked unlinks e from the map and list and retires it.
func (s *EndpointStore) removeLocked(e *Endpoint) {
	delete(s.m, e.peer)
	if s.hand == e {
		s.hand = e.newer
	}
	if e.newer != nil {
		e.newer.older = e.older
	} else {
		s.newest = e.older
	}
	if e.older != nil {
		e.older.newer = e.newer
	} else {
		s.oldest = e.newer
	}
	e.newer, e.older = nil, nil
	e.retire(s.now())
	s.waiting = append(s.waiting, e)
}

func (s *EndpointStore) pushNewest(e *Endpoint) {
	e.older = s.newest
	e.newer = nil
	if s.newest != nil {
		s.newest.newer = e
	}
	s.newest = e
	if s.oldest == nil {
		s.oldest = e
	}
}

// order lists peer paths from newest to oldest (tests).
func (s *EndpointStore) order() []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []string
	for e := s.newest; e != nil; e = e.older {
		out = append(out, e.peer)
	}
	return out
}
