package cmd

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/kvcache-ops/mc/pkg/coll/collbench"
	"github.com/kvcache-ops/mc/pkg/conductor"
	"github.com/kvcache-ops/mc/pkg/diag"
	"github.com/kvcache-ops/mc/pkg/store"
	sbench "github.com/kvcache-ops/mc/pkg/store/bench"
	"github.com/kvcache-ops/mc/pkg/store/replay"
	"github.com/kvcache-ops/mc/pkg/topo"
)

// openPTY opens a pseudo-terminal: its master, read by the test, and its
// slave, which a command gets as its standard output.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("open /dev/ptmx: %v", err)
	}
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatalf("unlockpt: %v", err)
	}
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatalf("ptsname: %v", err)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("open pts %d: %v", n, err)
	}
	t.Cleanup(func() { s.Close(); m.Close() })
	return m, s
}

// TestStoreGetToTerminal: a binary value is not dumped on a terminal
// (issue 40: `store get KEY -o table` wrote 1 MiB of binary to it); the
// error names --file, redirection and --force; text is printed; --force
// writes anyway.
func TestStoreGetToTerminal(t *testing.T) {
	isolateEnv(t)
	rpc, admin, _, _ := startServeStore(t, "--segment-size", "16M")
	m := []string{"--master", rpc, "--admin", admin}
	dir := t.TempDir()
	bin := bytes.Repeat([]byte{0, 1, 2, 0xff}, 64<<10) // 256 KiB
	os.WriteFile(filepath.Join(dir, "bin"), bin, 0o644)
	os.WriteFile(filepath.Join(dir, "txt"), []byte("hello\n"), 0o644)
	for _, k := range []string{"bin", "txt"} {
		if out, errs, code := execMC(t, append([]string{"store", "put", k, filepath.Join(dir, k)}, m...)...); code != 0 {
			t.Fatalf("put %s: %d %s %s", k, code, out, errs)
		}
	}
	ptm, pts := openPTY(t)
	got := make(chan int, 1)
	go func() { n, _ := io.Copy(io.Discard, ptm); got <- int(n) }()
	run := func(args ...string) (string, int) {
		var errb bytes.Buffer
		code := Execute(context.Background(), append(args, m...), pts, &errb)
		return errb.String(), code
	}
	if errs, code := run("store", "get", "bin", "-o", "table"); code != exitUsage || !strings.Contains(errs, "--file") || !strings.Contains(errs, "redirect") || !strings.Contains(errs, "--force") {
		t.Fatalf("binary get to a terminal: %d %q, want %d and a hint", code, errs, exitUsage)
	}
	if _, err := os.Stat("table"); err == nil {
		os.Remove("table")
		t.Fatal("-o table wrote a file named table")
	}
	if errs, code := run("store", "get", "txt"); code != 0 {
		t.Fatalf("text get to a terminal: %d %q", code, errs)
	}
	if errs, code := run("store", "get", "bin", "--force"); code != 0 {
		t.Fatalf("binary get --force: %d %q", code, errs)
	}
	pts.Close()
	if n := <-got; n < len(bin) || n > len(bin)+64 {
		t.Fatalf("the terminal got %d bytes, want the text and one binary value (%d)", n, len(bin))
	}
}

// TestStoreGetFileFlag: the file has its own flag (--file, -f); -o is
// the format, so MC_OUTPUT=json with a file prints a JSON summary; the
// old -o FILE still writes the file, with a warning (issue 40).
func TestStoreGetFileFlag(t *testing.T) {
	isolateEnv(t)
	rpc, admin, _, _ := startServeStore(t, "--segment-size", "16M")
	m := []string{"--master", rpc, "--admin", admin}
	dir := t.TempDir()
	val := bytes.Repeat([]byte{0, 9}, 1000)
	src := filepath.Join(dir, "src")
	os.WriteFile(src, val, 0o644)
	if out, errs, code := execMC(t, append([]string{"store", "put", "k", src}, m...)...); code != 0 {
		t.Fatalf("put: %d %s %s", code, out, errs)
	}
	check := func(what, file string) {
		t.Helper()
		if b, err := os.ReadFile(file); err != nil || !bytes.Equal(b, val) {
			t.Fatalf("%s: %s holds %d bytes (%v), want the value", what, file, len(b), err)
		}
		os.Remove(file)
	}
	for _, flag := range []string{"--file", "-f"} {
		f := filepath.Join(dir, "out"+flag)
		if out, errs, code := execMC(t, append([]string{"store", "get", "k", flag, f}, m...)...); code != 0 || out != "" || strings.Contains(errs, "warning") {
			t.Fatalf("get %s: %d %q %q", flag, code, out, errs)
		}
		check("get "+flag, f)
	}
	old := filepath.Join(dir, "old.bin")
	if out, errs, code := execMC(t, append([]string{"store", "get", "k", "-o", old}, m...)...); code != 0 || out != "" || !strings.Contains(errs, "warning") || !strings.Contains(errs, "--file "+old) {
		t.Fatalf("get -o FILE: %d %q %q, want the file and a deprecation warning", code, out, errs)
	}
	check("get -o FILE", old)

	t.Setenv("MC_OUTPUT", "json")
	for _, args := range [][]string{{"-o", old}, {"--file", old}} {
		out, errs, code := execMC(t, append(append([]string{"store", "get", "k"}, args...), m...)...)
		var v map[string]any
		if code != 0 || json.Unmarshal([]byte(out), &v) != nil || v["file"] != old || v["size"] != float64(len(val)) {
			t.Fatalf("MC_OUTPUT=json get %v: %d %q %q, want a JSON summary", args, code, out, errs)
		}
		for _, k := range []string{"key", "size", "file", "value_base64", "transport"} {
			if _, ok := v[k]; !ok {
				t.Fatalf("get %v -o json: no %q in %s", args, k, out)
			}
		}
		check(fmt.Sprint("MC_OUTPUT=json get ", args), old)
	}
	out, errs, code := execMC(t, append([]string{"store", "get", "k", "-o", "json", "--file", old, "-o", "x"}, m...)...)
	if code != exitUsage {
		t.Fatalf("-o x with --file: %d %q %q, want %d", code, out, errs, exitUsage)
	}
}

// TestJSONErrorOnFailure: under -o json every failure prints a JSON
// object on stdout ({"error","exit_code","command"}) beside its stderr
// line (issue 40: store exists against an unreachable master, store
// query of a missing key printed nothing): the two named cases, and a
// usage error on every command of the tree.
func TestJSONErrorOnFailure(t *testing.T) {
	isolateEnv(t)
	check := func(what, out string, code, wantCode int) {
		t.Helper()
		var v map[string]any
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			t.Fatalf("%s: stdout is not one JSON object (%v): %q", what, err, out)
		}
		for _, k := range []string{"error", "exit_code", "command"} {
			if _, ok := v[k]; !ok {
				t.Fatalf("%s: no %q in %s", what, k, out)
			}
		}
		if code != wantCode || v["exit_code"] != float64(wantCode) || v["error"] == "" {
			t.Fatalf("%s: exit %d, %s; want %d", what, code, out, wantCode)
		}
	}
	out, errs, code := execMC(t, "store", "exists", "k", "--master", "127.0.0.1:1", "-o", "json")
	check("store exists, no master "+errs, out, code, 2)

	_, admin, _, _ := startServeStore(t, "--segment-size", "8M")
	out, errs, code = execMC(t, "store", "query", "missing", "--admin", admin, "-o", "json")
	check("store query of a missing key "+errs, out, code, 1)

	// -o json after a misspelled flag, which stops parsing before it:
	// the error object was printed only when -o came first.
	for _, args := range [][]string{
		{"store", "ls", "--sise", "-o", "json"},
		{"store", "ls", "--sise", "--output=json"},
		{"store", "ls", "--sise", "-ojson"},
	} {
		out, errs, code := execMC(t, args...)
		check(fmt.Sprint("mc ", args, " ", errs), out, code, exitUsage)
	}
	if out, _, _ := execMC(t, "store", "ls", "--sise", "--", "-o", "json"); out != "" {
		t.Errorf("-o json after --: stdout %q, want none (it is an argument)", out)
	}

	// output: json in the config file, for failures before the command
	// ran too (they printed no JSON: only MC_OUTPUT and -o counted).
	cfgDir := t.TempDir()
	os.MkdirAll(filepath.Join(cfgDir, "mc"), 0o755)
	os.WriteFile(filepath.Join(cfgDir, "mc", "config.yaml"), []byte("output: json\n"), 0o644)
	t.Setenv("XDG_CONFIG_HOME", cfgDir)
	for _, args := range [][]string{{"no-such-verb"}, {"store", "exists"}, {"store", "exists", "k", "--no-such-flag"}} {
		out, errs, code := execMC(t, args...)
		check(fmt.Sprint("config output: json, mc ", args, " ", errs), out, code, exitUsage)
	}
	explicit := filepath.Join(cfgDir, "other.yaml")
	os.WriteFile(explicit, []byte("output: json\n"), 0o644)
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	out, errs, code = execMC(t, "--config", explicit, "store", "exists")
	check("--config with output: json, a missing argument "+errs, out, code, exitUsage)

	t.Setenv("MC_OUTPUT", "json")
	out, _, code = execMC(t, "no-such-verb")
	check("MC_OUTPUT=json, unknown command", out, code, exitUsage)

	root := newRootCmd(&printer{Out: io.Discard, Err: io.Discard})
	var walk func(c *cobra.Command)
	n := 0
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			if sub.Hidden || sub.Name() == "help" || sub.Name() == "completion" {
				continue
			}
			if sub.HasSubCommands() {
				walk(sub)
				continue
			}
			path := strings.Fields(sub.CommandPath())[1:]
			out, errs, code := execMC(t, append(path, "-o", "json", "--no-such-flag")...)
			check(strings.Join(path, " ")+" --no-such-flag "+errs, out, code, exitUsage)
			if !strings.Contains(out, `"command": "`+strings.Join(path, " ")+`"`) {
				t.Fatalf("%s --no-such-flag: the JSON error does not name the command: %s", strings.Join(path, " "), out)
			}
			n++
		}
	}
	walk(root)
	if n < 20 {
		t.Fatalf("walked %d commands", n)
	}
}

// TestJSONFieldsNeverOmitted: the types mc prints with -o json omit no
// field (no omitempty), nested types included, so that one schema holds
// for every answer (issue 40: error, vs_tcp, failed came and went). The
// roots are every type a command hands to PrintJSON (or prints as JSON
// lines); maps built field by field are checked where they are printed.
func TestJSONFieldsNeverOmitted(t *testing.T) {
	seen := map[reflect.Type]bool{}
	var walk func(typ reflect.Type, path string)
	walk = func(typ reflect.Type, path string) {
		for typ.Kind() == reflect.Pointer || typ.Kind() == reflect.Slice || typ.Kind() == reflect.Array || typ.Kind() == reflect.Map {
			typ = typ.Elem()
		}
		if typ.Kind() != reflect.Struct || seen[typ] {
			return
		}
		seen[typ] = true
		for i := range typ.NumField() {
			f := typ.Field(i)
			tag := f.Tag.Get("json")
			if !f.IsExported() || tag == "-" {
				continue
			}
			if strings.Contains(tag, "omitempty") || strings.Contains(tag, "omitzero") {
				t.Errorf("%s.%s (%s): json %q omits the field when empty", typ, f.Name, path, tag)
			}
			walk(f.Type, path+"."+f.Name)
		}
	}
	for _, v := range []any{
		benchJSONResult{}, serveMetadataInfo{}, serveStoreInfo{}, storeQueryResult{}, storeReplayJSON{},
		sbench.Result{}, collbench.Result{}, topo.NIC{}, replay.Result{}, store.DrainJobStatus{},
		storeStat{}, storeRmRegexJSON{}, storeQueryReplica{}, storeUndrainJSON{}, eventLine{}, versionInfo{}, jsonError{},
		segmentJSON{}, removalJSON{}, diag.Report{}, conductor.Result{}, store.AdminDiskReplica{},
	} {
		walk(reflect.TypeOf(v), reflect.TypeOf(v).String())
	}
}

// TestJSONMapsCarryEveryField: the answers built as maps carry every
// field every time (bench target's banner had "provider" only for rdma,
// store put's "warning" only with fewer replicas than asked).
func TestJSONMapsCarryEveryField(t *testing.T) {
	isolateEnv(t)
	keys := func(what, out string, want ...string) {
		t.Helper()
		var v map[string]any
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			t.Fatalf("%s: not JSON (%v): %q", what, err, out)
		}
		for _, k := range want {
			if _, ok := v[k]; !ok {
				t.Errorf("%s: no %q in %s", what, k, out)
			}
		}
	}
	var out syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- Execute(ctx, []string{"bench", "target", "--protocol", "tcp", "--metadata_server", "P2PHANDSHAKE",
			"--buffer-size", "8M", "--bind-address", "127.0.0.1", "-o", "json"}, &out, io.Discard)
	}()
	waitText(t, &out, "}\n")
	cancel()
	<-done
	keys("bench target -o json", out.String(), "segment_id", "protocol", "provider", "metadata_server", "buffers", "metrics_addr")

	rpc, admin, _, _ := startServeStore(t, "--segment-size", "8M")
	m := []string{"--master", rpc, "--admin", admin}
	src := filepath.Join(t.TempDir(), "v")
	os.WriteFile(src, []byte("hello"), 0o644)
	o, errs, code := execMC(t, append([]string{"store", "put", "k", src, "-o", "json"}, m...)...)
	if code != 0 {
		t.Fatalf("put: %d %s", code, errs)
	}
	keys("store put -o json", o, "key", "size", "replicas", "replicas_requested", "transport", "provider", "warning")
	o, errs, code = execMC(t, append([]string{"store", "get", "k", "-o", "json"}, m...)...)
	if code != 0 {
		t.Fatalf("get: %d %s", code, errs)
	}
	keys("store get -o json", o, "key", "size", "value_base64", "file", "transport", "provider")
}
