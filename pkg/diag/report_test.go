package diag

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite testdata/golden/*.json")

var t0 = time.Date(2026, 3, 7, 11, 30, 0, 0, time.UTC)

type goldenCase struct {
	name string
	in   Inputs
	opts Options
	want string // verdict
	// codes that must be among the findings
	codes []string
}

func goldenCases() []goldenCase {
	td := func(p ...string) string { return filepath.Join(append([]string{"testdata"}, p...)...) }
	return []goldenCase{
		{
			name: "leak",
			in: Inputs{RDMA: []string{td("leak", "rdma.txt")}, At: []time.Time{t0},
				Logs: []string{td("leak", "prefill-0.INFO.1.gz"), td("leak", "prefill-0.INFO")}, Year: 2026},
			want:  VerdictLeak,
			codes: []string{CodeQPExhausted, CodeQPAboveCeiling, CodeAsymmetricQP, CodeEvictionsNoReclm, CodeNoPeriodicReclaim},
		},
		{
			name: "healthy",
			in: Inputs{RDMA: []string{td("healthy", "rdma.txt")}, At: []time.Time{t0},
				Logs: []string{td("healthy", "prefill-0.INFO")}, Year: 2026},
			want: VerdictHealthy,
		},
		{
			name: "leak-noinfo",
			in: Inputs{RDMA: []string{td("leak", "rdma.json")}, At: []time.Time{t0},
				Logs: []string{td("leak-noinfo", "prefill-0.WARNING")}, Year: 2026},
			want:  VerdictLeak,
			codes: []string{CodeQPExhausted, CodeQPAboveCeiling, CodeAsymmetricQP, CodeNoEvictionLogs},
		},
		{
			name: "growth",
			in: Inputs{RDMA: []string{td("growth", "rdma-3.json"), td("growth", "rdma-1.json"), td("growth", "rdma-4.json"), td("growth", "rdma-2.json")},
				At: []time.Time{t0.Add(20 * time.Minute), t0, t0.Add(30 * time.Minute), t0.Add(10 * time.Minute)}},
			opts:  Options{MaxEPPerCtx: 256, MaxQP: 131072},
			want:  VerdictLeak,
			codes: []string{CodeQPGrowth, CodeQPAboveCeiling, CodeAsymmetricQP},
		},
		{
			name:  "perqp",
			in:    Inputs{RDMA: []string{td("perqp", "rdma-qp.txt")}, At: []time.Time{t0}},
			opts:  Options{MaxEPPerCtx: 256},
			want:  VerdictLeak,
			codes: []string{CodeQPErrorStatePile, CodeQPAboveCeiling, CodeAsymmetricQP},
		},
	}
}

func runGolden(t *testing.T, c goldenCase) *Report {
	t.Helper()
	snaps, logs, err := Load(context.Background(), c.in)
	if err != nil {
		t.Fatalf("%s: %v", c.name, err)
	}
	return Analyze(snaps, logs, c.opts)
}

func TestGoldenReports(t *testing.T) {
	for _, c := range goldenCases() {
		t.Run(c.name, func(t *testing.T) {
			r := runGolden(t, c)
			got, err := json.MarshalIndent(r, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, '\n')
			path := filepath.Join("testdata", "golden", c.name+".json")
			if *update {
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("report differs from %s (run with -update and review the diff):\n%s", path, got)
			}
			// Independent of the golden file: the verdict and the signals
			// the fixture was built to show.
			if r.Verdict != c.want {
				t.Errorf("verdict %s, want %s; findings %+v", r.Verdict, c.want, r.Findings)
			}
			for _, code := range c.codes {
				if !hasCode(r, code) {
					t.Errorf("finding %s missing: %+v", code, r.Findings)
				}
			}
		})
	}
}

func hasCode(r *Report, code string) bool {
	for _, f := range r.Findings {
		if f.Code == code {
			return true
		}
	}
	return false
}

// The incident's figures must come out of the leak fixture as counted.
func TestLeakFigures(t *testing.T) {
	r := runGolden(t, goldenCases()[0])
	if r.Evictions != 1118 {
		t.Errorf("evictions %d, want 1118", r.Evictions)
	}
	if r.Logs.QPCreateENOMEM != 37 || r.Logs.EvictionsBeforeFirstQPFailure != 1118 {
		t.Errorf("ENOMEM %d after %d evictions, want 37 after 1118", r.Logs.QPCreateENOMEM, r.Logs.EvictionsBeforeFirstQPFailure)
	}
	if r.TEVersion != "0.3.7.post2" {
		t.Errorf("version %q", r.TEVersion)
	}
	if r.Logs.Files != 2 || r.Logs.Unrecognised != 1 || r.Logs.OtherLines == 0 {
		t.Errorf("input counts: %+v", r.Logs)
	}
	var hot, cold int
	for _, n := range r.NICs {
		if n.Excess <= 0 || n.ExpectedMax == nil {
			t.Errorf("%s: excess %d", n.Name, n.Excess)
		}
		switch n.Name {
		case "mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3":
			hot += n.Evictions
		default:
			cold += n.Evictions
		}
	}
	if hot <= 5*cold || hot == 0 {
		t.Errorf("evictions attributed hot %d cold %d: want them on mlx5_0..3", hot, cold)
	}
	for _, f := range r.Findings {
		if f.Code == CodeAsymmetricQP && !strings.Contains(f.Message, "mlx5_0, mlx5_1, mlx5_2, mlx5_3 hold") {
			t.Errorf("asymmetry names the wrong NICs: %s", f.Message)
		}
	}
	if r.ExitCode() != 2 {
		t.Errorf("exit code %d", r.ExitCode())
	}
}

// Text and JSON forms of the same capture give the same report.
func TestTextAndJSONAgree(t *testing.T) {
	for _, pair := range [][2]string{{"leak/rdma.txt", "leak/rdma.json"}, {"perqp/rdma-qp.txt", "perqp/rdma-qp.json"}} {
		var reps [2]*Report
		for i, p := range pair {
			snaps, _, err := Load(context.Background(), Inputs{RDMA: []string{filepath.Join("testdata", p)}, At: []time.Time{t0}})
			if err != nil {
				t.Fatal(err)
			}
			reps[i] = Analyze(snaps, nil, Options{MaxEPPerCtx: 256})
			reps[i].Snapshots = nil
		}
		a, _ := json.Marshal(reps[0])
		b, _ := json.Marshal(reps[1])
		if !bytes.Equal(a, b) {
			t.Errorf("%s and %s disagree:\n%s\n%s", pair[0], pair[1], a, b)
		}
	}
}

func TestGrowthTimeToMax(t *testing.T) {
	r := runGolden(t, goldenCases()[3])
	n := r.NICs[0]
	// 9000 -> 10880 in 30 minutes: +3760/h. Time left at the last
	// interval's pace, 10250 -> 10880 in 10 minutes: (131072-10880)/3780 h.
	if n.QPGrowth != 1880 || n.QPGrowthPerHour == nil || *n.QPGrowthPerHour != 3760 {
		t.Fatalf("growth %d per hour %v", n.QPGrowth, n.QPGrowthPerHour)
	}
	want := float64(131072-10880) / 3780 * 3600
	if n.SecondsToMaxQP == nil || *n.SecondsToMaxQP < want-1 || *n.SecondsToMaxQP > want+1 {
		t.Fatalf("seconds to max %v, want %.0f", n.SecondsToMaxQP, want)
	}
	if r.NICs[5].QPGrowthPerHour == nil || r.NICs[5].QPGrowth > 5 {
		t.Errorf("flat NIC grew: %+v", r.NICs[5])
	}
}

// A host filling up towards max_qp: four NICs alike (no asymmetry),
// +3,760 QPs an hour, 1.5 h from --max-qp 16384, far below the ceiling
// Mooncake's default store (clamped to max_qp) allows. QP_GROWTH fires on
// the projection, naming the time left and the horizon; past the horizon
// it does not, and flat counts never do.
func TestGrowthTowardMaxQPWithinHorizon(t *testing.T) {
	snap := func(at time.Time, qp int64) *Snapshot {
		t.Helper()
		var b strings.Builder
		for i := range 4 {
			fmt.Fprintf(&b, "%d: mlx5_%d: pd 99 cq 95 qp %d cm_id 0 mr 848 ctx 98\n", i, i, qp)
		}
		s, err := ReadSnapshot(strings.NewReader(b.String()), at.Format(time.RFC3339))
		if err != nil {
			t.Fatal(err)
		}
		s.At = at
		return s
	}
	const maxQP = 16384
	last := int64(maxQP - 3760*3/2) // 1.5 h left at +3760/h
	snaps := []*Snapshot{snap(t0, last-3760), snap(t0.Add(30*time.Minute), last-1880), snap(t0.Add(time.Hour), last)}

	r := Analyze(snaps, nil, Options{MaxQP: maxQP})
	if e := r.NICs[0].ExpectedMax; e == nil || *e < maxQP {
		t.Fatalf("ceiling %v: the case needs one at or above max_qp", e)
	}
	if s := r.NICs[0].SecondsToMaxQP; s == nil || *s != 5400 {
		t.Fatalf("seconds to max_qp %v, want 5400", s)
	}
	var msg string
	for _, f := range r.Findings {
		if f.Code == CodeQPGrowth {
			msg = f.Message
		}
	}
	if r.Verdict != VerdictSuspect || r.ExitCode() != 1 || !strings.Contains(msg, "4 NICs (mlx5_0, mlx5_1, mlx5_2, mlx5_3) reach --max-qp 16384, the first (mlx5_0) in about 1.5h, within the 24.0h horizon") {
		t.Errorf("1.5 h from max_qp: verdict %s, findings %+v; want suspect with %s naming the time left and the horizon", r.Verdict, r.Findings, CodeQPGrowth)
	}
	if r.MaxQPHorizonSeconds != DefaultHorizon.Seconds() {
		t.Errorf("max_qp_horizon_seconds %v, want %v", r.MaxQPHorizonSeconds, DefaultHorizon.Seconds())
	}

	// Past a 1 h horizon, the same growth under the ceiling is filling up.
	if r := Analyze(snaps, nil, Options{MaxQP: maxQP, Horizon: time.Hour}); hasCode(r, CodeQPGrowth) || r.Verdict != VerdictHealthy {
		t.Errorf("1.5 h left, 1 h horizon: verdict %s, findings %+v; want healthy", r.Verdict, r.Findings)
	}
	// Without --max-qp there is no projection.
	if r := Analyze(snaps, nil, Options{}); hasCode(r, CodeQPGrowth) {
		t.Errorf("no --max-qp: findings %+v", r.Findings)
	}
	// Flat counts near max_qp are not growth.
	flat := []*Snapshot{snap(t0, maxQP-100), snap(t0.Add(time.Hour), maxQP-100)}
	if r := Analyze(flat, nil, Options{MaxQP: maxQP}); hasCode(r, CodeQPGrowth) {
		t.Errorf("flat: findings %+v", r.Findings)
	}
}

func TestVersionCompare(t *testing.T) {
	less := [][2]string{{"0.3.7.post2", "0.3.11"}, {"v0.3.10", "0.3.11"}, {"0.3.11rc1", "0.3.11"}, {"0.2.99", "0.3.0"}}
	for _, p := range less {
		if !versionLess(p[0], p[1]) || versionLess(p[1], p[0]) {
			t.Errorf("%s < %s not seen", p[0], p[1])
		}
	}
	for _, v := range []string{"0.3.11", "0.3.11.post1", "v0.4.0", "1.0.0"} {
		if versionLess(v, FixedVersion) {
			t.Errorf("%s taken as older than %s", v, FixedVersion)
		}
	}
	for in, want := range map[string]string{
		"mooncake-transfer-engine 0.3.7.post2":        "0.3.7.post2",
		"Mooncake transfer engine v0.3.11 starting":   "0.3.11",
		"mooncake_transfer_engine==0.3.10rc1; python": "0.3.10rc1",
		"Mooncake 2 of 3 ready":                       "",
	} {
		if got := findVersion([]byte(in)); got != want {
			t.Errorf("findVersion(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestUnreadableInputs(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage")
	os.WriteFile(garbage, []byte("\x00\x01 not rdma\nhello\n"), 0o644)
	badgz := filepath.Join(dir, "bad.gz")
	os.WriteFile(badgz, []byte{0x1f, 0x8b, 0, 0}, 0o644)
	for _, in := range []Inputs{
		{RDMA: []string{filepath.Join(dir, "missing")}},
		{RDMA: []string{garbage}},
		{RDMA: []string{"testdata/leak/rdma.txt"}, Logs: []string{filepath.Join(dir, "missing.log")}},
		{RDMA: []string{"testdata/leak/rdma.txt"}, Logs: []string{badgz}},
		{RDMA: []string{"testdata/leak/rdma.txt"}, At: []time.Time{t0, t0}},
	} {
		_, _, err := Load(context.Background(), in)
		if err == nil {
			t.Errorf("%+v: no error", in)
			continue
		}
		if len(in.At) == 0 && !errors.Is(err, ErrUnreadable) {
			t.Errorf("%+v: %v does not wrap ErrUnreadable", in, err)
		}
	}
}

// A log that cannot be read to its end (a gzip cut short while being
// copied, a directory) leaves the verdict unknown: the README's exit 3,
// never a report built from part of what the operator named.
func TestUnreadableLogStops(t *testing.T) {
	b, err := os.ReadFile("testdata/leak/prefill-0.INFO.1.gz")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cut := filepath.Join(dir, "cut.gz")
	os.WriteFile(cut, b[:len(b)/2], 0o644)
	for _, log := range []string{cut, dir} {
		_, _, err := Load(context.Background(), Inputs{RDMA: []string{"testdata/leak/rdma.txt"}, At: []time.Time{t0}, Logs: []string{log}})
		if !errors.Is(err, ErrUnreadable) || !strings.Contains(err.Error(), log) {
			t.Errorf("log %s: err = %v, want ErrUnreadable naming it", log, err)
		}
	}
	if _, err := Open(dir); err == nil || !strings.Contains(err.Error(), "is a directory") {
		t.Errorf("Open(dir) = %v", err)
	}
}

// Snapshot files copied without -p carry modification times a millisecond
// apart: no rate and no time to --max-qp come out of them, the report says
// why, and growth is still counted in the order given.
func TestSnapshotTimesUnusable(t *testing.T) {
	dir := t.TempDir()
	var files []string
	base := time.Now().Add(-time.Hour)
	for i := 1; i <= 4; i++ {
		b, err := os.ReadFile(filepath.Join("testdata", "growth", fmt.Sprintf("rdma-%d.json", i)))
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, fmt.Sprintf("rdma-%d.json", i))
		os.WriteFile(p, b, 0o644)
		mt := base.Add(time.Duration(i) * 300 * time.Microsecond)
		if err := os.Chtimes(p, mt, mt); err != nil {
			t.Fatal(err)
		}
		files = append(files, p)
	}
	check := func(name string, in Inputs) {
		t.Helper()
		snaps, _, err := Load(context.Background(), in)
		if err != nil {
			t.Fatal(err)
		}
		r := Analyze(snaps, nil, Options{MaxEPPerCtx: 256, MaxQP: 131072})
		if !hasCode(r, CodeSnapshotTimes) {
			t.Errorf("%s: no %s finding: %+v", name, CodeSnapshotTimes, r.Findings)
		}
		for _, n := range r.NICs {
			if n.QPGrowthPerHour != nil || n.SecondsToMaxQP != nil {
				t.Errorf("%s: %s has a rate %v or an ETA %v from unusable times", name, n.Name, n.QPGrowthPerHour, n.SecondsToMaxQP)
			}
		}
		if r.NICs[0].QPGrowth != 1880 || !hasCode(r, CodeQPGrowth) {
			t.Errorf("%s: growth %d in the order given, want 1880; findings %+v", name, r.NICs[0].QPGrowth, r.Findings)
		}
		for _, f := range r.Findings {
			if strings.Contains(f.Message, "per hour") || strings.Contains(f.Message, "reaches --max-qp") {
				t.Errorf("%s: finding reports a rate: %s", name, f.Message)
			}
		}
	}
	check("mtimes 300µs apart", Inputs{RDMA: files})
	check("identical --at", Inputs{RDMA: files, At: []time.Time{t0, t0, t0, t0}})

	// Sampled times (--watch) and --at stamps a second apart are real.
	snaps, _, err := Load(context.Background(), Inputs{RDMA: files, At: []time.Time{t0, t0.Add(time.Second), t0.Add(2 * time.Second), t0.Add(3 * time.Second)}})
	if err != nil {
		t.Fatal(err)
	}
	if r := Analyze(snaps, nil, Options{MaxEPPerCtx: 256}); hasCode(r, CodeSnapshotTimes) || r.NICs[0].QPGrowthPerHour == nil {
		t.Errorf("--at stamps a second apart rejected: %+v", r.Findings)
	}
}

// QP counts alone: the ceiling comes from Mooncake's defaults (listed in
// the report), and the incident's 3.6x asymmetry is suspect, not healthy.
func TestQPCountsAloneAssumeDefaults(t *testing.T) {
	snaps, _, err := Load(context.Background(), Inputs{RDMA: []string{"testdata/leak/rdma.txt"}, At: []time.Time{t0}})
	if err != nil {
		t.Fatal(err)
	}
	r := Analyze(snaps, nil, Options{})
	if r.Verdict != VerdictSuspect || r.ExitCode() != 1 || !hasCode(r, CodeAsymmetricQP) {
		t.Errorf("verdict %s, findings %+v; want suspect with %s", r.Verdict, r.Findings, CodeAsymmetricQP)
	}
	wantMax := int64(DefaultMaxEPPerCtx*DefaultNumQPPerEP + KernelQPAllowance)
	if e := r.NICs[0].ExpectedMax; e == nil || *e != wantMax {
		t.Errorf("expected max %v, want %d", e, wantMax)
	}
	if strings.Join(r.AssumedDefaults, ",") != "MC_NUM_QP_PER_EP=2,MC_MAX_EP_PER_CTX=65536" {
		t.Errorf("assumed defaults %q", r.AssumedDefaults)
	}
	// Mooncake clamps the store to max_qp / num_qp_per_ep.
	r = Analyze(snaps, nil, Options{MaxQP: 8192, NumQPPerEP: 4})
	if r.MaxEPPerCtx != 2048 || *r.NICs[0].ExpectedMax != 2048*4+KernelQPAllowance || strings.Join(r.AssumedDefaults, ",") != "MC_MAX_EP_PER_CTX=2048" {
		t.Errorf("clamped store: max_ep %d assumed %q", r.MaxEPPerCtx, r.AssumedDefaults)
	}
	if r.Verdict == VerdictHealthy || !hasCode(r, CodeQPAboveCeiling) {
		t.Errorf("22K QPs over a ceiling of 8K: verdict %s findings %+v", r.Verdict, r.Findings)
	}
	// Even counts stay healthy, with the ceiling known.
	snaps, _, err = Load(context.Background(), Inputs{RDMA: []string{"testdata/healthy/rdma.txt"}, At: []time.Time{t0}})
	if err != nil {
		t.Fatal(err)
	}
	if r = Analyze(snaps, nil, Options{}); r.Verdict != VerdictHealthy || r.NICs[0].ExpectedMax == nil {
		t.Errorf("healthy counts: verdict %s findings %+v", r.Verdict, r.Findings)
	}
}

// Without any QP count nothing was judged: unknown, never healthy.
func TestNoQPCountsIsUnknown(t *testing.T) {
	_, logs, err := Load(context.Background(), Inputs{RDMA: []string{"testdata/healthy/rdma.txt"}, Logs: []string{"testdata/healthy/prefill-0.INFO"}, Year: 2026})
	if err != nil {
		t.Fatal(err)
	}
	for name, snaps := range map[string][]*Snapshot{"no snapshot": nil, "empty snapshot": {{Source: "empty", At: t0}}} {
		r := Analyze(snaps, logs, Options{})
		if r.Verdict != VerdictUnknown || r.ExitCode() != 3 || !hasCode(r, CodeNoQPCounts) {
			t.Errorf("%s: verdict %s findings %+v", name, r.Verdict, r.Findings)
		}
	}
}

func TestStdinAndClassify(t *testing.T) {
	b, _ := os.ReadFile("testdata/leak/rdma.json")
	old := Stdin
	Stdin = bytes.NewReader(b)
	defer func() { Stdin = old }()
	snaps, _, err := Load(context.Background(), Inputs{RDMA: []string{"-"}})
	if err != nil || len(snaps[0].Devices) != 8 {
		t.Fatalf("stdin: %v", err)
	}
	for p, want := range map[string]string{
		"testdata/leak/rdma.txt": KindRDMA, "testdata/leak/rdma.json": KindRDMA, "testdata/perqp/rdma-qp.txt": KindRDMA,
		"testdata/leak/prefill-0.INFO.1.gz": KindLog, "testdata/leak-noinfo/prefill-0.WARNING": KindLog,
	} {
		if got, err := Classify(p); got != want || err != nil {
			t.Errorf("Classify(%s) = %q, %v; want %s", p, got, err, want)
		}
	}
	if _, err := Classify("testdata/README.md"); err == nil {
		t.Error("README classified")
	}
}

// An explicit --te-version overrides the logs. On a healthy host an old
// version is worth knowing, not alarming.
func TestTEVersionOption(t *testing.T) {
	c := goldenCases()[1]
	c.opts.TEVersion = "0.3.7.post2"
	r := runGolden(t, c)
	if r.Verdict != VerdictHealthy || r.TEVersion != "0.3.7.post2" {
		t.Fatalf("verdict %s version %s", r.Verdict, r.TEVersion)
	}
	var f *Finding
	for i := range r.Findings {
		if r.Findings[i].Code == CodeNoPeriodicReclaim {
			f = &r.Findings[i]
		}
	}
	if f == nil || f.Severity != SeverityInfo {
		t.Fatalf("findings %+v", r.Findings)
	}
	c = goldenCases()[2]
	c.opts.TEVersion = "v0.3.10"
	r = runGolden(t, c)
	if !hasCode(r, CodeNoPeriodicReclaim) || !strings.Contains(strings.Join(r.Advice, " "), "Upgrade Mooncake to v0.3.11") {
		t.Fatalf("findings %+v advice %q", r.Findings, r.Advice)
	}
	c.opts.TEVersion = "0.3.11"
	if r = runGolden(t, c); hasCode(r, CodeNoPeriodicReclaim) {
		t.Fatalf("0.3.11 flagged: %+v", r.Findings)
	}
}
