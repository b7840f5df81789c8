package diag

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/diag/glog"
)

func TestParseResourceLine(t *testing.T) {
	d, ok := ParseResourceLine([]byte("2: mlx5_2: pd 8056 cq 4030 qp 8053 cm_id 12079 mr 16159 ctx 4027 srq 2 "))
	if !ok || d.Index != 2 || d.Name != "mlx5_2" || d.QP != 8053 || d.CTX != 4027 || d.SRQ != 2 || d.CMID != 12079 {
		t.Fatalf("%+v %v", d, ok)
	}
	// Older kernels: no ctx or srq; unknown keys are ignored.
	d, ok = ParseResourceLine([]byte("0: mlx5_0: pd 99 cq 95 qp 130763 cm_id 130810 mr 848 newthing 5"))
	if !ok || d.QP != 130763 || d.CTX != -1 || d.SRQ != -1 {
		t.Fatalf("%+v %v", d, ok)
	}
	for _, bad := range []string{"", "0: mlx5_0: pd 99", "x: mlx5_0: qp 1", "0: mlx5_0: qp", "0: mlx5_0: qp -1",
		"0: mlx5 0: qp 1", "0 mlx5_0 qp 1", "0: mlx5_0: qp 99999999999999999999"} {
		if d, ok := ParseResourceLine([]byte(bad)); ok {
			t.Errorf("%q accepted: %+v", bad, d)
		}
	}
}

func TestParseQPLine(t *testing.T) {
	q, ok := ParseQPLine([]byte("link mlx5_bond_0/1 lqpn 30278 rqpn 39296 type RC state RTS rq-psn 164604 sq-psn 658420 path-mig-state MIGRATED pdn 128 pid 61655 comm kucl-poll-event"))
	if !ok || q != (QP{NIC: "mlx5_bond_0", Port: 1, LQPN: 30278, Type: "RC", State: "RTS", PID: 61655, Comm: "kucl-poll-event"}) {
		t.Fatalf("%+v %v", q, ok)
	}
	q, ok = ParseQPLine([]byte("link mlx5_0/- lqpn 1 type GSI state RTS sq-psn 0 comm [ib_core]"))
	if !ok || q != (QP{NIC: "mlx5_0", LQPN: 1, Type: "GSI", State: "RTS", PID: -1, Comm: "[ib_core]"}) {
		t.Fatalf("%+v %v", q, ok)
	}
	for _, bad := range []string{"link", "link mlx5_0 lqpn 1 state RTS", "link mlx5_0/1 lqpn x state RTS",
		"link mlx5_0/1 type RC state RTS", "link mlx5_0/1 lqpn 1 type RC", "link /1 lqpn 1 state RTS", "link mlx5_0/1 lqpn 1 state RTS pid -3"} {
		if q, ok := ParseQPLine([]byte(bad)); ok {
			t.Errorf("%q accepted: %+v", bad, q)
		}
	}
}

func TestReadSnapshotBadInputCounted(t *testing.T) {
	in := "0: mlx5_0: pd 1 qp 10\ngarbage here\n1: mlx5_1: pd 1 qp\n" + strings.Repeat("x", lineBufSize+10) + "\n2: mlx5_2: qp 30\n"
	s, err := ReadSnapshot(strings.NewReader(in), "t")
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Devices) != 2 || s.Bad != 3 || len(s.Problems) != 3 || !strings.Contains(s.Problems[2], "longer than") {
		t.Fatalf("devices %d bad %d problems %q", len(s.Devices), s.Bad, s.Problems)
	}
	// JSON: a wrongly typed object is skipped, the rest kept; a syntax
	// error after some objects keeps them.
	s, err = ReadSnapshot(strings.NewReader(`[{"ifname":"a","qp":1},{"ifname":"b","qp":"many"},{"ifname":"c","qp":3},{"nothing":1}]`), "t")
	if err != nil || len(s.Devices) != 2 || s.Bad != 2 {
		t.Fatalf("typed: %v %+v", err, s)
	}
	s, err = ReadSnapshot(strings.NewReader(`[{"ifname":"a","qp":1},{"ifname":"b","qp":2`), "t")
	if err != nil || len(s.Devices) != 1 || s.Bad != 1 || !strings.Contains(s.Problems[0], "JSON broken") {
		t.Fatalf("truncated: %v %+v", err, s)
	}
	// Bare objects one after another, and several arrays.
	s, err = ReadSnapshot(strings.NewReader("{\"ifname\":\"a\",\"qp\":1}\n{\"ifname\":\"b\",\"qp\":2}\n"), "t")
	if err != nil || len(s.Devices) != 2 {
		t.Fatalf("bare: %v %+v", err, s)
	}
	s, err = ReadSnapshot(strings.NewReader("[{\"ifname\":\"a\",\"qp\":1}]\n[{\"ifname\":\"b\",\"qp\":2}]"), "t")
	if err != nil || len(s.Devices) != 2 {
		t.Fatalf("two arrays: %v %+v", err, s)
	}
	for _, in := range []string{"", "   \n", "garbage\n", "[", "[]", `{"x":1}`, "\x1f\x8b"} {
		if _, err := ReadSnapshot(strings.NewReader(in), "t"); err == nil {
			t.Errorf("%q: no error", in)
		}
	}
}

// Every message of the catalogue (spec/rdma.md), in Mooncake's spelling
// and in mc's slog spelling, lands in its counter with its peer and, when
// the line names it, its local NIC.
func TestCatalogue(t *testing.T) {
	log := `I0307 09:00:00.000001  4101 rdma_context.cpp:140] Using SIEVE endpoint store
I0307 09:00:00.000002 4101 rdma_context.cpp:140] Using FIFO endpoint store
I0307 09:00:01.000000  4101 rdma_endpoint_store.cpp:171] decode-3@mlx5_0 evicted
E0307 09:00:02.000000  4102 rdma_endpoint.cpp:77] Failed to create QP: Cannot allocate memory [12]
E0307 09:00:02.100000  4102 rdma_endpoint.cpp:77] Failed to create QP: Invalid argument [22]
W0307 09:00:03.000000  4103 worker_pool.cpp:90] Worker: Cannot make connection for endpoint: decode-4@mlx5_1, mark it inactive
E0307 09:00:04.000000  4104 worker_pool.cpp:245] Worker: Process failed for slice (opcode: 0, source_addr: 0x1, length: 65536, dest_addr: 0x2, local_nic: mlx5_1, peer_nic: decode-3@mlx5_0, dest_rkey: 1, retry_cnt: 0): transport retry counter exceeded
E0307 09:00:04.100000  4104 worker_pool.cpp:245] Worker: Process failed for slice (opcode: 0, source_addr: 0x1, length: 65536, dest_addr: 0x2, local_nic: mlx5_1, peer_nic: decode-3@mlx5_0, dest_rkey: 1, retry_cnt: 1): Work Request Flushed Error
E0307 09:00:05.000000  4105 worker_pool.cpp:301] Worker: Timed out waiting for RDMA ready ACK for endpoint: decode-3@mlx5_0, deleting endpoint
W0307 09:00:06.000000  4106 rdma_endpoint.cpp:300] Retiring endpoint instead of resetting it (triggered by: cq error): EndPoint: local prefill-0@mlx5_2, peer decode-5@mlx5_2
W0307 09:00:07.000000  4107 worker_pool.cpp:118] Rail paused: peer=decode-3@mlx5_0 error_count=5 pause_ms=30000
E0307 09:00:08.000000  4108 worker_pool.cpp:402] Giving up after 9 retries (possible resource leak)
I0307 09:00:09.000000  4108 x.cpp:1] cache entry evicted
I0307 09:00:09.000000  4108 x.cpp:1] Worker: started
E0307 09:00:10.000000  4108 x.cpp:1] Worker: Process failed for slice (opcode: 0
I0307 09:00:11.000000  4108 x.cpp:1] Using endpoint store
`
	sc := NewLogScanner()
	sc.Year = 2026
	if err := sc.Scan(strings.NewReader(log), "t"); err != nil {
		t.Fatal(err)
	}
	// mc's own lines, written by its Handler.
	var buf bytes.Buffer
	h := glog.NewHandler(&buf, &glog.Options{Now: func() time.Time { return time.Date(2026, 3, 7, 9, 1, 0, 0, time.UTC) }})
	l := slog.New(h)
	l.Info("decode-9@mlx5_3 evicted", "local", "prefill-0@mlx5_3")
	l.Info("Using SIEVE endpoint store", "nic", "mlx5_3")
	l.Warn("Rail paused", "peer", "decode-9@mlx5_3", "error_count", 5, "pause_ms", 30000)
	l.Error("Failed to create QP: Cannot allocate memory [12]", "local_nic", "mlx5_3") // as pkg/rdma writes it
	if err := sc.Scan(&buf, "mc"); err != nil {
		t.Fatal(err)
	}
	s := sc.Summary()
	st := s.Stats
	got := fmt.Sprintf("ev=%d qpf=%d enomem=%d conn=%d slice=%d ack=%d retire=%d pause=%d giveup=%d store=%d %v unrec=%d",
		st.Evictions, st.QPCreateFailures, st.QPCreateENOMEM, st.ConnFailures, st.SliceFailures, st.ReadyAckTimeouts,
		st.Retirements, st.RailPauses, st.GiveUps, st.StoreLines, st.StoreTypes, st.Unrecognised)
	want := "ev=2 qpf=3 enomem=2 conn=1 slice=2 ack=1 retire=1 pause=2 giveup=1 store=3 map[FIFO:1 SIEVE:2] unrec=2"
	if got != want {
		t.Errorf("counts\n got %s\nwant %s", got, want)
	}
	peer := map[string]*PeerEvents{}
	for _, p := range s.Peers {
		peer[p.Name] = p
	}
	d3 := peer["decode-3@mlx5_0"]
	// One eviction; deletions: the non-flush slice failure and the ACK
	// timeout; seen only with local mlx5_1, so its peer-only events go there.
	if d3 == nil || d3.Evictions != 1 || d3.Deletions != 2 || d3.SliceFailures != 2 || d3.RailPauses != 1 ||
		strings.Join(d3.LocalNICs, ",") != "mlx5_1" {
		t.Errorf("decode-3: %+v", d3)
	}
	if n := s.NICs["mlx5_1"]; n == nil || n.Evictions != 1 || n.Deletions != 2 || n.SliceFailures != 2 {
		t.Errorf("mlx5_1: %+v", n)
	}
	if n := s.NICs["mlx5_2"]; n == nil || n.Deletions != 1 {
		t.Errorf("mlx5_2 (retirement): %+v", n)
	}
	if n := s.NICs["mlx5_3"]; n == nil || n.Evictions != 1 || n.Store != "SIEVE" || n.QPCreateFailures != 1 {
		t.Errorf("mlx5_3 (mc attrs): %+v", n)
	}
	// decode-4's connection failure has no local NIC anywhere.
	if s.UnattributedDeletions != 1 || s.UnattributedEvictions != 0 {
		t.Errorf("unattributed %d/%d", s.UnattributedEvictions, s.UnattributedDeletions)
	}
	if st.EvictionsBeforeFirstQPFailure != 1 {
		t.Errorf("evictions before ENOMEM %d", st.EvictionsBeforeFirstQPFailure)
	}
	if st.FirstEvent == nil || !st.FirstEvent.Equal(time.Date(2026, 3, 7, 9, 0, 0, 1000, time.UTC)) {
		t.Errorf("first event %v", st.FirstEvent)
	}
}

func TestScannerOddLines(t *testing.T) {
	long := "I0307 09:00:00.000001 1 a.cc:1] " + strings.Repeat("a", lineBufSize) + " evicted\n"
	in := "\n\r\n" + long + "I0307 09:00:01.000000 1 a.cc:1] b@mlx5_0 evicted\r\nno newline at end: x@mlx5_0 evicted"
	sc := NewLogScanner()
	if err := sc.Scan(strings.NewReader(in), "t"); err != nil {
		t.Fatal(err)
	}
	st := sc.Summary().Stats
	if st.Overlong != 1 || st.Evictions != 1 || st.Lines != 5 || st.GlogLines != 1 || st.OtherLines != 3 {
		t.Fatalf("%+v", st)
	}
}
