package cmd

import (
	"context"
	"fmt"
	"io"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvcache-ops/mc/pkg/diag"
)

// newDiagCmd is the diagnostics group. Its commands follow the
// monitoring-plugin convention for exit status: 0 healthy, 1 suspect,
// 2 leak (critical), 3 unknown (input unreadable).
func newDiagCmd(p *printer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "diag",
		Short: "Diagnose transfer-engine failures (queue-pair leaks) from kernel counters and logs",
	}
	cmd.AddCommand(newDiagQPLeakCmd(p))
	return cmd
}

type qpLeakOptions struct {
	RDMA        []string
	At          []string
	Logs        []string
	Args        []string // positional files, sorted into RDMA and Logs by content
	NumQPPerEP  int
	MaxEPPerCtx int
	MaxQP       int64
	Horizon     time.Duration
	TEVersion   string
	Watch       time.Duration
	Interval    time.Duration
	RDMABin     string
	PerQP       bool
	Top         int
}

func newDiagQPLeakCmd(p *printer) *cobra.Command {
	var o qpLeakOptions
	cmd := &cobra.Command{
		Use:   "qp-leak [FILE...]",
		Short: "Correlate per-NIC QP counts with endpoint logs: healthy, suspect or leak",
		Long: `qp-leak compares each NIC's queue-pair count (rdma resource show) with what the
transfer engine's live endpoints can explain, and reads its logs (Mooncake's or
mc's glog lines, plain or gzip, any size) for evictions, error-path deletions
and QP creation failures. It reports per NIC the QP count, the ceiling
(distinct peer NIC paths, or --max-ep-per-ctx, times --num-qp-per-ep, plus 16
kernel QPs), the excess, evictions and deletions, and findings with stable
codes: QP_EXHAUSTED, QP_ABOVE_CEILING, ASYMMETRIC_QP,
EVICTIONS_WITHOUT_RECLAIM, QP_GROWTH, QP_ERROR_STATE_PILE, NO_EVICTION_LOGS,
NO_PERIODIC_RECLAIM, and about the input: SNAPSHOT_TIMES_UNUSABLE,
NO_QP_COUNTS.

Several --rdma files are snapshots, ordered by modification time or by --at.
With --max-qp, a NIC whose QP count reaches max_qp within --horizon (24h) at
the pace of the last two snapshots is a QP_GROWTH finding, however far below
the ceiling it still is.
Without --rdma it runs 'rdma -j resource show' itself. --watch samples live
every --interval, tails the logs and prints growth per NIC as it goes.
Positional FILEs are sorted into rdma captures and logs by their content.

Exit status: 0 healthy, 1 suspect, 2 leak, 3 unknown (input unreadable);
64 on a usage error (an unknown flag, a refused value), as on every command.`,
		Example: `  mc diag qp-leak --rdma rdma.txt --log /var/log/mooncake/prefill.INFO
  mc diag qp-leak --rdma t0.json --rdma t1.json --max-qp 131072 -o json
  rdma -j res show qp | mc diag qp-leak --rdma - --log te.INFO.1.gz --log te.INFO
  mc diag qp-leak --log te.INFO --watch 10m --interval 30s`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Args = args
			// Flags of a mode not in use were ignored without a word.
			if o.Watch == 0 && cmd.Flags().Changed("interval") {
				return unknown(usagef("--interval is the sampling period of --watch: give --watch too"))
			}
			if len(o.RDMA) > 0 {
				for _, f := range []string{"rdma-bin", "per-qp"} {
					if cmd.Flags().Changed(f) {
						return unknown(usagef("--%s applies when sampling this host (no --rdma files): the --rdma files are what is read", f))
					}
				}
			}
			return runQPLeak(cmd.Context(), o, p)
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&o.RDMA, "rdma", nil, "`FILE` of 'rdma [-j] resource show [qp]' output (gzip ok, - for stdin); repeat for snapshots")
	f.StringSliceVar(&o.At, "at", nil, "time of each --rdma snapshot, in order (RFC 3339, 'YYYY-MM-DD hh:mm:ss' UTC or unix seconds); default: file modification time")
	f.StringSliceVar(&o.Logs, "log", nil, "transfer-engine log `FILE` (glog lines, gzip ok, - for stdin); repeat for rotated files, oldest first")
	f.IntVar(&o.NumQPPerEP, "num-qp-per-ep", 0, "QPs per endpoint (Mooncake MC_NUM_QP_PER_EP); 0: assume Mooncake's default, 2")
	f.IntVar(&o.MaxEPPerCtx, "max-ep-per-ctx", 0, "endpoint store size per NIC (Mooncake MC_MAX_EP_PER_CTX); 0: the peers in the logs, else assume Mooncake's default, 65536")
	f.Int64Var(&o.MaxQP, "max-qp", 0, "the NIC's max_qp (ibv_devinfo -v), for the time left at the current growth; 0: unknown")
	durationVar(f, &o.Horizon, "horizon", diag.DefaultHorizon, "with --max-qp and timed snapshots: a NIC that reaches max_qp within this time at the latest pace is a QP_GROWTH finding")
	f.StringVar(&o.TEVersion, "te-version", "", "the transfer engine's Mooncake version, when the logs do not say it")
	durationVar(f, &o.Watch, "watch", 0, "sample live for this long, tailing the logs, then report")
	durationVar(f, &o.Interval, "interval", 10*time.Second, "time between live samples with --watch")
	f.StringVar(&o.RDMABin, "rdma-bin", "rdma", "the iproute2 rdma binary to run when no --rdma file is given")
	f.BoolVar(&o.PerQP, "per-qp", false, "when sampling live, list every QP ('rdma -j resource show qp'): owners and states, slower with many QPs")
	f.IntVar(&o.Top, "top", 10, "peers listed in the table output")
	envName(f, "num-qp-per-ep", "MC_NUM_QP_PER_EP")
	envName(f, "max-ep-per-ctx", "MC_MAX_EP_PER_CTX")
	_ = cmd.RegisterFlagCompletionFunc("at", cobra.NoFileCompletions)
	return cmd
}

// unknown wraps an error into exit status 3, the verdict "unknown".
func unknown(err error) error {
	return &exitError{code: 3, err: fmt.Errorf("diag qp-leak: %w", err)}
}

func runQPLeak(ctx context.Context, o qpLeakOptions, p *printer) error {
	if o.NumQPPerEP < 0 {
		return unknown(usagef("invalid --num-qp-per-ep %d: want at least 1 (0 for Mooncake's default)", o.NumQPPerEP))
	}
	if o.MaxEPPerCtx < 0 || o.MaxQP < 0 {
		return unknown(usagef("--max-ep-per-ctx and --max-qp cannot be negative"))
	}
	if o.Horizon <= 0 {
		return unknown(usagef("invalid --horizon %v: want a positive duration", o.Horizon))
	}
	if o.Top < 0 {
		return unknown(usagef("invalid --top %d: want the number of peers to list (0 for none)", o.Top))
	}
	for _, a := range o.Args {
		kind, err := diag.Classify(a)
		if err != nil {
			return unknown(err)
		}
		if kind == diag.KindRDMA {
			o.RDMA = append(o.RDMA, a)
		} else {
			o.Logs = append(o.Logs, a)
		}
	}
	stdin := 0
	for _, f := range append(append([]string(nil), o.RDMA...), o.Logs...) {
		if f == "-" {
			stdin++
		}
	}
	if stdin > 1 {
		return unknown(usagef("standard input (-) can be only one of the inputs"))
	}
	at, err := parseStamps(o.At)
	if err != nil {
		return unknown(err)
	}
	if len(at) > 0 && len(at) != len(o.RDMA) {
		return unknown(usagef("%d --at stamps for %d --rdma files: give one per file, in the same order", len(at), len(o.RDMA)))
	}
	opts := diag.Options{NumQPPerEP: o.NumQPPerEP, MaxEPPerCtx: o.MaxEPPerCtx, MaxQP: o.MaxQP, TEVersion: o.TEVersion, Horizon: o.Horizon}
	sampler := diag.Sampler{Bin: o.RDMABin, PerQP: o.PerQP}
	if o.Watch > 0 {
		// Only a watch stops on SIGINT and reports: a one-shot read of
		// stdin could not be interrupted if the signal were caught.
		ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
		defer stop()
		return watchQPLeak(ctx, o, opts, sampler, p)
	}
	snaps, logs, err := diag.Load(ctx, diag.Inputs{RDMA: o.RDMA, At: at, Logs: o.Logs, Sampler: sampler})
	if err != nil {
		return unknown(err)
	}
	return printQPLeak(diag.Analyze(snaps, logs, opts), snaps, o, p)
}

// parseStamps reads --at values. A time without a zone is UTC: snapshot
// files are compared with each other, rarely with the local clock.
func parseStamps(in []string) ([]time.Time, error) {
	var out []time.Time
	for _, s := range in {
		s = strings.TrimSpace(s)
		var t time.Time
		var err error
		if n, perr := strconv.ParseInt(s, 10, 64); perr == nil {
			t = time.Unix(n, 0).UTC()
		} else {
			for _, layout := range []string{time.RFC3339Nano, "2006-01-02 15:04:05", "2006-01-02T15:04:05"} {
				if t, err = time.Parse(layout, s); err == nil {
					break
				}
			}
		}
		if err != nil {
			return nil, usagef("invalid --at %q: want RFC 3339 (2026-03-07T11:30:00Z), 'YYYY-MM-DD hh:mm:ss' or unix seconds", s)
		}
		out = append(out, t)
	}
	return out, nil
}

func watchQPLeak(ctx context.Context, o qpLeakOptions, opts diag.Options, sampler diag.Sampler, p *printer) error {
	if len(o.RDMA) > 0 {
		return unknown(usagef("--watch samples this host live; it takes no --rdma files"))
	}
	if o.Interval <= 0 {
		return unknown(usagef("invalid --interval %v", o.Interval))
	}
	cfg := diag.WatchConfig{
		Logs:     o.Logs,
		Interval: o.Interval,
		Duration: o.Watch,
		Sampler:  sampler,
		Notef: func(format string, args ...any) {
			fmt.Fprintf(p.Err, "note: %s\n", fmt.Sprintf(format, args...))
		},
	}
	if !p.JSON() {
		// The header waits for the first sample: a watch that cannot
		// sample at all prints only its error.
		header := false
		cfg.OnSample = func(first, prev, cur *diag.Snapshot, ev, dev int) {
			if !header {
				fmt.Fprintf(p.Out, "watching %s every %v for %v\n", sampler.Bin, o.Interval, o.Watch)
				header = true
			}
			printGrowth(p.Out, first, prev, cur, ev, dev)
		}
	}
	start := time.Now()
	snaps, logs, err := diag.Watch(ctx, cfg)
	if err != nil && ctx.Err() != nil {
		return &exitError{code: exitInterrupted, err: fmt.Errorf("diag qp-leak: interrupted before the first sample of --watch %s; nothing to report", o.Watch)}
	}
	if err != nil {
		return unknown(err)
	}
	if !p.JSON() {
		fmt.Fprintln(p.Out)
	}
	verdict := printQPLeak(diag.Analyze(snaps, logs, opts), snaps, o, p)
	if ctx.Err() != nil {
		// The report covers the samples taken; the verdict's status
		// gives way to the one every interrupted command exits with.
		return &exitError{code: exitInterrupted, err: fmt.Errorf("diag qp-leak: interrupted after %s of --watch %s (%d samples); the report above covers them", time.Since(start).Round(time.Second), o.Watch, len(snaps))}
	}
	return verdict
}

// printGrowth writes one line per sample: every NIC's count, its change
// since the previous sample and its rate since the first.
func printGrowth(w io.Writer, first, prev, cur *diag.Snapshot, ev, dev int) {
	c, pc, fc := cur.QPCounts(), prev.QPCounts(), first.QPCounts()
	names := make([]string, 0, len(c))
	for n := range c {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString(cur.At.Format("15:04:05"))
	dt := cur.At.Sub(first.At).Hours()
	for _, n := range names {
		fmt.Fprintf(&b, "  %s %d (%+d", n, c[n], c[n]-pc[n])
		if dt > 0 {
			fmt.Fprintf(&b, ", %+.0f/h", float64(c[n]-fc[n])/dt)
		}
		b.WriteString(")")
	}
	if ev > 0 || dev > 0 {
		fmt.Fprintf(&b, "  evictions %d (%+d)", ev, dev)
	}
	fmt.Fprintln(w, b.String())
}

func printQPLeak(r *diag.Report, snaps []*diag.Snapshot, o qpLeakOptions, p *printer) error {
	for _, s := range snaps {
		for _, pr := range s.Problems {
			fmt.Fprintf(p.Err, "note: %s: %s\n", s.Source, pr)
		}
	}
	if r.Logs != nil {
		for _, pr := range r.Logs.Problems {
			fmt.Fprintf(p.Err, "note: %s\n", pr)
		}
	}
	if p.JSON() {
		if err := p.PrintJSON(r); err != nil {
			return err
		}
	} else {
		printQPLeakTable(r, o, p)
	}
	if code := r.ExitCode(); code != 0 {
		return &exitError{code: code}
	}
	return nil
}

func printQPLeakTable(r *diag.Report, o qpLeakOptions, p *printer) {
	fmt.Fprintf(p.Out, "verdict: %s\n", r.Verdict)
	rows := make([][]string, 0, len(r.NICs))
	growth := len(r.Snapshots) > 1
	for _, n := range r.NICs {
		ceiling := "?"
		if n.ExpectedMax != nil {
			ceiling = strconv.FormatInt(*n.ExpectedMax, 10)
		}
		row := []string{n.Name, strconv.FormatInt(n.QP, 10), ceiling, strconv.FormatInt(n.Excess, 10),
			strconv.Itoa(n.Evictions), strconv.Itoa(n.Deletions), fmt.Sprintf("%.1f%%", n.Share*100)}
		if growth {
			g := "-"
			if n.QPGrowthPerHour != nil {
				g = fmt.Sprintf("%+.0f", *n.QPGrowthPerHour)
			}
			left := "-"
			if sec := n.SecondsToMaxQP; sec != nil {
				left = ">3y"
				if *sec < 1e8 {
					left = (time.Duration(*sec) * time.Second).String()
				}
			}
			row = append(row, g, left)
		}
		rows = append(rows, row)
	}
	header := []string{"nic", "qp", "expected max", "excess", "evictions", "deletions", "share"}
	if growth {
		header = append(header, "growth/h", "to max-qp")
	}
	p.Table("QPs per NIC", header, rows)

	if len(r.Findings) > 0 {
		rows = rows[:0]
		for _, f := range r.Findings {
			rows = append(rows, []string{f.Severity, f.Code, wrapText(f.Message, 72)})
		}
		p.Table("Findings", []string{"severity", "code", "finding"}, rows)
	}
	if n := min(o.Top, len(r.Peers)); n > 0 {
		rows = rows[:0]
		for _, pe := range r.Peers[:n] {
			rows = append(rows, []string{pe.Name, strconv.Itoa(pe.Evictions), strconv.Itoa(pe.Deletions),
				strconv.Itoa(pe.ConnFailures), strconv.Itoa(pe.SliceFailures), strconv.Itoa(pe.ReadyAckTimeouts),
				strconv.Itoa(pe.RailPauses), strings.Join(pe.LocalNICs, ",")})
		}
		p.Table(fmt.Sprintf("Peers (top %d of %d)", n, len(r.Peers)),
			[]string{"peer", "evictions", "deletions", "conn failures", "slice failures", "ack timeouts", "rail pauses", "local nics"}, rows)
	}
	if len(r.Processes) > 0 {
		rows = rows[:0]
		for _, pr := range r.Processes {
			pid := strconv.Itoa(pr.PID)
			if pr.PID < 0 {
				pid = "-"
			}
			rows = append(rows, []string{pid, pr.Comm, strconv.FormatInt(pr.QP, 10), strconv.FormatInt(pr.ErrorStateQP, 10)})
		}
		p.Table("QP owners", []string{"pid", "comm", "qp", "err/reset"}, rows)
	}
	for _, a := range r.Advice {
		fmt.Fprintf(p.Out, "- %s\n", a)
	}
	in := fmt.Sprintf("inputs: %d rdma snapshot(s)", len(r.Snapshots))
	if l := r.Logs; l != nil {
		in += fmt.Sprintf("; logs: %d file(s), %d lines (%d glog, %d other, %d unrecognised, %d overlong), %d evictions, %d QP creation failures",
			l.Files, l.Lines, l.GlogLines, l.OtherLines, l.Unrecognised, l.Overlong, l.Evictions, l.QPCreateFailures)
		if r.UnattributedEvictions > 0 {
			in += fmt.Sprintf(", %d evictions not attributable to a NIC", r.UnattributedEvictions)
		}
	}
	if r.TEVersion != "" {
		in += "; transfer engine " + r.TEVersion
	}
	fmt.Fprintln(p.Out, in)
	if len(r.AssumedDefaults) > 0 {
		fmt.Fprintf(p.Out, "assumed Mooncake defaults: %s (give --num-qp-per-ep / --max-ep-per-ctx when the engine runs with others)\n",
			strings.Join(r.AssumedDefaults, ", "))
	}
}

// wrapText breaks s at spaces so no line is longer than width; go-pretty
// keeps multi-line cells inside their column.
func wrapText(s string, width int) string {
	var b strings.Builder
	n := 0
	for i, w := range strings.Fields(s) {
		if i > 0 {
			if n+1+len(w) > width {
				b.WriteByte('\n')
				n = 0
			} else {
				b.WriteByte(' ')
				n++
			}
		}
		b.WriteString(w)
		n += len(w)
	}
	return b.String()
}
