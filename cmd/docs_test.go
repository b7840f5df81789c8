package cmd

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// makeDryRun prints what `make target` would run at the repository root.
func makeDryRun(t *testing.T, target string) string {
	t.Helper()
	c := exec.Command("make", "-n", target)
	c.Dir = ".."
	out, err := c.CombinedOutput()
	if err != nil {
		t.Fatalf("make -n %s: %v\n%s", target, err, out)
	}
	return string(out)
}

// Every `make X` the README tells a newcomer to run exists, and the
// targets it describes do what it says.
func TestReadmeMakeTargets(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, m := range regexp.MustCompile("`make ([a-z][a-z-]*)").FindAllStringSubmatch(string(readme), -1) {
		if !seen[m[1]] {
			seen[m[1]] = true
			makeDryRun(t, m[1])
		}
	}
	for _, want := range []string{"fixtures", "build-ibverbs", "install", "demo", "test"} {
		if !seen[want] {
			t.Errorf("README does not mention make %s", want)
		}
	}
	install := makeDryRun(t, "install")
	for _, want := range []string{"completions/mc.bash", "share/bash-completion/completions/mc", "site-functions/_mc", "vendor_completions.d/mc.fish", "man/*.1"} {
		if !strings.Contains(install, want) {
			t.Errorf("make install does not install %s:\n%s", want, install)
		}
	}
	if ib := makeDryRun(t, "build-ibverbs"); !strings.Contains(ib, "-tags ibverbs") {
		t.Errorf("make build-ibverbs builds without the ibverbs tag:\n%s", ib)
	}
	if fx := makeDryRun(t, "fixtures"); !strings.Contains(fx, "TestFixtureTrees") || !strings.Contains(fx, "-fixtures-dir") {
		t.Errorf("make fixtures does not unpack the topo fixtures:\n%s", fx)
	}
	// The security note of the bench target, with the flag that exists.
	if !strings.Contains(string(readme), "0.0.0.0") || !strings.Contains(string(readme), "--bind-address") {
		t.Error("README lacks the note on bench target's default bind address")
	}
	root := newRootCmd(&printer{})
	if target, _, err := root.Find([]string{"bench", "target"}); err != nil || target.Flags().Lookup("bind-address") == nil {
		t.Errorf("README names --bind-address, which bench target lacks: %v", err)
	}
}

// The traces the README and the help examples name are the ones make
// traces fetches into testdata/traces/ (checked by sha256), whose README
// states their source and licence.
func TestTraceExamples(t *testing.T) {
	isolateEnv(t)
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var docs strings.Builder
	docs.Write(readme)
	for _, path := range [][]string{{"sim", "conductor"}, {"store", "replay"}} {
		c, _, err := newRootCmd(&printer{}).Find(path)
		if err != nil {
			t.Fatal(err)
		}
		docs.WriteString(c.Example)
	}
	named := map[string]bool{}
	for _, m := range regexp.MustCompile(`--trace (\S+\.jsonl)`).FindAllStringSubmatch(docs.String(), -1) {
		named[m[1]] = true
	}
	if len(named) == 0 {
		t.Fatal("no --trace FILE in the README or the examples")
	}
	for path := range named {
		if !strings.HasPrefix(path, "testdata/traces/") {
			t.Errorf("an example reads %s, which make traces does not fetch", path)
			continue
		}
	}
	notes, err := os.ReadFile("../testdata/traces/README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"kvcache-ai/Mooncake", "3b5a594133958449a1feaf1c9e0fc1b553e34a28", "Apache License 2.0", "make traces"} {
		if !strings.Contains(string(notes), want) {
			t.Errorf("testdata/traces/README.md does not state %q", want)
		}
	}
	// The traces are not kept in the repository (shared/traces/README.md:
	// do not copy them in); make traces fetches the files the examples
	// name, checked against their sha256.
	mk, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	for path := range named {
		name := strings.TrimPrefix(path, "testdata/traces/")
		if !regexp.MustCompile(regexp.QuoteMeta(name) + `:[0-9a-f]{64}`).Match(mk) {
			t.Errorf("make traces does not fetch %s with its sha256", name)
		}
	}
}

// A newcomer is told to put bin/ on PATH (or make install) before the
// first mc command, and that make test needs root and the network.
func TestReadmeSetupForNewcomers(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(readme)
	path := strings.Index(s, `export PATH="$PWD/bin:$PATH"`)
	first := regexp.MustCompile(`(?m)^(\$ )?mc [a-z]`).FindStringIndex(s)
	if path < 0 || first == nil || path > first[0] {
		t.Errorf("README: bin/ goes on PATH at %d, the first mc command is at %v", path, first)
	}
	for _, want := range []string{"root or sudo", "network"} {
		if !strings.Contains(s, want) {
			t.Errorf("README does not say make test needs %s", want)
		}
	}
}

// The README's bench sample shows the embedded target's size the command
// prints for that command line.
func TestReadmeEmbeddedTargetSize(t *testing.T) {
	isolateEnv(t)
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?m)^\\$ mc (bench initiator [^\n]*)\nembedded target \\S+ (\\([^)]*\\))").FindSubmatch(readme)
	if m == nil {
		t.Fatal("README has no bench initiator sample with its embedded target line")
	}
	args := strings.Fields(string(m[1]))
	for i, a := range args {
		if a == "--duration" {
			args[i+1] = "100ms"
		}
	}
	out, errs, code := execMC(t, args...)
	if code != 0 {
		t.Fatalf("mc %s: %d %s", strings.Join(args, " "), code, errs)
	}
	if !strings.Contains(out, string(m[2])+"\n") {
		t.Errorf("README shows the embedded target as %s; mc %s prints:\n%s", m[2], strings.Join(args, " "), out)
	}
}
