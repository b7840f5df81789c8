package cmd

import (
	"context"
	"fmt"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jedib0t/go-pretty/v6/progress"
	"github.com/jedib0t/go-pretty/v6/text"
	"github.com/spf13/cobra"

	"github.com/kvcache-ops/mc/pkg/store"
)

type storeDrainOptions struct {
	storeClientOptions
	To             []string
	MaxConcurrency int
	Unmount        bool
	Force          bool
	Wait           bool
	Status         string
	Cancel         string
	Undo           string
	Interval       time.Duration
	// tty: stdout is a terminal (progress bar, and --wait's default).
	tty bool
}

func newStoreDrainCmd(p *printer) *cobra.Command {
	var o storeDrainOptions
	cmd := &cobra.Command{
		Use:   "drain {SEGMENT... | --status JOB | --cancel JOB | --undo SEGMENT}",
		Short: "Empty segments before maintenance: copy what lives only there elsewhere",
		Long: `drain creates a drain job on the master (Mooncake's /api/v1/drain_jobs, so it
also drives a mooncake_master): the segments stop taking new objects, and every
object whose only replicas are there is copied, hottest first, by the node that
holds it to a segment chosen by the allocation strategy (or one of --to). Gets
and puts go on meanwhile; an object removed or re-put during the drain is not
brought back. With --unmount the segments are unmounted once every object is
safe; when some objects find no room elsewhere the job fails and says how many
objects and bytes would be lost (--force unmounts anyway).

--wait (the default on a terminal) follows the job with a progress bar, or a
line every --interval when the output is not a terminal, and exits non-zero if
the job does not succeed.

--undo SEGMENT returns a DRAINING or DRAINED segment to service (status OK):
it takes new objects again at once, and a job draining only that segment is
canceled (copies under way finish). A segment left DRAINED by a finished job
otherwise stays out of service until its node restarts; --cancel applies only
while a job runs. A segment already in service is left as it is (exit 0).
Needs mc's master (POST /api/v1/segments/undrain; mooncake_master has no
such call) and, when the master has one, its admin token.`,
		Example: `  mc store drain node-7:15001 --unmount
  mc store drain node-7:15001 --to node-8:15001 --max-concurrency 32 --wait=false
  mc store drain --status 10363372161903120377-6505125312812371119
  mc store drain --cancel 10363372161903120377-6505125312812371119
  mc store drain --undo node-7:15001`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := refuseGiven(cmd, "picks the keys a verb uses; a drain moves every tenant's objects off its segments", "tenant"); err != nil {
				return err
			}
			o.tty = isTerminal(p.Out)
			if !cmd.Flags().Changed("wait") {
				o.Wait = o.tty
			}
			modes := 0
			for _, b := range []bool{len(args) > 0, o.Status != "", o.Cancel != "", o.Undo != ""} {
				if b {
					modes++
				}
			}
			if modes != 1 {
				return usagef("drain: name the segments to drain, or give --status JOB, --cancel JOB or --undo SEGMENT (one of the four)")
			}
			if len(args) == 0 {
				// Settings of a new job, given to --status, --cancel or
				// --undo, did nothing, silently.
				mode := map[bool]string{true: "--undo", false: "--status or --cancel"}[o.Undo != ""]
				if err := refuseGiven(cmd, "sets up a new drain job; it does nothing with "+mode, "to", "max-concurrency", "unmount", "force"); err != nil {
					return err
				}
				if o.Status == "" {
					if err := refuseGiven(cmd, "follows a job: give it with --status JOB or a new drain", "wait", "interval"); err != nil {
						return err
					}
				}
			}
			if o.MaxConcurrency < 0 {
				return usagef("invalid --max-concurrency %d: want 1 or more (0: the master's default)", o.MaxConcurrency)
			}
			if o.Force && !o.Unmount {
				return usagef("--force only applies with --unmount (it unmounts even when objects would be lost)")
			}
			for _, id := range []string{o.Status, o.Cancel} {
				if _, err := store.ParseUUID(id); id != "" && err != nil {
					return usagef("invalid job id %q: want the id drain printed (first-second, two decimal numbers)", id)
				}
			}
			if o.Interval <= 0 {
				return usagef("invalid --interval %s: want a positive duration", o.Interval)
			}
			a, err := o.admin()
			if err != nil {
				return err
			}
			// An interrupt stops the following, not the job: say how to
			// pick it up again.
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return runStoreDrain(ctx, o, a, args, p)
		},
	}
	f := cmd.Flags()
	o.addFlags(f)
	f.StringSliceVar(&o.To, "to", nil, "segments the copies may go to (default: any segment in service, by the allocation strategy)")
	f.IntVar(&o.MaxConcurrency, "max-concurrency", 0, "copies in flight (0: the master's default)")
	f.BoolVar(&o.Unmount, "unmount", false, "unmount the segments once every object is safe")
	f.BoolVar(&o.Force, "force", false, "with --unmount: unmount even when objects found no room (they are lost; the job says how many)")
	f.BoolVar(&o.Wait, "wait", false, "follow the job until it ends (default: on a terminal)")
	f.StringVar(&o.Status, "status", "", "show the state of job JOB")
	f.StringVar(&o.Cancel, "cancel", "", "cancel job JOB (copies under way finish; the segments return to service)")
	f.StringVar(&o.Undo, "undo", "", "return SEGMENT, DRAINING or DRAINED, to service (status OK)")
	durationVar(f, &o.Interval, "interval", 2*time.Second, "with --wait and no terminal: time between progress lines")
	return cmd
}

// storeUndrainJSON is `mc store drain --undo SEGMENT -o json`.
type storeUndrainJSON struct {
	Segment        string `json:"segment"`
	Status         string `json:"status"`
	PreviousStatus string `json:"previous_status"`
}

func runStoreDrain(ctx context.Context, o storeDrainOptions, a *store.Admin, segments []string, p *printer) error {
	switch {
	case o.Undo != "":
		st, err := a.UndrainSegment(ctx, o.Undo)
		if err != nil {
			return fmt.Errorf("undo drain of %s: %w", o.Undo, err)
		}
		if p.JSON() {
			return p.PrintJSON(storeUndrainJSON{Segment: st.Segment, Status: st.StatusName, PreviousStatus: st.PreviousStatusName})
		}
		if st.PreviousStatusName == "OK" {
			fmt.Fprintf(p.Out, "segment %s: already in service (OK)\n", st.Segment)
			return nil
		}
		fmt.Fprintf(p.Out, "segment %s: %s -> %s (back in service: takes new objects)\n", st.Segment, st.PreviousStatusName, st.StatusName)
		return nil
	case o.Cancel != "":
		if err := a.CancelDrainJob(ctx, o.Cancel); err != nil {
			return fmt.Errorf("cancel drain job %s: %w", o.Cancel, err)
		}
		j, err := a.QueryDrainJob(ctx, o.Cancel)
		if err != nil {
			return err
		}
		if p.JSON() {
			// success: the cancel was taken (exit 0); status_name says
			// where the job is, CANCELED once its copies under way end.
			return p.PrintJSON(j)
		}
		fmt.Fprintf(p.Out, "drain job %s: cancel asked (%s; copies under way finish, then the segments return to service)\n", o.Cancel, j.StatusName)
		return nil
	case o.Status != "":
		j, err := a.QueryDrainJob(ctx, o.Status)
		if err != nil {
			return fmt.Errorf("drain job %s: %w", o.Status, err)
		}
		if o.Wait && !j.Done() {
			return followDrain(ctx, o, a, o.Status, p)
		}
		return printDrainJob(p, j)
	}
	id, err := a.CreateDrainJob(ctx, store.DrainJobRequest{Segments: segments, TargetSegments: o.To, MaxConcurrency: o.MaxConcurrency, Unmount: o.Unmount, Force: o.Force})
	if err != nil {
		return fmt.Errorf("drain %s: %w", strings.Join(segments, ", "), err)
	}
	if !o.Wait {
		j, err := a.QueryDrainJob(ctx, id)
		if err != nil {
			return err
		}
		if p.JSON() {
			return p.PrintJSON(drainJSON(j))
		}
		fmt.Fprintf(p.Out, "drain job %s created for %s (%s)\nfollow it: mc store drain --status %s --wait\n", id, strings.Join(segments, ", "), j.StatusName, id)
		return nil
	}
	if !p.JSON() {
		fmt.Fprintf(p.Err, "drain job %s created for %s\n", id, strings.Join(segments, ", "))
	}
	return followDrain(ctx, o, a, id, p)
}

// followDrain polls the job until it ends, drawing progress, and returns
// an error when it did not succeed.
func followDrain(ctx context.Context, o storeDrainOptions, a *store.Admin, id string, p *printer) error {
	every := o.Interval
	var pw progress.Writer
	var tr *progress.Tracker
	if o.tty && !p.JSON() {
		pw = startProgress(p.Out, 40)
		pw.Style().Visibility.ETA = true
		pw.Style().Visibility.Value = true
		pw.Style().Visibility.Percentage = true
		pw.Style().Visibility.Speed = true
		tr = &progress.Tracker{Message: "drain " + id, Units: progress.UnitsBytes}
		pw.AppendTracker(tr)
		every = 250 * time.Millisecond
	}
	start := time.Now()
	var j store.DrainJobStatus
	var err error
	for {
		j, err = a.QueryDrainJob(ctx, id)
		if err != nil {
			if pw != nil {
				stopProgress(pw, nil)
			}
			if ctx.Err() != nil {
				return interruptedDrain(id)
			}
			return err
		}
		switch {
		case tr != nil:
			tr.UpdateTotal(int64(max(j.PlannedBytes, j.MigratedBytes)))
			tr.SetValue(int64(j.MigratedBytes))
			tr.UpdateMessage(fmt.Sprintf("%d/%d objects %s", j.SucceededUnits, j.PlannedUnits, j.StatusName))
		case !p.JSON():
			fmt.Fprintln(p.Err, drainLine(j, time.Since(start)))
		}
		if j.Done() {
			break
		}
		select {
		case <-ctx.Done():
			if pw != nil {
				stopProgress(pw, nil)
			}
			return interruptedDrain(id)
		case <-time.After(every):
		}
	}
	if pw != nil {
		stopProgress(pw, tr)
	}
	if err := printDrainJob(p, j); err != nil {
		return err
	}
	if j.StatusName != "SUCCEEDED" {
		return &exitError{code: 1, err: fmt.Errorf("drain job %s %s: %s", id, j.StatusName, j.Message)}
	}
	return nil
}

func interruptedDrain(id string) error {
	return &exitError{code: exitInterrupted, err: fmt.Errorf("stopped following drain job %s: it goes on on the master; follow it with mc store drain --status %s --wait, or stop it with --cancel %s", id, id, id)}
}

// drainLine is one progress line for a non-terminal.
func drainLine(j store.DrainJobStatus, elapsed time.Duration) string {
	rate := float64(j.MigratedBytes) / max(elapsed.Seconds(), 1e-3)
	eta := "-"
	if left := int64(j.PlannedBytes) - int64(j.MigratedBytes); left > 0 && rate > 0 && !j.Done() {
		eta = time.Duration(float64(left) / rate * float64(time.Second)).Round(time.Second).String()
	}
	return fmt.Sprintf("%s %s: %d/%d objects, %s/%s copied, %s/s, %d active, %d failed, %d blocked, eta %s",
		j.JobID, j.StatusName, j.SucceededUnits, j.PlannedUnits, humanBytes(j.MigratedBytes), humanBytes(j.PlannedBytes),
		humanBytes(uint64(rate)), j.ActiveUnits, j.FailedUnits, j.BlockedUnits, eta)
}

// drainJSON is a job's status as --status, --wait and a new job print
// it under -o json: the admin API's fields, but success says whether the
// job has not failed (the API's, Mooncake's, says the query worked: true
// for a FAILED job, which a script checking it read as a drain that
// worked). It agrees with the exit code.
func drainJSON(j store.DrainJobStatus) store.DrainJobStatus {
	j.Success = j.StatusName != "FAILED" && j.StatusName != "CANCELED"
	return j
}

func printDrainJob(p *printer, j store.DrainJobStatus) error {
	if p.JSON() {
		return p.PrintJSON(drainJSON(j))
	}
	targets := "any in service"
	if len(j.TargetSegments) > 0 {
		targets = strings.Join(j.TargetSegments, ", ")
	}
	rows := [][]string{
		{"job", j.JobID},
		{"status", j.StatusName},
		{"segments", strings.Join(j.Segments, ", ")},
		{"targets", targets},
		{"objects copied / planned", fmt.Sprintf("%d / %d", j.SucceededUnits, j.PlannedUnits)},
		{"bytes copied / planned", humanBytes(j.MigratedBytes) + " / " + humanBytes(j.PlannedBytes)},
		{"active / failed / blocked / skipped", fmt.Sprintf("%d / %d / %d / %d", j.ActiveUnits, j.FailedUnits, j.BlockedUnits, j.SkippedUnits)},
	}
	if j.LostObjects > 0 {
		rows = append(rows, []string{"objects without room (lost if unmounted)", fmt.Sprintf("%d (%s, %d pinned)", j.LostObjects, humanBytes(j.LostBytes), j.LostPinned)})
	}
	rows = append(rows, []string{"unmounted", strconv.FormatBool(j.Unmounted)})
	if j.CreatedAtMs > 0 {
		end := j.UpdatedAtMs
		if j.FinishedAtMs > 0 {
			end = j.FinishedAtMs
		}
		rows = append(rows, []string{"elapsed", (time.Duration(end-j.CreatedAtMs) * time.Millisecond).String()})
	}
	if j.Message != "" {
		// Wrapped: a long message made the table some 250 columns wide.
		rows = append(rows, []string{"message", text.WrapSoft(j.Message, 72)})
	}
	p.Table("", []string{"drain", "value"}, rows)
	return nil
}
