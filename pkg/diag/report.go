package diag

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Verdicts, in rising order of alarm.
const (
	VerdictHealthy = "healthy"
	VerdictSuspect = "suspect"
	VerdictLeak    = "leak"
	VerdictUnknown = "unknown"
)

// Severities of a finding.
const (
	SeverityInfo     = "info"
	SeverityWarning  = "warning"
	SeverityCritical = "critical"
)

// Finding codes. They are part of the JSON contract: never renamed.
const (
	CodeQPExhausted       = "QP_EXHAUSTED"
	CodeQPAboveCeiling    = "QP_ABOVE_CEILING"
	CodeAsymmetricQP      = "ASYMMETRIC_QP"
	CodeEvictionsNoReclm  = "EVICTIONS_WITHOUT_RECLAIM"
	CodeQPGrowth          = "QP_GROWTH"
	CodeNoEvictionLogs    = "NO_EVICTION_LOGS"
	CodeNoPeriodicReclaim = "NO_PERIODIC_RECLAIM"
	CodeQPErrorStatePile  = "QP_ERROR_STATE_PILE"
	// CodeSnapshotTimes: the snapshots carry no usable times, so growth
	// is shown in QPs without a rate or a time to --max-qp.
	CodeSnapshotTimes = "SNAPSHOT_TIMES_UNUSABLE"
	// CodeNoQPCounts: no snapshot listed a NIC, so nothing says the host
	// is healthy; the verdict is unknown.
	CodeNoQPCounts = "NO_QP_COUNTS"
)

// Mooncake's defaults, assumed when the operator gives neither the flag
// nor the MC_* variable (the report lists what it assumed).
const (
	DefaultNumQPPerEP  = 2     // MC_NUM_QP_PER_EP
	DefaultMaxEPPerCtx = 65536 // MC_MAX_EP_PER_CTX, clamped to max_qp / num_qp_per_ep
)

// countAsymmetryRatio is the step in QP counts between NICs that is a
// finding even with every NIC under its ceiling: leaked QPs pile up on the
// NICs that route to the failing peers (the incident had 3.6x). Counts
// below countAsymmetryFloor on the low side are taken as that floor, so an
// idle NIC next to a moderately busy one is not a finding.
const (
	countAsymmetryRatio = 3.0
	countAsymmetryFloor = 256
)

// KernelQPAllowance is added to every NIC's ceiling for QPs that are not
// endpoints: the GSI/SMI QPs of each port, ib_core's and IPoIB's.
const KernelQPAllowance = 16

// FixedVersion is the first Mooncake release that reclaims retired
// endpoints on a timer instead of only after an insert.
const FixedVersion = "0.3.11"

// Options are the operator's knowledge the logs cannot supply.
type Options struct {
	NumQPPerEP  int    // MC_NUM_QP_PER_EP; 0 means Mooncake's default, 2
	MaxEPPerCtx int    // MC_MAX_EP_PER_CTX; 0 when not given (Mooncake's default is assumed when the logs name no peer)
	MaxQP       int64  // the NIC's max_qp; 0 when not given
	TEVersion   string // the transfer engine's version, overriding the logs
	// Horizon: a NIC whose QPs reach MaxQP within it, at the pace of the
	// last interval, is a QP_GROWTH finding whatever the ceiling says.
	// 0 means DefaultHorizon.
	Horizon time.Duration
}

// DefaultHorizon is how far ahead the time to --max-qp is a finding: a
// day, time for an operator to drain and restart before QP creation
// fails.
const DefaultHorizon = 24 * time.Hour

// Finding is one conclusion with a stable code.
type Finding struct {
	Code     string `json:"code"`
	Severity string `json:"severity"`
	Message  string `json:"message"`
}

// NICReport is one local NIC's line of the report.
type NICReport struct {
	Name string `json:"name"`
	QP   int64  `json:"qp"`
	// ExpectedMax is the most QPs live endpoints can explain, null when
	// neither the logs nor --max-ep-per-ctx bound the endpoint count.
	ExpectedMax *int64  `json:"expected_max"`
	Excess      int64   `json:"excess"`
	Evictions   int     `json:"evictions"`
	Deletions   int     `json:"deletions"`
	Share       float64 `json:"share"`        // of all QPs in the latest snapshot
	ExcessShare float64 `json:"excess_share"` // of all excess QPs
	// Growth from the first to the last snapshot holding this NIC.
	QPGrowth        int64    `json:"qp_growth"`
	QPGrowthPerHour *float64 `json:"qp_growth_per_hour"`
	// SecondsToMaxQP projects the rate between the last two snapshots.
	SecondsToMaxQP  *float64 `json:"seconds_to_max_qp"`
	ErrorStateQP    int64    `json:"error_state_qp"`
	SliceFailures   int      `json:"slice_failures"`
	QPCreateFailure int      `json:"qp_create_failures"`
}

// SnapshotReport summarises one rdma snapshot.
type SnapshotReport struct {
	Source string           `json:"source"`
	At     *time.Time       `json:"at"`
	PerQP  bool             `json:"per_qp"`
	QP     map[string]int64 `json:"qp"`
	Total  int64            `json:"total_qp"`
	Lines  int              `json:"lines"`
	Bad    int              `json:"unparsed"`
}

// ProcessReport is one QP owner in per-QP snapshots.
type ProcessReport struct {
	PID          int              `json:"pid"`
	Comm         string           `json:"comm"`
	QP           int64            `json:"qp"`
	States       map[string]int64 `json:"states"`
	ErrorStateQP int64            `json:"error_state_qp"`
}

// Report is the result of `mc diag qp-leak`. Its JSON form is documented
// in README.md and stable: fields are added, never renamed.
type Report struct {
	Verdict          string           `json:"verdict"`
	NICs             []NICReport      `json:"nics"`
	Evictions        int              `json:"evictions"`
	Deletions        int              `json:"deletions"`
	QPCreateFailures int              `json:"qp_create_failures"`
	Peers            []*PeerEvents    `json:"peers"`
	Findings         []Finding        `json:"findings"`
	Snapshots        []SnapshotReport `json:"snapshots"`
	Processes        []ProcessReport  `json:"processes"`
	Advice           []string         `json:"advice"`
	LivePeers        int              `json:"live_peers"`
	NumQPPerEP       int              `json:"num_qp_per_ep"`
	MaxEPPerCtx      int              `json:"max_ep_per_ctx"`
	MaxQP            int64            `json:"max_qp"`
	// MaxQPHorizonSeconds is Options.Horizon: a NIC due to reach max_qp
	// within it is a QP_GROWTH finding.
	MaxQPHorizonSeconds float64 `json:"max_qp_horizon_seconds"`
	TEVersion           string  `json:"te_version"`
	// AssumedDefaults lists the Mooncake defaults the ceiling was
	// computed with because the operator did not give them, as
	// "MC_NUM_QP_PER_EP=2".
	AssumedDefaults []string `json:"assumed_defaults"`
	// UnattributedEvictions could not be tied to a local NIC.
	UnattributedEvictions int `json:"unattributed_evictions"`
	UnattributedDeletions int `json:"unattributed_deletions"`
	// Logs is null when no log was given.
	Logs *LogStats `json:"logs"`
}

// ExitCode maps the verdict to the monitoring-plugin convention.
func (r *Report) ExitCode() int {
	switch r.Verdict {
	case VerdictHealthy:
		return 0
	case VerdictSuspect:
		return 1
	case VerdictLeak:
		return 2
	}
	return 3
}

// Analyze correlates QP snapshots (in any order; they are sorted by time)
// with the log summary (nil when no logs were given).
func Analyze(snaps []*Snapshot, logs *LogSummary, o Options) *Report {
	var assumed []string
	if o.NumQPPerEP <= 0 {
		o.NumQPPerEP = DefaultNumQPPerEP
		assumed = append(assumed, fmt.Sprintf("MC_NUM_QP_PER_EP=%d", DefaultNumQPPerEP))
	}
	if o.Horizon <= 0 {
		o.Horizon = DefaultHorizon
	}
	logsGiven := logs != nil
	if !logsGiven {
		logs = NewLogScanner().Summary()
	}
	snaps = append([]*Snapshot(nil), snaps...)
	// Without usable times the snapshots stay in the order given: times
	// a millisecond apart from a copy say nothing about capture order.
	timed := snapshotTimesUsable(snaps)
	if timed {
		sort.SliceStable(snaps, func(i, j int) bool { return snaps[i].At.Before(snaps[j].At) })
	}

	r := &Report{
		NumQPPerEP:            o.NumQPPerEP,
		MaxEPPerCtx:           o.MaxEPPerCtx,
		MaxQP:                 o.MaxQP,
		MaxQPHorizonSeconds:   o.Horizon.Seconds(),
		Evictions:             logs.Stats.Evictions,
		QPCreateFailures:      logs.Stats.QPCreateFailures,
		Peers:                 logs.Peers,
		LivePeers:             len(logs.Peers),
		UnattributedEvictions: logs.UnattributedEvictions,
		UnattributedDeletions: logs.UnattributedDeletions,
		Findings:              []Finding{},
		Snapshots:             []SnapshotReport{},
		Processes:             []ProcessReport{},
		Advice:                []string{},
		AssumedDefaults:       []string{},
	}
	if r.Peers == nil {
		r.Peers = []*PeerEvents{}
	}
	st := logs.Stats
	if logsGiven {
		r.Logs = &st
	}
	for _, p := range logs.Peers {
		r.Deletions += p.Deletions
	}

	// Ceiling: every live peer path may hold one endpoint per NIC, each
	// with num_qp_per_ep QPs; the store never holds more than
	// max_ep_per_ctx. The logs only name peers that misbehaved or were
	// evicted, so the larger of the two bounds is the honest one.
	// With neither, the store's default size bounds it: a ceiling far
	// above any sane count, but a known one.
	if o.MaxEPPerCtx == 0 && r.LivePeers == 0 {
		o.MaxEPPerCtx = DefaultMaxEPPerCtx
		if o.MaxQP > 0 {
			o.MaxEPPerCtx = int(min(int64(DefaultMaxEPPerCtx), o.MaxQP/int64(o.NumQPPerEP)))
		}
		assumed = append(assumed, fmt.Sprintf("MC_MAX_EP_PER_CTX=%d", o.MaxEPPerCtx))
		r.MaxEPPerCtx = o.MaxEPPerCtx
	}
	r.AssumedDefaults = append(r.AssumedDefaults, assumed...)
	var ceiling *int64
	if eps := max(r.LivePeers, o.MaxEPPerCtx); eps > 0 {
		c := int64(eps)*int64(o.NumQPPerEP) + KernelQPAllowance
		ceiling = &c
	}

	// Per-NIC rows from the latest snapshot, growth from the first.
	rows := map[string]*NICReport{}
	row := func(name string) *NICReport {
		if n := rows[name]; n != nil {
			return n
		}
		n := &NICReport{Name: name, ExpectedMax: ceiling}
		rows[name] = n
		return n
	}
	type seen struct {
		qp int64
		at time.Time
	}
	firstSeen := map[string]seen{}
	prevSeen := map[string]seen{}
	lastRate := map[string]float64{} // per second, between the last two snapshots
	for _, s := range snaps {
		counts := s.QPCounts()
		sr := SnapshotReport{Source: s.Source, PerQP: s.PerQP, QP: counts, Lines: s.Lines, Bad: s.Bad}
		if !s.At.IsZero() {
			t := s.At.UTC()
			sr.At = &t
		}
		for name, qp := range counts {
			sr.Total += qp
			n := row(name)
			n.QP = qp
			if pv, ok := prevSeen[name]; ok && timed {
				if dt := s.At.Sub(pv.at).Seconds(); dt > 0 {
					lastRate[name] = float64(qp-pv.qp) / dt
				}
			}
			prevSeen[name] = seen{qp, s.At}
			if f, ok := firstSeen[name]; !ok {
				firstSeen[name] = seen{qp, s.At}
			} else {
				n.QPGrowth = qp - f.qp
				if dt := s.At.Sub(f.at).Hours(); dt > 0 && timed {
					g := float64(n.QPGrowth) / dt
					n.QPGrowthPerHour = &g
				}
			}
		}
		r.Snapshots = append(r.Snapshots, sr)
	}
	if len(snaps) > 0 {
		last := snaps[len(snaps)-1]
		lastCounts := last.QPCounts()
		for name, n := range rows {
			if _, ok := lastCounts[name]; !ok {
				n.QP = 0 // gone from the latest snapshot
			}
		}
		r.Processes = processes(last)
		for _, p := range r.Processes {
			for nic, e := range last.ErrByOwnerNIC[Owner{PID: p.PID, Comm: p.Comm}] {
				row(nic).ErrorStateQP += e
			}
		}
	}
	for name, e := range logs.NICs {
		n := row(name)
		n.Evictions, n.Deletions = e.Evictions, e.Deletions
		n.SliceFailures, n.QPCreateFailure = e.SliceFailures, e.QPCreateFailures
	}
	var totalQP, totalExcess int64
	for _, n := range rows {
		if n.ExpectedMax != nil && n.QP > *n.ExpectedMax {
			n.Excess = n.QP - *n.ExpectedMax
		}
		totalQP += n.QP
		totalExcess += n.Excess
		// "Time left" uses the latest interval's rate: a leak speeds up
		// with churn, and the operator acts on the present pace.
		if rate := lastRate[n.Name]; o.MaxQP > 0 && rate > 0 && significantGrowth(n) {
			sec := math.Max(0, float64(o.MaxQP-n.QP)/rate)
			sec = math.Round(sec)
			n.SecondsToMaxQP = &sec
		}
	}
	for _, n := range rows {
		if totalQP > 0 {
			n.Share = round3(float64(n.QP) / float64(totalQP))
		}
		if totalExcess > 0 {
			n.ExcessShare = round3(float64(n.Excess) / float64(totalExcess))
		}
		if n.QPGrowthPerHour != nil {
			g := math.Round(*n.QPGrowthPerHour*10) / 10
			n.QPGrowthPerHour = &g
		}
		r.NICs = append(r.NICs, *n)
	}
	sort.Slice(r.NICs, func(i, j int) bool { return nicLess(r.NICs[i].Name, r.NICs[j].Name) })
	if r.NICs == nil {
		r.NICs = []NICReport{}
	}

	r.TEVersion = o.TEVersion
	if r.TEVersion == "" && len(st.Versions) > 0 {
		// Several processes' logs: the oldest version decides the risk.
		vs := append([]string(nil), st.Versions...)
		sort.Slice(vs, func(i, j int) bool { return versionLess(vs[i], vs[j]) })
		r.TEVersion = vs[0]
	}
	judge(r, logs, o, snaps, timed)
	return r
}

// minModTimeGap is the closest two snapshot files' modification times may
// be and still give a rate: captures saved by hand or by cron are seconds
// to hours apart, while files copied without -p get times a millisecond
// apart. Sampled and --at times are taken as they are.
const minModTimeGap = time.Second

// snapshotTimesUsable reports whether snaps (two or more) carry distinct
// times, modification times at least minModTimeGap apart, so that a rate
// and a time to --max-qp mean something. One snapshot gives no rate and
// is always usable.
func snapshotTimesUsable(snaps []*Snapshot) bool {
	if len(snaps) < 2 {
		return true
	}
	s := append([]*Snapshot(nil), snaps...)
	for _, x := range s {
		if x.At.IsZero() {
			return false
		}
	}
	sort.SliceStable(s, func(i, j int) bool { return s[i].At.Before(s[j].At) })
	for i := 1; i < len(s); i++ {
		gap := s[i].At.Sub(s[i-1].At)
		if gap <= 0 || (gap < minModTimeGap && (s[i].AtModTime || s[i-1].AtModTime)) {
			return false
		}
	}
	return true
}

// significantGrowth leaves out noise: a rise under 2% or under a handful
// of endpoints' QPs.
func significantGrowth(n *NICReport) bool {
	if n.QPGrowth <= 0 {
		return false
	}
	return n.QPGrowth >= max(int64(16), (n.QP-n.QPGrowth)/50)
}

func round3(f float64) float64 { return math.Round(f*1000) / 1000 }

// nicLess orders mlx5_2 before mlx5_10.
func nicLess(a, b string) bool {
	ta, na := splitNum(a)
	tb, nb := splitNum(b)
	if ta != tb || na == nb {
		return a < b
	}
	return na < nb
}

func splitNum(s string) (string, int) {
	i := len(s)
	for i > 0 && isDigit(s[i-1]) {
		i--
	}
	if i == len(s) || len(s)-i > 9 {
		return s, -1
	}
	n, _ := strconv.Atoi(s[i:])
	return s[:i], n
}

func processes(s *Snapshot) []ProcessReport {
	out := []ProcessReport{}
	for o, states := range s.QPByOwner {
		p := ProcessReport{PID: o.PID, Comm: o.Comm, States: states}
		for st, n := range states {
			p.QP += n
			if st == "ERR" || st == "RESET" {
				p.ErrorStateQP += n
			}
		}
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].QP != out[j].QP {
			return out[i].QP > out[j].QP
		}
		return out[i].PID < out[j].PID
	})
	return out
}

// judge turns the signals into findings and a verdict. The incident had
// three signals (QPs far above the ceiling, the excess concentrated on
// some NICs, churn without reclaim) and a consequence (ENOMEM); any one
// alone has innocent explanations (a ceiling from too few logged peers,
// uneven traffic, a busy cache), two together do not.
func judge(r *Report, logs *LogSummary, o Options, snaps []*Snapshot, timed bool) {
	nsnaps := len(snaps)
	st := logs.Stats
	var core []int // indexes into r.Findings of leak signals
	add := func(code, sev, msg string, isCore bool) {
		if isCore {
			core = append(core, len(r.Findings))
		}
		r.Findings = append(r.Findings, Finding{Code: code, Severity: sev, Message: msg})
	}
	strong := 0 // signals that count double

	if st.QPCreateENOMEM > 0 {
		msg := fmt.Sprintf("QP creation failed with ENOMEM %d times", st.QPCreateENOMEM)
		if st.EvictionsBeforeFirstQPFailure > 0 {
			msg += fmt.Sprintf(", the first after %d evictions", st.EvictionsBeforeFirstQPFailure)
		}
		add(CodeQPExhausted, SeverityCritical, msg+": the NIC's QP pool is exhausted, so every new connection on it fails, healthy peers included.", true)
	}

	// A ceiling from logged peers alone is soft: healthy peers never log,
	// so a NIC must be twice over it before that counts as a finding.
	// --max-ep-per-ctx is the store's own limit, a hard bound.
	// Mooncake's default store size, assumed when neither is known, is
	// that limit too unless the operator changed it.
	hard := o.MaxEPPerCtx > 0 && o.MaxEPPerCtx >= r.LivePeers
	var above, far []NICReport
	var aboveQP, aboveExcess int64
	for _, n := range r.NICs {
		if n.Excess > 0 && (hard || n.QP >= 2**n.ExpectedMax) {
			above = append(above, n)
			aboveQP += n.QP
			aboveExcess += n.Excess
			if n.ExpectedMax != nil && n.QP >= 4**n.ExpectedMax {
				far = append(far, n)
			}
		}
	}
	if len(above) > 0 {
		c := *above[0].ExpectedMax
		var basis string
		switch {
		case o.MaxEPPerCtx > r.LivePeers && slices.Contains(r.AssumedDefaults, fmt.Sprintf("MC_MAX_EP_PER_CTX=%d", o.MaxEPPerCtx)):
			basis = fmt.Sprintf("Mooncake's default MC_MAX_EP_PER_CTX %d", o.MaxEPPerCtx)
		case o.MaxEPPerCtx > r.LivePeers:
			basis = fmt.Sprintf("--max-ep-per-ctx %d", o.MaxEPPerCtx)
		default:
			basis = fmt.Sprintf("%d live peer paths", r.LivePeers)
		}
		add(CodeQPAboveCeiling, SeverityWarning, fmt.Sprintf(
			"%s hold%s %d QPs, %d more than %s x %d QPs per endpoint (+%d kernel QPs) can explain (ceiling %d per NIC).",
			nicList(above), verbS(len(above)), aboveQP, aboveExcess, basis, o.NumQPPerEP, KernelQPAllowance, c), true)
		// Far above a hard bound (the store's own limit) has no innocent
		// reading: those QPs belong to endpoints the store let go.
		if len(far) > 0 && hard {
			strong++
		}
	}

	if hot, share := asymmetric(r.NICs); len(hot) > 0 {
		add(CodeAsymmetricQP, SeverityWarning, fmt.Sprintf(
			"The excess is concentrated on %d of %d NICs (%s hold%s %.0f%% of it): the leak follows the NICs that carry the evicting or failing peers.",
			len(hot), len(r.NICs), nicList(hot), verbS(len(hot)), share*100), true)
	} else if hot, ratio, hotMin, coldMax := asymmetricCounts(r.NICs); len(hot) > 0 {
		// No excess to speak of, but counts this uneven are how the
		// incident looked from rdma alone: worth a look, not a verdict.
		add(CodeAsymmetricQP, SeverityWarning, fmt.Sprintf(
			"%d of %d NICs (%s) hold %.1fx the QPs of the others (%d or more against at most %d), all under the ceiling: leaked QPs pile up on the NICs that carry the evicting or failing peers; the logs (--log) or --max-ep-per-ctx would tell a leak from uneven traffic.",
			len(hot), len(r.NICs), nicList(hot), ratio, hotMin, coldMax), true)
	}

	churn := st.Evictions + r.Deletions
	live := max(r.LivePeers, o.MaxEPPerCtx, 1)
	if churn >= 2*live && (len(above) > 0 || nsnaps == 0) {
		sev := SeverityWarning
		msg := fmt.Sprintf("%d evictions and %d error-path deletions against at most %d live endpoints per NIC", st.Evictions, r.Deletions, live)
		if len(above) > 0 {
			msg += fmt.Sprintf(", while %d NICs hold QPs above their ceiling: retired endpoints are not being reclaimed.", len(above))
		} else {
			msg += ": without QP counts this cannot be confirmed; run it with --rdma or on the host."
		}
		add(CodeEvictionsNoReclm, sev, msg, len(above) > 0)
	}

	// Growth is a finding when it runs past what live endpoints explain,
	// or when it reaches max_qp within the horizon: a NIC filling up
	// towards max_qp is below any ceiling clamped to max_qp until the
	// moment its QP creation fails, and that is too late to warn.
	var growing, due []NICReport
	for _, n := range r.NICs {
		if !significantGrowth(&n) {
			continue
		}
		if n.SecondsToMaxQP != nil && *n.SecondsToMaxQP <= o.Horizon.Seconds() {
			due = append(due, n)
		} else if n.ExpectedMax != nil && n.QP <= *n.ExpectedMax {
			continue // still filling up to what live endpoints explain
		}
		growing = append(growing, n)
	}
	if len(growing) > 0 {
		var msg string
		if timed {
			sort.SliceStable(growing, func(i, j int) bool { return *growing[i].QPGrowthPerHour > *growing[j].QPGrowthPerHour })
			g := growing[0]
			msg = fmt.Sprintf("QPs rose across %d snapshots on %d NICs, fastest %s at %+.0f per hour", nsnaps, len(growing), g.Name, *g.QPGrowthPerHour)
			if len(due) > 0 {
				sort.SliceStable(due, func(i, j int) bool { return *due[i].SecondsToMaxQP < *due[j].SecondsToMaxQP })
				d := due[0]
				if len(due) == 1 {
					msg += fmt.Sprintf("; at the latest pace %s reaches --max-qp %d in about %s", d.Name, o.MaxQP, humanDuration(*d.SecondsToMaxQP))
				} else {
					msg += fmt.Sprintf("; at the latest pace %d NICs (%s) reach --max-qp %d, the first (%s) in about %s", len(due), nicList(due), o.MaxQP, d.Name, humanDuration(*d.SecondsToMaxQP))
				}
				msg += fmt.Sprintf(", within the %s horizon: QP creation fails there", humanDuration(o.Horizon.Seconds()))
			} else if g.SecondsToMaxQP != nil {
				msg += fmt.Sprintf("; it reaches --max-qp %d in about %s", o.MaxQP, humanDuration(*g.SecondsToMaxQP))
			}
		} else {
			sort.SliceStable(growing, func(i, j int) bool { return growing[i].QPGrowth > growing[j].QPGrowth })
			g := growing[0]
			msg = fmt.Sprintf("QPs rose across %d snapshots (in the order given) on %d NICs, most %s by %+d", nsnaps, len(growing), g.Name, g.QPGrowth)
		}
		add(CodeQPGrowth, SeverityWarning, msg+".", true)
	}
	if !timed {
		add(CodeSnapshotTimes, SeverityWarning, fmt.Sprintf(
			"The %d snapshots have no usable times (missing, identical, or file times under %v apart as a copy without -p leaves them): no growth rate or time to --max-qp is computed, and they are taken in the order given; pass --at with the capture times.",
			nsnaps, minModTimeGap), false)
	}

	for _, p := range r.Processes {
		if p.ErrorStateQP >= 64 && p.ErrorStateQP*4 >= p.QP {
			add(CodeQPErrorStatePile, SeverityWarning, fmt.Sprintf(
				"pid %d (%s) owns %d QPs in ERR or RESET state out of %d: endpoints were torn down but their QPs never destroyed.",
				p.PID, p.Comm, p.ErrorStateQP, p.QP), true)
		}
	}

	if st.Files > 0 && st.GlogLines > 0 && st.InfoLines == 0 {
		add(CodeNoEvictionLogs, SeverityInfo,
			"The logs hold no INFO lines, so eviction lines (logged at INFO) may be hidden by the log level and the eviction counts are a floor.", false)
	}
	if st.Files > 0 && st.GlogLines == 0 {
		add(CodeNoEvictionLogs, SeverityInfo,
			"The logs hold no glog lines at all: check that these are the transfer engine's logs.", false)
	}

	if r.TEVersion != "" && versionLess(r.TEVersion, FixedVersion) {
		// Evictions alone are harmless on these versions (each comes with
		// an insert, which runs reclaim); error-path deletions are what
		// pile up once inserts stop.
		sev := SeverityInfo
		if r.Deletions > 0 || len(core) > 0 {
			sev = SeverityWarning
		}
		add(CodeNoPeriodicReclaim, sev, fmt.Sprintf(
			"Mooncake %s detected: versions before v%s reclaim retired endpoints only after an insert, so QPs leak while a peer keeps failing.",
			r.TEVersion, FixedVersion), false)
	}

	n := len(core) + strong
	hasAnchor := false
	for _, i := range core {
		switch r.Findings[i].Code {
		case CodeQPAboveCeiling, CodeQPExhausted, CodeQPErrorStatePile:
			hasAnchor = true
		}
	}
	counted := false
	for _, s := range snaps {
		counted = counted || len(s.QPCounts()) > 0
	}
	switch {
	case n >= 2 && hasAnchor:
		r.Verdict = VerdictLeak
		for _, i := range core {
			r.Findings[i].Severity = SeverityCritical
		}
	case n >= 1:
		r.Verdict = VerdictSuspect
	default:
		r.Verdict = VerdictHealthy
		for _, f := range r.Findings {
			if f.Severity == SeverityWarning && f.Code != CodeSnapshotTimes {
				r.Verdict = VerdictSuspect
			}
		}
		// Healthy is a claim about QP counts; with none, nothing was
		// judged.
		if r.Verdict == VerdictHealthy && !counted {
			r.Verdict = VerdictUnknown
			add(CodeNoQPCounts, SeverityWarning, "No snapshot lists a NIC with its QP count, so nothing shows the host is healthy: capture `rdma resource show` on the host, or run this there.", false)
		}
	}
	if r.Verdict == VerdictSuspect {
		// ENOMEM without other signals is exhaustion by honest load.
		for _, i := range core {
			if r.Findings[i].Severity == SeverityCritical {
				r.Findings[i].Severity = SeverityWarning
			}
		}
	}
	r.Advice = advise(r, logs, o)
}

// asymmetricCounts finds NICs holding countAsymmetryRatio times the QPs of
// the rest: sorted by count, the largest such step down separates them.
// It returns them, the ratio across the step and the counts either side
// of it.
func asymmetricCounts(nics []NICReport) (hot []NICReport, ratio float64, hotMin, coldMax int64) {
	if len(nics) < 2 {
		return nil, 0, 0, 0
	}
	s := append([]NICReport(nil), nics...)
	sort.SliceStable(s, func(i, j int) bool { return s[i].QP > s[j].QP })
	cut, best := -1, countAsymmetryRatio
	for i := 0; i+1 < len(s); i++ {
		lo := math.Max(float64(s[i+1].QP), countAsymmetryFloor)
		if ratio := float64(s[i].QP) / lo; ratio >= best {
			cut, best = i, ratio
		}
	}
	if cut < 0 {
		return nil, 0, 0, 0
	}
	hotMin, coldMax = s[cut].QP, s[cut+1].QP
	ratio = float64(hotMin) / float64(max(coldMax, 1))
	hot = s[:cut+1]
	sort.Slice(hot, func(i, j int) bool { return nicLess(hot[i].Name, hot[j].Name) })
	return hot, math.Floor(ratio*10) / 10, hotMin, coldMax
}

// asymmetric finds the NICs the excess concentrates on: sorted by QP count,
// the largest step down of at least 2x separates hot from cold.
func asymmetric(nics []NICReport) ([]NICReport, float64) {
	var total int64
	for _, n := range nics {
		total += n.Excess
	}
	if total == 0 || len(nics) < 2 {
		return nil, 0
	}
	s := append([]NICReport(nil), nics...)
	sort.SliceStable(s, func(i, j int) bool { return s[i].QP > s[j].QP })
	cut, best := -1, 2.0
	for i := 0; i+1 < len(s); i++ {
		lo := math.Max(float64(s[i+1].QP), 1)
		if ratio := float64(s[i].QP) / lo; ratio >= best {
			cut, best = i, ratio
		}
	}
	if cut < 0 {
		return nil, 0
	}
	hot := s[:cut+1]
	var ex int64
	for _, n := range hot {
		ex += n.Excess
	}
	if ex == 0 {
		return nil, 0
	}
	sort.Slice(hot, func(i, j int) bool { return nicLess(hot[i].Name, hot[j].Name) })
	return hot, float64(ex) / float64(total)
}

func advise(r *Report, logs *LogSummary, o Options) []string {
	has := map[string]bool{}
	for _, f := range r.Findings {
		has[f.Code] = true
	}
	var a []string
	if r.Verdict == VerdictLeak || has[CodeQPExhausted] {
		a = append(a, "Restart the transfer engine process on this host: leaked QPs are freed only when their process exits.")
	}
	switch {
	case r.Verdict != VerdictHealthy && has[CodeNoPeriodicReclaim]:
		a = append(a, "Upgrade Mooncake to v"+FixedVersion+" or later: it reclaims retired endpoints on a timer, not only after inserts.")
	case r.Verdict == VerdictLeak && r.TEVersion == "":
		a = append(a, "If the transfer engine is Mooncake older than v"+FixedVersion+" (give --te-version to check), upgrade: later versions reclaim retired endpoints on a timer, not only after inserts.")
	}
	if r.Verdict != VerdictHealthy && len(r.Peers) > 0 && r.Peers[0].Evictions+r.Peers[0].Deletions > 0 {
		var top []string
		for _, p := range r.Peers[:min(3, len(r.Peers))] {
			if p.Evictions+p.Deletions > 0 {
				top = append(top, p.Name)
			}
		}
		a = append(a, "Lower eviction churn: fix or drain the failing peers ("+strings.Join(top, ", ")+") and raise MC_MAX_EP_PER_CTX if the store is too small for the peer count.")
	}
	if has[CodeNoEvictionLogs] {
		a = append(a, "Set MC_LOG_LEVEL=INFO (GLOG_minloglevel=0) so eviction lines are logged, then run this again.")
	}
	if has[CodeQPGrowth] && o.MaxQP == 0 {
		a = append(a, "Give --max-qp (the NIC's max_qp from `ibv_devinfo -v`) to see how long until QP creation fails.")
	}
	if r.Verdict == VerdictHealthy {
		a = append(a, "Nothing to do: no leak signal in these QP counts and logs.")
		var soft bool
		for _, n := range r.NICs {
			soft = soft || n.Excess > 0
		}
		if soft && o.MaxEPPerCtx == 0 {
			a = append(a, "Some NICs are a little above the ceiling from logged peers, a soft bound since healthy peers never log: give --max-ep-per-ctx for a hard one.")
		}
	}
	return a
}

func nicList(ns []NICReport) string {
	names := make([]string, len(ns))
	for i, n := range ns {
		names[i] = n.Name
	}
	if len(names) > 6 {
		return strings.Join(names[:5], ", ") + fmt.Sprintf(" and %d more", len(names)-5)
	}
	return strings.Join(names, ", ")
}

func verbS(n int) string {
	if n == 1 {
		return "s"
	}
	return ""
}

func humanDuration(sec float64) string {
	if sec > 1e8 {
		return "more than 3 years"
	}
	d := time.Duration(sec) * time.Second
	switch {
	case d <= 0:
		return "no time (already there)"
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()+0.5))
	case d < 48*time.Hour:
		return fmt.Sprintf("%.1fh", d.Hours())
	}
	return fmt.Sprintf("%.1f days", d.Hours()/24)
}

// versionLess compares "0.3.7.post2" < "0.3.11". Missing parts are zero;
// a pre-release suffix (rc, dev, a, b) sorts before its release, a post
// release after it.
func versionLess(a, b string) bool {
	pa, pb := parseVersion(a), parseVersion(b)
	for i := range pa {
		if pa[i] != pb[i] {
			return pa[i] < pb[i]
		}
	}
	return false
}

func parseVersion(s string) [4]int {
	s = strings.TrimPrefix(strings.TrimPrefix(s, "v"), "V")
	var v [4]int
	part := 0
	i := 0
	for part < 3 && i < len(s) {
		j := i
		for j < len(s) && isDigit(s[j]) {
			j++
		}
		v[part], _ = strconv.Atoi(s[i:j])
		part++
		if j < len(s) && s[j] == '.' && j+1 < len(s) && isDigit(s[j+1]) {
			i = j + 1
			continue
		}
		i = j
		break
	}
	rest := strings.TrimLeft(s[min(i, len(s)):], ".-+")
	switch {
	case rest == "":
	case strings.HasPrefix(rest, "post"):
		v[3] = 1
	default:
		v[3] = -1
	}
	return v
}
