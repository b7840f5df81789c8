// Package vmem maps the memory that peers address by its virtual address:
// registered buffers, whose address travels on the wire as a Mooncake
// target address, and the same-host transport's memfd regions.
//
// Such an address is a capability: a peer that holds one (a writer stalled
// across a master restart, a stale descriptor) can write there later. So
// memory mapped here is placed at a random address, and when it is given
// up its range is not unmapped but replaced by an inaccessible
// reservation: the range names no memory again in this process (until
// MaxReservations later ranges push it out and the kernel may reuse it),
// and a process that starts after this one is unlikely to map its own
// buffers where this one's were. A late write then finds no registered
// buffer and fails, instead of landing in memory that now belongs to
// another object.
package vmem

import "sync"

// MaxReservations bounds how many given-up ranges stay reserved (each is
// one mapping of the kernel's, vm.max_map_count); past it the oldest is
// unmapped, its range free for the kernel to hand out again.
const MaxReservations = 4096

var reserved struct {
	mu     sync.Mutex
	ranges []span
	total  uint64
}

type span struct{ addr, size uintptr }

// Reserved reports how many ranges are reserved and their bytes.
func Reserved() (n int, bytes uint64) {
	reserved.mu.Lock()
	defer reserved.mu.Unlock()
	return len(reserved.ranges), reserved.total
}
