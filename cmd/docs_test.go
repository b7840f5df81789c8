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
