// Package bench is the logic of `mc bench store`: a closed loop of puts,
// gets or a mix against a store (a running one, or an embedded master and
// node benchmarked over real loopback TCP), per value size and
// concurrency, reporting objects/s, GB/s, per-batch latency percentiles
// and errors, optionally verifying every byte read.
//
// Each worker owns a registered buffer and uses the client's zero-copy
// batch calls (BatchPutFrom, BatchGetInto), so what is measured is the
// store (master round trips and transfers), not copies in the benchmark.
package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine"
	ebench "github.com/kvcache-ops/mc/pkg/engine/bench"
	"github.com/kvcache-ops/mc/pkg/engine/meta"
	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/master"
	"github.com/kvcache-ops/mc/pkg/store/server"
)

// Ops names the operations.
var Ops = []string{"put", "get", "mix"}

// Config describes a benchmark run: every combination of ValueSizes,
// Ops and Concurrency is one result row.
type Config struct {
	// Master is the store to benchmark (host:port); empty starts an
	// embedded master and node in this process.
	Master string
	// SegmentSize is the embedded node's segment (default 4 GiB).
	SegmentSize uint64
	ValueSizes  []int64
	Ops         []string
	// GetRatio is the share of gets in "mix" (0..1).
	GetRatio    float64
	Concurrency []int
	// Batch is the number of keys per call (BatchPutFrom / BatchGetInto).
	Batch    int
	Duration time.Duration
	// Keys is the number of keys gets read from (prefilled before the
	// timed loop); 0 picks enough to spread reads over half the store.
	Keys   int
	Verify bool
	// Checksums makes the clients record and check checksums of values
	// (store.Config.Checksums).
	Checksums bool
	// Tenant is the clients' tenant (store.Config.Tenant).
	Tenant string
	// Engine configures the benchmark client's engine (and the embedded
	// node's); default loopback TCP.
	Engine engine.Config
	// VsTCP runs every row twice: first from a second client whose
	// engine is Engine under tcp (a "tcp" row), then from the benchmark
	// client, whose row gives its GB/s over the tcp row's (VsTCP): the
	// same-host transport against loopback TCP in one run. Engine's
	// protocol must be auto or shm.
	VsTCP bool
	// SSDDir gives the embedded node a disk tier in this directory (of
	// SSDSize bytes; 0: 90% of the filesystem's free space).
	SSDDir  string
	SSDSize uint64
	// OnDisk makes get rows read objects that live only on the disk tier
	// (embedded store with SSDDir): every prefilled key is offloaded
	// before the row, reads go round the keys so each finds its object
	// on disk, and objects are never promoted. Each such row follows a
	// "disk-read" row: O_DIRECT reads of the same size and concurrency
	// from a file in SSDDir into huge-page memory (tier.ReadBuffer), the
	// disk's own throughput at its best, measured for half the duration
	// just before the row's gets and half just after.
	OnDisk bool
	// Admin is the admin API ("http://host:port") of the store at
	// Master. Against a store it did not start, the run reads the
	// store's capacity and use from it before every row and sizes the
	// row's working set (the keys gets read, and the puts it keeps at a
	// time) to the room below the store's eviction watermark, so that
	// it evicts none of the store's other keys; it refuses a row that
	// cannot fit. Required with Master unless AllowEvict.
	Admin string
	// AllowEvict lets a run against a store it did not start fill the
	// store past its watermark, as a run against the embedded store
	// does: the store then evicts other keys to make room.
	AllowEvict bool
	// HighWatermark is the store's eviction_high_watermark_ratio
	// (default master.DefaultHighWatermark, below mooncake_master's
	// 0.95): the run keeps the store's use below it.
	HighWatermark float64
	// Report, when set, gets one line saying what a run against a store
	// it did not start did there: its key prefix, its working set, the
	// keys it removed and what the store evicted meanwhile.
	Report func(string)
	// Progress, when set, is called about every 200 ms during a row.
	Progress func(Progress)
	// RowDone, when set, is called with every row as it finishes.
	RowDone func(Result)
	Logger  *slog.Logger
}

// Progress is a running row's state.
type Progress struct {
	ValueSize   int64
	Op          string
	Concurrency int
	Elapsed     time.Duration
	Ops         uint64
	Bytes       uint64
}

// Result is one row; JSON names are stable.
type Result struct {
	ValueSize   int64   `json:"value_size"`
	Op          string  `json:"op"`
	Concurrency int     `json:"concurrency"`
	Batch       int     `json:"batch"`
	OpsPerSec   float64 `json:"ops_per_sec"`
	GBPerSec    float64 `json:"gb_per_sec"`
	P50us       float64 `json:"p50_us"`
	P99us       float64 `json:"p99_us"`
	P999us      float64 `json:"p999_us"`
	Errors      int64   `json:"errors"`
	// Keys is how many keys get rows read (the working set the store
	// kept; 0 for put rows).
	Keys int `json:"keys"`
	// Corrupt counts gets that returned wrong bytes (--verify); they are
	// among Errors too.
	Corrupt int64 `json:"corrupt"`
	// FirstError says what the first error was (empty when Errors is
	// 0); its text is a message, not a code to match.
	FirstError string `json:"first_error"`
	// Error is set on a row that measured nothing (no operation
	// succeeded): why. Its figures are zeros, not a measurement, and
	// Run's caller fails the run (ErrNothingMeasured).
	Error string `json:"error"`
	// DiskReads counts the disk-tier loads an on-disk get row made (one
	// per get: a row where gets found staging copies left in memory is
	// refused).
	DiskReads uint64 `json:"disk_reads"`
	// VsDisk is an on-disk get row's GB/s over the disk-read row before
	// it (OnDisk), whose reads are measured half just before the row's
	// gets and half just after.
	VsDisk float64 `json:"vs_disk"` // null in JSON when 0: not an on-disk get row
	// Transport names the transports the client's engine moved the
	// timed loop's bytes with, as it counted them (engine.Stats: "shm",
	// "tcp", "local" for a segment of its own, "shm+tcp" for replicas
	// reached both ways).
	Transport string `json:"transport"`
	// Provider moved the rdma bytes ("soft": the software NIC, over TCP
	// sockets; "ibverbs"); empty when rdma moved none.
	Provider string `json:"provider"`
	// VsTCP is the row's GB/s over the tcp row before it (Config.VsTCP).
	VsTCP float64 `json:"vs_tcp"` // null in JSON when 0: no tcp row before it
}

// MarshalJSON writes every field, the ratios as null on rows that have
// none (0 here), so one schema holds for every row.
func (r Result) MarshalJSON() ([]byte, error) {
	type plain Result
	ratio := func(v float64) *float64 {
		if v == 0 {
			return nil
		}
		return &v
	}
	return json.Marshal(struct {
		plain
		VsDisk *float64 `json:"vs_disk"`
		VsTCP  *float64 `json:"vs_tcp"`
	}{plain(r), ratio(r.VsDisk), ratio(r.VsTCP)})
}

// DefaultSegmentSize is the embedded node's segment.
const DefaultSegmentSize = 4 << 30

func (c *Config) check() error {
	if len(c.ValueSizes) == 0 {
		return fmt.Errorf("no value size")
	}
	for _, v := range c.ValueSizes {
		if v <= 0 || v > store.MaxValueSize {
			return fmt.Errorf("value size %d: want 1 byte to %d", v, int64(store.MaxValueSize))
		}
	}
	if len(c.Ops) == 0 {
		c.Ops = []string{"get"}
	}
	for _, op := range c.Ops {
		if !slices.Contains(Ops, op) {
			return fmt.Errorf("op %q: want put, get or mix", op)
		}
	}
	if len(c.Concurrency) == 0 {
		c.Concurrency = []int{1}
	}
	for _, n := range c.Concurrency {
		if n <= 0 || n > 4096 {
			return fmt.Errorf("concurrency %d: want 1 to 4096", n)
		}
	}
	switch {
	case c.Batch == 0:
		c.Batch = 1
	case c.Batch < 0 || c.Batch > store.MaxBatchSize:
		return fmt.Errorf("batch %d: want 1 to %d", c.Batch, store.MaxBatchSize)
	}
	if !(c.GetRatio >= 0 && c.GetRatio <= 1) {
		return fmt.Errorf("get ratio %g: want 0 to 1", c.GetRatio)
	}
	if c.Duration <= 0 {
		c.Duration = 5 * time.Second
	}
	if c.Keys < 0 {
		return fmt.Errorf("keys %d: want 0 (auto) or more", c.Keys)
	}
	if c.SegmentSize == 0 {
		c.SegmentSize = DefaultSegmentSize
	}
	if c.Master == "" {
		// Refused before the embedded store starts (faulting in its
		// segment), not after a row of failed puts.
		for _, v := range c.ValueSizes {
			if uint64(v) > c.SegmentSize {
				return fmt.Errorf("value size %s is larger than the embedded store's segment (%s): give a --segment-size of at least %s or a smaller --value-size",
					ebench.FormatSize(v), ebench.FormatSize(int64(c.SegmentSize)), ebench.FormatSize(v))
			}
		}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.HighWatermark == 0 {
		c.HighWatermark = master.DefaultHighWatermark
	}
	if c.Engine.BindAddress == "" {
		c.Engine.BindAddress = "127.0.0.1"
	}
	switch {
	case c.SSDDir != "" && c.Master != "":
		return fmt.Errorf("a disk tier is the embedded node's: give no master with it")
	case c.OnDisk && c.SSDDir == "":
		return fmt.Errorf("gets of objects on disk need a disk tier directory")
	case c.VsTCP && c.OnDisk:
		return fmt.Errorf("one comparison per run: against tcp or against the disk, not both")
	case c.VsTCP && c.Engine.Protocol != engine.ProtocolAuto && c.Engine.Protocol != engine.ProtocolSHM:
		return fmt.Errorf("a comparison with tcp measures shared memory: the client's protocol is %q, want auto or shm", c.Engine.Protocol)
	case !(c.HighWatermark >= 0 && c.HighWatermark <= 1):
		return fmt.Errorf("eviction high watermark %g: want a fraction in (0, 1]", c.HighWatermark)
	case c.Master != "" && c.Admin == "" && !c.AllowEvict:
		return fmt.Errorf("a store this run did not start: its admin API is needed to size the working set to the room below its eviction watermark (or allow the run to evict the store's other keys)")
	case c.Master == "" && c.Admin != "":
		return fmt.Errorf("an admin API without a master: the embedded store is this run's own")
	}
	return nil
}

// ErrNothingMeasured is what Run's caller reports when a row has Error
// set: the run completed, but a row measured nothing.
var ErrNothingMeasured = errors.New("measured nothing")

// Run runs every row and returns the results in order. A row that cannot
// run at all (no room for its keys, a value larger than any segment)
// ends the run with an error after the rows that ran; a row in which no
// operation succeeded is returned with Error set (see Failed).
func Run(ctx context.Context, cfg Config) ([]Result, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	addr := cfg.Master
	var srv *server.Server
	if addr == "" {
		scfg := server.Config{
			RPCAddress: "127.0.0.1:0", SegmentSize: cfg.SegmentSize, Engine: cfg.Engine,
			Master: master.Config{Logger: cfg.Logger}, Logger: cfg.Logger,
		}
		if cfg.SSDDir != "" {
			scfg.Tier = &store.TierConfig{Dir: cfg.SSDDir, Capacity: cfg.SSDSize, Logger: cfg.Logger}
		}
		if cfg.OnDisk {
			// Objects stay on disk (never promoted); a staged read is
			// handed back when its transfer ends, so the next read of
			// the key reads the disk again.
			scfg.Master.PromoteAfter = -1
		}
		var err error
		srv, err = server.Start(ctx, scfg)
		if err != nil {
			return nil, fmt.Errorf("embedded store: %w", err)
		}
		defer srv.Close(context.WithoutCancel(ctx))
		addr = srv.RPCAddr
		if err := srv.Node.WaitPopulated(ctx); err != nil {
			return nil, err
		}
	}
	c, err := store.New(ctx, store.Config{Master: addr, EngineConfig: cfg.Engine, Logger: cfg.Logger, Checksums: cfg.Checksums, Tenant: cfg.Tenant})
	if err != nil {
		return nil, err
	}
	defer c.Close(context.WithoutCancel(ctx))
	r := &runner{cfg: cfg, c: c, run: newRunID(), srv: srv}
	r.removed = &r.removedKeys
	if cfg.Master != "" && !cfg.AllowEvict {
		if r.foreign, err = newForeign(ctx, cfg); err != nil {
			return nil, err
		}
		if err := r.foreign.check(cfg); err != nil {
			return nil, err
		}
	}
	if cfg.Master != "" && cfg.Report != nil {
		defer func() {
			if r.touched.Load() { // else nothing was written
				cfg.Report(r.report(context.WithoutCancel(ctx), cfg))
			}
		}()
	}
	var rt *runner // VsTCP: the tcp client's rows
	if cfg.VsTCP {
		tcfg := cfg.Engine
		tcfg.Protocol = "tcp"
		ct, err := store.New(ctx, store.Config{Master: addr, EngineConfig: tcfg, Logger: cfg.Logger, Checksums: cfg.Checksums, Tenant: cfg.Tenant})
		if err != nil {
			return nil, fmt.Errorf("tcp client: %w", err)
		}
		defer ct.Close(context.WithoutCancel(ctx))
		rt = &runner{cfg: cfg, c: ct, run: r.run, srv: srv, foreign: r.foreign, removed: &r.removedKeys, tcp: true}
	}
	var out []Result
	for _, vs := range cfg.ValueSizes {
		for _, op := range cfg.Ops {
			for _, n := range cfg.Concurrency {
				if ctx.Err() != nil {
					return out, ctx.Err()
				}
				if cfg.OnDisk && op == "get" {
					// The disk's own reads are measured inside the row,
					// half before its gets and half after.
					probe, err := openDiskRead(ctx, cfg.SSDDir, vs, r.diskKeys(vs, n))
					if err != nil {
						return out, fmt.Errorf("%s disk-read x%d: %w", ebench.FormatSize(vs), n, err)
					}
					r.probe = probe
				}
				if rt != nil {
					base, err := rt.row(ctx, vs, op, n)
					if err != nil {
						if ctx.Err() != nil {
							return out, ctx.Err()
						}
						return out, fmt.Errorf("%s %s x%d over tcp: %w", ebench.FormatSize(vs), op, n, err)
					}
					out = append(out, base)
					if cfg.RowDone != nil {
						cfg.RowDone(base)
					}
				}
				res, err := r.row(ctx, vs, op, n)
				if r.probe != nil {
					base := r.probe.result(n)
					r.probe.Close()
					r.probe = nil
					if base.OpsPerSec == 0 && err == nil {
						err = errors.New("the disk-read baseline measured nothing")
					}
					out = append(out, base)
					if cfg.RowDone != nil {
						cfg.RowDone(base)
					}
				}
				if rt != nil && out[len(out)-1].GBPerSec > 0 {
					res.VsTCP = res.GBPerSec / out[len(out)-1].GBPerSec
				}
				if cfg.OnDisk && op == "get" && len(out) > 0 && out[len(out)-1].GBPerSec > 0 {
					res.VsDisk = res.GBPerSec / out[len(out)-1].GBPerSec
				}
				if err != nil && ctx.Err() != nil {
					// Interrupted: the row so far is still a measurement.
					if res.OpsPerSec > 0 {
						out = append(out, res)
					}
					return out, ctx.Err()
				}
				if err != nil {
					return out, fmt.Errorf("%s %s x%d: %w", ebench.FormatSize(vs), op, n, err)
				}
				out = append(out, res)
				if cfg.RowDone != nil {
					cfg.RowDone(res)
				}
			}
		}
	}
	return out, nil
}

// Failed returns the rows that measured nothing, as an error wrapping
// ErrNothingMeasured that names them, or nil.
func Failed(rows []Result) error {
	var names []string
	for _, r := range rows {
		if r.Error != "" {
			names = append(names, fmt.Sprintf("%s %s x%d", ebench.FormatSize(r.ValueSize), r.Op, r.Concurrency))
		}
	}
	if len(names) == 0 {
		return nil
	}
	return fmt.Errorf("%d of %d row(s) %w (%s)", len(names), len(rows), ErrNothingMeasured, strings.Join(names, ", "))
}

type runner struct {
	cfg  Config
	c    *store.Client
	srv  *server.Server // the embedded store, if any
	next atomic.Uint64  // OnDisk: the next key a get reads
	run  uint32
	// seq numbers put keys: a row's puts are the keys of its prefix
	// numbered from where seq stood when it began to where it ends, so
	// its cleanup needs no list of them (a list of every key put grew
	// a long row by about 50 B a put).
	seq atomic.Uint64
	// probe is an on-disk get row's disk-read baseline, measured around
	// the row's gets.
	probe *diskFile
	// fits records the value sizes a probe put showed the store takes.
	fits map[int64]bool
	// foreign sizes rows to a store the run did not start (nil: the
	// embedded store, or AllowEvict).
	foreign *foreign
	// removed counts the keys the run removed (shared with the VsTCP
	// runner); removedKeys holds it for the first runner.
	removed     *atomic.Uint64
	removedKeys atomic.Uint64
	tcp         bool // the VsTCP runner: its keys are apart from the other's
	// touched: a row began writing (the run has something to report)
	touched atomic.Bool
}

// prefix is the run's key prefix: every key it writes starts with it.
func (r *runner) prefix() string { return fmt.Sprintf("bench/%08x/", r.run) }

// tcpPart keeps the VsTCP runner's keys apart from the other's.
func (r *runner) tcpPart() string {
	if r.tcp {
		return "tcp/"
	}
	return ""
}

func (r *runner) getKey(vs int64, i int) string {
	return fmt.Sprintf("%s%s%d/get/%d", r.prefix(), r.tcpPart(), vs, i)
}

// newRunID names a run's keys (a variable for tests).
var newRunID = rand.Uint32

// seedOf makes every key's bytes different, so a get that returned
// another key's value fails verification.
func seedOf(key string) uint64 {
	var h uint64 = 14695981039346656037
	for i := 0; i < len(key); i++ {
		h = (h ^ uint64(key[i])) * 1099511628211
	}
	return h
}

// prefill puts the keys gets read, not timed.
func (r *runner) prefill(ctx context.Context, vs int64, n int) error {
	chunk := prefillChunk(vs)
	buf, err := r.c.RegisterBuffer(ctx, int(vs)*chunk)
	if err != nil {
		return err
	}
	defer r.c.ReleaseBuffer(context.WithoutCancel(ctx), buf)
	for i := 0; i < n; i += chunk {
		var keys []string
		var slices []store.Slice
		for j := i; j < min(i+chunk, n); j++ {
			k := r.getKey(vs, j)
			off := (j - i) * int(vs)
			ebench.FillPattern(buf.Bytes()[off:off+int(vs)], 0, seedOf(k))
			keys = append(keys, k)
			slices = append(slices, store.Slice{Buf: buf, Off: off, Len: int(vs)})
		}
		// A full store evicts in the background: wait for it a little.
		deadline := time.Now().Add(10 * time.Second)
		for {
			var retry []int
			// Soft-pinned: the puts of a mix row fill the store and
			// evict, and they should evict their own keys before the
			// ones gets read (a get of an evicted key is an error here).
			for k, err := range r.c.BatchPutFrom(ctx, keys, slices, softPin) {
				switch {
				case err == nil, errors.Is(err, store.ErrObjectAlreadyExists):
				case errors.Is(err, store.ErrNoAvailableHandle) && !tooLarge(err) && time.Now().Before(deadline):
					retry = append(retry, k)
				default:
					return fmt.Errorf("prefill %s: %w", keys[k], err)
				}
			}
			if len(retry) == 0 {
				break
			}
			time.Sleep(20 * time.Millisecond)
			var rk []string
			var rs []store.Slice
			for _, k := range retry {
				rk, rs = append(rk, keys[k]), append(rs, slices[k])
			}
			keys, slices = rk, rs
		}
	}
	return nil
}

// prefillChunk is how many values prefill puts per call: at most 1024
// and 256 MiB of buffer, one value when larger (a fixed minimum of 16
// values of 4 GB asked the kernel for 64 GB).
func prefillChunk(vs int64) int { return int(min(1024, max(1, (256<<20)/vs))) }

// survivors waits for the store to stop evicting the keys prefill wrote
// and returns those it kept. The working set's default size comes from
// the embedded segment's size, which says nothing about a remote
// store's: one smaller than it evicts part of the working set while
// filling (in the background, after the puts returned), and gets of those
// keys would be counted as errors of the store.
func (r *runner) survivors(ctx context.Context, keys []string) ([]string, error) {
	present := func() ([]string, error) {
		var kept []string
		for i := 0; i < len(keys); i += 1024 {
			part := keys[i:min(i+1024, len(keys))]
			ok, errs := r.c.BatchExist(ctx, part)
			for j, k := range part {
				if errs[j] != nil {
					return nil, fmt.Errorf("check the values written for gets: %s: %w", k, errs[j])
				}
				if ok[j] {
					kept = append(kept, k)
				}
			}
		}
		return kept, nil
	}
	kept, err := present()
	if err != nil || len(kept) == len(keys) {
		return kept, err
	}
	// Eviction goes on in rounds: wait until a round finds no more gone.
	for range 50 {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(300 * time.Millisecond):
		}
		again, err := present()
		if err != nil {
			return nil, err
		}
		if len(again) == len(kept) {
			return again, nil
		}
		kept = again
	}
	return kept, nil
}

// cleanup removes the keys a row wrote (not timed), so rows do not fill
// the store for each other and a benchmarked store is left as found:
// key(i) for i in [0, n), 1024 a call.
//
// After an interrupt it removes them again, a few times: puts cut short
// may have their ends on the way, and a key still being written is not
// removed but lands after.
func (r *runner) cleanup(ctx context.Context, n uint64, key func(uint64) string) {
	interrupted := ctx.Err() != nil
	ctx = context.WithoutCancel(ctx)
	keys := make([]string, 0, 1024)
	for round := 0; round == 0 || interrupted && round <= settleRounds; round++ {
		if round > 0 {
			time.Sleep(settlePause)
		}
		for i := uint64(0); i < n; i += 1024 {
			keys = keys[:0]
			for j := i; j < min(i+1024, n); j++ {
				keys = append(keys, key(j))
			}
			for _, err := range r.c.BatchRemove(ctx, keys, true) {
				if err == nil {
					r.removed.Add(1)
				}
			}
		}
	}
}

// After an interrupt, cleanup repeats its removal settleRounds times,
// settlePause apart.
const (
	settleRounds = 3
	settlePause  = 100 * time.Millisecond
)

func (r *runner) putPrefix(vs int64) string {
	return fmt.Sprintf("%s%s%d/put/", r.prefix(), r.tcpPart(), vs)
}

// keyCount is how many keys gets read: --keys, or about 256 MiB of them
// (far more than any CPU cache, so reads are not served from cache),
// at least one per value in flight, at most 16384 and half the store.
func (r *runner) keyCount(vs int64, workers int) int {
	if r.cfg.Keys > 0 {
		return r.cfg.Keys
	}
	if r.cfg.OnDisk {
		return r.diskKeys(vs, workers)
	}
	n := max(int((256<<20)/vs), workers*r.cfg.Batch)
	n = min(n, 16384, int(r.cfg.SegmentSize/2/uint64(vs)))
	return max(n, 1)
}

func (r *runner) row(ctx context.Context, vs int64, op string, workers int) (Result, error) {
	res := Result{ValueSize: vs, Op: op, Concurrency: workers, Batch: r.cfg.Batch}
	nkeys, putLimit := 0, 0
	if op != "put" {
		nkeys = r.keyCount(vs, workers)
	}
	if r.foreign != nil {
		// Sized to the store's room now, before any key of the row is
		// written: the probe put of fit takes room too.
		rm, err := r.foreign.room(ctx)
		if err != nil {
			return res, err
		}
		if nkeys, putLimit, err = r.foreign.plan(rm, vs, op, workers, r.cfg.Batch, nkeys); err != nil {
			return res, err
		}
	}
	r.touched.Store(true)
	if err := r.fit(ctx, vs); err != nil {
		return res, err
	}
	seq0 := r.seq.Load()
	// Removed however the row ends (an interrupt included): the keys
	// gets read, and every key a put of the row was given, written or
	// not (removing one that is not there costs nothing).
	defer func() {
		r.cleanup(ctx, uint64(nkeys), func(i uint64) string { return r.getKey(vs, int(i)) })
		prefix := r.putPrefix(vs)
		r.cleanup(ctx, r.seq.Load()-seq0, func(i uint64) string { return prefix + strconv.FormatUint(seq0+1+i, 10) })
	}()
	if op != "put" {
		if err := r.prefill(ctx, vs, nkeys); err != nil {
			return res, err
		}
		if r.cfg.OnDisk && op == "get" {
			if err := r.offloadAll(ctx, vs, nkeys); err != nil {
				return res, err
			}
		}
	}
	getKeys := make([]string, nkeys)
	for i := range getKeys {
		getKeys[i] = r.getKey(vs, i)
	}
	if nkeys > 0 && !r.cfg.OnDisk {
		kept, err := r.survivors(ctx, getKeys)
		if err != nil {
			return res, err
		}
		if len(kept) < len(getKeys) {
			r.cfg.Logger.Warn(fmt.Sprintf("the store kept %d of the %d values of %d bytes written for gets (the rest were evicted: it is smaller than the working set); gets read those %d (--keys sets the working set)", len(kept), len(getKeys), vs, len(kept)))
		}
		if len(kept) < min(len(getKeys), workers*r.cfg.Batch) {
			return res, fmt.Errorf("the store kept only %d of %d values of %d bytes written for gets (evicted): too few for %d callers of batch %d; use a smaller --value-size, --keys or --concurrency", len(kept), len(getKeys), vs, workers, r.cfg.Batch)
		}
		getKeys = kept
	}
	res.Keys = len(getKeys)
	ws := make([]*worker, workers)
	for i := range ws {
		buf, err := r.c.RegisterBuffer(ctx, int(vs)*r.cfg.Batch)
		if err != nil {
			for _, w := range ws[:i] {
				r.c.ReleaseBuffer(ctx, w.buf)
			}
			return res, fmt.Errorf("worker buffer: %w", err)
		}
		ws[i] = &worker{r: r, id: i, vs: vs, op: op, getKeys: getKeys, buf: buf, rng: rand.New(rand.NewPCG(uint64(i), uint64(r.run)))}
		ws[i].putPrefix = r.putPrefix(vs)
		if op != "get" {
			// Put values carry a recognisable pattern, written before
			// the clock starts (for a value of GBs it takes seconds)
			// and reused for every put.
			ebench.FillPattern(buf.Bytes(), 0, uint64(i))
		}
		if r.cfg.Verify {
			ws[i].want = make([]byte, vs)
		}
	}
	defer func() {
		for _, w := range ws {
			r.c.ReleaseBuffer(context.WithoutCancel(ctx), w.buf)
		}
	}()
	var win *putWindow
	if putLimit > 0 {
		win = newPutWindow(r.c, r.removed, putLimit, r.cfg.Batch, workers)
		defer win.close()
		for _, w := range ws {
			w.win = win
		}
	}
	var stop atomic.Bool
	quit := make(chan struct{})
	for _, w := range ws {
		w.quit = quit
	}
	var ops, bytesDone atomic.Uint64
	var wg sync.WaitGroup
	moved := r.c.Engine().Stats()
	onDiskGets := r.cfg.OnDisk && op == "get" && r.srv != nil && r.srv.Tier != nil
	var loads0 uint64
	if onDiskGets {
		st := r.srv.Tier.Stats()
		loads0 = st.Loads + st.DirectReads
	}
	if onDiskGets && r.probe != nil {
		if err := r.probe.measure(ctx, workers, r.cfg.Duration/2); err != nil {
			return res, fmt.Errorf("disk-read baseline: %w", err)
		}
	}
	start := time.Now()
	for _, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.loop(ctx, &stop, &ops, &bytesDone)
		}()
	}
	timer := time.NewTimer(r.cfg.Duration)
	tick := time.NewTicker(200 * time.Millisecond)
	func() {
		defer timer.Stop()
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-timer.C:
				return
			case <-tick.C:
				if r.cfg.Progress != nil {
					r.cfg.Progress(Progress{vs, op, workers, time.Since(start), ops.Load(), bytesDone.Load()})
				}
			}
		}
	}()
	stop.Store(true)
	close(quit)
	wg.Wait()
	elapsed := time.Since(start)
	if win != nil {
		win.close()
	}
	if onDiskGets && r.probe != nil && ctx.Err() == nil {
		if err := r.probe.measure(ctx, workers, r.cfg.Duration-r.cfg.Duration/2); err != nil {
			return res, fmt.Errorf("disk-read baseline: %w", err)
		}
	}
	if onDiskGets {
		// Concurrent gets of one key share its staged copy, served
		// from memory: the row measures reads from disk only if
		// (nearly) every get made one.
		st := r.srv.Tier.Stats()
		res.DiskReads = st.Loads + st.DirectReads - loads0
		if n := ops.Load(); res.DiskReads < n-n/100 {
			return res, fmt.Errorf("on-disk get row of %d-byte values: only %d of %d gets read the disk, the others shared another get's staged copy of the same key (gets of one key in flight at once): give more --keys", vs, res.DiskReads, n)
		}
	}
	res.Transport = r.c.Engine().Stats().Sub(moved).Transport()
	if slices.Contains(strings.Split(res.Transport, "+"), meta.ProtocolRDMA) {
		res.Provider = r.c.Engine().Provider(meta.ProtocolRDMA)
	}
	var lat latencies
	for _, w := range ws {
		lat.merge(&w.lat)
		res.Errors += w.errors
		if w.corruptErr != nil && res.Corrupt == 0 {
			// Wrong bytes matter more than any miss: they are named
			// first.
			res.FirstError = w.corruptErr.Error()
		}
		res.Corrupt += w.corrupt
		if res.FirstError == "" && w.firstErr != nil {
			res.FirstError = w.firstErr.Error()
		}
	}
	res.OpsPerSec = float64(ops.Load()) / elapsed.Seconds()
	res.GBPerSec = float64(bytesDone.Load()) / elapsed.Seconds() / 1e9
	res.P50us = us(lat.percentile(0.50))
	res.P99us = us(lat.percentile(0.99))
	res.P999us = us(lat.percentile(0.999))
	if ops.Load() == 0 && ctx.Err() == nil {
		switch {
		case res.Errors > 0:
			res.Error = fmt.Sprintf("all %d %ss failed, the first: %s", res.Errors, op, res.FirstError)
		default:
			res.Error = fmt.Sprintf("no %s completed in %s: give a longer --duration or a smaller --value-size", op, elapsed.Round(time.Millisecond))
		}
	}
	return res, ctx.Err()
}

// fit refuses, at once, a value size the store cannot hold in any
// segment: one put of that size, not timed, before the row (and only
// the first time). A store that says so is not asked again for 10 s of
// prefill retries or a row of failed puts.
func (r *runner) fit(ctx context.Context, vs int64) error {
	if r.fits[vs] {
		return nil
	}
	buf, err := r.c.RegisterBuffer(ctx, int(vs))
	if err != nil {
		return fmt.Errorf("buffer for a value of %s: %w", ebench.FormatSize(vs), err)
	}
	defer r.c.ReleaseBuffer(context.WithoutCancel(ctx), buf)
	key := fmt.Sprintf("%s%s%d/fit", r.prefix(), r.tcpPart(), vs)
	err = r.c.PutFrom(ctx, key, store.Slice{Buf: buf, Len: int(vs)})
	if err == nil {
		r.c.Remove(context.WithoutCancel(ctx), key, true)
	}
	if tooLarge(err) {
		return fmt.Errorf("value size %s does not fit the store: %w", ebench.FormatSize(vs), err)
	}
	// Other failures (a full store that will evict, a master away) are
	// the row's to meet and count.
	if r.fits == nil {
		r.fits = make(map[int64]bool)
	}
	r.fits[vs] = true
	return nil
}

// tooLarge reports a put refused because no segment of the store is as
// large as the value (mc's master says so; a mooncake_master's bare
// NO_AVAILABLE_HANDLE does not tell).
func tooLarge(err error) bool {
	return errors.Is(err, store.ErrNoAvailableHandle) && strings.Contains(err.Error(), "larger than any segment")
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

type worker struct {
	r         *runner
	id        int
	vs        int64
	op        string
	getKeys   []string
	putPrefix string
	buf       *store.Buffer
	rng       *rand.Rand
	lat       latencies
	errors    int64
	firstErr  error
	// corrupt gets and the first of them (see Result.Corrupt)
	corrupt    int64
	corruptErr error
	want       []byte
	// win bounds the put keys kept in a store the run did not start
	// (nil: unbounded); quit closes when the row ends.
	win  *putWindow
	quit <-chan struct{}
}

func (w *worker) fail(err error) {
	w.errors++
	if w.firstErr == nil {
		w.firstErr = err
	}
}

func (w *worker) loop(ctx context.Context, stop *atomic.Bool, ops, bytesDone *atomic.Uint64) {
	b := w.r.cfg.Batch
	keys := make([]string, b)
	sl := make([]store.Slice, b)
	for i := range sl {
		sl[i] = store.Slice{Buf: w.buf, Off: i * int(w.vs), Len: int(w.vs)}
	}
	for !stop.Load() && ctx.Err() == nil {
		get := w.op == "get" || w.op == "mix" && w.rng.Float64() < w.r.cfg.GetRatio
		switch {
		case get && w.r.cfg.OnDisk:
			for i := range keys {
				keys[i] = w.getKeys[w.r.next.Add(1)%uint64(len(w.getKeys))]
			}
		case get:
			for i := range keys {
				keys[i] = w.getKeys[w.rng.IntN(len(w.getKeys))]
			}
		default:
			if w.win != nil && !w.win.take(ctx, w.quit) {
				return
			}
			for i := range keys {
				keys[i] = w.putPrefix + strconv.FormatUint(w.r.seq.Add(1), 10)
			}
		}
		t0 := time.Now()
		var errs []error
		if get {
			_, errs = w.r.c.BatchGetInto(ctx, keys, sl)
		} else {
			errs = w.r.c.BatchPutFrom(ctx, keys, sl)
		}
		w.lat.add(time.Since(t0))
		if !get && w.win != nil {
			w.win.put(keys)
		}
		okN := 0
		for i, err := range errs {
			if err != nil {
				if ctx.Err() == nil {
					w.fail(fmt.Errorf("%s %s: %w", map[bool]string{true: "get", false: "put"}[get], keys[i], err))
				}
				continue
			}
			if get && w.want != nil {
				ebench.FillPattern(w.want, 0, seedOf(keys[i]))
				if got := w.buf.Bytes()[i*int(w.vs) : (i+1)*int(w.vs)]; !bytes.Equal(got, w.want) {
					at := 0
					for at < len(got) && got[at] == w.want[at] {
						at++
					}
					err := fmt.Errorf("verify %s: byte %d is 0x%02x, want 0x%02x", keys[i], at, got[at], w.want[at])
					w.fail(err)
					if w.corrupt++; w.corruptErr == nil {
						w.corruptErr = err
					}
					continue
				}
			}
			okN++
		}
		ops.Add(uint64(okN))
		bytesDone.Add(uint64(okN) * uint64(w.vs))
		if okN == 0 && len(errs) > 0 && masterAway(errs[0]) && !stop.Load() {
			// A closed loop against an unreachable master would spin
			// through failures as fast as they come (hundreds of
			// thousands a second): wait a little, as a real client
			// would.
			select {
			case <-time.After(masterAwayPause):
			case <-ctx.Done():
			}
		}
	}
}

// masterAwayPause is how long a worker waits after a call that failed for
// want of a master.
const masterAwayPause = 10 * time.Millisecond

func masterAway(err error) bool {
	switch store.CodeOf(err) {
	case store.RPCFail, store.RPCTimeout, store.UnavailableInCurrentMode:
		return true
	}
	return false
}

func softPin(c *store.ReplicateConfig) { c.SoftPin = true }
