package store

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine"
	"github.com/kvcache-ops/mc/pkg/store/alloc"
)

// stagingPool is a node's staging pool for disk reads: memory registered
// with its engine apart from the segment, the one allocator over it, and
// the staged reads (batches) it holds. Two kinds of batch share it: the
// master's (STAGE over the Tier stream, for readers on Mooncake's wire:
// freed by the master's RELEASE, or with the stream), and a reader's own
// (TierRead: freed by the reader's ReleaseStaged or ttl after the node
// answered). A batch takes all its ranges at once or waits, so two
// batches never hold part of the pool each while waiting for the rest.
type stagingPool struct {
	mu    sync.Mutex
	mem   *engine.Memory
	gen   uint64 // bumped when mem is renewed: older batches went with it
	alloc *alloc.Allocator
	room  chan struct{} // closed (and replaced) whenever ranges are freed
	// batches by id; ids start at random per process, so a release
	// meant for an earlier incarnation of this node frees nothing here.
	batches map[uint64]*stagedBatch
	nextID  uint64
	ttl     time.Duration // a direct batch's hold without a hand-back

	// waits counts reads that waited for room; reclaimed and released
	// the readers' staged reads (a range each) freed by the TTL and
	// handed back; direct the batches readers asked for.
	waits, reclaimed, released, direct atomic.Uint64
}

// stagedBatch is one staged read's ranges.
type stagedBatch struct {
	gen    uint64
	addrs  []uint64 // 0: a key that failed (nothing held)
	sizes  []uint64
	until  time.Time // zero: the master's, freed by its RELEASE
	master bool
}

// stagingAlign is where a range of a page or more starts, when one can
// be had: a node without huge pages then reads a value with O_DIRECT
// straight into it (tier's readRecord).
const stagingAlign = 4096

func newStagingPool(mem *engine.Memory, ttl time.Duration) (*stagingPool, error) {
	p := &stagingPool{batches: make(map[uint64]*stagedBatch), nextID: rand.Uint64() >> 1, ttl: ttl}
	if err := p.reset(mem); err != nil {
		return nil, err
	}
	return p, nil
}

// reset puts the pool on mem (new, or renewed): every batch of the old
// memory is gone with it.
func (p *stagingPool) reset(mem *engine.Memory) error {
	a, err := alloc.New(mem.Addr(), uint64(mem.Len()))
	if err != nil {
		return fmt.Errorf("staging pool 0x%x+%d: %w", mem.Addr(), mem.Len(), err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mem, p.alloc = mem, a
	p.gen++
	clear(p.batches)
	p.wake()
	return nil
}

func (p *stagingPool) wake() {
	if p.room != nil {
		close(p.room)
	}
	p.room = make(chan struct{})
}

func (p *stagingPool) setTTL(ttl time.Duration) {
	p.mu.Lock()
	p.ttl = ttl
	p.mu.Unlock()
}

func (p *stagingPool) ttlNow() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ttl
}

// memory is the pool's memory now, pinned (nil: being renewed).
func (p *stagingPool) memory() *engine.Memory {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.mem.Pin() {
		return nil
	}
	return p.mem
}

// take allocates a range for each size (0: none), all at once, waiting
// for room until ctx ends. It returns the ranges, the generation they
// belong to and the memory, pinned (the caller reads into it, Unpins,
// then hands the ranges to add or put).
func (p *stagingPool) take(ctx context.Context, sizes []uint64) ([]uint64, uint64, *engine.Memory, error) {
	var total uint64
	for _, n := range sizes {
		total += n
	}
	waited := false
	for {
		p.mu.Lock()
		if total > p.alloc.Capacity() {
			capacity := p.alloc.Capacity()
			p.mu.Unlock()
			return nil, 0, nil, Errorf(NoAvailableHandle, "%d bytes of disk objects in one read are more than this node's staging pool of %s holds (raise --ssd-staging-size, or read fewer at once)", total, fmtSize(capacity))
		}
		addrs := make([]uint64, len(sizes))
		ok := true
		for i, n := range sizes {
			if n == 0 {
				continue
			}
			a, err := p.alloc.AllocAligned(n, stagingAlign)
			if err != nil {
				a, err = p.alloc.Alloc(n)
			}
			if err != nil {
				ok = false
				break
			}
			addrs[i] = a
		}
		if ok && p.mem.Pin() {
			gen, mem := p.gen, p.mem
			p.mu.Unlock()
			return addrs, gen, mem, nil
		}
		for i, a := range addrs {
			if a != 0 {
				_ = p.alloc.Free(a, sizes[i])
			}
		}
		room, used, capacity := p.room, p.alloc.Used(), p.alloc.Capacity()
		p.mu.Unlock()
		if !waited {
			waited = true
			p.waits.Add(1)
		}
		select {
		case <-room:
		case <-ctx.Done():
			return nil, 0, nil, Errorf(NoAvailableHandle, "this node's staging pool of %s stayed full (%s in use by reads): %v", fmtSize(capacity), fmtSize(used), ctx.Err())
		}
	}
}

// add records a batch of ranges taken (a failed key's range freed and
// its addr 0): held until its release, or ttl from now for a reader's
// own. It returns the batch id.
func (p *stagingPool) add(gen uint64, addrs, sizes []uint64, master bool) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	b := &stagedBatch{gen: gen, addrs: addrs, sizes: sizes, master: master}
	if !master {
		b.until = time.Now().Add(p.ttl)
		p.direct.Add(1)
	}
	if gen != p.gen {
		// Renewed meanwhile: the ranges went with the old memory.
		return 0
	}
	p.nextID++
	p.batches[p.nextID] = b
	return p.nextID
}

// held is the number of staged reads (ranges) b holds: what released
// and reclaimed count, as the master counts its staged reads.
func (b *stagedBatch) held() uint64 {
	var n uint64
	for _, a := range b.addrs {
		if a != 0 {
			n++
		}
	}
	return n
}

// put frees ranges taken and not kept (a read that failed).
func (p *stagingPool) put(gen uint64, addrs, sizes []uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.freeLocked(&stagedBatch{gen: gen, addrs: addrs, sizes: sizes})
}

func (p *stagingPool) freeLocked(b *stagedBatch) {
	if b.gen != p.gen {
		return
	}
	for i, a := range b.addrs {
		if a != 0 {
			_ = p.alloc.Free(a, b.sizes[i])
		}
	}
	p.wake()
}

// release frees batch id (a reader's hand-back, or the master's
// RELEASE); false when it is not held (freed by its TTL already, or an
// id of another incarnation).
//
// byMaster says who hands it back: the master frees only its loads'
// batches and a reader only readers' (a reader never holds a master's
// id; one that sent one would free a range the master's transfer into a
// DRAM segment may still be reading, and that copy would carry another
// record's bytes).
func (p *stagingPool) release(id uint64, byMaster bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	b := p.batches[id]
	if b == nil || b.master != byMaster {
		return false
	}
	delete(p.batches, id)
	p.freeLocked(b)
	if !b.master {
		p.released.Add(b.held())
	}
	return true
}

// dropMaster frees the master's batches (its stream ended: it will not
// release them, and a new master knows nothing of them).
func (p *stagingPool) dropMaster() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for id, b := range p.batches {
		if b.master {
			delete(p.batches, id)
			p.freeLocked(b)
		}
	}
}

// expire frees the readers' batches whose TTL has passed, counted as
// reclaimed (their readers died, or took longer than they were told).
func (p *stagingPool) expire(now time.Time) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for id, b := range p.batches {
		if !b.until.IsZero() && !now.Before(b.until) {
			delete(p.batches, id)
			p.freeLocked(b)
			n += int(b.held())
		}
	}
	p.reclaimed.Add(uint64(n))
	return n
}

// usage is the pool's size and the bytes held.
func (p *stagingPool) usage() (size, used uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.alloc.Capacity(), p.alloc.Used()
}

func fmtSize(n uint64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%d bytes", n)
}
