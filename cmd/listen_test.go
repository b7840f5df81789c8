package cmd

import (
	"bufio"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// listenAddrs is the local addresses of this network namespace's TCP
// sockets listening on port, as /proc/net/tcp{,6} list them (IPv4 in
// dotted form, IPv6 in hex).
func listenAddrs(t *testing.T, port int) []string {
	t.Helper()
	var out []string
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		fh, err := os.Open(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) < 4 || fs[3] != "0A" { // TCP_LISTEN
				continue
			}
			host, p, ok := strings.Cut(fs[1], ":")
			if n, err := strconv.ParseUint(p, 16, 16); !ok || err != nil || int(n) != port {
				continue
			}
			if len(host) == 8 {
				v, _ := strconv.ParseUint(host, 16, 32)
				host = fmt.Sprintf("%d.%d.%d.%d", v&0xff, v>>8&0xff, v>>16&0xff, v>>24)
			}
			out = append(out, host)
		}
		fh.Close()
	}
	return out
}

// TestServeStoreListensWhereAsked: MC_TCP_BIND_ADDRESS (Mooncake's) puts
// the node's handshake and data listeners on that address, and
// --metrics-address the admin port, even with --rpc_address 0.0.0.0
// (issue 40: both listened on every interface, the variable ignored).
func TestServeStoreListensWhereAsked(t *testing.T) {
	isolateEnv(t)
	t.Setenv("MC_TCP_BIND_ADDRESS", "127.0.0.1")
	rpc, admin, out, _ := startServeStore(t, "--segment-size", "8M", "--rpc_address", "0.0.0.0", "--metrics-address", "127.0.0.1")
	_ = rpc
	adminPort, _ := strconv.Atoi(admin[strings.LastIndex(admin, ":")+1:])
	if got := listenAddrs(t, adminPort); len(got) != 1 || got[0] != "127.0.0.1" {
		t.Fatalf("admin port %d listens on %v, want [127.0.0.1]", adminPort, got)
	}
	// The segment's endpoint is host:handshake port.
	re := regexp.MustCompile(`reached at [^ ]*:(\d+) over`)
	var m []string
	for deadline := time.Now().Add(10 * time.Second); m == nil && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		m = re.FindStringSubmatch(out.String())
	}
	if m == nil {
		t.Fatalf("no segment line in:\n%s", out.String())
	}
	hs, _ := strconv.Atoi(m[1])
	if got := listenAddrs(t, hs); len(got) != 1 || got[0] != "127.0.0.1" {
		t.Fatalf("handshake port %d listens on %v, want [127.0.0.1]\n%s", hs, got, out.String())
	}
	resp, err := http.Get(admin + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
}

// TestAdminTokenCLI: serve store --admin-token-file refuses remove_all
// without the token (401, JSON), mc store drain without it says what is
// missing, and with MC_ADMIN_TOKEN it gets through (issue 40).
func TestAdminTokenCLI(t *testing.T) {
	isolateEnv(t)
	tf := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tf, []byte("t0ken\n"), 0o600)
	rpc, admin, out, _ := startServeStore(t, "--segment-size", "8M", "--admin-token-file", tf)
	if strings.Contains(out.String(), "has no token") {
		t.Fatalf("warned about a missing token:\n%s", out.String())
	}
	resp, err := http.Post(admin+"/api/v1/remove_all", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		t.Fatalf("remove_all without the token: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	m := []string{"--master", rpc, "--admin", admin}
	_, errs, code := execMC(t, append([]string{"store", "drain", "--cancel", "1-2"}, m...)...)
	if code != 1 || !strings.Contains(errs, "HTTP 401") || !strings.Contains(errs, "--admin-token") {
		t.Fatalf("drain --cancel without the token: %d %q", code, errs)
	}
	t.Setenv("MC_ADMIN_TOKEN", "t0ken")
	_, errs, code = execMC(t, append([]string{"store", "drain", "--cancel", "1-2"}, m...)...)
	if code == 0 || strings.Contains(errs, "401") {
		t.Fatalf("drain --cancel with the token: %d %q, want the job's own error", code, errs)
	}
	_, errs, code = execMC(t, append([]string{"store", "drain", "--cancel", "1-2", "--admin-token", "x", "--admin-token-file", tf}, m...)...)
	if code != exitUsage {
		t.Fatalf("both token flags: %d %q, want %d", code, errs, exitUsage)
	}
}
