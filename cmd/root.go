// Package cmd holds mc's cobra commands: flag parsing, configuration and
// output only. The work itself is done by the packages under pkg/.
package cmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kvcache-ops/mc/pkg/diag/glog"
	"github.com/kvcache-ops/mc/pkg/engine/bench"
)

// exitError carries a specific exit status out of a command. A nil err
// means the command already said everything it had to say.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

// Exit statuses every command shares; the answers of single commands
// (store exists, meta gc, diag qp-leak, ...) are documented on each and
// in the table of exitStatusHelp.
const (
	exitFailure     = 1
	exitInterrupted = 130
	// exitUsage is sysexits' EX_USAGE. It collides with no command's
	// answer: diag qp-leak already answers 0-3 (healthy, suspect, leak,
	// unknown) and store exists / meta gc answer 1 and 2.
	exitUsage = 64
)

// exitStatusHelp is the table printed in the root help and the README.
const exitStatusHelp = `Exit status:
  0    success (store exists: the key is stored; diag qp-leak: healthy)
  1    failure; store exists: not stored; meta gc: stale segments remain;
       diag qp-leak: suspect
  2    store exists, meta gc: the check itself failed; diag qp-leak: leak
  3    diag qp-leak: unknown (its input could not be read)
  64   usage error on every command: unknown command or flag, bad flag
       value, missing or extra argument (sysexits' EX_USAGE)
  130  interrupted (SIGINT/SIGTERM) after printing what was done; what runs
       until stopped (serve, store events) exits 0 when stopped so`

// usageErr marks an error as the caller's mistake (a usage error): it
// exits exitUsage whatever status the errors around it carry.
type usageErr struct {
	err   error
	named bool // the message already names its command (usageError)
}

func (e *usageErr) Error() string { return e.err.Error() }
func (e *usageErr) Unwrap() error { return e.err }

// usagef is fmt.Errorf for usage errors: a flag value or combination
// refused before any work is done.
func usagef(format string, a ...any) error {
	return &usageErr{err: fmt.Errorf(format, a...)}
}

// globalOptions are the flags every command inherits.
type globalOptions struct {
	ConfigFile string
	Output     string
	LogLevel   string
	LogDir     string
}

// Execute runs mc with args and returns the process exit status. Errors are
// printed as one line, `mc: <what failed>: <why>`, never with a usage dump.
func Execute(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	p := &printer{Out: stdout, Err: stderr}
	root := newRootCmd(p)
	args, err := gflagsArgs(root, args)
	if err != nil {
		fmt.Fprintf(stderr, "mc: %v\n", err)
		return exitUsage
	}
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return 0
	}
	code := exitFailure
	var ee *exitError
	if errors.As(err, &ee) {
		code = ee.code
		if ee.err == nil {
			return code // the command said all it had to say
		}
	}
	msg := err.Error()
	name := "" // the command that failed, for -o json
	if cmd != nil && cmd != root {
		name = strings.TrimPrefix(cmd.CommandPath(), root.Name()+" ")
	}
	if ue := (*usageErr)(nil); errors.As(err, &ue) {
		code = exitUsage
		if ue.named {
			cmd = nil
		}
	}
	line := withVerb(cmd, msg)
	fmt.Fprintf(stderr, "mc: %s\n", line)
	if (jsonWanted(root, p) || !outputFlagParsed(root) && outputInArgs(args) == "json") && !p.printedJSON {
		// -o json: stdout carries a JSON document on failure too, so
		// that `mc ... -o json | jq` always has one to read.
		_ = p.PrintJSON(jsonError{Error: line, ExitCode: code, Command: name})
	}
	return code
}

// jsonError is what every command prints on stdout when it fails under
// -o json (its stderr line is the same message).
type jsonError struct {
	Error    string `json:"error"`
	ExitCode int    `json:"exit_code"`
	Command  string `json:"command"` // "store get"; "" when no command was found
}

// jsonWanted reports whether JSON output was asked for: the format setup
// chose, or, when the command failed before setup (a bad flag, an
// unknown command, a missing argument), --output/-o as parsed so far,
// else $MC_OUTPUT, else the config file's output key (--config as parsed
// so far, or the default file), as setup would have resolved it.
func jsonWanted(root *cobra.Command, p *printer) bool {
	if p.format != "" {
		return p.JSON()
	}
	pf := root.PersistentFlags()
	if f := pf.Lookup("output"); f != nil && f.Changed {
		return f.Value.String() == "json"
	}
	if v, ok := os.LookupEnv("MC_OUTPUT"); ok && v != "" {
		return v == "json"
	}
	var path string
	explicit := false
	if f := pf.Lookup("config"); f != nil {
		path, explicit = f.Value.String(), f.Changed
	}
	if cfg, err := loadConfig(path, explicit, os.Getenv); err == nil && cfg.path != "" {
		return cfg.v.GetString("output") == "json"
	}
	return false
}

// outOfRange rewords pflag's "must be an integer" for a value that is
// one, only too large for the flag (99999999999999999999).
func outOfRange(err error) error {
	var ive *pflag.InvalidValueError
	if !errors.As(err, &ive) || ive.Unwrap() == nil || ive.Unwrap().Error() != "must be an integer" {
		return err
	}
	v := strings.TrimLeft(ive.GetValue(), "+-")
	if v == "" || strings.Trim(v, "0123456789") != "" {
		return err
	}
	return fmt.Errorf("invalid argument %q for --%s: out of range for an integer flag (%s)", ive.GetValue(), ive.GetFlag().Name, ive.GetFlag().Value.Type())
}

// outputFlagParsed reports whether --output/-o was parsed (it decides).
func outputFlagParsed(root *cobra.Command) bool {
	f := root.PersistentFlags().Lookup("output")
	return f != nil && f.Changed
}

// outputInArgs is the value of the last --output/-o in args, for a
// command line whose parsing stopped before reaching it (a misspelled
// flag earlier on the line): `mc store ls --sise -o json` printed no
// error object where `mc store ls -o json --sise` did.
func outputInArgs(args []string) string {
	out := ""
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			return out
		case a == "-o" || a == "--output":
			if i+1 < len(args) {
				out = args[i+1]
				i++
			}
		case strings.HasPrefix(a, "--output="):
			out = strings.TrimPrefix(a, "--output=")
		case strings.HasPrefix(a, "-o=") || strings.HasPrefix(a, "-o") && len(a) > 2 && !strings.HasPrefix(a, "--"):
			out = strings.TrimPrefix(strings.TrimPrefix(a, "-o"), "=")
		}
	}
	return out
}

// withVerb makes msg start with the path of the command that failed
// ("store get: "), so that every error reads mc: <verb>: <why>. A message
// that already starts with it is left alone, and one that starts with the
// verb's bare name (get "k": ..., ls: ...) loses that name.
func withVerb(cmd *cobra.Command, msg string) string {
	if cmd == nil {
		return msg
	}
	sp := subPath(cmd)
	if sp == "" || strings.HasPrefix(msg, sp) || strings.HasPrefix(msg, strings.TrimSuffix(sp, ": ")+" ") {
		return msg
	}
	if rest, ok := strings.CutPrefix(msg, cmd.Name()+" "); ok && (strings.HasPrefix(rest, `"`) || strings.HasPrefix(rest, "-")) {
		msg = rest
	} else if rest, ok := strings.CutPrefix(msg, cmd.Name()+": "); ok {
		msg = rest
	}
	return sp + msg
}

func newRootCmd(p *printer) *cobra.Command {
	var g globalOptions
	root := &cobra.Command{
		Use:   "mc",
		Short: "Toolkit for disaggregated LLM serving: transfer engine, KV-cache store, diagnostics",
		Long: `mc is one binary for the people who run disaggregated LLM serving (prefill
and decode on separate GPU pools, the KV cache shipped between them), built on
its own transfer engine and compatible with Mooncake's wire formats, flags,
metadata and admin API. It is for:

  transfer benchmarks    mc bench initiator/target: over TCP and RDMA (real
                         NICs or software ones), transfer_engine_bench's flags
  NIC topology           mc topo: which NIC each GPU and NUMA node should use
  KV-cache store         mc serve store (master, nodes, HA), mc store (put, get,
                         rm, ls, stat, query, replay), mc bench store
  collectives            mc bench coll: all-reduce and friends over the engine
  Conductor simulator    mc sim conductor: Mooncake's scheduler on request traces
  metadata services      mc serve metadata (etcd or HTTP), mc meta (list, probe,
                         clean up segments)
  QP-leak diagnostics    mc diag qp-leak: rdma counters and engine logs to a
                         verdict

Sizes read 4096, 4K, 4KiB or "4 GB" (K = 1024); durations read seconds (10)
or Go durations (500ms, 2m). Every flag can also be set by an MC_*
environment variable or in $XDG_CONFIG_HOME/mc/config.yaml.

` + exitStatusHelp,
		// mc --version answers as scripts and users expect of a CLI
		// (it was an unknown flag); mc version has the detail.
		Version:       currentVersion().Version,
		SilenceErrors: true,
		SilenceUsage:  true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return setup(cmd, &g, p)
		},
	}
	root.SetOut(p.Out)
	root.SetErr(p.Err)
	// pflag >= 1.1 prints every boolean as --flag[=true|false]; the
	// default template, reading flags through flagUsages, shows --flag.
	// cobra's template functions are global: register once, so that
	// commands built concurrently (tests run several in one process) do
	// not race on that map.
	addTemplateFuncs.Do(func() { cobra.AddTemplateFunc("flagUsages", flagUsages) })
	tmpl := strings.NewReplacer(".LocalFlags.FlagUsages", "flagUsages .LocalFlags",
		".InheritedFlags.FlagUsages", "flagUsages .InheritedFlags").Replace(root.UsageTemplate())
	root.SetUsageTemplate(tmpl)
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		// mc topo discovr --sysfs-root x: cobra stops at topo and
		// parses discover's flags against it; the word is the mistake.
		if rest := c.Flags().Args(); c.HasSubCommands() && len(rest) > 0 {
			return unknownSubcommand(c, rest)
		}
		return usageError(c, fmt.Errorf("%s%w%s (see '%s --help')", subPath(c), outOfRange(err), flagSuggestion(c, err), c.CommandPath()))
	})

	pf := root.PersistentFlags()
	pf.StringVar(&g.ConfigFile, "config", "", "config file (also $MC_CONFIG; default $XDG_CONFIG_HOME/mc/config.yaml when present)")
	pf.StringVarP(&g.Output, "output", "o", "table", "output format: table or json")
	pf.StringVar(&g.LogLevel, "log-level", "info", "log level: debug, info, warning, error or fatal")
	pf.StringVar(&g.LogDir, "log-dir", "", "write logs to glog-named files in this directory (errors still go to stderr)")
	_ = root.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"table", "json"}, cobra.ShellCompDirectiveNoFileComp))
	_ = root.RegisterFlagCompletionFunc("log-level", cobra.FixedCompletions([]string{"debug", "info", "warning", "error", "fatal"}, cobra.ShellCompDirectiveNoFileComp))

	root.AddCommand(newVersionCmd(p))
	// command groups
	root.AddCommand(newBenchCmd(p))
	root.AddCommand(newDiagCmd(p))
	root.AddCommand(newTopoCmd(p))
	root.AddCommand(newServeCmd(p))
	root.AddCommand(newStoreCmd(p))
	root.AddCommand(newSimCmd(p))
	root.AddCommand(newMetaCmd(p))
	root.InitDefaultCompletionCmd()
	strictArgs(root)
	completeEnums(root)
	finiteFloats(root)
	root.InitDefaultHelpCmd()
	strictHelp(root)

	// One normaliser for every flag set: Mooncake's underscore spellings
	// (--block_size) resolve to the kebab-case flag (--block-size).
	root.SetGlobalNormalizationFunc(normalizeFlag)
	root.SetVersionTemplate("mc {{.Version}}\n")
	return root
}

// strictArgs makes every command of the tree reject what it does not
// take, so that no typo ends in a help page and exit 0: a command with
// sub-commands accepts none but them (and prints its help when called
// bare), a leaf that declares no Args (or cobra.NoArgs) accepts no
// positional argument; a leaf that takes some says so (cobra.ArbitraryArgs).
// Groups added later get this without doing anything.
func strictArgs(c *cobra.Command) {
	for _, sub := range c.Commands() {
		strictArgs(sub)
	}
	// Cobra only runs Args for a runnable command; a bare group prints
	// its help as before.
	if c.HasSubCommands() {
		c.DisableSuggestions = true // ours are one line
		c.SuggestionsMinimumDistance = 2
		c.Args = unknownSubcommand
		if c.Run == nil && c.RunE == nil {
			c.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
		}
		return
	}
	if c.Args == nil || isNoArgs(c.Args) {
		c.Args = func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageError(cmd, fmt.Errorf("%sunexpected argument %q (see '%s --help')", subPath(cmd), args[0], cmd.CommandPath()))
			}
			return nil
		}
		return
	}
	// Cobra's own count checks say "accepts 1 arg(s), received 0": name
	// the command and what it takes.
	check := c.Args
	c.Args = func(cmd *cobra.Command, args []string) error {
		if err := check(cmd, args); err != nil {
			return usageError(cmd, fmt.Errorf("%s%v: usage: %s (see '%s --help')", subPath(cmd), err, cmd.UseLine(), cmd.CommandPath()))
		}
		return nil
	}

}

// strictHelp makes `mc help <topic>` fail as `mc <topic>` would when the
// topic names no command: cobra's help prints the root's help and exits 0.
func strictHelp(root *cobra.Command) {
	help, _, err := root.Find([]string{"help"})
	if err != nil || help == root || help.Run == nil {
		return
	}
	show := help.Run
	help.Run = nil
	help.RunE = func(c *cobra.Command, args []string) error {
		if cmd, rest, err := root.Find(args); err == nil && len(rest) > 0 {
			return unknownSubcommand(cmd, rest)
		}
		show(c, args)
		return nil
	}
}

// isNoArgs reports whether a is cobra.NoArgs, whose message names the
// command twice ("mc: unknown command "x" for "mc version"").
func isNoArgs(a cobra.PositionalArgs) bool {
	return reflect.ValueOf(a).Pointer() == reflect.ValueOf(cobra.NoArgs).Pointer()
}

// unknownSubcommand is the Args check of a command group.
func unknownSubcommand(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	msg := fmt.Sprintf("%sunknown command %q", subPath(cmd), args[0])
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		msg += fmt.Sprintf(" (did you mean %s?)", nearest(args[0], s))
	} else if s := deeperCommand(cmd, args[0]); s != "" {
		msg += fmt.Sprintf(" (did you mean %q?)", s)
	}
	return usageError(cmd, fmt.Errorf("%s (see '%s --help')", msg, cmd.CommandPath()))
}

// nearest is the candidates closest to word by edit distance, quoted
// and joined with "or": cobra lists its suggestions in command order, so
// its first was "get" for "pt", beside "put".
func nearest(word string, cands []string) string {
	best, bestD := []string(nil), -1
	for _, c := range cands {
		switch d := editDistance(word, c); {
		case bestD < 0 || d < bestD:
			best, bestD = []string{strconv.Quote(c)}, d
		case d == bestD:
			best = append(best, strconv.Quote(c))
		}
	}
	return strings.Join(best, " or ")
}

// deeperCommand finds a command below cmd's direct sub-commands named
// word or within one edit of it (mc coll: "bench coll"), and returns its
// path below cmd, or "".
func deeperCommand(cmd *cobra.Command, word string) string {
	best, bestD := "", 2
	var walk func(c *cobra.Command, path string)
	walk = func(c *cobra.Command, path string) {
		for _, sub := range c.Commands() {
			if !sub.IsAvailableCommand() {
				continue
			}
			p := strings.TrimPrefix(path+" "+sub.Name(), " ")
			if c != cmd {
				if d := editDistance(word, sub.Name()); d < bestD {
					best, bestD = p, d
				}
			}
			walk(sub, p)
		}
	}
	walk(cmd, "")
	return best
}

// subPath is cmd's path below the root followed by ": " ("bench
// initiator: "), or "" for the root, whose name the error prefix already
// gives.
func subPath(cmd *cobra.Command) string {
	if !cmd.HasParent() {
		return ""
	}
	_, rest, _ := strings.Cut(cmd.CommandPath(), " ")
	return rest + ": "
}

// usageError marks err, a mistake in how cmd was called, as a usage
// error: exit status exitUsage on every command, diag's included (a
// monitoring system reads a status above 3 as UNKNOWN, so a mistyped
// check still never reads as healthy).
func usageError(_ *cobra.Command, err error) error {
	return &usageErr{err: err, named: true}
}

// flagUsages is fs.FlagUsages with booleans shown as "--verify", not
// "--verify[=true|false]": they take no value on the command line.
func flagUsages(fs *pflag.FlagSet) string {
	out := pflag.NewFlagSet("usage", pflag.ContinueOnError)
	out.SortFlags = fs.SortFlags
	fs.VisitAll(func(f *pflag.Flag) {
		c := *f
		if c.Value.Type() == "bool" {
			c.Value = plainBool{f.Value}
		}
		out.AddFlag(&c)
	})
	return out.FlagUsages()
}

// plainBool hides IsBoolFlag from pflag's usage printer; a bool flag's
// NoOptDefVal ("true") already says it needs no value.
type plainBool struct{ pflag.Value }

// enumValues are the completions offered for flags that take one of a few
// words, whatever command they are on. A new enum flag adds a line here.
var enumValues = map[string][]string{
	"protocol":    {"tcp", "rdma"},
	"operation":   {"read", "write"},
	"report-unit": bench.UnitNames(),
}

// completeEnums registers enumValues on every command of the tree that
// has one of those flags and no completion of its own.
func completeEnums(c *cobra.Command) {
	for _, sub := range c.Commands() {
		completeEnums(sub)
	}
	c.LocalFlags().VisitAll(func(f *pflag.Flag) {
		vals, ok := enumValues[f.Name]
		if !ok {
			return
		}
		if _, has := c.GetFlagCompletionFunc(f.Name); has {
			return
		}
		_ = c.RegisterFlagCompletionFunc(f.Name, cobra.FixedCompletions(vals, cobra.ShellCompDirectiveNoFileComp))
	})
}

// finiteFloats makes every float flag of the tree refuse NaN and ±Inf,
// which strconv.ParseFloat (and so pflag) accepts and range checks
// written as "x < 0 || x > 1" let through: --eviction-ratio NaN started
// a master whose eviction target was NaN. From the command line, an MC_*
// variable or a config file alike (all set flags through Value.Set).
func finiteFloats(c *cobra.Command) {
	for _, sub := range c.Commands() {
		finiteFloats(sub)
	}
	c.LocalFlags().VisitAll(func(f *pflag.Flag) {
		if _, done := f.Value.(finiteFloat); !done && f.Value.Type() == "float64" {
			f.Value = finiteFloat{f.Value}
		}
	})
}

// finiteFloat is a float64 flag value that refuses NaN and infinities.
type finiteFloat struct{ pflag.Value }

func (v finiteFloat) Set(s string) error {
	x, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err == nil && (math.IsNaN(x) || math.IsInf(x, 0)) {
		return fmt.Errorf("not a finite number")
	}
	return v.Value.Set(s)
}

// flagAliases are other tools' names for mc's flags: mooncake_client's
// (--master_server_address, --global_segment_size, --host,
// --device_names), so its command lines work on mc serve store. An alias
// applies only where the flag set has the flag it stands for and has no
// flag of the alias's own name.
var flagAliases = map[string]string{
	"master-server-address": "master",
	"global-segment-size":   "segment-size",
	"host":                  "local-hostname",
	"device-names":          "device-name",
	// topo show spelt it --cluster-id, bench and meta
	// --metadata-cluster-id: each takes both.
	"cluster-id": "metadata-cluster-id",
	// bench initiator (transfer_engine_bench's names) says
	// --batch-size and --operation, bench store --batch and --op.
	"batch-size": "batch",
	"operation":  "op",
}

func normalizeFlag(fs *pflag.FlagSet, name string) pflag.NormalizedName {
	name = strings.ReplaceAll(name, "_", "-")
	if to, ok := flagAliases[name]; ok && fs != nil && hasFlag(fs, to) && !hasFlag(fs, name) {
		return pflag.NormalizedName(to)
	}
	return pflag.NormalizedName(name)
}

// hasFlag looks name up without normalizing it (Lookup would call
// normalizeFlag again).
func hasFlag(fs *pflag.FlagSet, name string) bool {
	found := false
	fs.VisitAll(func(f *pflag.Flag) { found = found || f.Name == name })
	return found
}

// setup runs before every command: configuration, output format, logging.
func setup(cmd *cobra.Command, g *globalOptions, p *printer) error {
	cfg, err := loadConfig(g.ConfigFile, cmd.Flags().Changed("config"), os.Getenv)
	if err != nil {
		return err
	}
	if err := cfg.apply(cmd); err != nil {
		return err
	}
	switch g.Output {
	case "table", "json":
		p.format = g.Output
	default:
		if cmd.Annotations[outputMayBeFile] == "" {
			return usagef("invalid --output %q: want table or json", g.Output)
		}
		// -o names a file here (mc store get KEY -o FILE, deprecated):
		// the format is what it would be without that -o.
		p.format = "table"
		if f := cmd.Flags().Lookup("output"); f != nil {
			if v, _, ok := cfg.lookup("", f); ok && v == "json" {
				p.format = "json"
			}
		}
	}
	level, err := glog.ParseLevel(g.LogLevel)
	if err != nil {
		return usagef("invalid --log-level: %w", err)
	}
	if g.LogDir == "" {
		glog.Setup(p.Err, level)
	} else {
		// As glog with --log_dir: every line to the file, errors to
		// stderr too. The file stays open until the process exits.
		f, err := glog.CreateLogFile(g.LogDir, "mc", time.Now())
		if err != nil {
			return fmt.Errorf("--log-dir: %w", err)
		}
		slog.SetDefault(slog.New(glog.Tee(
			glog.NewHandler(f, &glog.Options{Level: level}),
			glog.NewHandler(p.Err, &glog.Options{Level: max(level, slog.LevelError)}),
		)))
	}
	for _, k := range cfg.unknownKeys(cmd.Root()) {
		slog.Warn(fmt.Sprintf("config file %s: unknown key %s, ignored", cfg.path, k))
	}
	return nil
}

var addTemplateFuncs sync.Once

// flagSuggestion is "; did you mean --NAME?" for an unknown flag within
// two edits of one of c's (a typo such as --tenat), else "".
func flagSuggestion(c *cobra.Command, err error) string {
	name, ok := strings.CutPrefix(err.Error(), "unknown flag: --")
	if !ok || len(name) < 4 {
		return ""
	}
	name = strings.ReplaceAll(name, "_", "-")
	best, bestD := "", 3
	c.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		if d := editDistance(name, f.Name); d < bestD || d == bestD && f.Name < best {
			best, bestD = f.Name, d
		}
	})
	if best == "" {
		return ""
	}
	return "; did you mean --" + best + "?"
}
