package cmd

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kvcache-ops/mc/pkg/units"
)

// walkFlags calls fn for every local flag of every command under root.
func walkFlags(root *cobra.Command, fn func(c *cobra.Command, f *pflag.Flag)) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.LocalFlags().VisitAll(func(f *pflag.Flag) { fn(c, f) })
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}

// The flags that hold a byte count, by command. A new one goes here and
// through sizeVar, or this test fails.
var sizeFlags = map[string][]string{
	"mc bench target":    {"buffer-size", "handshake-max-length"},
	"mc bench initiator": {"block-size", "buffer-size", "handshake-max-length"},
	"mc bench coll":      {"max-bytes", "min-bytes", "slot-size"},
	"mc bench store":     {"segment-size", "ssd-size", "value-size"},
	"mc serve store":     {"region-size", "request-budget", "segment-size", "ssd-size", "ssd-staging-size"},
	"mc store replay":    {"block-bytes"},
	"mc sim conductor":   {"block-bytes"},
}

// Every duration flag reads bare seconds (milliseconds for
// mooncake_master's TTLs) and Go durations through pkg/units, and every
// size flag reads Mooncake's forms: none is left on pflag's own parsers
// or on an integer with the unit in its name.
func TestEverySizeAndDurationFlagUsesOneParser(t *testing.T) {
	root := newRootCmd(&printer{})
	found := map[string][]string{}
	walkFlags(root, func(c *cobra.Command, f *pflag.Flag) {
		where := c.CommandPath() + " --" + f.Name
		switch v := f.Value.(type) {
		case durationValue:
			for _, in := range []string{"5", "2m", "1h 30m"} {
				if err := v.Set(in); err != nil {
					t.Errorf("%s %q: %v", where, in, err)
				}
			}
			if err := v.Set("5"); err != nil || (*v.p != 5e9 && *v.p != 5e6) {
				t.Errorf("%s 5 = %v, %v; want 5 s (or 5 ms for a TTL)", where, *v.p, err)
			}
			if !strings.Contains(f.Usage, "seconds, or") && !strings.Contains(f.Usage, "milliseconds, or") {
				t.Errorf("%s: help %q does not say what a bare number is", where, f.Usage)
			}
		case sizeValue, sizeListValue:
			found[c.CommandPath()] = append(found[c.CommandPath()], f.Name)
			for in, want := range map[string]string{"4 GB": "4G", "4KiB": "4K", "4kb": "4K", "4096": "4K", "512 MB": "512M"} {
				if err := v.Set(in); err != nil || v.String() != want {
					t.Errorf("%s %q = %s, %v; want %s", where, in, v.String(), err, want)
				}
			}
			if !strings.Contains(f.Usage, sizeHelp) {
				t.Errorf("%s: help %q does not give the size forms", where, f.Usage)
			}
		default:
			name := f.Value.Type()
			if name == "duration" {
				t.Errorf("%s is a plain Go duration: bare seconds are refused", where)
			}
			if (name == "int" || name == "int64" || name == "string") &&
				(strings.HasSuffix(f.Name, "-sec") || strings.HasSuffix(f.Name, "-ttl") || strings.HasSuffix(f.Name, "timeout") ||
					strings.HasSuffix(f.Name, "-bytes") || strings.HasSuffix(f.Name, "-length") ||
					(strings.HasSuffix(f.Name, "-size") && f.Name != "batch-size" && f.Name != "world-size")) {
				t.Errorf("%s is a %s: want a duration or size flag", where, name)
			}
		}
	})
	for cmd, want := range sizeFlags {
		got := found[cmd]
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("%s: size flags %v, want %v", cmd, got, want)
		}
	}
}

// The command lines of issue #25, end to end: what was refused runs, and
// what is wrong is refused with the flag's name and the accepted forms,
// from the command line, the environment or a config file alike.
func TestSizeAndDurationCommandLines(t *testing.T) {
	isolateEnv(t)
	// Accepted: each fails later, on something else, with the value read.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "store", "--segment-size", "4 GB", "--enable_ha"}, "--enable-ha needs etcd"},
		{[]string{"bench", "store", "--duration", "5", "--batch", "0"}, "invalid --batch 0"},
		{[]string{"bench", "store", "--duration", "500ms", "--value-size", "512 MB,4KiB", "--batch", "0"}, "invalid --batch 0"},
		{[]string{"bench", "coll", "--timeout", "30", "-b", "1 KB", "-e", "4KiB", "--ranks", "0"}, "--ranks 0"},
		{[]string{"serve", "store", "--client_ttl", "10", "--default_kv_lease_ttl", "5 s", "--ha-lease-ttl", "1500ms", "--enable_ha", "--etcd-endpoints", "127.0.0.1:1"}, "invalid --ha-lease-ttl 1.5s: want whole seconds"},
		{[]string{"meta", "ls", "--probe-timeout", "2"}, "--metadata-server is required"},
	} {
		_, errs, code := execMC(t, c.args...)
		if code == 0 || !strings.Contains(errs, c.want) {
			t.Errorf("mc %s: exit %d, stderr %q; want it past the flags, failing on %q", strings.Join(c.args, " "), code, errs, c.want)
		}
	}
	// Refused, naming the flag and the forms.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "store", "--segment-size", "4 GBs"}, `invalid argument "4 GBs" for "--segment-size" flag: unknown unit "GBs"; want a size: ` + units.SizeForms},
		{[]string{"serve", "store", "--segment-size", "-1G"}, `"--segment-size" flag: negative; want a size`},
		{[]string{"serve", "store", "--segment-size", "99999999999P"}, `"--segment-size" flag: too large`},
		{[]string{"bench", "coll", "-b", "lots"}, `"-b, --min-bytes" flag: not a number; want a size`},
		{[]string{"bench", "store", "--duration", "5x"}, `invalid argument "5x" for "--duration" flag: unknown unit "x"; want seconds (10, 0.5) or a Go duration`},
		{[]string{"bench", "initiator", "--duration", "-5"}, `"--duration" flag: negative`},
		{[]string{"serve", "store", "--default_kv_lease_ttl", "soon"}, `"--default-kv-lease-ttl" flag: not a number; want milliseconds (10000) or a Go duration`},
		{[]string{"diag", "qp-leak", "--watch", "99999999999h"}, `"--watch" flag: too long`},
		{[]string{"sim", "conductor", "--block-bytes", "1.5"}, `"--block-bytes" flag: not a whole number of bytes`},
	} {
		_, errs, code := execMC(t, c.args...)
		if code == 0 || !strings.Contains(errs, c.want) || strings.Count(errs, "\n") != 1 {
			t.Errorf("mc %s: exit %d, stderr %q; want one line with %q", strings.Join(c.args, " "), code, errs, c.want)
		}
	}
	// The environment and the config file go through the same parser.
	t.Setenv("MC_BENCH_DURATION", "5x")
	if _, errs, _ := execMC(t, "bench", "store"); !strings.Contains(errs, `invalid value "5x" for --duration from $MC_BENCH_DURATION: unknown unit "x"`) {
		t.Errorf("MC_BENCH_DURATION=5x: %q", errs)
	}
	t.Setenv("MC_BENCH_DURATION", "")
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, []byte("serve:\n  segment-size: 4 GB\n  region-size: 4 GBs\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, errs, _ := execMC(t, "--config", cfg, "serve", "store"); !strings.Contains(errs, `invalid value "4 GBs" for --region-size from config key serve.region-size: unknown unit "GBs"`) {
		t.Errorf("config file: %q", errs)
	}
}

// Every float flag refuses NaN and infinities (strconv accepts them, and
// a range check "x < 0 || x > 1" lets NaN through: --eviction-ratio NaN
// started a master), from the command line, the environment or a config
// file alike, exiting 64 with one line naming the flag.
func TestFloatFlagsRefuseNaN(t *testing.T) {
	isolateEnv(t)
	root := newRootCmd(&printer{})
	floats := 0
	walkFlags(root, func(c *cobra.Command, f *pflag.Flag) {
		if f.Value.Type() != "float64" {
			return
		}
		floats++
		for _, in := range []string{"NaN", "nan", "Inf", "-inf", "+Infinity"} {
			if err := f.Value.Set(in); err == nil {
				t.Errorf("%s --%s %s: accepted", c.CommandPath(), f.Name, in)
			}
		}
		if err := f.Value.Set("0.5"); err != nil {
			t.Errorf("%s --%s 0.5: %v", c.CommandPath(), f.Name, err)
		}
	})
	if floats < 5 {
		t.Fatalf("found %d float flags, want the tree's (eviction ratios, get ratio, sim's)", floats)
	}
	for _, args := range [][]string{
		{"serve", "store", "--eviction-ratio", "NaN"},
		{"serve", "store", "--eviction_high_watermark_ratio", "nan"},
		{"bench", "store", "--get-ratio", "NaN"},
	} {
		_, errs, code := execMC(t, args...)
		if code != 64 || !strings.Contains(errs, "not a finite number") || strings.Count(errs, "\n") != 1 {
			t.Errorf("mc %s: exit %d, stderr %q; want 64 and one line: not a finite number", strings.Join(args, " "), code, errs)
		}
	}
	// Out of range is a usage error too (it exited 1).
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "store", "--eviction-ratio", "2"}, "invalid --eviction-ratio (eviction_ratio) 2: want a fraction in [0, 1]"},
		{[]string{"serve", "store", "--eviction-high-watermark-ratio", "1.5"}, "invalid --eviction-high-watermark-ratio (eviction_high_watermark_ratio) 1.5: want a fraction in (0, 1]"},
		{[]string{"serve", "store", "--max-regions-per-instance", "-3"}, "invalid --max-regions-per-instance -3"},
		{[]string{"serve", "store", "--max-connections", "-1"}, "invalid --max-connections -1: want 0 (from the descriptor limit) or more"},
		{[]string{"serve", "store", "--max_connections_per_host", "-2"}, "invalid --max-connections-per-host -2"},
	} {
		if _, errs, code := execMC(t, c.args...); code != 64 || !strings.Contains(errs, c.want) {
			t.Errorf("mc %s: exit %d, stderr %q; want 64 and %q", strings.Join(c.args, " "), code, errs, c.want)
		}
	}
	t.Setenv("MC_SERVE_EVICTION_RATIO", "NaN")
	if _, errs, code := execMC(t, "serve", "store"); code != 64 || !strings.Contains(errs, `invalid value "NaN" for --eviction-ratio from $MC_SERVE_EVICTION_RATIO: not a finite number`) {
		t.Errorf("MC_SERVE_EVICTION_RATIO=NaN: exit %d, %q", code, errs)
	}
}

// An integer too large for its flag is said to be out of range (pflag
// said "must be an integer"); a word still is not an integer.
func TestIntFlagOutOfRange(t *testing.T) {
	isolateEnv(t)
	for _, c := range []struct{ val, want string }{
		{"99999999999999999999", "out of range for an integer flag"},
		{"-99999999999999999999", "out of range for an integer flag"},
		{"abc", "must be an integer"},
	} {
		_, errs, code := execMC(t, "store", "put", "k", "/dev/null", "--replicas", c.val)
		if code != exitUsage || !strings.Contains(errs, c.want) || !strings.Contains(errs, "--replicas") {
			t.Errorf("--replicas %s: exit %d, %q; want %d naming the flag and %q", c.val, code, errs, exitUsage, c.want)
		}
	}
}
