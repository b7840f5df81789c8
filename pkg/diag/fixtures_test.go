package diag

import (
	"bytes"
	"compress/gzip"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/diag/glog"
)

// The fixtures under testdata/ are synthesised from the figures of the
// incident in spec/diag.md (no real log was available): `go test
// ./pkg/diag -run TestFixtures -regen-fixtures` writes them again, byte for
// byte, from a fixed seed. TestFixturesUpToDate fails when the files and
// the generator disagree, so neither can drift.
var regenFixtures = flag.Bool("regen-fixtures", false, "rewrite the synthesised fixtures in testdata/")

const fixtureHeader = "# synthesised by pkg/diag/fixtures_test.go from the QP-leak incident's figures (spec/diag.md); not a real capture"

// logWriter emits glog lines with advancing time, mixing catalogue lines
// with the noise a real transfer-engine log carries.
type logWriter struct {
	buf  bytes.Buffer
	t    time.Time
	rng  *rand.Rand
	year bool // "Iyyyymmdd" prefix
}

func (w *logWriter) line(sev byte, file string, msg string) {
	w.t = w.t.Add(time.Duration(w.rng.IntN(900_000)+1000) * time.Microsecond)
	var b []byte
	tid := 4100 + w.rng.IntN(48)
	if w.year {
		b = append(b, sev)
		b = append(b, w.t.Format("20060102")...)
		b = append(b, ' ')
		b = append(b, glog.AppendPrefix(nil, sev, w.t, tid, file)[6:]...)
	} else {
		b = glog.AppendPrefix(nil, sev, w.t, tid, file)
	}
	w.buf.Write(b)
	w.buf.WriteString(msg)
	w.buf.WriteByte('\n')
}

func (w *logWriter) noise() {
	switch w.rng.IntN(4) {
	case 0:
		w.line('I', "transfer_engine.cpp:312", fmt.Sprintf("Submitted batch %d with %d requests", w.rng.IntN(1<<20), 1+w.rng.IntN(128)))
	case 1:
		w.line('I', "rdma_transport.cpp:201", fmt.Sprintf("Registered memory region addr=0x7f%08x length=%d", w.rng.Uint32(), 1<<(20+w.rng.IntN(8))))
	case 2:
		w.line('I', "scheduler.py:88", "Prefill batch. #new-seq: 3, #new-token: 4096, #cached-token: 0")
	case 3:
		w.buf.WriteString(fmt.Sprintf("[2026-03-07 10:%02d:%02d] INFO: 10.0.0.%d - \"POST /generate HTTP/1.1\" 200 OK\n", w.rng.IntN(60), w.rng.IntN(60), w.rng.IntN(250)))
	}
}

func peerPath(node, dev int) string { return fmt.Sprintf("decode-%d@mlx5_%d", node, dev) }

func sliceFail(w *logWriter, local int, peer string, status string) {
	w.line('E', "worker_pool.cpp:245", fmt.Sprintf("Worker: Process failed for slice (opcode: 0, source_addr: 0x7f3a%08x, length: 65536, dest_addr: 0x7e11%08x, local_nic: mlx5_%d, peer_nic: %s, dest_rkey: %d, retry_cnt: %d): %s",
		w.rng.Uint32(), w.rng.Uint32(), local, peer, 2000+w.rng.IntN(9000), w.rng.IntN(3), status))
}

// leakLogs writes the incident: 1118 evictions, most of them of the failing
// peer decode-3's rails 0..3 (routed from local mlx5_0..3), slice failures
// and ready-ACK timeouts on those rails, then ENOMEM. withInfo=false drops
// every INFO line, as GLOG_minloglevel=1 would.
func leakLogs(withInfo bool) (part1, part2 []byte) {
	w := &logWriter{t: time.Date(2026, 3, 7, 8, 59, 58, 0, time.UTC), rng: rand.New(rand.NewPCG(7, 2))}
	w.buf.WriteString("Log file created at: 2026/03/07 08:59:58\nRunning on machine: prefill-0\nLog line format: [IWEF]mmdd hh:mm:ss.uuuuuu threadid file:line] msg\n")
	info := func(file, msg string) {
		if withInfo {
			w.line('I', file, msg)
		}
	}
	info("transfer_engine.cpp:61", "Mooncake transfer engine v0.3.7.post2 starting, local server prefill-0")
	for d := 0; d < 8; d++ {
		info("rdma_context.cpp:140", "Using SIEVE endpoint store")
	}
	evictions := 0
	var out [][]byte
	for step := 0; step < 1118; step++ {
		if step == 560 {
			out = append(out, append([]byte(nil), w.buf.Bytes()...))
			w.buf.Reset()
			w.year = true // the rotated-to file came from a newer glog
		}
		for k := 0; k < 3; k++ {
			if withInfo {
				w.noise()
			}
		}
		var victim string
		if w.rng.IntN(100) < 63 {
			victim = peerPath(3, w.rng.IntN(4))
		} else {
			victim = peerPath(w.rng.IntN(16), w.rng.IntN(8))
		}
		info("rdma_endpoint_store.cpp:171", victim+" evicted")
		evictions++
		if step%4 == 0 {
			rail := w.rng.IntN(4)
			sliceFail(w, rail, peerPath(3, rail), "transport retry counter exceeded")
			sliceFail(w, rail, peerPath(3, rail), "Work Request Flushed Error")
		}
		if step%9 == 0 {
			w.line('E', "worker_pool.cpp:301", "Worker: Timed out waiting for RDMA ready ACK for endpoint: "+peerPath(3, w.rng.IntN(4))+", deleting endpoint")
		}
		if step%25 == 0 {
			w.line('W', "worker_pool.cpp:118", fmt.Sprintf("Rail paused: peer=%s error_count=5 pause_ms=30000", peerPath(3, w.rng.IntN(4))))
		}
		if step%40 == 0 {
			w.line('W', "worker_pool.cpp:90", "Worker: Cannot make connection for endpoint: "+peerPath(3, w.rng.IntN(4))+", mark it inactive")
		}
		if step%150 == 0 {
			// Healthy peers on the other rails see the odd flushed WR.
			rail := 4 + w.rng.IntN(4)
			sliceFail(w, rail, peerPath(5, rail), "Work Request Flushed Error")
		}
	}
	// Garbage the scanner must count, not choke on.
	w.buf.WriteString("E0307 11:4\n\x00\x01\x02binary junk\x7f\n")
	w.line('E', "worker_pool.cpp:245", "Worker: Process failed for slice (opcode: 0, truncated")
	for i := 0; i < 37; i++ {
		w.line('E', "rdma_endpoint.cpp:77", "Failed to create QP: Cannot allocate memory [12]")
		w.line('W', "worker_pool.cpp:90", "Worker: Cannot make connection for endpoint: "+peerPath(6+i%8, i%4)+", mark it inactive")
		w.line('E', "worker_pool.cpp:402", "Giving up after 9 retries (possible resource leak)")
	}
	out = append(out, w.buf.Bytes())
	return out[0], out[1]
}

func healthyLogs() []byte {
	w := &logWriter{t: time.Date(2026, 3, 7, 9, 0, 0, 0, time.UTC), rng: rand.New(rand.NewPCG(11, 5))}
	w.buf.WriteString("mooncake-transfer-engine 0.3.11.post1\n")
	for d := 0; d < 8; d++ {
		w.line('I', "rdma_context.cpp:140", "Using SIEVE endpoint store")
	}
	for i := 0; i < 400; i++ {
		w.noise()
		if i%10 == 0 {
			w.line('I', "rdma_endpoint_store.cpp:171", peerPath(w.rng.IntN(8), w.rng.IntN(8))+" evicted")
		}
	}
	sliceFail(w, 2, peerPath(1, 2), "Work Request Flushed Error")
	w.line('W', "worker_pool.cpp:118", "Rail paused: peer="+peerPath(1, 2)+" error_count=5 pause_ms=30000")
	return w.buf.Bytes()
}

func rdmaText(qps []int64) []byte {
	var b bytes.Buffer
	for i, q := range qps {
		// Trailing space, as iproute2 prints it.
		fmt.Fprintf(&b, "%d: mlx5_%d: pd %d cq %d qp %d cm_id 0 mr %d ctx %d srq 0 \n", i, i, 12+i, q/2+40, q, 1600+i, 11)
	}
	return b.Bytes()
}

// rdmaJSON writes iproute2 >= 6.7's layout: one object per line inside
// the array.
func rdmaJSON(qps []int64) []byte {
	var b bytes.Buffer
	b.WriteString("[")
	for i, q := range qps {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, "{\"ifindex\":%d,\"ifname\":\"mlx5_%d\",\"pd\":%d,\"cq\":%d,\"qp\":%d,\"cm_id\":0,\"mr\":%d,\"ctx\":11,\"srq\":0}\n", i, i, 12+i, q/2+40, q, 1600+i)
	}
	b.WriteString("]\n")
	return b.Bytes()
}

var (
	leakQP    = []int64{22013, 21876, 22140, 21957, 6021, 5987, 6102, 5949}
	healthyQP = []int64{102, 98, 110, 96, 104, 100, 99, 101}
	growthQP  = [][]int64{
		{9000, 9012, 8990, 9031, 131, 129, 130, 128},
		{9600, 9607, 9588, 9640, 130, 131, 130, 128},
		{10250, 10230, 10241, 10262, 132, 129, 131, 130},
		{10880, 10871, 10850, 10902, 131, 130, 129, 131},
	}
)

// perQPText is `rdma resource show qp` with kernel QPs, a healthy second
// process, and pid 4242 holding thousands of QPs in ERR.
func perQPText(json bool) []byte {
	var b bytes.Buffer
	rng := rand.New(rand.NewPCG(3, 3))
	lqpn := 100
	type q struct {
		nic   int
		typ   string
		state string
		pid   int
		comm  string
	}
	var qs []q
	for nic := 0; nic < 2; nic++ {
		qs = append(qs, q{nic, "SMI", "RTS", -1, "ib_core"}, q{nic, "GSI", "RTS", -1, "ib_core"})
	}
	add := func(n, nic int, state string, pid int, comm string) {
		for i := 0; i < n; i++ {
			qs = append(qs, q{nic, "RC", state, pid, comm})
		}
	}
	add(60, 0, "RTS", 4242, "python3")
	add(50, 1, "RTS", 4242, "python3")
	add(1500, 0, "ERR", 4242, "python3")
	add(400, 1, "ERR", 4242, "python3")
	add(12, 0, "RESET", 4242, "python3")
	add(20, 1, "RTS", 5150, "ib_write_bw")
	if json {
		b.WriteString("[")
	}
	for i, x := range qs {
		lqpn += 1 + rng.IntN(3)
		n := lqpn
		if x.typ == "SMI" {
			n = 0
		} else if x.typ == "GSI" {
			n = 1
		}
		if json {
			if i > 0 {
				b.WriteString(",\n")
			}
			fmt.Fprintf(&b, `{"ifindex":%d,"ifname":"mlx5_%d","port":1,"lqpn":%d,"type":"%s","state":"%s","sq-psn":%d`, x.nic, x.nic, n, x.typ, x.state, rng.IntN(1<<20))
			if x.pid >= 0 {
				fmt.Fprintf(&b, `,"pdn":3,"pid":%d`, x.pid)
			}
			fmt.Fprintf(&b, `,"comm":"%s"}`, x.comm)
			continue
		}
		if x.pid < 0 {
			fmt.Fprintf(&b, "link mlx5_%d/1 lqpn %d type %s state %s sq-psn 0 comm [%s] \n", x.nic, n, x.typ, x.state, x.comm)
			continue
		}
		fmt.Fprintf(&b, "link mlx5_%d/1 lqpn %d rqpn %d type RC state %s rq-psn %d sq-psn %d path-mig-state MIGRATED pdn 3 pid %d comm %s \n",
			x.nic, n, 30000+rng.IntN(9000), x.state, rng.IntN(1<<20), rng.IntN(1<<20), x.pid, x.comm)
	}
	if json {
		b.WriteString("]\n")
	}
	return b.Bytes()
}

func gz(b []byte) []byte {
	var out bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&out, gzip.BestCompression)
	zw.Write(b)
	zw.Close()
	return out.Bytes()
}

// fixtureFiles maps testdata-relative paths to contents. Text fixtures
// carry the synthesised header (rdma and glog parsers count it as one
// unparsed line, which the goldens show).
func fixtureFiles() map[string][]byte {
	hdr := []byte(fixtureHeader + "\n")
	l1, l2 := leakLogs(true)
	n1, n2 := leakLogs(false)
	m := map[string][]byte{
		"leak/rdma.txt":                 append(append([]byte(nil), hdr...), rdmaText(leakQP)...),
		"leak/rdma.json":                rdmaJSON(leakQP),
		"leak/prefill-0.INFO.1.gz":      gz(append(append([]byte(nil), hdr...), l1...)),
		"leak/prefill-0.INFO":           l2,
		"healthy/rdma.txt":              append(append([]byte(nil), hdr...), rdmaText(healthyQP)...),
		"healthy/prefill-0.INFO":        append(append([]byte(nil), hdr...), healthyLogs()...),
		"leak-noinfo/prefill-0.WARNING": append(append(append([]byte(nil), hdr...), n1...), n2...),
		"perqp/rdma-qp.txt":             append(append([]byte(nil), hdr...), perQPText(false)...),
		"perqp/rdma-qp.json":            perQPText(true),
		"README.md":                     []byte(readme),
	}
	for i, q := range growthQP {
		m[fmt.Sprintf("growth/rdma-%d.json", i+1)] = rdmaJSON(q)
	}
	return m
}

const readme = `# pkg/diag test fixtures

` + fixtureHeader + `.

All inputs here are synthesised by fixtures_test.go from the figures of the
QP-leak incident (spec/diag.md): about 22K QPs on mlx5_0..3 and 6K on
mlx5_4..7, 1118 eviction lines, then "Failed to create QP: Cannot allocate
memory [12]". Regenerate with:

    go test ./pkg/diag -run TestFixturesUpToDate -regen-fixtures

- leak/: the incident (rdma text and JSON, a gzip'd rotated log plus the
  current one, with Iyyyymmdd prefixes in the second).
- healthy/: a cluster where QPs match live endpoints.
- leak-noinfo/: the incident logged with INFO off (GLOG_minloglevel=1).
- growth/: four snapshots ten minutes apart, QPs rising on four NICs.
- perqp/: rdma resource show qp, with thousands of ERR QPs owned by one pid.
- golden/: the expected reports (go test ./pkg/diag -update).
- fuzz/: seed corpora for the fuzz tests.
`

func TestFixturesUpToDate(t *testing.T) {
	for rel, want := range fixtureFiles() {
		path := filepath.Join("testdata", rel)
		if *regenFixtures {
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, want, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (run with -regen-fixtures)", err)
		}
		if strings.HasSuffix(rel, ".gz") {
			got, want = gunzip(t, got), gunzip(t, want)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from its generator (run with -regen-fixtures and review)", path)
		}
	}
}

func gunzip(t *testing.T, b []byte) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if _, err := out.ReadFrom(zr); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}
