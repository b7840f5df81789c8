package cmd

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jedib0t/go-pretty/v6/progress"
	"github.com/spf13/cobra"

	"github.com/kvcache-ops/mc/pkg/engine"
	ebench "github.com/kvcache-ops/mc/pkg/engine/bench"
	"github.com/kvcache-ops/mc/pkg/store"
	sbench "github.com/kvcache-ops/mc/pkg/store/bench"
	"github.com/kvcache-ops/mc/pkg/store/master"
	"github.com/kvcache-ops/mc/pkg/units"
)

type benchStoreOptions struct {
	Data        storeDataOptions
	Master      string
	ValueSizes  []int64
	Op          string
	GetRatio    float64
	Concurrency string
	Batch       int
	Duration    time.Duration
	Keys        int
	Verify      bool
	Checksums   bool
	Tenant      string
	SegmentSize int64
	Plot        string
	SSDDir      string
	SSDSize     int64
	OnDisk      bool
	VsTCP       bool
	// A store this run did not start: its admin API, whether the run
	// may evict its other keys, and its eviction watermark.
	Admin         string
	AllowEvict    bool
	HighWatermark float64
	// Progress forces (true) or suppresses (false) the live bar; nil
	// means a bar on a terminal and one line per row on stderr
	// otherwise.
	Progress *bool
}

func newBenchStoreCmd(p *printer) *cobra.Command {
	var o benchStoreOptions
	cmd := &cobra.Command{
		Use:   "store",
		Short: "Benchmark a KV-cache store: put, get or a mix, per value size and concurrency",
		Long: `store runs a closed loop of puts, gets or a mix (--op mix --get-ratio R)
against a store for --duration per row, one row per value size, op and
concurrency, and prints objects/s, GB/s, per-call latency percentiles (a call
moves --batch keys) and errors. Gets read keys written before the timed
loop; --verify checks every byte read. Each row removes the keys it wrote.
A row in which no operation succeeded is marked failed, its figures "-",
and the run exits 1 after printing every row. A value size larger than any
segment is refused before the run (one put of that size tells).

With no --master it starts a master and a node (--segment-size) in this
process and benchmarks them from a separate client engine, as mc bench
initiator does with its embedded target.

Against a store it did not start (--master), the run leaves the store's
other keys alone: it writes under its own key prefix (bench/<run id>/),
reads the store's capacity and use from the master's admin API (--admin)
before every row, and sizes the row to the room below the store's eviction
watermark (--eviction-high-watermark-ratio): the keys gets read, and the
puts it keeps at a time (a put row removes its oldest keys as it writes
new ones). A row that cannot fit is refused before the run, saying so;
--allow-evict runs it anyway, letting the store evict other keys. Every
key of the run is removed at the end, also on SIGINT, and one line says
what the run did.

On a terminal a progress bar follows each row; otherwise each finished row
is one line on stderr.

--protocol auto (the default here) moves bytes through shared memory with
a node on this host (the embedded one, or one started with mc serve store
--protocol auto) and over tcp with the others; --protocol tcp measures
loopback TCP. The transport column says which transports the client's
engine actually moved each row's bytes with. --vs-tcp runs every row
twice, first from a second client under tcp, and gives the shared-memory
row's ratio to it: both measured in the same run.

--ssd-dir gives the embedded node a disk tier (--ssd-size bytes). With
--on-disk, get rows read objects that live only on that disk: every key is
offloaded before the row, reads go round the keys, nothing is promoted; each
such row follows a disk-read row (O_DIRECT reads of the same size and
concurrency from a file in --ssd-dir into huge-page memory: the disk's own
throughput at its best, measured for half of --duration just before the
row's gets and half just after, so both see the same disk), and the get row
gives its ratio to it.`,
		Example: `  mc bench store --value-size 4K,64K,1M,16M --op get
  mc bench store --value-size 4K --batch 32 --concurrency 1,4,16,64 --plot curve.svg
  mc bench store --master 10.0.0.1:50051 --op mix --get-ratio 0.9 --verify -o json
  mc bench store --master mooncake://10.0.0.1:50051 --metadata-server P2PHANDSHAKE --op put,get --batch 8
  mc bench store --op get --value-size 1M,16M --ssd-dir /nvme/bench --on-disk --verify
  mc bench store --master 127.0.0.1:50051 --op get --value-size 1M --vs-tcp   # a node of this host, started with --protocol auto`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Master != "" {
				if err := refuseGiven(cmd, "sizes the embedded store's segment: give no --master with it (a running store's nodes have their own)", "segment-size"); err != nil {
					return err
				}
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			if err := (storeClientOptions{Tenant: o.Tenant}).checkTenant(); err != nil {
				return err
			}
			return runBenchStore(ctx, o, p)
		},
	}
	f := cmd.Flags()
	o.Data.addFlagsProtocol(f, engine.ProtocolAuto)
	f.StringVar(&o.Master, "master", "", "store master host:port, etcd://H:P[;H:P] for HA masters, or mooncake://H:P for a mooncake_master (default: an embedded store in this process, moving bytes as --protocol says)")
	sizeListVar(f, &o.ValueSizes, "value-size", []int64{4 << 10, 64 << 10, 1 << 20, 16 << 20}, "value sizes, comma-separated")
	f.StringVar(&o.Op, "op", "get", "put, get or mix (comma-separated to run several; also --operation)")
	f.Float64Var(&o.GetRatio, "get-ratio", 0.9, "share of gets with --op mix")
	f.StringVar(&o.Concurrency, "concurrency", "1", "concurrent callers, comma-separated for a curve (1,4,16,64)")
	f.IntVar(&o.Batch, "batch", 1, "keys per call (BatchPut / BatchGet; also --batch-size)")
	durationVar(f, &o.Duration, "duration", 5*time.Second, "time per row")
	f.IntVar(&o.Keys, "keys", 0, "keys gets read from (0: about 256 MiB of values, at least one per value in flight, at most 16384 keys and half the segment)")
	f.BoolVar(&o.Verify, "verify", false, "check every byte of every get")
	f.BoolVar(&o.Checksums, "checksums", false, "the clients record a CRC32C of each value put and check it on every get, as mc store put/get do by default (off here: it cost 13-39% of 1 MiB gets on a 2-core VM; run both ways to see its cost on yours)")
	f.StringVar(&o.Tenant, "tenant", "default", "the clients' tenant on a --master with --enable-multi-tenants (Mooncake's tenant_id)")
	envName(f, "tenant", "MC_TENANT")
	sizeVar(f, &o.SegmentSize, "segment-size", 2<<30, "the embedded store's segment (without --master); it is faulted in before measuring")
	f.StringVar(&o.Plot, "plot", "", "draw objects/s and p99 latency against concurrency as SVG to this file")
	f.StringVar(&o.SSDDir, "ssd-dir", "", "give the embedded node a disk tier in this existing directory")
	sizeVar(f, &o.SSDSize, "ssd-size", 0, "the disk tier's capacity (0: 90% of the space free in --ssd-dir)")
	f.BoolVar(&o.OnDisk, "on-disk", false, "gets read objects that live only on the disk tier, next to the disk's own O_DIRECT reads (needs --ssd-dir)")
	f.BoolVar(&o.VsTCP, "vs-tcp", false, "run every row from a tcp client first and give the ratio to it (with --protocol auto or shm)")
	f.StringVar(&o.Admin, "admin", "", "with --master: the master's admin HTTP API, read for the store's capacity and use (default http://<master or leader host>:9003)")
	f.BoolVar(&o.AllowEvict, "allow-evict", false, "with --master: do not size the run to the store's room below its eviction watermark; the store may evict its other keys to make room")
	f.Float64Var(&o.HighWatermark, "eviction-high-watermark-ratio", master.DefaultHighWatermark, "with --master: the store's eviction watermark (its master's --eviction_high_watermark_ratio; mooncake_master's default is 0.95); the run keeps the store's use below it")
	_ = cmd.RegisterFlagCompletionFunc("op", cobra.FixedCompletions(sbench.Ops, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

func parseIntList(flag, s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, usagef("invalid --%s %q: want positive whole numbers, comma-separated", flag, s)
		}
		out = append(out, n)
	}
	return out, nil
}

func (o benchStoreOptions) config() (sbench.Config, error) {
	var cfg sbench.Config
	sizes := o.ValueSizes
	for _, s := range sizes {
		if s <= 0 {
			return cfg, usagef("invalid --value-size %s: want sizes of more than 0 bytes", units.FormatSizes(sizes))
		}
	}
	if len(sizes) == 0 {
		return cfg, usagef("invalid --value-size: give at least one size")
	}
	conc, err := parseIntList("concurrency", o.Concurrency)
	if err != nil {
		return cfg, err
	}
	var ops []string
	for _, op := range strings.Split(o.Op, ",") {
		op = strings.TrimSpace(op)
		switch op {
		case "put", "get", "mix":
			ops = append(ops, op)
		default:
			return cfg, usagef("invalid --op %q: want put, get or mix", op)
		}
	}
	seg := o.SegmentSize
	if seg <= 0 {
		return cfg, usagef("invalid --segment-size %d: want more than 0 bytes", seg)
	}
	switch {
	case o.Batch <= 0 || o.Batch > store.MaxBatchSize:
		return cfg, usagef("invalid --batch %d: want 1 to %d", o.Batch, store.MaxBatchSize)
	case o.Duration <= 0:
		return cfg, usagef("invalid --duration %s: want a positive duration", o.Duration)
	case o.GetRatio < 0 || o.GetRatio > 1:
		return cfg, usagef("invalid --get-ratio %g: want 0 to 1", o.GetRatio)
	case o.Keys < 0:
		return cfg, usagef("invalid --keys %d", o.Keys)
	}
	ecfg, err := o.Data.engineConfig("127.0.0.1")
	if err != nil {
		return cfg, err
	}
	ecfg.NameWithPort = o.Master != "" // a client beside a node of this host
	ssdSize := o.SSDSize
	switch {
	case o.SSDSize != 0 && o.SSDDir == "":
		return cfg, usagef("--ssd-size without --ssd-dir: give the disk tier a directory")
	case o.OnDisk && o.SSDDir == "":
		return cfg, usagef("--on-disk reads objects from a disk tier: give --ssd-dir")
	case o.SSDDir != "" && o.Master != "":
		return cfg, usagef("--ssd-dir gives the embedded store a disk tier: give no --master with it (a running store's nodes have their own --ssd-dir)")
	case o.SSDSize < 0:
		return cfg, usagef("invalid --ssd-size %d: want bytes", o.SSDSize)
	case o.VsTCP && o.Data.Protocol != engine.ProtocolAuto && o.Data.Protocol != engine.ProtocolSHM:
		return cfg, usagef("--vs-tcp compares shared memory with tcp: give --protocol auto or shm, not %s", o.Data.Protocol)
	case o.VsTCP && o.OnDisk:
		return cfg, usagef("--vs-tcp with --on-disk: one comparison per run")
	case o.Master == "" && (o.Admin != "" || o.AllowEvict):
		return cfg, usagef("--admin and --allow-evict concern a running store: give --master with them (the embedded store is the run's own)")
	case o.HighWatermark <= 0 || o.HighWatermark > 1:
		return cfg, usagef("invalid --eviction-high-watermark-ratio %g: want a fraction in (0, 1]", o.HighWatermark)
	}
	if o.Admin != "" {
		if _, err := store.NewAdmin(o.Admin); err != nil {
			return cfg, usagef("invalid --admin: %w", err)
		}
	}
	admin := ""
	if o.Master != "" && !o.AllowEvict {
		if admin, err = (storeClientOptions{Master: o.Master, Admin: o.Admin}).adminURL(); err != nil {
			return cfg, err
		}
	}
	return sbench.Config{
		Master: o.Master, SegmentSize: uint64(seg), ValueSizes: sizes, Ops: ops, GetRatio: o.GetRatio,
		Concurrency: conc, Batch: o.Batch, Duration: o.Duration, Keys: o.Keys, Verify: o.Verify, Checksums: o.Checksums, Tenant: o.Tenant,
		Engine: ecfg, Logger: quietLogger(), SSDDir: o.SSDDir, SSDSize: uint64(ssdSize), OnDisk: o.OnDisk, VsTCP: o.VsTCP,
		Admin: admin, AllowEvict: o.AllowEvict, HighWatermark: o.HighWatermark,
	}, nil
}

func runBenchStore(ctx context.Context, o benchStoreOptions, p *printer) error {
	cfg, err := o.config()
	if err != nil {
		return err
	}
	if err := checkOutput("--plot", o.Plot); err != nil {
		return err
	}
	tty := !p.JSON() && isTerminal(p.Out)
	bar, lines := tty, !tty && !p.JSON()
	if o.Progress != nil {
		bar, lines = *o.Progress, false
	}
	stopBar := func() {}
	if bar {
		update, stop := storeProgress(p.Out, cfg.Duration)
		cfg.Progress = update
		stopBar = sync.OnceFunc(stop)
		defer stopBar()
	}
	if lines {
		n := 0
		cfg.RowDone = func(r sbench.Result) {
			n++
			fmt.Fprintln(p.Err, storeRowLine(n, r))
		}
	}
	var report string
	cfg.Report = func(s string) { report = s }
	defer func() {
		// After the rows: what the run did to a store it did not start.
		if report == "" {
			return
		}
		w := p.Out
		if p.JSON() {
			w = p.Err
		}
		fmt.Fprintln(w, report)
	}()
	results, err := sbench.Run(ctx, cfg)
	stopBar() // before the table
	if o.Plot != "" && len(results) > 0 {
		if perr := writeFileWith(o.Plot, func(f *os.File) error { return sbench.Plot(f, results) }); perr != nil {
			// The rows first: they are the run's result, the plot only
			// draws them.
			printStoreResults(p, results)
			return fmt.Errorf("--plot: %w (the rows above are the run's results)", perr)
		}
	}
	if ctx.Err() != nil {
		if len(results) > 0 {
			printStoreResults(p, results)
		}
		if len(results) == 0 {
			return &exitError{code: exitInterrupted, err: fmt.Errorf("bench store: interrupted before a row was measured")}
		}
		return &exitError{code: exitInterrupted, err: fmt.Errorf("bench store: interrupted after %d rows (the last may be partial)", len(results))}
	}
	if err != nil {
		if len(results) > 0 {
			printStoreResults(p, results)
		}
		return fmt.Errorf("bench store: %w", err)
	}
	if err := printStoreResults(p, results); err != nil {
		return err
	}
	var corrupt int64
	for _, r := range results {
		corrupt += r.Corrupt
	}
	if corrupt > 0 {
		return fmt.Errorf("bench store: %d gets returned wrong bytes", corrupt)
	}
	if err := sbench.Failed(results); err != nil {
		return fmt.Errorf("bench store: %w", err)
	}
	return nil
}

func printStoreResults(p *printer, results []sbench.Result) error {
	if p.JSON() {
		return p.PrintJSON(map[string]any{"results": results})
	}
	rows := make([][]string, 0, len(results))
	var notes []string
	vsDisk := slices.ContainsFunc(results, func(r sbench.Result) bool { return r.Op == "disk-read" })
	vsTCP := slices.ContainsFunc(results, func(r sbench.Result) bool { return r.VsTCP > 0 })
	for _, r := range results {
		row := []string{
			ebench.FormatSize(r.ValueSize), r.Op, strconv.Itoa(r.Concurrency), strconv.Itoa(r.Batch),
			strconv.FormatFloat(r.OpsPerSec, 'f', 0, 64), strconv.FormatFloat(r.GBPerSec, 'f', 2, 64),
			strconv.FormatFloat(r.P50us, 'f', 0, 64), strconv.FormatFloat(r.P99us, 'f', 0, 64),
			strconv.FormatFloat(r.P999us, 'f', 0, 64), strconv.FormatInt(r.Errors, 10), engine.TransportLabel(r.Transport, r.Provider),
		}
		if vsDisk {
			ratio := ""
			if r.VsDisk > 0 {
				ratio = strconv.FormatFloat(r.VsDisk, 'f', 2, 64) + "x"
			}
			row = append(row, ratio)
		}
		if vsTCP {
			ratio := ""
			if r.VsTCP > 0 {
				ratio = strconv.FormatFloat(r.VsTCP, 'f', 2, 64) + "x"
			}
			row = append(row, ratio)
		}
		if r.Error != "" {
			// Zeros would read as a measurement: the row is marked, and
			// the note says why it measured nothing.
			for i := 4; i <= 8; i++ {
				row[i] = "-"
			}
			row[1] += " (failed)"
		}
		rows = append(rows, row)
		switch {
		case r.Error != "":
			notes = append(notes, fmt.Sprintf("%s %s x%d: failed, measured nothing: %s", ebench.FormatSize(r.ValueSize), r.Op, r.Concurrency, r.Error))
		case r.FirstError != "":
			notes = append(notes, fmt.Sprintf("%s %s x%d: first error: %s", ebench.FormatSize(r.ValueSize), r.Op, r.Concurrency, r.FirstError))
		}
	}
	head := []string{"value", "op", "concurrency", "batch", "ops/s", "GB/s", "p50 (µs)", "p99 (µs)", "p99.9 (µs)", "errors", "transport"}
	if vsDisk {
		head = append(head, "vs disk")
	}
	if vsTCP {
		head = append(head, "vs tcp")
	}
	p.Table("", head, rows)
	for _, n := range notes {
		fmt.Fprintln(p.Out, n)
	}
	return nil
}

// storeRowLine is a finished row as one progress line (not a terminal).
func storeRowLine(n int, r sbench.Result) string {
	if r.Error != "" {
		return fmt.Sprintf("row %d: %s %s x%d: failed: %s", n, ebench.FormatSize(r.ValueSize), r.Op, r.Concurrency, r.Error)
	}
	return fmt.Sprintf("row %d: %s %s x%d batch %d: %.0f ops/s, %.2f GB/s, p99 %.0f µs, %d errors", n, ebench.FormatSize(r.ValueSize), r.Op,
		r.Concurrency, r.Batch, r.OpsPerSec, r.GBPerSec, r.P99us, r.Errors)
}

// storeProgress draws one go-pretty tracker per row: elapsed time and the
// current rate.
func storeProgress(w io.Writer, d time.Duration) (func(sbench.Progress), func()) {
	pw := startProgress(w, 40)
	var cur *progress.Tracker
	var key string
	update := func(pr sbench.Progress) {
		k := fmt.Sprintf("%d/%s/%d", pr.ValueSize, pr.Op, pr.Concurrency)
		if cur == nil || k != key {
			if cur != nil {
				cur.MarkAsDone()
			}
			cur = &progress.Tracker{Total: d.Milliseconds(), Units: progress.UnitsDefault}
			key = k
			pw.AppendTracker(cur)
		}
		cur.UpdateMessage(fmt.Sprintf("%s %s x%d %.0f ops/s %.2f GB/s", ebench.FormatSize(pr.ValueSize), pr.Op, pr.Concurrency,
			float64(pr.Ops)/pr.Elapsed.Seconds(), float64(pr.Bytes)/pr.Elapsed.Seconds()/1e9))
		cur.SetValue(min(pr.Elapsed.Milliseconds(), cur.Total))
	}
	stop := func() { stopProgress(pw, cur) }
	return update, stop
}
