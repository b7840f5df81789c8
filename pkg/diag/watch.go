package diag

import (
	"context"
	"fmt"
	"os"
	"time"
)

// WatchConfig says what Watch samples, for how long, and whom it tells.
type WatchConfig struct {
	// Logs are read in full first; plain files among them are then
	// followed, through rotations. Stdin ("-") and gzip files (by
	// content, whatever their name) are read once only: neither can grow
	// in a way a tail could follow.
	Logs []string
	// Interval is the time between samples, Duration the length of the
	// watch; both must be positive.
	Interval, Duration time.Duration
	Sampler            Sampler
	// OnSample, when set, is called after every sample with the running
	// eviction count of the logs and its change since the previous
	// sample. The first call is the baseline: prev and cur are first, and
	// both counts are zero.
	OnSample func(first, prev, cur *Snapshot, evictions, newEvictions int)
	// Notef, when set, receives what does not stop the watch: a log that
	// is not followed, a failed tail read, a failed sample.
	Notef func(format string, args ...any)
}

// Watch samples the host every Interval for Duration while following the
// logs, so that a leak shows as growth rather than as one high count.
// Cancelling ctx ends the watch early with what it has: an operator who
// interrupts a long watch still wants the report. Failures before the
// first sample (an unreadable log, a tool that cannot run) are
// ErrUnreadable; later failed samples are only noted, as one bad run of
// rdma in a long watch does not void the others. logs is nil when no log
// was given.
func Watch(ctx context.Context, cfg WatchConfig) (snaps []*Snapshot, logs *LogSummary, err error) {
	if cfg.Interval <= 0 {
		return nil, nil, fmt.Errorf("invalid watch interval %v", cfg.Interval)
	}
	if cfg.Duration <= 0 {
		return nil, nil, fmt.Errorf("invalid watch duration %v", cfg.Duration)
	}
	notef := cfg.Notef
	if notef == nil {
		notef = func(string, ...any) {}
	}
	onSample := cfg.OnSample
	if onSample == nil {
		onSample = func(_, _, _ *Snapshot, _, _ int) {}
	}

	sc := NewLogScanner()
	var tailed []string
	for _, l := range cfg.Logs {
		if l == "-" || isGzip(l) {
			notef("%s is read once, not followed", l)
			continue
		}
		tailed = append(tailed, l)
	}
	if err := ScanFiles(sc, cfg.Logs); err != nil {
		return nil, nil, unreadable{err}
	}
	// Open the tails after the full read: lines written in between are
	// counted at the first poll only if they arrive after the seek; a
	// few lost lines at the start of a watch do not change a verdict.
	tl, err := NewTailer(sc, tailed)
	if err != nil {
		return nil, nil, unreadable{fmt.Errorf("follow logs: %w", err)}
	}
	defer tl.Close()

	first, err := cfg.Sampler.Sample(ctx)
	if err != nil {
		if ctx.Err() != nil {
			// Interrupted before the first sample: nothing was read
			// wrong, there is just nothing to report.
			return nil, nil, ctx.Err()
		}
		return nil, nil, unreadable{err}
	}
	snaps = []*Snapshot{first}
	onSample(first, first, first, 0, 0)
	end := time.Now().Add(cfg.Duration)
	deadline := time.NewTimer(cfg.Duration)
	defer deadline.Stop()
	tick := time.NewTicker(cfg.Interval)
	defer tick.Stop()
	lastEv := sc.Summary().Stats.Evictions
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-deadline.C:
			break loop
		case <-tick.C:
			// A slow sample leaves a tick and the deadline both ready,
			// and select picks at random: without this the watch could
			// go on sampling past its --duration.
			if !time.Now().Before(end) {
				break loop
			}
		}
		if err := tl.Poll(); err != nil {
			notef("%v", err)
		}
		s, err := cfg.Sampler.Sample(ctx)
		if err != nil {
			if ctx.Err() != nil {
				break loop
			}
			notef("sample failed: %v", err)
			continue
		}
		prev := snaps[len(snaps)-1]
		snaps = append(snaps, s)
		ev := sc.Summary().Stats.Evictions
		onSample(first, prev, s, ev, ev-lastEv)
		lastEv = ev
	}
	if err := tl.Poll(); err != nil {
		notef("%v", err)
	}
	if len(cfg.Logs) > 0 {
		logs = sc.Summary()
	}
	return snaps, logs, nil
}

// isGzip reports whether path starts with the gzip magic; an unreadable
// path is not, and fails later with its own error.
func isGzip(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	var magic [2]byte
	n, _ := f.Read(magic[:])
	return n == 2 && magic[0] == 0x1f && magic[1] == 0x8b
}
