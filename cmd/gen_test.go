package cmd

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
	"github.com/spf13/pflag"
)

// `make gen` runs this test with -update-gen to rewrite completions/ and
// man/; `make test` runs it without, so stale generated files fail CI.
var updateGen = flag.Bool("update-gen", false, "rewrite completions/ and man/ from the command tree")

// manDate is fixed so that regenerating changes nothing unless commands do.
var manDate = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func generated(t *testing.T) map[string][]byte {
	t.Helper()
	root := newRootCmd(&printer{Out: &bytes.Buffer{}, Err: &bytes.Buffer{}})
	root.DisableAutoGenTag = true
	files := map[string][]byte{}
	gens := map[string]func(*cobra.Command, *bytes.Buffer) error{
		"completions/mc.bash": func(c *cobra.Command, b *bytes.Buffer) error { return c.GenBashCompletionV2(b, true) },
		"completions/_mc":     func(c *cobra.Command, b *bytes.Buffer) error { return c.GenZshCompletion(b) },
		"completions/mc.fish": func(c *cobra.Command, b *bytes.Buffer) error { return c.GenFishCompletion(b, true) },
		"completions/mc.ps1":  func(c *cobra.Command, b *bytes.Buffer) error { return c.GenPowerShellCompletionWithDesc(b) },
	}
	for name, gen := range gens {
		var b bytes.Buffer
		if err := gen(root, &b); err != nil {
			t.Fatalf("generate %s: %v", name, err)
		}
		files[name] = b.Bytes()
	}
	dir := t.TempDir()
	hdr := &doc.GenManHeader{Title: "MC", Section: "1", Date: &manDate, Source: "mc", Manual: "mc manual"}
	manRoot := newRootCmd(&printer{Out: &bytes.Buffer{}, Err: &bytes.Buffer{}})
	manRoot.DisableAutoGenTag = true
	escapeForMan(manRoot)
	if err := doc.GenManTree(manRoot, hdr, dir); err != nil {
		t.Fatalf("generate man pages: %v", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		files["man/"+e.Name()] = b
	}
	return files
}

// escapeForMan makes the help text of c's tree literal markdown for
// cobra's man generator (go-md2man): <cluster> read as an HTML tag and
// vanished, kv_events_* turned italic. Code spans (a flag's `FILE`) stay.
// A persistent flag is one *pflag.Flag in every command's set: escaped once.
func escapeForMan(c *cobra.Command) {
	done := map[*pflag.Flag]bool{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.Short = markdownLiteral(c.Short)
		c.Long = markdownLiteral(c.Long)
		esc := func(f *pflag.Flag) {
			if !done[f] {
				done[f] = true
				f.Usage = markdownLiteral(f.Usage)
			}
		}
		c.Flags().VisitAll(esc)
		c.PersistentFlags().VisitAll(esc)
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(c)
}

func markdownLiteral(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, "\t") || strings.HasPrefix(l, "    ") {
			continue // an indented code block: literal already
		}
		var b strings.Builder
		inCode := false
		for _, r := range l {
			switch {
			case r == '`':
				inCode = !inCode
			case !inCode && strings.ContainsRune(`\\<>_*[]`, r):
				b.WriteByte('\\')
			}
			b.WriteRune(r)
		}
		lines[i] = b.String()
	}
	return strings.Join(lines, "\n")
}

func TestGeneratedFilesUpToDate(t *testing.T) {
	isolateEnv(t)
	want := generated(t)
	repo := ".."
	var have []string
	for _, d := range []string{"completions", "man"} {
		entries, _ := os.ReadDir(filepath.Join(repo, d))
		for _, e := range entries {
			have = append(have, d+"/"+e.Name())
		}
	}
	if *updateGen {
		for _, name := range have {
			if _, ok := want[name]; !ok {
				if err := os.Remove(filepath.Join(repo, name)); err != nil {
					t.Fatal(err)
				}
			}
		}
		for name, b := range want {
			p := filepath.Join(repo, name)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return
	}
	var stale []string
	for name, b := range want {
		got, err := os.ReadFile(filepath.Join(repo, name))
		if err != nil || !bytes.Equal(got, b) {
			stale = append(stale, name)
		}
	}
	for _, name := range have {
		if _, ok := want[name]; !ok {
			stale = append(stale, name+" (no longer generated)")
		}
	}
	sort.Strings(stale)
	if len(stale) > 0 {
		t.Fatalf("generated files are stale; run `make gen` and commit:\n  %s", strings.Join(stale, "\n  "))
	}
}

// The man pages say what --help says: <placeholders>, [optional parts]
// and snake_case names survive go-md2man (mooncake/[<cluster>/]ram/,
// mooncake-store/<cluster_id>/master_view and http://<master or leader
// host>:9003 were mangled), checked on every command's text and flags.
func TestManPagesKeepHelpText(t *testing.T) {
	isolateEnv(t)
	files := generated(t)
	root := newRootCmd(&printer{Out: &bytes.Buffer{}, Err: &bytes.Buffer{}})
	literal := regexp.MustCompile(`<[^<>\s][^<>\n]*>|\[[^\[\]\n]+\]|\b[a-z0-9]+(_[a-z0-9]+)+_?\*?`)
	checked := 0
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			walk(sub)
		}
		if !c.IsAvailableCommand() && c != root {
			return
		}
		name := "man/" + strings.ReplaceAll(c.CommandPath(), " ", "-") + ".1"
		page, ok := files[name]
		if !ok {
			t.Errorf("no %s", name)
			return
		}
		// roff: \- is -, \& is nothing, lines are joined.
		text := strings.NewReplacer(`\-`, "-", `\&`, "", "\n", " ").Replace(string(page))
		var sources []string
		for _, l := range strings.Split(c.Long, "\n") {
			if !strings.HasPrefix(l, "\t") && !strings.HasPrefix(l, "    ") {
				sources = append(sources, l)
			}
		}
		c.LocalFlags().VisitAll(func(f *pflag.Flag) {
			if !f.Hidden {
				sources = append(sources, f.Usage)
			}
		})
		for _, src := range sources {
			for _, m := range literal.FindAllString(src, -1) {
				checked++
				if !strings.Contains(text, m) {
					t.Errorf("%s lacks %q (from %q)", name, m, src)
				}
			}
		}
	}
	walk(root)
	if checked < 50 {
		t.Fatalf("only %d literals checked", checked)
	}
}
