package cmd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine/meta"
	"github.com/kvcache-ops/mc/pkg/topo"
	"github.com/kvcache-ops/mc/pkg/topo/topotest"
)

func fixtureRoot(t *testing.T, name string) string {
	t.Helper()
	return topotest.Tree(t, filepath.Join("..", "pkg", "topo", "testdata", name+".sysfs"))
}

func goldenMatrix(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "pkg", "topo", "testdata", name+".matrix.golden"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// --output json prints exactly the matrix file, byte for byte the golden
// one, and nothing else on stdout.
func TestTopoDiscoverJSON(t *testing.T) {
	isolateEnv(t)
	for _, name := range []string{"dgx-h100", "cpu-2s-4nic", "port-down", "numa-unknown"} {
		root := fixtureRoot(t, name)
		out, _, err := runCmd(t, "topo", "discover", "--sysfs-root", root, "-o", "json")
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if want := goldenMatrix(t, name); out != want {
			t.Errorf("%s: stdout\n%s\nwant\n%s", name, out, want)
		}
		if _, err := topo.ParseMatrix([]byte(out)); err != nil {
			t.Errorf("%s: output does not load: %v", name, err)
		}
	}
}

func TestTopoDiscoverTable(t *testing.T) {
	isolateEnv(t)
	root := fixtureRoot(t, "dgx-h100")
	out, errOut, err := runCmd(t, "topo", "discover", "--sysfs_root", root)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(out, "\n")
	var header, cuda0, mlx10 string
	for _, l := range lines {
		switch {
		case strings.Contains(l, "location") && header == "":
			header = l
		case strings.Contains(l, "cuda:0 "):
			cuda0 = l
		case strings.Contains(l, "│ mlx5_10 "):
			mlx10 = l
		}
	}
	// NICs in natural order: mlx5_9 before mlx5_10.
	if i9, i10 := strings.Index(header, "mlx5_9 "), strings.Index(header, "mlx5_10 "); i9 < 0 || i10 < 0 || i9 > i10 {
		t.Errorf("header not in natural order: %q", header)
	}
	for _, want := range []string{"0000:13:00.0", "PIX*", "NODE ", "SYS ", "PIX, best of NICs on node 0"} {
		if !strings.Contains(cuda0, want) {
			t.Errorf("cuda:0 row lacks %q: %q", want, cuda0)
		}
	}
	if strings.Count(cuda0, "*") != 1 {
		t.Errorf("cuda:0 should mark exactly one preferred NIC: %q", cuda0)
	}
	for _, want := range []string{"0000:ba:00.0", "ACTIVE", "Ethernet", "200 Gb/sec (4X HDR)", "enp186s0f0np0", "yes"} {
		if !strings.Contains(mlx10, want) {
			t.Errorf("mlx5_10 row lacks %q: %q", want, mlx10)
		}
	}
	if !strings.Contains(out, "PIX same PCIe switch") {
		t.Error("no legend")
	}
	if errOut != "" {
		t.Errorf("stderr %q, want nothing on a clean host", errOut)
	}
}

func TestTopoDiscoverPortDown(t *testing.T) {
	isolateEnv(t)
	root := fixtureRoot(t, "port-down")
	out, errOut, err := runCmd(t, "topo", "discover", "--sysfs-root", root)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "(PIX)") || !strings.Contains(out, "no: no usable port (port 1 DOWN)") {
		t.Errorf("table does not show the unused NIC and why:\n%s", out)
	}
	if !strings.Contains(errOut, "note: mlx5_1 left out: no usable port (port 1 DOWN)") {
		t.Errorf("stderr %q", errOut)
	}
	out, _, err = runCmd(t, "topo", "discover", "--sysfs-root", root, "--include-inactive", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	if want := goldenMatrix(t, "port-down.include-inactive"); out != want {
		t.Errorf("--include-inactive: %s, want %s", out, want)
	}
}

func TestTopoDiscoverNoNICs(t *testing.T) {
	isolateEnv(t)
	root := fixtureRoot(t, "no-nics")
	var stdout, stderr strings.Builder
	code := Execute(context.Background(), []string{"topo", "discover", "--sysfs-root", root, "-o", "json"}, &stdout, &stderr)
	if code != 0 || stdout.String() != "{}\n" {
		t.Errorf("exit %d, stdout %q; want 0 and an empty matrix", code, stdout.String())
	}
	if !strings.Contains(stderr.String(), "note: no RDMA devices") {
		t.Errorf("stderr %q, want a note", stderr.String())
	}
	// An empty matrix is not written where an engine would load it.
	file := filepath.Join(t.TempDir(), "nic_priority.json")
	stdout.Reset()
	stderr.Reset()
	code = Execute(context.Background(), []string{"topo", "discover", "--sysfs-root", root, "--write", file}, &stdout, &stderr)
	if _, err := os.Stat(file); code != 1 || err == nil || !strings.Contains(stderr.String(), "mc: topo discover: no RDMA NIC found: did not write an empty matrix to "+file) {
		t.Errorf("--write with no NIC: exit %d, file written %v, stderr %q; want exit 1, no file, and why", code, err == nil, stderr.String())
	}
	// With -o json: one JSON document on stdout, the error's. Before, the
	// empty matrix came first, then the error object.
	stdout.Reset()
	stderr.Reset()
	code = Execute(context.Background(), []string{"topo", "discover", "--sysfs-root", root, "--write", file, "-o", "json"}, &stdout, &stderr)
	var e struct {
		Error    string `json:"error"`
		ExitCode int    `json:"exit_code"`
	}
	if err := json.Unmarshal([]byte(stdout.String()), &e); code != 1 || err != nil || !strings.Contains(e.Error, "no RDMA NIC found") {
		t.Errorf("--write -o json with no NIC: exit %d, stdout %q (%v); want one error object", code, stdout.String(), err)
	}
}

// A filter none of whose names is a NIC here is refused, naming the NICs.
// Before, every NIC was left out and an empty matrix printed, exit 0.
func TestTopoDiscoverFilterTypo(t *testing.T) {
	isolateEnv(t)
	root := fixtureRoot(t, "dgx-h100")
	var stdout, stderr strings.Builder
	code := Execute(context.Background(), []string{"topo", "discover", "--sysfs-root", root, "--filter", "bogus0"}, &stdout, &stderr)
	if code != exitUsage || !strings.Contains(stderr.String(), "bogus0") || !strings.Contains(stderr.String(), "mlx5_0") {
		t.Errorf("--filter bogus0: exit %d, stderr %q; want %d naming the filter and the NICs", code, stderr.String(), exitUsage)
	}
	// One right name among wrong ones keeps that NIC (the rest are notes).
	stdout.Reset()
	stderr.Reset()
	code = Execute(context.Background(), []string{"topo", "discover", "--sysfs-root", root, "--filter", "bogus0,mlx5_1", "-o", "json"}, &stdout, &stderr)
	if m, err := topo.ParseMatrix([]byte(stdout.String())); code != 0 || err != nil || strings.Join(m.NICs(), ",") != "mlx5_1" || !strings.Contains(stderr.String(), "bogus0") {
		t.Errorf("--filter bogus0,mlx5_1: exit %d, stdout %q, stderr %q", code, stdout.String(), stderr.String())
	}
}

// --filter and MC_TE_FILTERS keep a subset; the flag wins over the env.
func TestTopoDiscoverFilter(t *testing.T) {
	isolateEnv(t)
	root := fixtureRoot(t, "dgx-h100")
	parse := func(out string) topo.Matrix {
		t.Helper()
		m, err := topo.ParseMatrix([]byte(out))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	t.Setenv("MC_TE_FILTERS", "mlx5_0,mlx5_4")
	out, _, err := runCmd(t, "topo", "discover", "--sysfs-root", root, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	if got := parse(out).NICs(); strings.Join(got, ",") != "mlx5_0,mlx5_4" {
		t.Errorf("MC_TE_FILTERS: NICs %v", got)
	}
	out, _, err = runCmd(t, "topo", "discover", "--sysfs-root", root, "-o", "json", "--filter", "mlx5_10,mlx5_2")
	if err != nil {
		t.Fatal(err)
	}
	m := parse(out)
	if got := m.NICs(); strings.Join(got, ",") != "mlx5_2,mlx5_10" {
		t.Errorf("--filter: NICs %v", got)
	}
	if e := m["cuda:2"]; strings.Join(e.Preferred, ",") != "mlx5_2" {
		t.Errorf("cuda:2 = %+v", e)
	}
}

func TestTopoDiscoverWrite(t *testing.T) {
	isolateEnv(t)
	root := fixtureRoot(t, "cpu-2s-4nic")
	file := filepath.Join(t.TempDir(), "matrix.json")
	if err := os.WriteFile(file, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut, err := runCmd(t, "topo", "discover", "--sysfs-root", root, "--write", file)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != goldenMatrix(t, "cpu-2s-4nic") {
		t.Errorf("written file:\n%s", b)
	}
	if !strings.Contains(out, "NIC priority matrix") || !strings.Contains(errOut, "wrote the priority matrix to "+file) {
		t.Errorf("stdout %q stderr %q", out, errOut)
	}
	if m, err := topo.ReadMatrixFile(file); err != nil || len(m) != 2 {
		t.Errorf("reload: %v %v", m, err)
	}
	entries, _ := os.ReadDir(filepath.Dir(file))
	if len(entries) != 1 {
		t.Errorf("temporary files left behind: %v", entries)
	}
	_, _, err = runCmd(t, "topo", "discover", "--sysfs-root", root, "--write", filepath.Join(t.TempDir(), "no", "such", "dir", "m.json"))
	if err == nil || !strings.Contains(err.Error(), "write matrix") {
		t.Errorf("unwritable --write: %v", err)
	}
}

func TestTopoDiscoverErrors(t *testing.T) {
	isolateEnv(t)
	missing := filepath.Join(t.TempDir(), "missing")
	escape := topotest.TreeString(t, "d sys/devices/system/node/node0\nl sys/class/infiniband/mlx5_0 ../../../../..\n")
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"topo", "discover", "--sysfs-root", missing}, "mc: topo discover: sysfs root " + `"` + missing},
		{[]string{"topo", "discover", "--sysfs-root", escape}, "mc: topo discover: NIC mlx5_0: resolve"},
		{[]string{"topo", "discover", "extra"}, `mc: topo discover: unexpected argument "extra"`},
		{[]string{"topo", "show"}, "mc: topo show: --segment is required"},
		{[]string{"topo", "show", "--segment", "x"}, "mc: topo show: --metadata-server is required"},
		{[]string{"topo", "show", "--segment", "x", "--metadata-server", "redis://h:1"}, "mc: topo show: invalid --metadata-server: metadata server"},
	}
	for _, c := range cases {
		var out, errb strings.Builder
		code := Execute(context.Background(), c.args, &out, &errb)
		wantCode := exitFailure
		if strings.Contains(c.want, "is required") || strings.Contains(c.want, "unexpected argument") || strings.Contains(c.want, "invalid --") {
			wantCode = exitUsage
		}
		if code != wantCode || !strings.HasPrefix(errb.String(), c.want) || strings.Count(errb.String(), "\n") != 1 {
			t.Errorf("%v: exit %d stderr %q, want %d and one line starting %q", c.args, code, errb.String(), wantCode, c.want)
		}
	}
}

func rdmaSegment() *meta.SegmentDesc {
	return &meta.SegmentDesc{
		Name: "prefill-0", Protocol: "rdma", Timestamp: "2026-08-01 12:00:00.000002", TCPProtoVersion: 1,
		Devices: []meta.DeviceDesc{
			{Name: "mlx5_0", LID: 1, GID: "fe:80:00:00:00:00:00:00:00:00:00:00:00:00:00:01"},
			{Name: "mlx5_10", LID: 2, GID: "fe:80:00:00:00:00:00:00:00:00:00:00:00:00:00:02"},
		},
		Buffers: []meta.BufferDesc{{Name: "cpu:0", Addr: 0x7f0000000000, Length: 4096, Rkey: []uint32{1, 2}, Lkey: []uint32{3, 4}}},
		PriorityMatrix: topo.Matrix{
			"cpu:0":  {Preferred: []string{"mlx5_0"}, Accessible: []string{"mlx5_10"}},
			"cuda:0": {Preferred: []string{"mlx5_10"}, Accessible: []string{"mlx5_0", "mlx5_3"}},
		},
	}
}

func publish(t *testing.T, server string, d *meta.SegmentDesc) {
	t.Helper()
	ctx := context.Background()
	b, err := meta.Open(ctx, server, meta.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.PutSegment(ctx, d); err != nil {
		t.Fatal(err)
	}
}

func checkShow(t *testing.T, server string) {
	t.Helper()
	seg := rdmaSegment()
	publish(t, server, seg)
	want, err := seg.PriorityMatrix.MarshalFile()
	if err != nil {
		t.Fatal(err)
	}
	out, errOut, err := runCmd(t, "topo", "show", "--segment", "prefill-0", "--metadata_server", server, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	if out != string(want) {
		t.Errorf("json: %s, want %s", out, want)
	}
	if !strings.Contains(errOut, "mlx5_3, which segment \"prefill-0\" does not publish") {
		t.Errorf("stderr %q: want a note about the NIC without a device", errOut)
	}
	out, _, err = runCmd(t, "topo", "show", "--segment", "prefill-0", "--metadata-server", server)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"segment prefill-0 (rdma), published 2026-08-01 12:00:00.000002\n", "fe:80:00:00:00:00:00:00:00:00:00:00:00:00:00:02", "cuda:0"} {
		if !strings.Contains(out, w) {
			t.Errorf("table lacks %q:\n%s", w, out)
		}
	}
	// Columns in natural order, mlx5_3 (named only in the matrix) included.
	if i0, i3, i10 := strings.Index(out, "mlx5_0 "), strings.Index(out, "mlx5_3 "), strings.Index(out, "mlx5_10 "); !(i0 >= 0 && i0 < i3 && i3 < i10) {
		t.Errorf("columns not in natural order:\n%s", out)
	}

	tcp := &meta.SegmentDesc{Name: "decode-0", Protocol: "tcp", TCPDataPort: 15000, TCPProtoVersion: 2,
		Buffers: []meta.BufferDesc{{Name: "decode-0", Addr: 4096, Length: 4096}}}
	publish(t, server, tcp)
	out, errOut, err = runCmd(t, "topo", "show", "--segment", "decode-0", "--metadata-server", server, "-o", "json")
	if err != nil || out != "{}\n" || !strings.Contains(errOut, "published no priority matrix") {
		t.Errorf("tcp segment: %q %q %v", out, errOut, err)
	}
	// The table form says why there is nothing, instead of empty tables.
	out, errOut, err = runCmd(t, "topo", "show", "--segment", "decode-0", "--metadata-server", server)
	if err != nil || !strings.Contains(out, "a TCP segment has no NIC priority matrix") || strings.Contains(out, "┌") || errOut != "" {
		t.Errorf("tcp segment table: %v\n%s\nstderr %q", err, out, errOut)
	}

	_, _, err = runCmd(t, "topo", "show", "--segment", "absent", "--metadata-server", server)
	if !errors.Is(err, meta.ErrNotFound) || !strings.Contains(err.Error(), `"absent"`) {
		t.Errorf("absent segment: %v", err)
	}
}

func TestTopoShowHTTP(t *testing.T) {
	isolateEnv(t)
	srv := httptest.NewServer(meta.NewHTTPHandler())
	defer srv.Close()
	checkShow(t, srv.URL+"/metadata")
}

func TestTopoShowEtcd(t *testing.T) {
	isolateEnv(t)
	ee, err := meta.StartEtcd(context.Background(), meta.EtcdConfig{Listen: "127.0.0.1:0", NoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ee.Close()
	checkShow(t, strings.Join(ee.Endpoints(), ","))
}

// MC_METADATA_CLUSTER_ID namespaces the keys, as in Mooncake.
func TestTopoShowClusterID(t *testing.T) {
	isolateEnv(t)
	srv := httptest.NewServer(meta.NewHTTPHandler())
	defer srv.Close()
	server := srv.URL + "/metadata"
	ctx := context.Background()
	b, err := meta.Open(ctx, server, meta.Options{ClusterID: "blue"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.PutSegment(ctx, rdmaSegment()); err != nil {
		t.Fatal(err)
	}
	if _, _, err := runCmd(t, "topo", "show", "--segment", "prefill-0", "--metadata-server", server); !errors.Is(err, meta.ErrNotFound) {
		t.Errorf("without cluster id: %v", err)
	}
	t.Setenv("MC_METADATA_CLUSTER_ID", "blue")
	out, _, err := runCmd(t, "topo", "show", "--segment", "prefill-0", "--metadata-server", server, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(out), &m); err != nil || len(m) != 2 {
		t.Errorf("with MC_METADATA_CLUSTER_ID: %q %v", out, err)
	}
	t.Setenv("MC_METADATA_CLUSTER_ID", "")
	// bench and meta spell the flag --metadata-cluster-id: topo show
	// takes both spellings, as they do.
	for _, flag := range []string{"--metadata-cluster-id", "--metadata_cluster_id", "--cluster-id", "--cluster_id"} {
		if _, _, err := runCmd(t, "topo", "show", "--segment", "prefill-0", "--metadata-server", server, flag, "blue"); err != nil {
			t.Errorf("topo show %s blue: %v", flag, err)
		}
	}
}

// Every command that names the metadata key namespace takes both
// spellings, --metadata-cluster-id and --cluster-id; serve store's own
// --cluster-id (the store's cluster) stays its own.
func TestClusterIDSpellings(t *testing.T) {
	isolateEnv(t)
	for _, path := range [][]string{{"topo", "show"}, {"meta", "ls"}, {"meta", "show"}, {"meta", "gc"}, {"bench", "initiator"}, {"bench", "target"}} {
		for _, flag := range []string{"--metadata-cluster-id", "--cluster-id", "--cluster_id"} {
			root := newRootCmd(&printer{Out: &bytes.Buffer{}, Err: &bytes.Buffer{}})
			c, _, err := root.Find(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.ParseFlags([]string{flag, "blue"}); err != nil {
				t.Errorf("mc %s %s: %v", strings.Join(path, " "), flag, err)
				continue
			}
			if f := c.Flags().Lookup("metadata-cluster-id"); f == nil || f.Value.String() != "blue" {
				t.Errorf("mc %s %s blue: --metadata-cluster-id not set", strings.Join(path, " "), flag)
			}
		}
	}
	root := newRootCmd(&printer{Out: &bytes.Buffer{}, Err: &bytes.Buffer{}})
	c, _, _ := root.Find([]string{"serve", "store"})
	if err := c.ParseFlags([]string{"--cluster-id", "blue"}); err != nil || c.Flags().Lookup("cluster-id").Value.String() != "blue" {
		t.Errorf("serve store --cluster-id: %v", err)
	}
}
