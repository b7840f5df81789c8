package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvcache-ops/mc/pkg/engine"
	ebench "github.com/kvcache-ops/mc/pkg/engine/bench"
	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/master"
	"github.com/kvcache-ops/mc/pkg/store/server"
	"github.com/kvcache-ops/mc/pkg/store/tier"
)

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

// diskFile is an on-disk get row's baseline: a file of nkeys values of
// vs bytes (each rounded up to whole blocks) in the tier's directory,
// read with O_DIRECT going round the file into huge-page memory. Into a
// plain buffer the baseline was a draw: where a hypervisor stands between
// the disk and the VM a read's cost follows how scattered the buffer's
// pages are (tier.ReadBuffer), and a fresh buffer's 1 MiB reads took from
// 0.3 to 1.7 ms on the same disk (dd with bs=16M: 0.7-0.9 GB/s; into huge
// pages: 3 GB/s). It is written before the row's
// prefill and read in two halves that bracket the row's gets in time
// (measure before, measure after): this VM's disk (the host's page cache
// behind virtio) swings 2x within seconds, and a baseline taken half a
// minute before the gets, across the prefill and offload, compared the
// gets with another disk.
type diskFile struct {
	path  string
	vs    int64
	span  int64
	nkeys int
	next  atomic.Uint64

	ops     uint64
	elapsed time.Duration
	lat     []time.Duration
}

func openDiskRead(ctx context.Context, dir string, vs int64, nkeys int) (*diskFile, error) {
	d := &diskFile{vs: vs, span: (vs + tier.BlockSize - 1) &^ (tier.BlockSize - 1), nkeys: nkeys,
		path: filepath.Join(dir, fmt.Sprintf(".mc-bench-disk-read.%d", os.Getpid()))}
	f, err := d.open(os.O_CREATE | os.O_RDWR | os.O_TRUNC)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	chunk := max(d.span, 16<<20/d.span*d.span)
	wbuf, err := unix.Mmap(-1, 0, int(chunk), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		os.Remove(d.path)
		return nil, err
	}
	defer unix.Munmap(wbuf)
	ebench.FillPattern(wbuf, 0, 1)
	total := d.span * int64(nkeys)
	for off := int64(0); off < total; off += chunk {
		if ctx.Err() != nil {
			os.Remove(d.path)
			return nil, ctx.Err()
		}
		if _, err := f.WriteAt(wbuf[:min(chunk, total-off)], off); err != nil {
			os.Remove(d.path)
			return nil, fmt.Errorf("write %s: %w", d.path, err)
		}
	}
	if err := f.Sync(); err != nil {
		os.Remove(d.path)
		return nil, err
	}
	return d, nil
}

func (d *diskFile) open(flag int) (*os.File, error) {
	f, err := os.OpenFile(d.path, flag|unix.O_DIRECT, 0o600)
	if errors.Is(err, unix.EINVAL) { // a filesystem without O_DIRECT
		f, err = os.OpenFile(d.path, flag, 0o600)
	}
	return f, err
}

func (d *diskFile) Close() error { return os.Remove(d.path) }

// measure reads for dur from workers at once and adds to the totals.
func (d *diskFile) measure(ctx context.Context, workers int, dur time.Duration) error {
	var ops atomic.Uint64
	var stop atomic.Bool
	lats := make([][]time.Duration, workers)
	errs := make([]error, workers)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rf, err := d.open(os.O_RDONLY)
			if err != nil {
				errs[w] = err
				return
			}
			defer rf.Close()
			// The memory the tier's own reads land in: huge pages, so
			// the baseline is the disk at its best, not a draw of how
			// scattered a fresh buffer's pages are (tier.ReadBuffer).
			buf, err := tier.ReadBuffer(int(d.span))
			if err != nil {
				errs[w] = err
				return
			}
			defer tier.FreeReadBuffer(buf)
			for !stop.Load() && ctx.Err() == nil {
				off := int64(d.next.Add(1)%uint64(d.nkeys)) * d.span
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
	case <-time.After(dur):
	case <-ctx.Done():
	}
	stop.Store(true)
	wg.Wait()
	d.elapsed += time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("read %s: %w", d.path, err)
	}
	d.ops += ops.Load()
	d.lat = append(d.lat, slices.Concat(lats...)...)
	return ctx.Err()
}

// result is the disk-read row of everything measured.
func (d *diskFile) result(workers int) Result {
	res := Result{ValueSize: d.vs, Op: "disk-read", Concurrency: workers, Batch: 1}
	if d.elapsed > 0 {
		res.OpsPerSec = float64(d.ops) / d.elapsed.Seconds()
		res.GBPerSec = float64(d.ops) * float64(d.vs) / d.elapsed.Seconds() / 1e9
	}
	slices.Sort(d.lat)
	res.P50us = us(ebench.Percentile(d.lat, 0.50))
	res.P99us = us(ebench.Percentile(d.lat, 0.99))
	res.P999us = us(ebench.Percentile(d.lat, 0.999))
	return res
}

// ScanConfig is issue 36's mixed row: a writer putting into DRAM while
// readers scan objects that live only on disk.
type ScanConfig struct {
	Dir      string // the disk tier's directory
	PutSize  int64  // the writer's values (upserts of PutKeys keys in turn)
	PutKeys  int
	ScanSize int64 // the disk objects' size
	ScanKeys int   // how many objects on disk the readers go round
	Readers  int
	Duration time.Duration // per phase
	Rounds   int
	Engine   engine.Config
	Logger   *slog.Logger
}

// ScanRound is one round: the writer's puts per second alone, then with
// the readers scanning, and the readers' gets per second meanwhile.
type ScanRound struct {
	AlonePuts, ScanPuts, ScanGets float64
	GetErrors                     int
}

// ScanWhilePut runs cfg on an embedded store with a disk tier: it puts
// ScanKeys objects and offloads them all, then per round measures the
// writer alone and the writer with Readers readers getting the disk
// objects round the keys (gets never promote them), one phase after the
// other, so that each round's ratio compares the same minute of a loaded
// machine.
func ScanWhilePut(ctx context.Context, cfg ScanConfig) ([]ScanRound, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	srv, err := server.Start(ctx, server.Config{RPCAddress: "127.0.0.1:0", SegmentSize: 1 << 30, Engine: cfg.Engine,
		Master: master.Config{Logger: log, PromoteAfter: -1}, Logger: log,
		Tier: &store.TierConfig{Dir: cfg.Dir, Capacity: 4 << 30, Logger: log}})
	if err != nil {
		return nil, fmt.Errorf("embedded store: %w", err)
	}
	defer srv.Close(context.WithoutCancel(ctx))
	if err := srv.Node.WaitPopulated(ctx); err != nil {
		return nil, err
	}
	newClient := func() (*store.Client, error) {
		return store.New(ctx, store.Config{Master: srv.RPCAddr, EngineConfig: cfg.Engine, Logger: log})
	}
	w, err := newClient()
	if err != nil {
		return nil, err
	}
	defer w.Close(context.WithoutCancel(ctx))
	rd, err := newClient()
	if err != nil {
		return nil, err
	}
	defer rd.Close(context.WithoutCancel(ctx))
	scanKey := func(i int) string { return fmt.Sprintf("scan/%d", i) }
	val := make([]byte, cfg.ScanSize)
	ebench.FillPattern(val, 0, 1)
	for i := range cfg.ScanKeys {
		if err := w.Put(ctx, scanKey(i), val); err != nil {
			return nil, fmt.Errorf("put %s: %w", scanKey(i), err)
		}
	}
	// Every scanned object on disk only.
	for deadline := time.Now().Add(5 * time.Minute); ; {
		srv.Master.Evict(1 << 62)
		left := 0
		for i := range cfg.ScanKeys {
			if r := srv.Master.BatchQuery([]string{scanKey(i)})[0]; r.Err != nil || len(r.Replicas) > 0 || r.Disk == nil {
				left++
			}
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%d of %d objects still in DRAM after 5 minutes of offloading", left, cfg.ScanKeys)
		}
		time.Sleep(50 * time.Millisecond)
	}
	put := make([]byte, cfg.PutSize)
	ebench.FillPattern(put, 0, 2)
	var next atomic.Uint64
	writer := func(stop *atomic.Bool) (int, error) {
		n := 0
		for !stop.Load() {
			k := fmt.Sprintf("put/%d", next.Add(1)%uint64(cfg.PutKeys))
			if err := w.Upsert(ctx, k, put); err != nil {
				return n, fmt.Errorf("upsert %s: %w", k, err)
			}
			n++
		}
		return n, nil
	}
	bufs := make([]*store.Buffer, cfg.Readers)
	for i := range bufs {
		if bufs[i], err = rd.RegisterBuffer(ctx, int(cfg.ScanSize)); err != nil {
			return nil, err
		}
	}
	var cursor atomic.Uint64
	phase := func(readers int) (puts, gets float64, getErrs int, err error) {
		var stop atomic.Bool
		var ngets, nerrs atomic.Int64
		var wg sync.WaitGroup
		for g := range readers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for !stop.Load() {
					k := scanKey(int(cursor.Add(1) % uint64(cfg.ScanKeys)))
					if _, err := rd.GetInto(ctx, k, store.Slice{Buf: bufs[g], Len: int(cfg.ScanSize)}); err != nil {
						nerrs.Add(1)
						continue
					}
					ngets.Add(1)
				}
			}()
		}
		t0 := time.Now()
		timer := time.AfterFunc(cfg.Duration, func() { stop.Store(true) })
		defer timer.Stop()
		n, werr := writer(&stop)
		el := time.Since(t0)
		stop.Store(true)
		wg.Wait()
		return float64(n) / el.Seconds(), float64(ngets.Load()) / el.Seconds(), int(nerrs.Load()), werr
	}
	var out []ScanRound
	for range cfg.Rounds {
		var r ScanRound
		if r.AlonePuts, _, _, err = phase(0); err != nil {
			return out, err
		}
		if r.ScanPuts, r.ScanGets, r.GetErrors, err = phase(cfg.Readers); err != nil {
			return out, err
		}
		out = append(out, r)
	}
	return out, nil
}
