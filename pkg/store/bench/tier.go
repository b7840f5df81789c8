package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	ebench "github.com/kvcache-ops/mc/pkg/engine/bench"
	"github.com/kvcache-ops/mc/pkg/store/tier"
)

// onDiskLease is the embedded master's read lease in OnDisk runs: a
// staging copy lives as long as its lease (every read renews it, and it
// is freed at the master's next maintenance tick after), and a shorter
// one keeps the next read of the same key (one pass over the keys later)
// going to disk. A row whose keys come round sooner is refused. A
// variable for tests, which run small key sets.
var onDiskLease = 200 * time.Millisecond

// diskKeys is how many keys an OnDisk get row reads: about 2 GiB of them,
// at least 64 and four per value in flight, at most 80% of the tier.
func (r *runner) diskKeys(vs int64, workers int) int {
	if r.cfg.Keys > 0 {
		return r.cfg.Keys
	}
	n := max(int((2<<30)/vs), 64, 4*workers*r.cfg.Batch)
	if r.srv != nil && r.srv.Tier != nil {
		room := r.srv.Tier.Stats().Capacity / 10 * 8
		n = min(n, int(room/tier.SpaceFor(r.getKey(vs, n), uint64(vs))))
	}
	return max(n, 1)
}

// offloadAll evicts the embedded store until every key of the row lives
// only on disk.
func (r *runner) offloadAll(ctx context.Context, vs int64, n int) error {
	if r.srv == nil || r.srv.Master == nil {
		return errors.New("objects on disk need the embedded store")
	}
	m := r.srv.Master
	keys := make([]string, n)
	for i := range keys {
		keys[i] = r.getKey(vs, i)
	}
	deadline := time.Now().Add(5*time.Minute + time.Duration(n)*10*time.Millisecond)
	for {
		m.Evict(1 << 62)
		left := 0
		for i := 0; i < len(keys); i += 1024 {
			for _, res := range m.BatchQuery(keys[i:min(i+1024, len(keys))]) {
				if res.Err != nil {
					return fmt.Errorf("offload for the row: %w", res.Err)
				}
				if len(res.Replicas) > 0 || res.Disk == nil {
					left++
				}
			}
		}
		if left == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("offload for the row: %d of %d objects still in DRAM after %s", left, n, time.Since(deadline.Add(-5*time.Minute)).Round(time.Second))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// diskRead measures the disk's own read throughput as an on-disk get row
// uses it: O_DIRECT reads of vs bytes (rounded up to whole blocks) from
// a file of nkeys such values in dir, going round the file, workers at
// once, for d.
func diskRead(ctx context.Context, dir string, vs int64, workers int, d time.Duration, nkeys int) (Result, error) {
	res := Result{ValueSize: vs, Op: "disk-read", Concurrency: workers, Batch: 1}
	span := (vs + tier.BlockSize - 1) &^ (tier.BlockSize - 1)
	path := filepath.Join(dir, fmt.Sprintf(".mc-bench-disk-read.%d", os.Getpid()))
	open := func(flag int) (*os.File, error) {
		f, err := os.OpenFile(path, flag|unix.O_DIRECT, 0o600)
		if errors.Is(err, unix.EINVAL) { // a filesystem without O_DIRECT
			f, err = os.OpenFile(path, flag, 0o600)
		}
		return f, err
	}
	f, err := open(os.O_CREATE | os.O_RDWR | os.O_TRUNC)
	if err != nil {
		return res, err
	}
	defer os.Remove(path)
	defer f.Close()
	chunk := max(span, 16<<20/span*span)
	wbuf, err := unix.Mmap(-1, 0, int(chunk), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return res, err
	}
	defer unix.Munmap(wbuf)
	ebench.FillPattern(wbuf, 0, 1)
	total := span * int64(nkeys)
	for off := int64(0); off < total; off += chunk {
		if _, err := f.WriteAt(wbuf[:min(chunk, total-off)], off); err != nil {
			return res, fmt.Errorf("write %s: %w", path, err)
		}
	}
	if err := f.Sync(); err != nil {
		return res, err
	}
	var next, ops atomic.Uint64
	var stop atomic.Bool
	lats := make([][]time.Duration, workers)
	errs := make([]error, workers)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rf, err := open(os.O_RDONLY)
			if err != nil {
				errs[w] = err
				return
			}
			defer rf.Close()
			buf, err := unix.Mmap(-1, 0, int(span), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
			if err != nil {
				errs[w] = err
				return
			}
			defer unix.Munmap(buf)
			for !stop.Load() && ctx.Err() == nil {
				off := int64(next.Add(1)%uint64(nkeys)) * span
				t0 := time.Now()
				if _, err := rf.ReadAt(buf, off); err != nil {
					errs[w] = err
					return
				}
				lats[w] = append(lats[w], time.Since(t0))
				ops.Add(1)
			}
		}()
	}
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
	stop.Store(true)
	wg.Wait()
	elapsed := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return res, fmt.Errorf("read %s: %w", path, err)
	}
	lat := slices.Concat(lats...)
	slices.Sort(lat)
	res.OpsPerSec = float64(ops.Load()) / elapsed.Seconds()
	res.GBPerSec = float64(ops.Load()) * float64(vs) / elapsed.Seconds() / 1e9
	res.P50us = us(ebench.Percentile(lat, 0.50))
	res.P99us = us(ebench.Percentile(lat, 0.99))
	res.P999us = us(ebench.Percentile(lat, 0.999))
	return res, ctx.Err()
}
