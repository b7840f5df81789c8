package cmd

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// runCmd executes mc with args in-process and returns what it printed.
func runCmd(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errb bytes.Buffer
	p := &printer{Out: &out, Err: &errb}
	root := newRootCmd(p)
	root.SetArgs(args)
	err = root.ExecuteContext(context.Background())
	return out.String(), errb.String(), err
}

// isolateEnv keeps a developer's own MC_* variables and config file out of
// the test.
func isolateEnv(t *testing.T) {
	t.Helper()
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "MC_") {
			t.Setenv(k, "")
		}
	}
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
}

func TestVersionTableAndJSON(t *testing.T) {
	isolateEnv(t)
	out, _, err := runCmd(t, "version")
	if err != nil || !strings.HasPrefix(out, "mc ") || !strings.Contains(out, "go: go1.") {
		t.Fatalf("version: %v\n%s", err, out)
	}
	if out, _, err := runCmd(t, "--version"); err != nil || !strings.HasPrefix(out, "mc ") {
		t.Fatalf("mc --version: %v\n%s", err, out)
	}
	out, _, err = runCmd(t, "version", "--output", "json")
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]string
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("json: %v\n%s", err, out)
	}
	for _, k := range []string{"version", "commit", "go_version", "platform"} {
		if v[k] == "" {
			t.Errorf("field %q missing in %s", k, out)
		}
	}
}

func TestExecuteBadInputOneLine(t *testing.T) {
	isolateEnv(t)
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--output", "xml", "version"}, `mc: version: invalid --output "xml": want table or json`},
		{[]string{"version", "--bogus"}, "mc: version: unknown flag: --bogus (see 'mc version --help')"},
		{[]string{"--bogus"}, "mc: unknown flag: --bogus (see 'mc --help')"},
		{[]string{"store", "stat", "--tenat", "a"}, "mc: store stat: unknown flag: --tenat; did you mean --tenant? (see 'mc store stat --help')"},
		{[]string{"bench", "initiator", "--block_sise", "4K"}, "mc: bench initiator: unknown flag: --block_sise; did you mean --block-size? (see 'mc bench initiator --help')"},
		{[]string{"--config", filepath.Join(t.TempDir(), "nope.yaml"), "version"}, "mc: version: --config"},
		{[]string{"--log-level", "loud", "version"}, `mc: version: invalid --log-level: unknown log level "loud"`},
		{[]string{"nosuchverb"}, `mc: unknown command "nosuchverb"`},
	}
	for _, c := range cases {
		var out, errb bytes.Buffer
		code := Execute(context.Background(), c.args, &out, &errb)
		if code == 0 {
			t.Errorf("%v: exit 0, want non-zero", c.args)
		}
		got := errb.String()
		if strings.Count(got, "\n") != 1 || !strings.HasPrefix(got, c.want) {
			t.Errorf("%v: stderr %q, want one line starting %q", c.args, got, c.want)
		}
		if strings.Contains(got, "mc: mc") {
			t.Errorf("%v: prefix repeated: %q", c.args, got)
		}
		if strings.Contains(got, "goroutine") || strings.Contains(got, "Usage:") {
			t.Errorf("%v: stack trace or usage dump on stderr: %q", c.args, got)
		}
	}
}

func TestUnreadableConfigFile(t *testing.T) {
	isolateEnv(t)
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte("output: [unclosed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err := runCmd(t, "--config", path, "version")
	if err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("garbage config: err = %v, want one naming %s", err, path)
	}
}

// flag > environment > config file > default, shown on --output.
func TestConfigPrecedence(t *testing.T) {
	isolateEnv(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, []byte("output: json\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	isJSON := func(out string) bool { return strings.HasPrefix(out, "{") }

	out, _, err := runCmd(t, "version")
	if err != nil || isJSON(out) {
		t.Fatalf("default should be table: %v %q", err, out)
	}
	out, _, err = runCmd(t, "--config", cfg, "version")
	if err != nil || !isJSON(out) {
		t.Fatalf("config file should give json: %v %q", err, out)
	}
	t.Setenv("MC_OUTPUT", "table")
	out, _, err = runCmd(t, "--config", cfg, "version")
	if err != nil || isJSON(out) {
		t.Fatalf("env should beat config file: %v %q", err, out)
	}
	out, _, err = runCmd(t, "--config", cfg, "--output", "json", "version")
	if err != nil || !isJSON(out) {
		t.Fatalf("flag should beat env: %v %q", err, out)
	}
}

// MC_CONFIG names the config file as --config does (every flag has its
// variable; --config had none), and --config beats it.
func TestConfigFromEnvironment(t *testing.T) {
	isolateEnv(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "mc.yaml")
	if err := os.WriteFile(cfg, []byte("output: json\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("MC_CONFIG", cfg)
	if out, _, err := runCmd(t, "version"); err != nil || !strings.HasPrefix(out, "{") {
		t.Fatalf("MC_CONFIG's file not read: %v %q", err, out)
	}
	other := filepath.Join(dir, "other.yaml")
	if err := os.WriteFile(other, []byte("output: table\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, _, err := runCmd(t, "--config", other, "version"); err != nil || strings.HasPrefix(out, "{") {
		t.Fatalf("--config should beat MC_CONFIG: %v %q", err, out)
	}
	t.Setenv("MC_CONFIG", filepath.Join(dir, "missing.yaml"))
	if _, errs, code := execMC(t, "version"); code != exitUsage || !strings.Contains(errs, "$MC_CONFIG") {
		t.Fatalf("MC_CONFIG naming no file: exit %d, %q", code, errs)
	}
}

// The default config file is read when present and ignored when absent.
func TestDefaultConfigFile(t *testing.T) {
	isolateEnv(t)
	xdg := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", xdg)
	if out, _, err := runCmd(t, "version"); err != nil || strings.HasPrefix(out, "{") {
		t.Fatalf("absent default config: %v %q", err, out)
	}
	if err := os.MkdirAll(filepath.Join(xdg, "mc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(xdg, "mc", "config.yaml"), []byte("output: json\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, _, err := runCmd(t, "version"); err != nil || !strings.HasPrefix(out, "{") {
		t.Fatalf("default config not applied: %v %q", err, out)
	}
}

// Mooncake's underscore spellings resolve to the kebab-case flags.
func TestUnderscoreFlagSpelling(t *testing.T) {
	isolateEnv(t)
	var errb bytes.Buffer
	code := Execute(context.Background(), []string{"--log_level", "loud", "version"}, &bytes.Buffer{}, &errb)
	if code == 0 || !strings.Contains(errb.String(), "invalid --log-level") {
		t.Fatalf("--log_level not normalised to --log-level: %d %q", code, errb.String())
	}
	out, _, err := runCmd(t, "version", "--output=json")
	if err != nil || !strings.HasPrefix(out, "{") {
		t.Fatalf("%v %q", err, out)
	}
}

func TestCompletionShells(t *testing.T) {
	isolateEnv(t)
	for _, sh := range []string{"bash", "zsh", "fish", "powershell"} {
		out, _, err := runCmd(t, "completion", sh)
		if err != nil || !strings.Contains(out, "mc") || len(out) < 200 {
			t.Errorf("completion %s: %v (%d bytes)", sh, err, len(out))
		}
	}
}

func TestDerivedEnvNames(t *testing.T) {
	cases := map[[2]string]string{
		{"", "log-level"}:         "MC_LOG_LEVEL",
		{"bench", "block-size"}:   "MC_BENCH_BLOCK_SIZE",
		{"diag", "num-qp-per-ep"}: "MC_DIAG_NUM_QP_PER_EP",
	}
	for in, want := range cases {
		if got := derivedEnv(in[0], in[1]); got != want {
			t.Errorf("derivedEnv(%q, %q) = %q, want %q", in[0], in[1], got, want)
		}
	}
}

// --log-dir (MC_LOG_DIR) writes glog-named files that mc diag can read;
// only errors still reach stderr.
func TestLogDir(t *testing.T) {
	isolateEnv(t)
	dir := filepath.Join(t.TempDir(), "logs")
	t.Setenv("MC_LOG_DIR", dir)
	// The store line is at info once per process, at debug after that:
	// another test may have opened an RDMA context first.
	t.Setenv("MC_LOG_LEVEL", "debug")
	defer slog.SetDefault(slog.Default())
	_, errOut, err := runCmd(t, "bench", "initiator", "--protocol", "rdma", "--device_name", "soft0",
		"--bind-address", "127.0.0.1", "--duration", "100ms", "--threads", "1", "--batch_size", "4")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "mc.INFO"))
	if err != nil {
		t.Fatalf("mc.INFO: %v", err)
	}
	if !regexp.MustCompile(`(?m)^I\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ \S+:\d+\] Using SIEVE endpoint store`).Match(b) {
		t.Fatalf("log file lacks the glog store line:\n%s", b)
	}
	if strings.Contains(errOut, "Using SIEVE") {
		t.Fatalf("INFO line also on stderr: %q", errOut)
	}
}

// Every command group, present and future, rejects a mistyped sub-command
// or a stray argument with one line and a failing status (3 under diag,
// whose 0 means healthy to monitoring), and still prints its help when
// called bare.
func TestUnknownSubcommandFails(t *testing.T) {
	isolateEnv(t)
	root := newRootCmd(&printer{Out: &bytes.Buffer{}, Err: &bytes.Buffer{}})
	var groups [][]string
	var walk func(path []string, c *cobra.Command)
	walk = func(path []string, c *cobra.Command) {
		if c.HasSubCommands() && c.Name() != "help" {
			groups = append(groups, path)
		}
		for _, sub := range c.Commands() {
			walk(append(append([]string(nil), path...), sub.Name()), sub)
		}
	}
	walk(nil, root)
	if len(groups) < 6 { // root, bench, completion, diag, serve, topo
		t.Fatalf("only %d groups found: %v", len(groups), groups)
	}
	for _, g := range groups {
		want := exitUsage
		var out, errb bytes.Buffer
		code := Execute(context.Background(), append(append([]string(nil), g...), "bogus"), &out, &errb)
		got := errb.String()
		if code != want || strings.Count(got, "\n") != 1 || !strings.Contains(got, `unknown command "bogus"`) {
			t.Errorf("mc %v bogus: exit %d, stderr %q; want exit %d and one line", g, code, got, want)
		}
		if out.Len() != 0 {
			t.Errorf("mc %v bogus: printed %q on stdout", g, out.String())
		}
		if len(g) == 0 {
			continue
		}
		out.Reset()
		errb.Reset()
		if code := Execute(context.Background(), g, &out, &errb); code != 0 || !strings.Contains(out.String(), "Usage:") {
			t.Errorf("mc %v: exit %d, stdout %q: want its help", g, code, out.String())
		}
	}
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"diag", "qp-lek"}, 64, `mc: diag: unknown command "qp-lek" (did you mean "qp-leak"?)`},
		{[]string{"bench", "initator"}, 64, `mc: bench: unknown command "initator" (did you mean "initiator"?)`},
		{[]string{"diag", "qp-leak", "--bogus"}, 64, "mc: diag qp-leak: unknown flag: --bogus"},
		{[]string{"help", "bogus"}, 64, `mc: unknown command "bogus"`},
		{[]string{"help", "diag", "qp-lek"}, 64, `mc: diag: unknown command "qp-lek"`},
		{[]string{"topo", "discover", "extra"}, 64, `mc: topo discover: unexpected argument "extra"`},
		{[]string{"completion", "bash", "extra"}, 64, `mc: completion bash: unexpected argument "extra"`},
		{[]string{"diag", "qp-leak", "no-such-file"}, 3, "mc: diag qp-leak: open no-such-file"},
	} {
		var errb bytes.Buffer
		code := Execute(context.Background(), c.args, &bytes.Buffer{}, &errb)
		if code != c.code || !strings.HasPrefix(errb.String(), c.want) || strings.Count(errb.String(), "\n") != 1 {
			t.Errorf("mc %v: exit %d, stderr %q; want %d, %q", c.args, code, errb.String(), c.code, c.want)
		}
	}
}

// A config key that names no flag is warned about, by name; a config file
// whose extension viper does not know is read as YAML.
func TestConfigUnknownKeysAndConfExtension(t *testing.T) {
	isolateEnv(t)
	defer slog.SetDefault(slog.Default())
	path := filepath.Join(t.TempDir(), "mc.conf")
	if err := os.WriteFile(path, []byte("output: json\nbench:\n  blok-size: 4K\n  block_size: 4K\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, err := runCmd(t, "--config", path, "version")
	if err != nil || !strings.HasPrefix(out, "{") {
		t.Fatalf("mc.conf not read as YAML: %v %q", err, out)
	}
	if !strings.Contains(errOut, `unknown key "bench.blok-size" (did you mean "bench.block-size"?)`) {
		t.Errorf("no warning naming the misspelt key: %q", errOut)
	}
	if strings.Count(errOut, "unknown key") != 1 {
		t.Errorf("warned about a known key (bench.block_size or output): %q", errOut)
	}
}

// The first screen a newcomer sees says what mc is for (issue #25: the
// store, collectives and the Conductor simulator were missing, and RDMA),
// and every command it points at exists.
func TestRootHelpSaysWhatMCIsFor(t *testing.T) {
	isolateEnv(t)
	out, _, err := runCmd(t, "--help")
	if err != nil {
		t.Fatal(err)
	}
	intro, _, _ := strings.Cut(out, "Usage:")
	for _, want := range []string{"transfer benchmarks", "TCP and RDMA", "NIC topology", "KV-cache store", "collectives",
		"Conductor simulator", "metadata services", "QP-leak diagnostics", `"4 GB" (K = 1024)`, "seconds (10)"} {
		if !strings.Contains(intro, want) {
			t.Errorf("mc --help does not say %q:\n%s", want, intro)
		}
	}
	_, list, _ := strings.Cut(intro, "It is for:")
	root := newRootCmd(&printer{})
	for _, m := range regexp.MustCompile(`mc ([a-z]+)(?: ([a-z-]+))?`).FindAllStringSubmatch(list, -1) {
		args := []string{m[1]}
		if m[2] != "" {
			args = append(args, m[2])
		}
		c, rest, err := root.Find(args)
		if err != nil || c == root || (len(rest) > 0 && c.HasSubCommands()) {
			t.Errorf("mc --help names %q, which is no command (%v, rest %q)", m[0], err, rest)
		}
	}
}
