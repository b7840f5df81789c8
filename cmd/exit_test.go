package cmd

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// commandPaths lists the path below the root of every command of mc's
// tree (groups and leaves), help included.
func commandPaths() [][]string {
	var out [][]string
	var walk func(path []string, c *cobra.Command)
	walk = func(path []string, c *cobra.Command) {
		out = append(out, path)
		for _, sub := range c.Commands() {
			walk(append(append([]string(nil), path...), sub.Name()), sub)
		}
	}
	walk(nil, newRootCmd(&printer{Out: &bytes.Buffer{}, Err: &bytes.Buffer{}}))
	return out
}

// Every command answers an unknown flag with exit 64 (EX_USAGE), which
// no command uses as an answer, and one line naming the command.
func TestUsageErrorsExit64OnEveryCommand(t *testing.T) {
	isolateEnv(t)
	paths := commandPaths()
	if len(paths) < 30 {
		t.Fatalf("only %d commands found", len(paths))
	}
	for _, path := range paths {
		args := append(append([]string(nil), path...), "--no-such-flag")
		out, errs, code := execMC(t, args...)
		want := "mc: " + strings.TrimPrefix(strings.Join(path, " ")+": ", ": ") + "unknown flag: --no-such-flag"
		if code != exitUsage || !strings.HasPrefix(errs, want) || strings.Count(errs, "\n") != 1 || out != "" {
			t.Errorf("mc %s: exit %d, stdout %q, stderr %q; want exit 64 and %q", strings.Join(args, " "), code, out, errs, want)
		}
	}
}

// A value a typed flag cannot hold is a usage error on every command.
func TestBadFlagValuesExit64OnEveryCommand(t *testing.T) {
	isolateEnv(t)
	root := newRootCmd(&printer{Out: &bytes.Buffer{}, Err: &bytes.Buffer{}})
	n := 0
	walkFlags(root, func(c *cobra.Command, f *pflag.Flag) {
		switch f.Value.Type() {
		case "string", "stringSlice", "stringArray":
			return
		}
		if f.Name == "help" {
			return
		}
		path := strings.Fields(c.CommandPath())[1:]
		args := append(path, "--"+f.Name+"=@bogus@")
		out, errs, code := execMC(t, args...)
		n++
		if code != exitUsage || !strings.Contains(errs, "--"+f.Name) || strings.Count(errs, "\n") != 1 || out != "" {
			t.Errorf("mc %s: exit %d, stdout %q, stderr %q; want exit 64 naming the flag", strings.Join(args, " "), code, out, errs)
		}
	})
	if n < 50 {
		t.Fatalf("only %d typed flags tried", n)
	}
}

// Usage errors that are not flag parsing: a missing argument, a refused
// value or combination, a bad environment value; and the answers that
// must stay apart from them.
func TestUsageErrorsExit64(t *testing.T) {
	isolateEnv(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"topo", "discovr", "--sysfs-root", "x"}, `mc: topo: unknown command "discovr" (did you mean "discover"?)`},
		{[]string{"coll", "--ranks", "2"}, `mc: unknown command "coll" (did you mean "bench coll"?)`},
		{[]string{"store", "exists"}, "mc: store exists: accepts 1 arg(s), received 0"},
		{[]string{"store", "exists", ""}, "mc: store exists: invalid key"},
		{[]string{"store", "exists", "k", "--master", "a:b:c:d"}, "mc: store exists: "},
		{[]string{"bench", "initiator", "--threads", "0"}, "mc: bench initiator: --threads 0 must be positive"},
		{[]string{"bench", "--mode", "sideways"}, `mc: bench: --mode "sideways"`},
		{[]string{"sim", "conductor"}, "mc: sim conductor: --trace is required"},
		{[]string{"meta", "ls"}, "mc: meta ls: --metadata-server is required"},
		{[]string{"meta", "gc"}, "mc: meta gc: --metadata-server is required"},
		{[]string{"serve", "store", "--rpc-port", "99999"}, "mc: serve store: invalid --rpc-port 99999"},
		{[]string{"--output", "yaml", "version"}, `mc: version: invalid --output "yaml"`},
		{[]string{"diag", "qp-leak", "--num-qp-per-ep", "-1"}, "mc: diag qp-leak: invalid --num-qp-per-ep -1"},
		{[]string{"diag", "qp-leak", "--rdma", diagTD + "leak/rdma.txt", "--at", "yesterday"}, `mc: diag qp-leak: invalid --at "yesterday"`},
		{[]string{"store", "pt", "k"}, `mc: store: unknown command "pt" (did you mean "put"?)`},
		{[]string{"diag", "qp-lek"}, `mc: diag: unknown command "qp-lek" (did you mean "qp-leak"?)`},
		{[]string{"store", "drain", "--status", "nonsense"}, `mc: store drain: invalid job id "nonsense"`},
		{[]string{"bench", "initiator", "--metadata_server", "10.0.0.1:2379"}, "mc: bench initiator: --metadata-server 10.0.0.1:2379 finds a target by its --segment_id: give --segment_id too"},
		{[]string{"bench", "--mode=initiator", "--metadata_server=10.0.0.1:2379"}, "mc: bench initiator: --metadata-server 10.0.0.1:2379 finds a target"},
		{[]string{"bench", "coll", "--store", "127.0.0.1:2379"}, "mc: bench coll: --store goes with --rank"},
		{[]string{"bench", "coll", "--group", "g"}, "mc: bench coll: --group goes with --rank"},
		{[]string{"bench", "coll", "--slots", "100"}, "mc: bench coll: invalid --slots 100: want 1 to 64"},
		{[]string{"serve", "store", "--enable-multi-tenants"}, "mc: serve store: --enable-multi-tenants needs --tenant-quota-connector-uri"},
		// A flag of another mode is refused rather than ignored.
		{[]string{"store", "drain", "--undo", "n:1", "--to", "m:1"}, "mc: store drain: --to sets up a new drain job; it does nothing with --undo"},
		{[]string{"store", "drain", "--cancel", "1-2", "--wait"}, "mc: store drain: --wait follows a job"},
		{[]string{"store", "ls", "--regex", "a", "--all-tenants"}, "mc: store ls: --all-tenants lists through the admin API"},
		{[]string{"store", "ls", "--protocol", "rdma"}, "mc: store ls: --protocol sets up the data path"},
		{[]string{"store", "stat", "--tenant", "a"}, "mc: store stat: --tenant picks the keys a verb uses; stat reports the whole pool"},
		{[]string{"bench", "target", "--tcp-lanes", "2"}, "mc: bench target: --tcp-lanes sets how an initiator's transfers go; a target starts none"},
		{[]string{"bench", "--mode=target", "--tcp_status_timeout_sec=5"}, "mc: bench target: --tcp-status-timeout-sec sets how an initiator's transfers go"},
		{[]string{"store", "drain", "n:1", "--tenant", "a"}, "mc: store drain: --tenant picks the keys a verb uses"},
		{[]string{"store", "tenants", "--tenant", "a"}, "mc: store tenants: --tenant picks the keys a verb uses"},
		{[]string{"store", "replay", "--trace", "x", "--device-name", "mlx5_0"}, "mc: store replay: --device-name concerns a running store"},
		{[]string{"store", "replay", "--trace", "x", "--online", "--eviction-high-watermark-ratio", "1.5"}, "mc: store replay: invalid --eviction-high-watermark-ratio 1.5"},
		{[]string{"bench", "store", "--master", "127.0.0.1:1", "--segment-size", "1K"}, "mc: bench store: --segment-size sizes the embedded store's segment"},
		{[]string{"bench", "initiator", "--min-rpc-port", "20000", "--max-rpc-port", "19000"}, "mc: bench initiator: --min-rpc-port 20000 and --max-rpc-port 19000: want"},
		// Aliases in gflags' form through --mode (before, a nil flag set
		// was looked up: a panic).
		{[]string{"bench", "--mode=initiator", "--cluster_id=x", "--threads=0"}, "mc: bench initiator: --threads 0 must be positive"},
		{[]string{"bench", "--mode=initiator", "--batch_size=0"}, "mc: bench initiator: --batch-size 0 must be positive"},
		// bench initiator's names work on bench store (and stay its own).
		{[]string{"bench", "store", "--batch-size", "0"}, "mc: bench store: invalid --batch 0"},
		{[]string{"bench", "store", "--operation", "sideways"}, `mc: bench store: invalid --op "sideways"`},
		{[]string{"bench", "initiator", "--batch-size", "0"}, "mc: bench initiator: --batch-size 0 must be positive"},
		{[]string{"bench", "initiator", "--metrics-listen", "bogus"}, `mc: bench initiator: invalid --metrics-listen "bogus"`},
		{[]string{"bench", "target", "--metrics-listen", "127.0.0.1:70000"}, `mc: bench target: invalid --metrics-listen "127.0.0.1:70000": port "70000"`},
		{[]string{"bench", "target", "--metadata-server", "bogus"}, `mc: bench target: invalid --metadata-server: metadata server "bogus"`},
		{[]string{"bench", "initiator", "--block-size", "4K,,8K"}, `mc: bench initiator: invalid argument "4K,,8K" for "--block-size" flag: item 2`},
		{[]string{"meta", "ls", "--metadata-server", "bogus"}, `mc: meta ls: invalid --metadata-server: metadata server "bogus"`},
		{[]string{"meta", "gc", "--metadata-server", "http://127.0.0.1:1/metadata"}, "mc: meta gc: an HTTP metadata server cannot list its segments"},
		{[]string{"meta", "ls", "--metadata-server", "http://127.0.0.1:1/metadata"}, "mc: meta ls: an HTTP metadata server cannot list its segments"},
		{[]string{"topo", "show", "--segment", "s", "--metadata-server", "redis://127.0.0.1:1"}, "mc: topo show: invalid --metadata-server"},
		{[]string{"serve", "metadata", "--backend", "http", "--quota-backend-bytes", "1G"}, "mc: serve metadata: --quota-backend-bytes applies to --backend etcd only"},
		{[]string{"bench", "coll", "--kill-after", "3"}, "mc: bench coll: --kill-after 3 goes with --kill-rank R"},
		{[]string{"bench", "coll", "--slots", "-1"}, "mc: bench coll: invalid --slots -1"},
		{[]string{"store", "exists", "k", "--master", "127.0.0.1:1", "--admin", "tcp://"}, `mc: store exists: "k": invalid --admin: admin URL "tcp://"`},
		{[]string{"store", "query", "k", "--admin", "http://127.0.0.1:1", "--master", "a:b:c"}, `mc: store query: invalid --master "a:b:c"`},
		{[]string{"store", "get", "k", "-o", ""}, `mc: store get: invalid --output "": want table or json`},
		{[]string{"bench", "--mode=initiator", "--mode=target"}, "mc: bench: --mode initiator and --mode target: give one"},
		{[]string{"bench", "initiator", "--bind-address", "mooncake://"}, `mc: bench initiator: invalid --bind-address "mooncake://"`},
		{[]string{"bench", "target", "--local-server-name", "127.0.0.1:-1"}, `mc: bench target: invalid --local-server-name "127.0.0.1:-1"`},
		{[]string{"bench", "store", "--batch", "9223372036854775807"}, "mc: bench store: invalid --batch 9223372036854775807: want 1 to"},
		{[]string{"bench", "store", "--master", "127.0.0.1:1", "--admin", "1e400"}, `mc: bench store: invalid --admin: admin URL "1e400"`},
		{[]string{"store", "stat", "--admin", "4K,,8K"}, `mc: store stat: invalid --admin: admin URL "4K,,8K"`},
		{[]string{"store", "stat", "--admin-token-file", "/nonexistent/token"}, "mc: store stat: --admin-token-file: open /nonexistent/token"},
		// Data-path flags of ls --regex are checked before any call.
		{[]string{"store", "ls", "--regex", "a", "--protocol", "etcd://"}, `mc: store ls: --regex: --protocol "etcd://" is not supported`},
		{[]string{"store", "ls", "--regex", "a", "--metadata-server", "foo://x"}, "mc: store ls: --regex: invalid --metadata-server"},
		{[]string{"store", "ls", "--regex", "a", "--bind-address", "notanip"}, `mc: store ls: --regex: invalid --bind-address "notanip"`},
		{[]string{"store", "exists", "k", "--admin-token-file", "/nonexistent/token"}, `mc: store exists: "k": --admin-token-file: open /nonexistent/token`},
		{[]string{"store", "get", "k", "--admin-token", "t", "--admin-token-file", "/etc/hostname"}, `mc: store get: "k": --admin-token and --admin-token-file both give the admin token`},
		{[]string{"serve", "store", "--config-path", "/nonexistent/master.json"}, "mc: serve store: --config-path: open /nonexistent/master.json"},
		{[]string{"sim", "conductor", "--trace", "/nonexistent/t.jsonl"}, "mc: sim conductor: --trace: "},
		{[]string{"store", "replay", "--trace", "/nonexistent/t.jsonl"}, "mc: store replay: --trace: open /nonexistent/t.jsonl"},
		{[]string{"store", "replay", "--trace", "/"}, "mc: store replay: --trace /: is a directory"},
		{[]string{"store", "put", "k", ""}, `mc: store put: "k": the value's FILE is empty`},
		{[]string{"store", "put", "k", "/nonexistent/v"}, `mc: store put: "k": value FILE: open /nonexistent/v`},
		{[]string{"bench", "initiator", "--plot", "/"}, "mc: bench initiator: --plot /: is a directory"},
		{[]string{"store", "tenants", "set", " ", "1G"}, `mc: store tenants set: invalid tenant " ": a tenant id of only spaces`},
		{[]string{"diag", "qp-leak", "--interval", "0"}, "mc: diag qp-leak: --interval is the sampling period of --watch"},
		{[]string{"diag", "qp-leak", "--rdma", diagTD + "leak/rdma.txt", "--per-qp"}, "mc: diag qp-leak: --per-qp applies when sampling this host"},
		{[]string{"diag", "qp-leak", "--rdma", diagTD + "leak/rdma.txt", "--rdma-bin", "/bin/true"}, "mc: diag qp-leak: --rdma-bin applies when sampling"},
		{[]string{"serve", "metadata", "--quota-backend-bytes", "9223372036854775807"}, "mc: serve metadata: --quota-backend-bytes 9223372036854775807: at most 8G"},
		{[]string{"serve", "metadata", "--listen", "127.0.0.1:99999"}, `mc: serve metadata: invalid --listen "127.0.0.1:99999": port "99999" is not 0-65535`},
		{[]string{"serve", "store", "--metadata-server", "etcd://nohost"}, "mc: serve store: invalid --metadata-server"},
		{[]string{"bench", "coll", "--rank", "0", "--world-size", "1", "--store", "bogus"}, "mc: bench coll: invalid --store"},
		{[]string{"store", "replay", "--trace", "t.jsonl", "--capacity-blocks", "99999999999999999999"}, `mc: store replay: invalid --capacity-blocks "99999999999999999999": too large`},
		{[]string{"bench", "coll", "--rank", "0", "--world-size", "1", "--store", "127.0.0.1:1", "--ranks", "2"}, "mc: bench coll: --ranks starts local ranks"},
	} {
		out, errs, code := execMC(t, c.args...)
		if code != exitUsage || !strings.HasPrefix(errs, c.want) || strings.Count(errs, "\n") != 1 || out != "" {
			t.Errorf("mc %s: exit %d, stdout %q, stderr %q; want 64 and %q", strings.Join(c.args, " "), code, out, errs, c.want)
		}
	}
	t.Setenv("MC_BENCH_THREADS", "many")
	if _, errs, code := execMC(t, "bench", "initiator"); code != exitUsage || !strings.Contains(errs, "$MC_BENCH_THREADS") {
		t.Errorf("MC_BENCH_THREADS=many: exit %d, stderr %q; want 64 naming the variable", code, errs)
	}
}

// Answers keep their codes: a failure that is not the caller's mistake
// exits 1, diag's unreadable input 3.
func TestRuntimeFailuresKeepTheirCodes(t *testing.T) {
	isolateEnv(t)
	dir := t.TempDir()
	if _, errs, code := execMC(t, "diag", "qp-leak", filepath.Join(dir, "missing.txt")); code != 3 || !strings.HasPrefix(errs, "mc: diag qp-leak: ") {
		t.Errorf("diag qp-leak on a missing file: exit %d, stderr %q; want 3", code, errs)
	}
	trace := filepath.Join(dir, "t.jsonl")
	if err := os.WriteFile(trace, []byte("not json\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, errs, code := execMC(t, "sim", "conductor", "--trace", trace); code != exitFailure || !strings.HasPrefix(errs, "mc: sim conductor: ") {
		t.Errorf("sim conductor on a bad trace: exit %d, stderr %q; want 1", code, errs)
	}
}

// The root help carries the exit-status table, as the README does.
func TestExitStatusTableDocumented(t *testing.T) {
	isolateEnv(t)
	out, _, code := execMC(t, "--help")
	if code != 0 || !strings.Contains(out, exitStatusHelp) {
		t.Errorf("mc --help lacks the exit status table:\n%s", out)
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(exitStatusHelp, "\n")[1:] {
		code := strings.Fields(line)[0]
		if _, err := strconv.Atoi(code); err != nil {
			continue // a continuation line
		}
		if !bytes.Contains(readme, []byte("| "+code+" |")) {
			t.Errorf("README's exit status table lacks a row for %s", code)
		}
	}
}

// A verb mistyped (its last letter dropped) is an unknown command, exit
// 64, whose suggestion names that verb (for "pt" it named "get").
func TestTypoSuggestsTheVerbOnEveryCommand(t *testing.T) {
	isolateEnv(t)
	n := 0
	for _, path := range commandPaths() {
		if len(path) == 0 || path[len(path)-1] == "help" || len(path[len(path)-1]) < 2 {
			continue
		}
		typo := append([]string(nil), path...)
		name := typo[len(typo)-1]
		typo[len(typo)-1] = name[:len(name)-1]
		out, errs, code := execMC(t, typo...)
		n++
		if code != exitUsage || !strings.Contains(errs, `unknown command "`+typo[len(typo)-1]+`"`) || !strings.Contains(errs, `"`+name+`"?`) || out != "" {
			t.Errorf("mc %s: exit %d, stderr %q; want 64 suggesting %q", strings.Join(typo, " "), code, errs, name)
		}
	}
	if n < 30 {
		t.Fatalf("only %d typos tried", n)
	}
}
