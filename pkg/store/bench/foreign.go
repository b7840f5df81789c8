package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	ebench "github.com/kvcache-ops/mc/pkg/engine/bench"
	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/alloc"
)

// ErrNoRoom is a row refused against a store the run did not start: the
// room below the store's eviction watermark cannot hold the row's
// working set, and filling past it would evict the store's other keys.
var ErrNoRoom = errors.New("not enough room below the store's eviction watermark")

// room is what a store the run did not start can take without evicting:
// its capacity, its use and the bytes below the watermark.
type room struct {
	capacity, used uint64
	largest        uint64 // the largest segment
	free           uint64 // below the watermark, less a margin
}

// foreign is a run's view of a store it did not start (Config.Master
// without AllowEvict): it reads the store's room from the admin API and
// sizes each row to it.
type foreign struct {
	admin     *store.Admin
	watermark float64
	// evicted0 is the store's evicted-key count when the run began (-1:
	// the admin API does not export it).
	evicted0 float64
	first    room
	// peak is the largest working set a row used, in bytes.
	peak atomic.Uint64
}

func newForeign(ctx context.Context, cfg Config) (*foreign, error) {
	a, err := store.NewAdmin(cfg.Admin)
	if err != nil {
		return nil, err
	}
	f := &foreign{admin: a, watermark: cfg.HighWatermark, evicted0: -1}
	if f.first, err = f.room(ctx); err != nil {
		return nil, err
	}
	f.evicted0 = f.evicted(ctx)
	return f, nil
}

// room reads the store's segments. The margin (a tenth of the room)
// covers the allocator's rounding, regions other clients hold and what
// other clients put meanwhile.
func (f *foreign) room(ctx context.Context) (room, error) {
	segs, err := f.admin.Segments(ctx)
	if err != nil {
		return room{}, fmt.Errorf("read the store's capacity and use (its admin API, to keep the run below its eviction watermark): %w", err)
	}
	var r room
	for _, s := range segs {
		r.capacity += s.Capacity
		r.used += s.Used
		r.largest = max(r.largest, s.Capacity)
	}
	if below := uint64(f.watermark * float64(r.capacity)); below > r.used {
		r.free = (below - r.used) / 10 * 9
	}
	return r, nil
}

// evicted is the store's evicted-key count, -1 when unknown.
func (f *foreign) evicted(ctx context.Context) float64 {
	m, err := f.admin.Metrics(ctx)
	if err != nil {
		return -1
	}
	v, ok := m["master_evicted_key_count"]
	if !ok {
		return -1
	}
	return v
}

// footprint is what one value takes in a segment.
func footprint(vs int64) uint64 { return (uint64(vs) + alloc.Align - 1) / alloc.Align * alloc.Align }

// plan sizes a row to r: the keys gets read (nkeys, at most want) and the
// put keys it keeps in the store at a time (putLimit; the oldest are
// removed as new ones are written). It refuses a row whose callers
// cannot all have a batch in flight.
func (f *foreign) plan(r room, vs int64, op string, workers, batch, want int) (nkeys, putLimit int, err error) {
	if uint64(vs) > r.largest {
		return 0, 0, fmt.Errorf("value size %s is larger than any segment of the store (the largest is %s)", ebench.FormatSize(vs), ebench.FormatSize(int64(r.largest)))
	}
	fits := int(r.free / footprint(vs))
	inFlight := workers * batch
	need := 0
	switch op {
	case "get":
		nkeys = min(want, fits)
		need = inFlight
	case "put":
		putLimit = fits
		need = 2 * inFlight
	default: // mix: half for the keys gets read, half for puts
		nkeys = min(want, fits/2)
		putLimit = fits - nkeys
		need = 3 * inFlight
	}
	if (op != "put" && nkeys < min(want, inFlight)) || (op != "get" && putLimit < 2*inFlight) {
		return 0, 0, fmt.Errorf("%w: a %s %s row with %d caller(s) of batch %d needs %s, the store has %s (%s used of %s, eviction watermark %.2f, less a tenth for rounding); use a smaller --value-size, --concurrency or --batch, or give --allow-evict to let the run evict the store's other keys",
			ErrNoRoom, ebench.FormatSize(vs), op, workers, batch, fmtBytes(uint64(need)*footprint(vs)), fmtBytes(r.free), fmtBytes(r.used), fmtBytes(r.capacity), f.watermark)
	}
	f.peak.Store(max(f.peak.Load(), uint64(nkeys+putLimit)*footprint(vs)))
	return nkeys, putLimit, nil
}

// check plans every row of cfg against the room at the start, so a run
// that cannot fit is refused before it measures anything.
func (f *foreign) check(cfg Config) error {
	for _, vs := range cfg.ValueSizes {
		for _, op := range cfg.Ops {
			for _, n := range cfg.Concurrency {
				if _, _, err := f.plan(f.first, vs, op, n, cfg.Batch, n*cfg.Batch); err != nil {
					return err
				}
			}
		}
	}
	f.peak.Store(0)
	return nil
}

// fmtBytes is n in the largest binary unit it holds, one decimal.
func fmtBytes(n uint64) string {
	const units = "KMGTPE"
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	f, i := float64(n)/1024, 0
	for ; f >= 1024 && i < len(units)-1; i++ {
		f /= 1024
	}
	return fmt.Sprintf("%.1f %ciB", f, units[i])
}

// putWindow bounds the put keys a row keeps in a store it did not start:
// a put batch takes a token, and a remover returns it by removing the
// batch once more than half the window is written; so at most putLimit
// keys of the row are in the store at a time, oldest removed first.
type putWindow struct {
	tokens  chan struct{}
	written chan []string
	done    chan struct{}
	removed *atomic.Uint64 // the run's count of keys removed
	once    sync.Once
}

func newPutWindow(c *store.Client, removed *atomic.Uint64, putLimit, batch, workers int) *putWindow {
	n := putLimit / batch
	w := &putWindow{tokens: make(chan struct{}, n), written: make(chan []string, workers), done: make(chan struct{}), removed: removed}
	for range n {
		w.tokens <- struct{}{}
	}
	go func() {
		defer close(w.done)
		ctx := context.Background()
		var queue [][]string
		remove := func() {
			for _, err := range c.BatchRemove(ctx, queue[0], true) {
				if err == nil {
					w.removed.Add(1)
				}
			}
			queue = queue[1:]
			w.tokens <- struct{}{}
		}
		for keys := range w.written {
			queue = append(queue, keys)
			for len(queue) > n/2 {
				remove()
			}
		}
		for len(queue) > 0 {
			remove()
		}
	}()
	return w
}

// take waits for room for one more batch; false when the row ends first.
func (w *putWindow) take(ctx context.Context, quit <-chan struct{}) bool {
	select {
	case <-w.tokens:
		return true
	case <-quit:
		return false
	case <-ctx.Done():
		return false
	}
}

// put hands a written batch to the remover.
func (w *putWindow) put(keys []string) { w.written <- append([]string(nil), keys...) }

// close removes what is left and waits for it.
func (w *putWindow) close() {
	w.once.Do(func() { close(w.written) })
	<-w.done
}

// report is the one line a run against a store it did not start ends
// with.
func (r *runner) report(ctx context.Context, cfg Config) string {
	prefix := fmt.Sprintf("%q", r.prefix())
	removed := r.removed.Load()
	if r.foreign == nil {
		return fmt.Sprintf("bench store: wrote under %s with --allow-evict (working set not bounded by the store's room; the store may have evicted other keys to make room); removed %d keys at the end", prefix, removed)
	}
	f := r.foreign
	evicted := "the store's eviction count is not exported"
	if now := f.evicted(ctx); now >= 0 && f.evicted0 >= 0 {
		evicted = fmt.Sprintf("the store evicted %.0f keys meanwhile", now-f.evicted0)
	}
	return fmt.Sprintf("bench store: wrote under %s on a store it did not start, at most %s at a time (room below its %.2f eviction watermark at the start: %s, with %s used of %s); removed %d keys at the end; %s",
		prefix, fmtBytes(f.peak.Load()), f.watermark, fmtBytes(f.first.free), fmtBytes(f.first.used), fmtBytes(f.first.capacity), removed, evicted)
}
