package cmd

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"
)

// envAnnotation names the environment variable a flag reads when it maps to
// one of Mooncake's MC_* variables (MC_SLICE_SIZE, MC_LOG_LEVEL, ...).
const envAnnotation = "mc_env"

// envName declares that flag name of fs is also set by the environment
// variable env (a Mooncake name), instead of the derived MC_<GROUP>_<FLAG>.
func envName(fs *pflag.FlagSet, name, env string) {
	if err := fs.SetAnnotation(name, envAnnotation, []string{env}); err != nil {
		// Only a programming error (a misspelt flag) gets here.
		panic(fmt.Sprintf("envName: %v", err))
	}
}

// config resolves flag values that were not given on the command line:
// environment first, then the config file, then the flag's own default
// (flag > env > config file > default).
type config struct {
	v      *viper.Viper
	path   string // the config file read, "" when none
	getenv func(string) string
}

// loadConfig reads the config file. An explicit --config that cannot be
// read is an error; a missing default file is not.
func loadConfig(path string, explicit bool, getenv func(string) string) (*config, error) {
	v := viper.New()
	c := &config{v: v, getenv: getenv}
	what := "--config"
	if env := getenv("MC_CONFIG"); !explicit && env != "" {
		// Every flag has its MC_* variable; --config's is MC_CONFIG.
		path, explicit, what = env, true, "$MC_CONFIG"
	}
	if !explicit {
		path = defaultConfigPath(getenv)
		if path == "" {
			return c, nil
		}
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			return c, nil
		}
	}
	if explicit {
		// A --config naming no file is a bad flag value, not a failure
		// of the command (exit 64).
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			return nil, usagef("%s %q: no such file", what, path)
		} else if err != nil {
			return nil, usagef("%s: %w", what, err)
		}
	}
	v.SetConfigFile(path)
	// mc.conf, config (no extension), ...: viper goes by the extension
	// and refuses what it does not know; YAML is the documented format.
	if ext := strings.TrimPrefix(filepath.Ext(path), "."); !slices.Contains(viper.SupportedExts, ext) {
		v.SetConfigType("yaml")
	}
	if err := v.ReadInConfig(); err != nil {
		return nil, fmt.Errorf("read config file %q: %w", path, err)
	}
	c.path = path
	return c, nil
}

// unknownKeys lists the config file's keys that name no flag of root's
// tree (a typo like bench.blok-size would otherwise be ignored without a
// word), each with a suggestion when a known key is close.
func (c *config) unknownKeys(root *cobra.Command) []string {
	if c.path == "" {
		return nil
	}
	known := map[string]bool{}
	addKey := func(group, flag string) {
		for _, k := range configKeys(group, flag) {
			known[k] = true
		}
	}
	root.PersistentFlags().VisitAll(func(f *pflag.Flag) { addKey("", f.Name) })
	var walk func(group string, cmd *cobra.Command)
	walk = func(group string, cmd *cobra.Command) {
		cmd.LocalFlags().VisitAll(func(f *pflag.Flag) { addKey(group, f.Name) })
		for _, sub := range cmd.Commands() {
			walk(group, sub)
		}
	}
	for _, g := range root.Commands() {
		walk(g.Name(), g)
	}
	var out []string
	for _, k := range c.v.AllKeys() {
		if known[k] {
			continue
		}
		msg := fmt.Sprintf("%q", k)
		if s := closestKey(k, known); s != "" {
			msg += fmt.Sprintf(" (did you mean %q?)", s)
		}
		out = append(out, msg)
	}
	slices.Sort(out)
	return out
}

// closestKey is the known key nearest to k: the same flag under a group
// (block-size at the top level for bench.block-size), or one within two
// edits of it (blok-size).
func closestKey(k string, known map[string]bool) string {
	best, bestD := "", 3
	for cand := range known {
		d := editDistance(k, cand)
		if strings.HasSuffix(cand, "."+k) {
			d = 0
		}
		if d < bestD || (d == bestD && cand < best) {
			best, bestD = cand, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b (bytes).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

func defaultConfigPath(getenv func(string) string) string {
	dir := getenv("XDG_CONFIG_HOME")
	if dir == "" {
		home := getenv("HOME")
		if home == "" {
			return ""
		}
		dir = filepath.Join(home, ".config")
	}
	return filepath.Join(dir, "mc", "config.yaml")
}

// apply fills every flag of cmd that was not set on the command line from
// the environment or the config file.
func (c *config) apply(cmd *cobra.Command) error {
	group := commandGroup(cmd)
	root := cmd.Root()
	var firstErr error
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if firstErr != nil || f.Changed || f.Name == "config" || f.Name == "help" {
			return
		}
		g := group
		if root.PersistentFlags().Lookup(f.Name) != nil {
			g = ""
		}
		val, src, ok := c.lookup(g, f)
		if !ok {
			return
		}
		if err := setFlag(f, val); err != nil {
			firstErr = usagef("invalid value %q for --%s from %s: %w", val, f.Name, src, err)
			return
		}
		if f.Annotations == nil {
			f.Annotations = map[string][]string{}
		}
		f.Annotations[setFromAnnotation] = []string{src}
	})
	return firstErr
}

// setFromAnnotation marks a flag set from the environment or the config
// file (not Changed: only the command line changes a flag).
const setFromAnnotation = "mc_set_from"

// isSet reports whether flag name of fs was given anywhere: the command
// line, an MC_* variable or the config file. Checks that pick a mode by a
// flag use it: a rank given as MC_BENCH_RANK ran local ranks instead,
// silently.
func isSet(fs *pflag.FlagSet, name string) bool {
	f := fs.Lookup(name)
	return f != nil && (f.Changed || len(f.Annotations[setFromAnnotation]) > 0)
}

func (c *config) lookup(group string, f *pflag.Flag) (val, source string, ok bool) {
	env := derivedEnv(group, f.Name)
	if a := f.Annotations[envAnnotation]; len(a) > 0 {
		env = a[0]
	}
	if v, set := lookupEnv(c.getenv, env); set {
		return v, "$" + env, true
	}
	for _, key := range configKeys(group, f.Name) {
		if !c.v.IsSet(key) {
			continue
		}
		raw := c.v.Get(key)
		if list, isList := raw.([]any); isList {
			parts := make([]string, len(list))
			for i, x := range list {
				parts[i] = fmt.Sprint(x)
			}
			return strings.Join(parts, ","), "config key " + key, true
		}
		return fmt.Sprint(raw), "config key " + key, true
	}
	return "", "", false
}

func lookupEnv(getenv func(string) string, name string) (string, bool) {
	if v := getenv(name); v != "" {
		return v, true
	}
	return "", false
}

// derivedEnv is MC_<GROUP>_<FLAG>, or MC_<FLAG> for global flags.
func derivedEnv(group, flag string) string {
	name := "MC_"
	if group != "" {
		name += group + "_"
	}
	name += flag
	return strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// configKeys lists the config file keys for a flag: "<group>.<flag>" in
// kebab and underscore spelling (viper lower-cases keys itself).
func configKeys(group, flag string) []string {
	us := strings.ReplaceAll(flag, "-", "_")
	if group == "" {
		return []string{flag, us}
	}
	return []string{group + "." + flag, group + "." + us}
}

// commandGroup is the first command below the root on cmd's path
// ("bench" for `mc bench initiator`), or "" for the root itself.
func commandGroup(cmd *cobra.Command) string {
	var group string
	for c := cmd; c != nil && c.HasParent(); c = c.Parent() {
		group = c.Name()
	}
	return group
}

// setFlag sets f from a string; a slice flag takes a comma list in one go.
func setFlag(f *pflag.Flag, val string) error {
	if sv, ok := f.Value.(pflag.SliceValue); ok {
		return sv.Replace(splitList(val))
	}
	return f.Value.Set(val)
}

func splitList(s string) []string {
	s = strings.TrimSpace(strings.TrimSuffix(strings.TrimPrefix(s, "["), "]"))
	if s == "" {
		return nil
	}
	parts := strings.Split(s, ",")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	return parts
}
