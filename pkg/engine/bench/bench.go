// Package bench is the logic of `mc bench target|initiator`, Mooncake's
// transfer_engine_bench: a target registers buffers holding a
// deterministic pattern; an initiator runs Mooncake's loop (per thread:
// batch_size requests of block_size at offset block_size*(i*threads+tid),
// submit, wait for every task, repeat until duration) and reports
// throughput, IOPS, per-batch latency percentiles and failed tasks,
// optionally verifying every byte. A block-size list runs a sweep.
package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine"
)

// Target is a running bench target.
type Target struct {
	Engine  *engine.Engine
	Buffers []*engine.Memory
	owned   bool // Close also closes the engine
}

// TargetConfig says what a target registers.
type TargetConfig struct {
	// BufferSize is registered once per NUMA node.
	BufferSize int64
	// Nodes are the NUMA nodes (one buffer each, location "cpu:<n>");
	// empty means node 0 only.
	Nodes []int
}

// StartTarget registers cfg's buffers on e, remotely accessible, each
// filled with the verification pattern (offsets from its own start).
func StartTarget(ctx context.Context, e *engine.Engine, cfg TargetConfig) (*Target, error) {
	if cfg.BufferSize <= 0 || cfg.BufferSize > math.MaxInt {
		return nil, fmt.Errorf("buffer size %d is not a positive size", cfg.BufferSize)
	}
	nodes := cfg.Nodes
	if len(nodes) == 0 {
		nodes = []int{0}
	}
	t := &Target{Engine: e}
	for _, n := range nodes {
		m, err := e.RegisterMemory(ctx, int(cfg.BufferSize), fmt.Sprintf("cpu:%d", n), true)
		if err != nil {
			t.release(ctx)
			return nil, err
		}
		FillPattern(m.Bytes(), 0, 0)
		t.Buffers = append(t.Buffers, m)
	}
	return t, nil
}

// StartLoopbackTarget starts a target in its own engine on 127.0.0.1 with
// P2P metadata: the embedded default of `mc bench initiator`, reached over
// real loopback TCP.
func StartLoopbackTarget(ctx context.Context, cfg engine.Config, size int64) (*Target, error) {
	cfg.BindAddress = "127.0.0.1"
	cfg.MetadataServer = "P2PHANDSHAKE"
	cfg.Backend = nil
	cfg.HandshakeAddr = "127.0.0.1:0"
	if cfg.LocalServerName == "" {
		cfg.LocalServerName = "mc-embedded-target"
	}
	e, err := engine.New(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("embedded target: %w", err)
	}
	t, err := StartTarget(ctx, e, TargetConfig{BufferSize: size})
	if err != nil {
		e.Close()
		return nil, fmt.Errorf("embedded target: %w", err)
	}
	t.owned = true
	return t, nil
}

// RunLoopback runs the initiator loop of ic against a fresh loopback
// target (StartLoopbackTarget, sized to ic.BufferSize) from a fresh
// initiator engine on 127.0.0.1, both configured from cfg: the engine's
// own speed on this host, the baseline other benchmarks compare with.
// ic.Engine and ic.Segment are set here.
func RunLoopback(ctx context.Context, cfg engine.Config, ic InitiatorConfig) ([]Result, error) {
	tgt, err := StartLoopbackTarget(ctx, cfg, ic.BufferSize)
	if err != nil {
		return nil, err
	}
	defer tgt.Close()
	cfg.BindAddress, cfg.HandshakeAddr = "127.0.0.1", "127.0.0.1:0"
	e, err := engine.New(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer e.Close()
	ic.Engine, ic.Segment = e, tgt.Engine.SegmentName()
	return Run(ctx, ic)
}

func (t *Target) release(ctx context.Context) {
	for _, m := range t.Buffers {
		t.Engine.UnregisterMemory(ctx, m)
	}
	t.Buffers = nil
}

// Close unregisters the buffers (and closes the engine of a loopback
// target).
func (t *Target) Close() error {
	if t.owned {
		return t.Engine.Close()
	}
	t.release(context.Background())
	return nil
}

// InitiatorConfig is one initiator run (a sweep when BlockSizes has more
// than one entry).
type InitiatorConfig struct {
	Engine     *engine.Engine
	Segment    string
	Op         engine.Opcode
	BatchSize  int
	BlockSizes []int64
	// BufferSize is the local buffer registered for the run; it must hold
	// batch_size*block_size*threads.
	BufferSize int64
	Duration   time.Duration
	Threads    int
	Verify     bool
	// Nodes are the NUMA nodes to allocate local buffers on, one each
	// (location "cpu:<n>"); empty means node 0.
	Nodes []int
	// Progress, when set, is called about every 200 ms during each run.
	Progress func(Progress)

	afterPrime func() // tests: runs once the read-verify pattern is in place
}

// Progress is a live snapshot.
type Progress struct {
	BlockSize int64
	Elapsed   time.Duration
	Duration  time.Duration
	Bytes     uint64
}

// Result is one run (one block size).
type Result struct {
	Operation   string        `json:"operation"`
	BlockSize   int64         `json:"block_size"`
	BatchSize   int           `json:"batch_size"`
	Threads     int           `json:"threads"`
	Duration    time.Duration `json:"-"`
	BatchCount  uint64        `json:"batch_count"`
	Bytes       uint64        `json:"bytes"`
	BytesPerSec float64       `json:"bytes_per_sec"`
	IOPS        float64       `json:"iops"`
	LatencyP50  time.Duration `json:"-"`
	LatencyP99  time.Duration `json:"-"`
	LatencyP999 time.Duration `json:"-"`
	FailedTasks uint64        `json:"failed_tasks"`
	Verified    bool          `json:"verified"`
	// Transport moved the bytes: "tcp", "rdma", "shm" (a same-host
	// target's memory, mapped) or "local" (the initiator's own segment).
	Transport string `json:"transport"`
	// Provider moved rdma's bytes: "ibverbs", or "soft" (the software
	// NIC, over TCP sockets); "" for other transports.
	Provider string `json:"provider"`
	Err      error  `json:"-"`
}

// TransportLabel names the transport for a table or a banner: "rdma
// (soft)" when the software NIC moved the bytes.
func (r Result) TransportLabel() string { return engine.TransportLabel(r.Transport, r.Provider) }

// ErrFailedTasks is matched when a run ended because tasks failed.
var ErrFailedTasks = errors.New("transfer tasks failed")

// Run executes the initiator: one run per block size, in order. It stops
// at the first run that fails (tasks failed, or verification found a
// mismatch) and returns the results so far with that error. A cancelled
// ctx ends the current run early; its figures cover the time run.
func Run(ctx context.Context, cfg InitiatorConfig) ([]Result, error) {
	if cfg.BatchSize <= 0 || cfg.Threads <= 0 || cfg.Duration <= 0 || len(cfg.BlockSizes) == 0 {
		return nil, fmt.Errorf("bench: batch size, threads, duration and block size must be positive")
	}
	e := cfg.Engine
	seg, err := e.OpenSegment(ctx, cfg.Segment)
	if err != nil {
		return nil, err
	}
	defer seg.Close()
	d := seg.Descriptor()
	if len(d.Buffers) == 0 {
		return nil, fmt.Errorf("segment %q has no registered buffer", cfg.Segment)
	}
	maxBlock := slices.Max(cfg.BlockSizes)
	span := maxBlock * int64(cfg.BatchSize) * int64(cfg.Threads)
	if span/int64(cfg.Threads)/int64(cfg.BatchSize) != maxBlock || span > cfg.BufferSize {
		return nil, fmt.Errorf("batch_size %d x block_size %d x threads %d = %d bytes does not fit in buffer_size %d",
			cfg.BatchSize, maxBlock, cfg.Threads, span, cfg.BufferSize)
	}
	nodes := cfg.Nodes
	if len(nodes) == 0 {
		nodes = []int{0}
	}
	// As transfer_engine_bench: one local buffer per NUMA node (cpu:<n>),
	// thread tid working from buffer tid % nodes and on the target's
	// buffer tid % buffers (the target registers one per node too).
	places := make([]place, cfg.Threads)
	for tid := range places {
		rb := d.Buffers[tid%len(d.Buffers)]
		if uint64(span) > rb.Length {
			return nil, fmt.Errorf("--batch-size %d x the largest --block-size %s x --threads %d = %s does not fit in the target's buffer (segment %q registers %s, buffer %q): lower one of them, or give the target a larger --buffer-size",
				cfg.BatchSize, FormatSize(maxBlock), cfg.Threads, FormatSize(span), cfg.Segment, FormatSize(int64(rb.Length)), rb.Name)
		}
		places[tid].remote = rb.Addr
	}
	for i, n := range nodes[:min(len(nodes), cfg.Threads)] {
		loc := fmt.Sprintf("cpu:%d", n)
		local, err := e.RegisterMemory(ctx, int(span), loc, false)
		if err != nil {
			return nil, err
		}
		defer e.UnregisterMemory(context.Background(), local)
		// Writes carry the target's own pattern, so a write run leaves
		// the target as it found it (a later read --verify still passes).
		FillPattern(local.Bytes(), 0, 0)
		var readback *engine.Memory
		if cfg.Verify && cfg.Op == engine.Write {
			if readback, err = e.RegisterMemory(ctx, int(span), loc, false); err != nil {
				return nil, err
			}
			defer e.UnregisterMemory(context.Background(), readback)
		}
		for tid := i; tid < cfg.Threads; tid += len(nodes) {
			places[tid].local, places[tid].readback = local, readback
		}
	}
	if cfg.Verify && cfg.Op == engine.Read {
		// The target's memory holds mc's pattern only when the target is
		// mc: a Mooncake target (or one a write run of other data has
		// touched) holds anything. Writing the pattern first makes read
		// verification check the transport, not who the target is.
		primed := map[uint64]bool{}
		for _, pl := range places {
			if primed[pl.remote] {
				continue
			}
			primed[pl.remote] = true
			if err := writeSpan(ctx, e, seg, pl.local, pl.remote, span); err != nil {
				return nil, fmt.Errorf("verify: write the pattern to segment %q before reading it back: %w", cfg.Segment, err)
			}
		}
		if cfg.afterPrime != nil {
			cfg.afterPrime()
		}
	}
	var out []Result
	for _, bs := range cfg.BlockSizes {
		r := runOne(ctx, cfg, seg, places, bs)
		r.Transport, r.Provider = seg.Transport(), seg.Provider()
		out = append(out, r)
		if r.Err != nil {
			return out, r.Err
		}
		if ctx.Err() != nil {
			break
		}
	}
	return out, nil
}

// place is where one thread works: its local buffer (and read-back
// buffer for write verification) and the target buffer's address.
type place struct {
	local, readback *engine.Memory
	remote          uint64
}

type worker struct {
	tid       int
	lat       []time.Duration
	batches   uint64
	failed    uint64
	err       error
	scratch   []byte
	verifySeq uint64
}

func runOne(ctx context.Context, cfg InitiatorConfig, seg *engine.Segment, places []place, bs int64) Result {
	var stop atomic.Bool
	var bytesDone atomic.Uint64
	workers := make([]*worker, cfg.Threads)
	var wg sync.WaitGroup
	start := time.Now()
	for tid := range workers {
		w := &worker{tid: tid, lat: make([]time.Duration, 0, 4096)}
		if cfg.Verify {
			w.scratch = make([]byte, bs)
		}
		workers[tid] = w
		wg.Add(1)
		go func() {
			defer wg.Done()
			pl := places[tid]
			w.loop(cfg, seg, pl.remote, pl.local, pl.readback, bs, &stop, &bytesDone)
			if w.err != nil {
				stop.Store(true)
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	tick := time.NewTicker(200 * time.Millisecond)
	timer := time.NewTimer(cfg.Duration)
	defer tick.Stop()
	defer timer.Stop()
loop:
	for {
		select {
		case <-done:
			break loop
		case <-timer.C:
			stop.Store(true)
		case <-ctx.Done():
			stop.Store(true)
		case <-tick.C:
			if cfg.Progress != nil {
				cfg.Progress(Progress{BlockSize: bs, Elapsed: time.Since(start), Duration: cfg.Duration, Bytes: bytesDone.Load()})
			}
		}
	}
	elapsed := time.Since(start)

	r := Result{Operation: opName(cfg.Op), BlockSize: bs, BatchSize: cfg.BatchSize, Threads: cfg.Threads, Duration: elapsed, Verified: cfg.Verify}
	var lat []time.Duration
	for _, w := range workers {
		r.BatchCount += w.batches
		r.FailedTasks += w.failed
		lat = append(lat, w.lat...)
		if r.Err == nil && w.err != nil {
			r.Err = w.err
		}
	}
	// Mooncake's figure: bytes = batch_count*batch_size*block_size.
	r.Bytes = r.BatchCount * uint64(cfg.BatchSize) * uint64(bs)
	if s := elapsed.Seconds(); s > 0 {
		r.BytesPerSec = float64(r.Bytes) / s
		r.IOPS = float64(r.BatchCount*uint64(cfg.BatchSize)) / s
	}
	slices.Sort(lat)
	r.LatencyP50, r.LatencyP99, r.LatencyP999 = Percentile(lat, 0.50), Percentile(lat, 0.99), Percentile(lat, 0.999)
	return r
}

// Percentile is the nearest-rank percentile of sorted v (0 when empty),
// the one definition both the transfer and the store benchmarks report.
func Percentile(v []time.Duration, p float64) time.Duration {
	if len(v) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(v)))) - 1
	return v[max(0, min(i, len(v)-1))]
}

func opName(op engine.Opcode) string {
	if op == engine.Write {
		return "write"
	}
	return "read"
}

func (w *worker) loop(cfg InitiatorConfig, seg *engine.Segment, remoteBase uint64, local, readback *engine.Memory, bs int64, stop *atomic.Bool, bytesDone *atomic.Uint64) {
	e := cfg.Engine
	b, err := e.AllocateBatch(cfg.BatchSize)
	if err != nil {
		w.err = err
		return
	}
	reqs := make([]engine.Request, cfg.BatchSize)
	offs := make([]uint64, cfg.BatchSize)
	for i := range reqs {
		off := uint64(bs) * uint64(i*cfg.Threads+w.tid)
		offs[i] = off
		reqs[i] = engine.Request{Op: cfg.Op, Source: local.Addr() + off, Segment: seg, Target: remoteBase + off, Length: uint64(bs)}
	}
	var back []engine.Request
	if readback != nil {
		back = make([]engine.Request, len(reqs))
		for i, r := range reqs {
			back[i] = engine.Request{Op: engine.Read, Source: readback.Addr() + offs[i], Segment: seg, Target: r.Target, Length: r.Length}
		}
	}
	ctx := context.Background() // tasks end on their own (status timeout)
	for !stop.Load() {
		seed := uint64(0)
		if readback != nil {
			// A fresh pattern per batch, so a write that never landed
			// cannot pass by matching the previous one.
			w.verifySeq++
			seed = w.verifySeq
			for _, off := range offs {
				FillPattern(local.Bytes()[off:off+uint64(bs)], off, seed)
			}
		}
		t0 := time.Now()
		if err := w.batch(ctx, b, reqs); err != nil {
			return
		}
		w.lat = append(w.lat, time.Since(t0))
		w.batches++
		bytesDone.Add(uint64(cfg.BatchSize) * uint64(bs))
		if !cfg.Verify {
			continue
		}
		check := local
		if readback != nil {
			if err := w.batch(ctx, b, back); err != nil {
				return
			}
			check = readback
		}
		for i, off := range offs {
			blk := check.Bytes()[off : off+uint64(bs)]
			if j := checkPattern(blk, w.scratch, off, seed); j >= 0 {
				o := off + uint64(j)
				w.err = &MismatchError{Segment: seg.Name(), Offset: o, Addr: reqs[i].Target + uint64(j),
					Expected: PatternByte(o, seed), Actual: blk[j]}
				return
			}
		}
	}
	if readback != nil && w.err == nil {
		// Put the target's pattern back.
		for _, off := range offs {
			FillPattern(local.Bytes()[off:off+uint64(bs)], off, 0)
		}
		w.batch(ctx, b, reqs)
	}
}

// writeSpan writes local[0:span) to the segment at remote, in requests
// of at most 1 MiB, 64 at a time.
func writeSpan(ctx context.Context, e *engine.Engine, seg *engine.Segment, local *engine.Memory, remote uint64, span int64) error {
	const block, batch = 1 << 20, 64
	reqs := make([]engine.Request, 0, batch)
	for off := int64(0); off < span; {
		reqs = reqs[:0]
		for ; off < span && len(reqs) < batch; off += block {
			reqs = append(reqs, engine.Request{Op: engine.Write, Source: local.Addr() + uint64(off), Segment: seg,
				Target: remote + uint64(off), Length: uint64(min(block, span-off))})
		}
		if err := e.Transfer(ctx, reqs...); err != nil {
			return err
		}
	}
	return nil
}

// batch runs reqs through b and waits; failed tasks are counted and end
// the run.
func (w *worker) batch(ctx context.Context, b *engine.Batch, reqs []engine.Request) error {
	b.Reset()
	if _, err := b.Submit(reqs...); err != nil {
		w.err = err
		return err
	}
	err := b.Wait(ctx)
	if err == nil {
		return nil
	}
	for i := 0; i < b.Len(); i++ {
		if st, _ := b.TaskStatus(i); st.Status == engine.Failed {
			w.failed++
		}
	}
	w.err = fmt.Errorf("%w: %d of %d in a batch: %w", ErrFailedTasks, w.failed, b.Len(), err)
	return w.err
}
