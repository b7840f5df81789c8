package cmd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jedib0t/go-pretty/v6/progress"
	"github.com/spf13/cobra"

	"github.com/kvcache-ops/mc/pkg/coll"
	"github.com/kvcache-ops/mc/pkg/coll/collbench"
	"github.com/kvcache-ops/mc/pkg/engine"
	"github.com/kvcache-ops/mc/pkg/engine/bench"
	"github.com/kvcache-ops/mc/pkg/engine/meta"
	"github.com/kvcache-ops/mc/pkg/units"
)

type benchCollOptions struct {
	Collective string
	Ranks      int
	MinBytes   int64
	MaxBytes   int64
	Factor     int64
	Iters      int
	Warmup     int
	Check      bool
	KillRank   int
	KillAfter  int
	SlotSize   int64
	Slots      int
	Timeout    time.Duration
	// JoinTimeout bounds the wait for the group's other ranks at the
	// start.
	JoinTimeout time.Duration
	Protocol    string
	// One rank of a group (across hosts, or launched by the parent).
	Rank        int
	WorldSize   int
	Store       string
	Group       string
	BindAddress string
	EmitRows    bool // internal: JSON lines of every row, for the parent
	// Progress forces (true) or suppresses (false) the progress bar; nil
	// means a bar on a terminal and one line per row on stderr otherwise.
	Progress *bool
	// exit ends the killed rank of the drill; nil: the process exits.
	exit func()
}

func newBenchCollCmd(p *printer) *cobra.Command {
	var o benchCollOptions
	c := &cobra.Command{
		Use:   "coll",
		Short: "Benchmark collectives (all_reduce, ...) over the transfer engine, nccl-tests style",
		Long: `mc bench coll sweeps one collective over message sizes, from -b to -e
bytes multiplying by -f, and prints per size the time, algbw and busbw with
nccl-tests' definitions (busbw = algbw x 2(n-1)/n for all_reduce, (n-1)/n
for all_gather, reduce_scatter and all_to_all, x 1 for broadcast; n the
active ranks), the active ranks and, with --check, whether every rank got
the right result. Data is float32 in registered memory; bytes move by
engine writes into the peers' registered mailboxes. As in nccl-tests, a
size is rounded down to whole float32 elements per rank's block (at
least one), and the size column shows the bytes actually moved: -b 7
starts with a 4-byte row.

--protocol auto (the default) moves bytes between ranks on one host
through shared memory (their mailboxes are memfd regions each peer maps)
and over tcp between hosts; tcp forces loopback TCP, shm refuses any
peer it cannot map. The transport column says which transports the
ranks' engines actually moved each row's bytes with.

By default it starts --ranks local rank processes (this binary again) and
an embedded etcd on a loopback port as their rendezvous. With --rank,
--world-size and --store it is one rank of a group whose ranks run
anywhere (the lowest live rank prints); --store is an etcd (host:port or etcd://) or
HTTP metadata server (http://host:port/path).

A run needs every rank: one that starts with fewer active ranks than
--world-size fails naming the missing ones. A run that finishes removes
its records from the store, so the --group name serves the next run; an
interrupted run leaves them, and the next run of that name fails: pick
another --group.

A rank waits --join-timeout (default 2m) for the group's other ranks to
start, then fails naming those that never came.

On a terminal a progress bar follows the sweep; otherwise each finished
row is one line on stderr. SIGINT stops the sweep: the rows done are
printed and the run exits 130.

--kill-rank R --kill-after K is a failure drill: rank R exits after K
collectives; the others find it failed, the collective in flight is
retried over the survivors and the sweep goes on. Rows show the ranks
that were active and those that failed while the row ran; the run then
exits 1, since rank R did not finish.

Exit status: 0 when every rank finished (and every checked row was
right), 64 on a usage error, 130 when interrupted, 1 otherwise.`,
		Example: `  mc bench coll --collective all_reduce --ranks 4 -b 8 -e 64M -f 2 --check
  mc bench coll --collective all_gather --ranks 8 -b 1K -e 16M -f 4 -o json
  mc bench coll --ranks 4 -b 1M -e 16M --iters 50 --kill-rank 2 --kill-after 60
  mc bench coll --rank 0 --world-size 2 --store 10.0.0.1:2379 --bind-address 10.0.0.2`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			// Each mode's own flags are refused in the other, where they
			// did nothing: --store without --rank ran local ranks on an
			// embedded etcd, the store given unused.
			fs := cmd.Flags()
			if isSet(fs, "rank") {
				if fs.Changed("ranks") {
					return usagef("--ranks starts local ranks; with --rank this process is one rank of --world-size: give one of them")
				}
				return runBenchCollRank(ctx, o, p)
			}
			// Only the command line's: a config file's bench.store or
			// bench.bind_address serves the group's other verbs too.
			if err := refuseGiven(cmd, "goes with --rank (this process as one rank of a group); without --rank mc starts --ranks local ranks on an embedded etcd",
				"world-size", "store", "group", "bind-address"); err != nil {
				return err
			}
			return runBenchColl(ctx, o, p)
		},
	}
	fs := c.Flags()
	fs.StringVar(&o.Collective, "collective", "all_reduce", "collective: "+strings.Join(collbench.Collectives, ", "))
	fs.IntVar(&o.Ranks, "ranks", 4, "local rank processes to start")
	sizeVarP(fs, &o.MinBytes, "min-bytes", "b", 8, "smallest size")
	sizeVarP(fs, &o.MaxBytes, "max-bytes", "e", 64<<20, "largest size")
	fs.Int64VarP(&o.Factor, "step-factor", "f", 2, "multiply the size by this between rows")
	fs.IntVar(&o.Iters, "iters", 20, "timed collectives per size")
	fs.IntVar(&o.Warmup, "warmup", 5, "untimed collectives per size before the timed ones")
	fs.BoolVar(&o.Check, "check", false, "run one more collective per size on known data and verify every rank's result")
	fs.IntVar(&o.KillRank, "kill-rank", -1, "failure drill: this rank exits after --kill-after collectives")
	fs.IntVar(&o.KillAfter, "kill-after", 0, "failure drill: collectives the killed rank completes first")
	sizeVar(fs, &o.SlotSize, "slot-size", 4<<20, "mailbox slot size per peer (every rank must agree)")
	fs.IntVar(&o.Slots, "slots", 2, "mailbox slots per peer (pipelining depth, at most 64; 0: 2)")
	durationVar(fs, &o.Timeout, "timeout", coll.DefaultTimeout, "a peer silent this long (its engine still up) is marked failed (0: the default, 30s)")
	durationVar(fs, &o.JoinTimeout, "join-timeout", defaultJoinTimeout, "how long a rank waits for the group's other ranks to start, then fails naming them (0: as long as it takes)")
	fs.StringVar(&o.Protocol, "protocol", engine.ProtocolAuto, "transport between ranks: auto (shared memory on one host, else tcp), tcp, or shm (shared memory only)")
	fs.IntVar(&o.Rank, "rank", 0, "run as this rank of a group (with --world-size and --store)")
	fs.IntVar(&o.WorldSize, "world-size", 0, "ranks of the group (with --rank)")
	fs.StringVar(&o.Store, "store", "", "rendezvous: etcd host:port, etcd://..., or http://host:port/path (with --rank)")
	fs.StringVar(&o.Group, "group", "mc-bench-coll", "group name in the store (with --rank; free again once a run finishes)")
	fs.StringVar(&o.BindAddress, "bind-address", "127.0.0.1", "address this rank's engine listens on (with --rank)")
	envName(fs, "bind-address", "MC_TCP_BIND_ADDRESS")
	fs.BoolVar(&o.EmitRows, "emit-rows", false, "write every row as a JSON line (used by the launching process)")
	_ = fs.MarkHidden("emit-rows")
	_ = c.RegisterFlagCompletionFunc("collective", cobra.FixedCompletions(collbench.Collectives, cobra.ShellCompDirectiveNoFileComp))
	_ = c.RegisterFlagCompletionFunc("protocol", cobra.FixedCompletions(collProtocols, cobra.ShellCompDirectiveNoFileComp))
	return c
}

func (o benchCollOptions) sweep() (collbench.Config, error) {
	cfg := collbench.Config{
		Collective: o.Collective, MinBytes: o.MinBytes, MaxBytes: o.MaxBytes, Factor: o.Factor,
		Iters: o.Iters, Warmup: o.Warmup, Check: o.Check, KillRank: o.KillRank, KillAfter: o.KillAfter,
	}
	// The flags by name first (the package's check names the fields).
	switch {
	case !slices.Contains(collbench.Collectives, o.Collective):
		return cfg, usagef("invalid --collective %q: want one of %s", o.Collective, strings.Join(collbench.Collectives, ", "))
	case o.MinBytes <= 0:
		return cfg, usagef("invalid --min-bytes (-b) %d: want more than 0", o.MinBytes)
	case o.MaxBytes < o.MinBytes:
		return cfg, usagef("invalid --max-bytes (-e) %s: below --min-bytes %s", units.FormatSize(o.MaxBytes), units.FormatSize(o.MinBytes))
	case o.Factor < 2:
		return cfg, usagef("invalid --step-factor (-f) %d: want at least 2", o.Factor)
	case o.Iters < 1:
		return cfg, usagef("invalid --iters %d: want at least 1", o.Iters)
	case o.Warmup < 0:
		return cfg, usagef("invalid --warmup %d: want 0 or more", o.Warmup)
	}
	if err := cfg.Validate(); err != nil {
		return cfg, err
	}
	if o.KillAfter < 0 {
		return cfg, usagef("--kill-after %d: want 0 or more", o.KillAfter)
	}
	if o.KillRank < 0 && o.KillAfter > 0 {
		// The drill does nothing without the rank to kill.
		return cfg, usagef("--kill-after %d goes with --kill-rank R (the rank that exits)", o.KillAfter)
	}
	if o.Slots < 0 || o.Slots > coll.MaxSlots {
		return cfg, usagef("invalid --slots %d: want 1 to %d (0: the default, 2)", o.Slots, coll.MaxSlots)
	}
	return cfg, nil
}

// defaultJoinTimeout is --join-timeout's default: time to start the
// ranks of a group by hand on several hosts.
const defaultJoinTimeout = 2 * time.Minute

// collProtocols are the values --protocol takes.
var collProtocols = []string{engine.ProtocolAuto, "tcp", engine.ProtocolSHM}

func (o benchCollOptions) protocol() error {
	if !slices.Contains(collProtocols, o.Protocol) {
		return usagef("--protocol %q: want one of %s", o.Protocol, strings.Join(collProtocols, ", "))
	}
	return nil
}

func (o benchCollOptions) slotSize() (int, error) {
	if s := o.SlotSize; s < 64 || s%64 != 0 || s > 1<<30 {
		return 0, usagef("--slot-size %s: want a multiple of 64 bytes up to 1G", units.FormatSize(s))
	}
	return int(o.SlotSize), nil
}

// runBenchColl launches o.Ranks local ranks and prints their merged rows.
func runBenchColl(ctx context.Context, o benchCollOptions, p *printer) error {
	if _, err := o.sweep(); err != nil {
		return err
	}
	if _, err := o.slotSize(); err != nil {
		return err
	}
	if err := o.protocol(); err != nil {
		return err
	}
	if o.Ranks < 1 || o.Ranks > 64 {
		return usagef("--ranks %d: want 1-64", o.Ranks)
	}
	if o.KillRank >= o.Ranks {
		return usagef("--kill-rank %d: the group has ranks 0-%d", o.KillRank, o.Ranks-1)
	}
	if o.JoinTimeout < 0 {
		return usagef("invalid --join-timeout %s: want a duration (0: wait as long as it takes)", o.JoinTimeout)
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find this binary to start ranks: %w", err)
	}
	args := []string{"bench", "coll", "--emit-rows",
		"--collective", o.Collective, "-b", units.FormatSize(o.MinBytes), "-e", units.FormatSize(o.MaxBytes), "-f", strconv.FormatInt(o.Factor, 10),
		"--iters", strconv.Itoa(o.Iters), "--warmup", strconv.Itoa(o.Warmup),
		"--kill-rank", strconv.Itoa(o.KillRank), "--kill-after", strconv.Itoa(o.KillAfter),
		"--slot-size", units.FormatSize(o.SlotSize), "--slots", strconv.Itoa(o.Slots), "--timeout", o.Timeout.String(), "--join-timeout", o.JoinTimeout.String(), "--protocol", o.Protocol,
		"--check=" + strconv.FormatBool(o.Check)}
	if !p.JSON() {
		fmt.Fprintf(p.Out, "%d local ranks (--protocol %s), rendezvous in an embedded etcd\n", o.Ranks, o.Protocol)
	}
	cfg, _ := o.sweep()
	onRow, stop := collProgress(o, p, len(cfg.Sizes()))
	rows, err := collbench.Launch(ctx, collbench.LaunchConfig{
		Exe: exe, Args: args, Ranks: o.Ranks, Stderr: p.Err, OnRow: onRow,
		RankArgs: func(r int, store, group string) []string {
			return []string{"--rank", strconv.Itoa(r), "--world-size", strconv.Itoa(o.Ranks), "--store", store, "--group", group}
		},
	})
	stop()
	if ctx.Err() != nil {
		// The merged rows, whichever rank measured them (the ranks'
		// rule, that the lowest active rank prints, is not the
		// launcher's: it prints them all).
		return interruptedColl(p, rows, len(cfg.Sizes()))
	}
	if err != nil {
		return err
	}
	if err := printCollRows(p, rows); err != nil {
		return err
	}
	return unfinished(collbench.Unfinished(rows, o.Ranks))
}

// interruptedColl prints the rows done before SIGINT and exits 130.
func interruptedColl(p *printer, rows []collbench.Result, sizes int) error {
	if len(rows) > 0 {
		printCollRows(p, rows)
	}
	return &exitError{code: exitInterrupted, err: fmt.Errorf("bench coll: interrupted after %d of %d sizes", len(rows), sizes)}
}

// collProgress follows a sweep of n sizes: a go-pretty bar on a terminal
// (as mc bench initiator and mc store drain draw), else one line per
// finished row on stderr (none with -o json). stop ends the bar.
func collProgress(o benchCollOptions, p *printer, n int) (onRow func(collbench.Result), stop func()) {
	tty := !p.JSON() && isTerminal(p.Out)
	bar, lines := tty, !tty && !p.JSON()
	if o.Progress != nil {
		bar, lines = *o.Progress, false
	}
	done := 0
	switch {
	case bar:
		pw := startProgress(p.Out, 48)
		pw.Style().Visibility.Percentage = true
		tr := &progress.Tracker{Total: int64(n), Units: progress.UnitsDefault, Message: fmt.Sprintf("%s, %d sizes", o.Collective, n)}
		pw.AppendTracker(tr)
		return func(r collbench.Result) {
			done++
			tr.UpdateMessage(fmt.Sprintf("%s %s: busbw %.3f GB/s (%d/%d)", r.Collective, bench.FormatSize(r.SizeBytes), r.BusBW, done, n))
			tr.SetValue(int64(done))
		}, func() { stopProgress(pw, tr) }
	case lines:
		return func(r collbench.Result) {
			done++
			fmt.Fprintln(p.Err, collRowLine(done, n, r))
		}, func() {}
	}
	return nil, func() {}
}

// collRowLine is a finished row as one progress line (not a terminal).
func collRowLine(i, n int, r collbench.Result) string {
	correct := ""
	if r.Correct != nil {
		correct = ", correct " + map[bool]string{true: "yes", false: "WRONG"}[*r.Correct]
	}
	return fmt.Sprintf("row %d/%d: %s %s, %d ranks: %.1f us, algbw %.3f GB/s, busbw %.3f GB/s%s", i, n, r.Collective,
		bench.FormatSize(r.SizeBytes), r.Ranks, r.TimeUS, r.AlgBW, r.BusBW, correct)
}

// unfinished fails a run some ranks did not finish: the rows then
// measured fewer ranks than asked for.
func unfinished(ranks []int) error {
	if len(ranks) == 0 {
		return nil
	}
	return fmt.Errorf("bench coll: %s did not finish the sweep (failed during it: the rows above name the ranks each was measured on)", coll.RankNames(ranks))
}

// runBenchCollRank is one rank: engine, group, sweep.
func runBenchCollRank(ctx context.Context, o benchCollOptions, p *printer) error {
	cfg, err := o.sweep()
	if err != nil {
		return err
	}
	slot, err := o.slotSize()
	if err != nil {
		return err
	}
	if err := o.protocol(); err != nil {
		return err
	}
	switch {
	case o.WorldSize < 1:
		return usagef("--world-size %d: want the group's rank count (with --rank)", o.WorldSize)
	case o.Rank < 0 || o.Rank >= o.WorldSize:
		return usagef("--rank %d: want 0 to %d", o.Rank, o.WorldSize-1)
	case o.Store == "" || o.Store == meta.P2PHandshake:
		return usagef("--store: want the rendezvous (etcd host:port or http://host:port/path)")
	case o.JoinTimeout < 0:
		return usagef("invalid --join-timeout %s: want a duration (0: wait as long as it takes)", o.JoinTimeout)
	}
	if err := checkMetadataServer("store", o.Store); err != nil {
		return err
	}
	be, err := meta.Open(ctx, o.Store, meta.Options{HTTPToken: metadataToken()})
	if err != nil {
		return fmt.Errorf("--store: %w", err)
	}
	defer be.Close()
	st, err := meta.StoreOf(be)
	if err != nil {
		return fmt.Errorf("--store: %w", err)
	}
	eng, err := engine.New(ctx, engine.Config{
		LocalServerName: fmt.Sprintf("%s-rank%d", o.Group, o.Rank),
		MetadataServer:  o.Store, BindAddress: o.BindAddress, Protocol: o.Protocol,
		MetadataHTTPToken: metadataToken(),
	})
	if err != nil {
		return err
	}
	defer eng.Close()
	g, err := coll.New(ctx, coll.Config{
		Group: o.Group, Rank: o.Rank, WorldSize: o.WorldSize, Engine: eng, Store: st,
		Slots: o.Slots, SlotSize: slot, Timeout: o.Timeout, JoinTimeout: o.JoinTimeout,
	})
	switch {
	case ctx.Err() != nil:
		return &exitError{code: exitInterrupted, err: fmt.Errorf("bench coll: interrupted while waiting for the group's ranks")}
	case errors.Is(err, coll.ErrJoinTimeout):
		return fmt.Errorf("bench coll: %w (--join-timeout %s: start every rank with the same --group and --store, or give a longer --join-timeout)", err, o.JoinTimeout)
	case err != nil:
		return fmt.Errorf("bench coll: %w (a --group whose earlier run did not finish keeps its records: use another --group)", err)
	}
	defer g.Close()
	// A rank whose record is there but whose engine is not (an earlier
	// run's, left behind) is marked failed at once: a sweep over the rest
	// would measure fewer ranks than asked for.
	if act := g.ActiveRanks(); len(act) < o.WorldSize {
		var missing []int
		for r := range o.WorldSize {
			if !slices.Contains(act, r) {
				missing = append(missing, r)
			}
		}
		return fmt.Errorf("bench coll: group %q has %d of %d ranks active, %s missing (not started, failed, or records a run that did not finish left in the store: use another --group)",
			o.Group, len(act), o.WorldSize, coll.RankNames(missing))
	}
	cfg.Exit = func() {
		fmt.Fprintf(p.Err, "exiting after %d collectives (--kill-rank %d --kill-after %d)\n", o.KillAfter, o.KillRank, o.KillAfter)
		if o.exit != nil {
			o.exit()
		}
		os.Exit(0)
	}
	var rows []collbench.Result
	onRow, stop := func(collbench.Result) {}, func() {}
	if !o.EmitRows {
		if f, s := collProgress(o, p, len(cfg.Sizes())); f != nil {
			onRow, stop = f, s
		}
	}
	emit := func(r collbench.Result) {
		if o.EmitRows {
			b, _ := json.Marshal(r)
			fmt.Fprintf(p.Out, "%s\n", b)
			return
		}
		rows = append(rows, r)
		onRow(r)
	}
	err = collbench.RunRank(ctx, g, eng, cfg, emit)
	stop()
	if ctx.Err() != nil {
		if o.EmitRows {
			return &exitError{code: exitInterrupted, err: errors.New("bench coll: interrupted")}
		}
		if len(rows) > 0 && rows[len(rows)-1].ActiveRanks[0] != o.Rank {
			rows = nil // the lowest active rank prints them
		}
		return interruptedColl(p, rows, len(cfg.Sizes()))
	}
	if err != nil {
		return err
	}
	var gone []int
	act := g.ActiveRanks()
	for r := range o.WorldSize {
		if !slices.Contains(act, r) {
			gone = append(gone, r)
		}
	}
	// Every rank still active removes the group's records together, so
	// the name is free for the next run.
	if err := g.Finish(ctx); err != nil {
		return fmt.Errorf("bench coll: %w", err)
	}
	if o.EmitRows {
		return nil // the launching process judges the merged rows
	}
	if len(rows) > 0 && rows[len(rows)-1].ActiveRanks[0] == o.Rank {
		if err := printCollRows(p, rows); err != nil {
			return err
		}
	}
	return unfinished(gone)
}

func printCollRows(p *printer, rows []collbench.Result) error {
	wrong := 0
	for _, r := range rows {
		if r.Correct != nil && !*r.Correct {
			wrong++
		}
	}
	if p.JSON() {
		if err := p.PrintJSON(map[string]any{"results": rows}); err != nil {
			return err
		}
	} else {
		printCollTable(p.Out, p, rows)
	}
	if wrong > 0 {
		return errors.New(strconv.Itoa(wrong) + " sizes gave wrong results")
	}
	return nil
}

func printCollTable(_ io.Writer, p *printer, rows []collbench.Result) {
	var tr [][]string
	for _, r := range rows {
		correct := "-"
		if r.Correct != nil {
			correct = "yes"
			if !*r.Correct {
				correct = "WRONG"
			}
		}
		act := make([]string, len(r.ActiveRanks))
		for i, q := range r.ActiveRanks {
			act[i] = strconv.Itoa(q)
		}
		failed := "-"
		if len(r.Failed) > 0 {
			f := make([]string, len(r.Failed))
			for i, q := range r.Failed {
				f[i] = strconv.Itoa(q)
			}
			failed = strings.Join(f, ",")
		}
		tr = append(tr, []string{
			r.Collective, bench.FormatSize(r.SizeBytes), strconv.Itoa(r.Ranks), strings.Join(act, ","),
			fmt.Sprintf("%.1f", r.TimeUS), fmt.Sprintf("%.3f", r.AlgBW), fmt.Sprintf("%.3f", r.BusBW), r.Transport, correct, failed,
		})
	}
	p.Table("", []string{"collective", "size", "ranks", "active", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "transport", "correct", "failed"}, tr)
}
