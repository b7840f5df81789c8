// Package cmd holds mc's cobra commands: flag parsing, configuration and
// output only. The work itself is done by the packages under pkg/.
package cmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kvcache-ops/mc/pkg/diag/glog"
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
		return 1
	}
	root.SetArgs(args)
	err = root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			fmt.Fprintf(stderr, "mc: %v\n", ee.err)
		}
		return ee.code
	}
	fmt.Fprintf(stderr, "mc: %v\n", err)
	return 1
}

func newRootCmd(p *printer) *cobra.Command {
	var g globalOptions
	root := &cobra.Command{
		Use:   "mc",
		Short: "Transfer-engine toolkit and ops suite for disaggregated LLM serving",
		Long: `mc benchmarks, inspects and diagnoses the KV-cache transfer layer of
disaggregated LLM serving (Mooncake-compatible): transfer benchmarks over TCP,
NIC topology discovery, metadata services and queue-pair leak diagnostics.`,
		SilenceErrors: true,
		SilenceUsage:  true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return setup(cmd, &g, p)
		},
	}
	root.SetOut(p.Out)
	root.SetErr(p.Err)
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return fmt.Errorf("%s: %w (see '%s --help')", c.CommandPath(), err, c.CommandPath())
	})

	pf := root.PersistentFlags()
	pf.StringVar(&g.ConfigFile, "config", "", "config file (default $XDG_CONFIG_HOME/mc/config.yaml when present)")
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
	root.InitDefaultCompletionCmd()
	root.InitDefaultHelpCmd()

	// One normaliser for every flag set: Mooncake's underscore spellings
	// (--block_size) resolve to the kebab-case flag (--block-size).
	root.SetGlobalNormalizationFunc(normalizeFlag)
	return root
}

func normalizeFlag(_ *pflag.FlagSet, name string) pflag.NormalizedName {
	return pflag.NormalizedName(strings.ReplaceAll(name, "_", "-"))
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
		return fmt.Errorf("invalid --output %q: want table or json", g.Output)
	}
	level, err := glog.ParseLevel(g.LogLevel)
	if err != nil {
		return fmt.Errorf("invalid --log-level: %w", err)
	}
	if g.LogDir == "" {
		glog.Setup(p.Err, level)
		return nil
	}
	// As glog with --log_dir: every line to the file, errors to stderr
	// too. The file stays open until the process exits.
	f, err := glog.CreateLogFile(g.LogDir, "mc", time.Now())
	if err != nil {
		return fmt.Errorf("--log-dir: %w", err)
	}
	slog.SetDefault(slog.New(glog.Tee(
		glog.NewHandler(f, &glog.Options{Level: level}),
		glog.NewHandler(p.Err, &glog.Options{Level: max(level, slog.LevelError)}),
	)))
	return nil
}
