package store

import (
	"slices"
	"sync"
)

// tierRoster is the pool's disk tiers as this client last heard them
// from its master (ping answers): those in the pool, and those fenced (a
// master acknowledged puts and removes without them, so their records
// from before are stale wherever they come back). The client names them
// when it re-mounts on a master restarted without HA, which then holds
// puts and removes until the pool's tiers are back, and drops a fenced
// tier's old records when it attaches (master/settle.go): a tier slower
// to return than the others could otherwise hold a record of a key the
// new master acknowledged a put of, and bring it back after a second
// restart.
type tierRoster struct {
	mu      sync.Mutex
	version uint64
	ids     []string
	fenced  []string
	// onChange, when set, is told each new roster (a tier node keeps it
	// in its directory, for a restart of its own).
	onChange func(ids, fenced []string)
}

// seen is the version to ping with.
func (r *tierRoster) seen() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.version
}

// list is the roster to name at a re-mount.
func (r *tierRoster) list() (ids, fenced []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ids), slices.Clone(r.fenced)
}

// update takes a master's answer: ids and fenced are the roster when
// version differs from the one asked with.
func (r *tierRoster) update(version uint64, ids, fenced []string) {
	r.mu.Lock()
	if version == 0 || version == r.version {
		r.mu.Unlock()
		return
	}
	r.version = version
	changed := !slices.Equal(r.ids, ids) || !slices.Equal(r.fenced, fenced)
	r.ids, r.fenced = slices.Clone(ids), slices.Clone(fenced)
	fn := r.onChange
	r.mu.Unlock()
	if changed && fn != nil {
		fn(slices.Clone(ids), slices.Clone(fenced))
	}
}

// seed sets the roster a node kept from before its restart, unless a
// master has given it one since.
func (r *tierRoster) seed(ids, fenced []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.version == 0 && len(r.ids) == 0 && len(r.fenced) == 0 {
		r.ids, r.fenced = slices.Clone(ids), slices.Clone(fenced)
	}
}

func (r *tierRoster) watch(fn func(ids, fenced []string)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.onChange = fn
}
