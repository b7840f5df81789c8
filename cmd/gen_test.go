package cmd

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
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
	if err := doc.GenManTree(root, hdr, dir); err != nil {
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
