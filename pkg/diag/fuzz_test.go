package diag

import (
	"bytes"
	"strings"
	"testing"
)

// Seeds live in testdata/fuzz/<FuzzName>/ as well; these few keep each
// target meaningful on its own.

func FuzzParseResourceLine(f *testing.F) {
	f.Add([]byte("0: mlx5_0: pd 99 cq 95 qp 130763 cm_id 130810 mr 848 ctx 98"))
	f.Add([]byte("2: mlx5_2: pd 8056 cq 4030 qp 8053 cm_id 12079 mr 16159 ctx 4027 srq 2 "))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, ok := ParseResourceLine(b)
		if !ok {
			return
		}
		if d.QP < 0 || d.Name == "" || strings.ContainsAny(d.Name, " :") {
			t.Fatalf("accepted bad device %+v from %q", d, b)
		}
		// Whatever parses must also be counted when read as a snapshot.
		s, err := ReadSnapshot(bytes.NewReader(bytes.ReplaceAll(b, []byte("\n"), nil)), "fuzz")
		if err == nil && len(s.Devices) == 1 && s.Devices[0].QP != d.QP {
			t.Fatalf("line and snapshot disagree: %d vs %d", d.QP, s.Devices[0].QP)
		}
	})
}

func FuzzParseQPLine(f *testing.F) {
	f.Add([]byte("link mlx5_bond_0/1 lqpn 30278 rqpn 39296 type RC state RTS rq-psn 164604 sq-psn 658420 path-mig-state MIGRATED pdn 128 pid 61655 comm kucl-poll-event"))
	f.Add([]byte("link mlx5_0/- lqpn 1 type GSI state RTS sq-psn 0 comm [ib_core]"))
	f.Fuzz(func(t *testing.T, b []byte) {
		q, ok := ParseQPLine(b)
		if !ok {
			return
		}
		if q.NIC == "" || q.LQPN < 0 || q.State == "" || q.PID < -1 {
			t.Fatalf("accepted bad QP %+v from %q", q, b)
		}
	})
}

// fuzzSnapshot checks the invariants of ReadSnapshot on any input: no
// panic, counts never negative, bad input counted rather than fatal once
// something parsed.
func fuzzSnapshot(t *testing.T, b []byte) {
	s, err := ReadSnapshot(bytes.NewReader(b), "fuzz")
	if s == nil {
		if err == nil {
			t.Fatal("nil snapshot without error")
		}
		return
	}
	if s.Bad < 0 || s.Lines < 0 || s.Bad > s.Lines+1 {
		t.Fatalf("counts lines %d bad %d", s.Lines, s.Bad)
	}
	for _, d := range s.Devices {
		if d.QP < 0 || d.Name == "" {
			t.Fatalf("bad device %+v", d)
		}
	}
	var total int64
	for nic, n := range s.QPByNIC {
		if n <= 0 || nic == "" {
			t.Fatalf("bad per-QP tally %q=%d", nic, n)
		}
		total += n
	}
	if err == nil && s.Empty() {
		t.Fatal("empty snapshot without error")
	}
	_ = Analyze([]*Snapshot{s}, nil, Options{})
}

func FuzzReadSnapshotText(f *testing.F) {
	f.Add([]byte("0: mlx5_0: pd 99 cq 95 qp 130763 cm_id 130810 mr 848 ctx 98\n1: mlx5_1: pd 9 qp 3\n"))
	f.Fuzz(fuzzSnapshot)
}

func FuzzReadSnapshotJSON(f *testing.F) {
	f.Add([]byte(`[{"ifindex":0,"ifname":"mlx5_0","pd":99,"cq":95,"qp":130763,"cm_id":130810,"mr":848,"ctx":98}` + "\n" + `,{"ifindex":1,"ifname":"mlx5_1","qp":7}]`))
	f.Add([]byte(`{"ifname":"mlx5_0","qp":1}{"ifname":"mlx5_1","qp":"x"}`))
	f.Fuzz(fuzzSnapshot)
}

func FuzzReadQPText(f *testing.F) {
	f.Add([]byte("link mlx5_0/1 lqpn 30278 rqpn 39296 type RC state ERR pdn 128 pid 61655 comm python3\nlink mlx5_0/- lqpn 1 type GSI state RTS sq-psn 0 comm [ib_core]\n"))
	f.Fuzz(fuzzSnapshot)
}

func FuzzReadQPJSON(f *testing.F) {
	f.Add([]byte(`[{"ifindex":0,"ifname":"mlx5_0","port":1,"lqpn":30278,"rqpn":39296,"type":"RC","state":"ERR","pid":61655,"comm":"python3"},` + "\n" + `{"ifindex":0,"ifname":"mlx5_0","port":1,"lqpn":1,"type":"GSI","state":"RTS","comm":"ib_core"}]`))
	f.Fuzz(fuzzSnapshot)
}

// FuzzLogScanner feeds arbitrary bytes as a log: never a panic, and the
// line accounting always adds up.
func FuzzLogScanner(f *testing.F) {
	f.Add([]byte("I0307 09:05:03.000042   812 rdma_endpoint_store.cpp:171] decode-3@mlx5_0 evicted\n" +
		"E0307 09:05:04.000001  7777 worker_pool.cpp:245] Worker: Process failed for slice (opcode: 0, local_nic: mlx5_1, peer_nic: b@mlx5_1, retry_cnt: 0): transport retry counter exceeded\n" +
		"W20260307 09:05:05.000001 worker_pool.cpp:118] Rail paused: peer=b@mlx5_1 error_count=5 pause_ms=30000\n" +
		"W0307 09:05:06.000001 1 ep.cpp:1] Retiring endpoint instead of resetting it (triggered by: x): EndPoint: local a@mlx5_1, peer b@mlx5_1\n" +
		"E0307 09:05:07.000001 1 ep.cpp:1] Failed to create QP: Cannot allocate memory [12]\n" +
		"I0307 09:05:08.000001 1 te.cpp:1] Mooncake transfer engine v0.3.7.post2\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		sc := NewLogScanner()
		sc.Year = 2026
		if err := sc.Scan(bytes.NewReader(b), "fuzz"); err != nil {
			t.Fatal(err)
		}
		s := sc.Summary()
		st := s.Stats
		if st.GlogLines+st.OtherLines+st.Overlong != st.Lines {
			t.Fatalf("lines %d != glog %d + other %d + overlong %d", st.Lines, st.GlogLines, st.OtherLines, st.Overlong)
		}
		if st.InfoLines+st.WarningLines+st.ErrorLines+st.FatalLines != st.GlogLines {
			t.Fatalf("severities do not add up: %+v", st)
		}
		if st.Events+st.Unrecognised > st.GlogLines {
			t.Fatalf("more events than glog lines: %+v", st)
		}
		var ev int
		for _, p := range s.Peers {
			ev += p.Evictions
		}
		if ev != st.Evictions {
			t.Fatalf("peer evictions %d != %d", ev, st.Evictions)
		}
		attributed := s.UnattributedEvictions
		for _, n := range s.NICs {
			attributed += n.Evictions
		}
		if attributed != st.Evictions {
			t.Fatalf("attributed+unattributed %d != evictions %d", attributed, st.Evictions)
		}
		_ = Analyze(nil, s, Options{})
	})
}

// FuzzLogMessage puts arbitrary text behind a valid glog prefix, so the
// fuzzer spends its time in the catalogue's field parsing rather than on
// finding a prefix.
func FuzzLogMessage(f *testing.F) {
	for _, m := range []string{
		"decode-3@mlx5_0 evicted",
		"decode-9@mlx5_3 evicted local=prefill-0@mlx5_3",
		"Failed to create QP: Cannot allocate memory [12]",
		"Using SIEVE endpoint store nic=mlx5_0",
		"Worker: Cannot make connection for endpoint: decode-4@mlx5_1, mark it inactive",
		"Worker: Process failed for slice (opcode: 0, local_nic: mlx5_1, peer_nic: decode-3@mlx5_0, retry_cnt: 0): Work Request Flushed Error",
		"Worker: Timed out waiting for RDMA ready ACK for endpoint: decode-3@mlx5_0, deleting endpoint",
		"Retiring endpoint instead of resetting it (triggered by: cq error): EndPoint: local prefill-0@mlx5_2, peer decode-5@mlx5_2",
		"Rail paused: peer=decode-3@mlx5_0 error_count=5 pause_ms=30000",
		"Giving up after 9 retries (possible resource leak)",
		"Mooncake transfer engine v0.3.7.post2",
	} {
		f.Add(byte('I'), []byte(m))
	}
	f.Fuzz(func(t *testing.T, sev byte, msg []byte) {
		sc := NewLogScanner()
		sc.Year = 2026
		line := append([]byte{"IWEF"[int(sev)%4]}, "0307 09:00:00.000001  4101 x.cpp:1] "...)
		sc.Line(append(line, msg...))
		s := sc.Summary()
		if s.Stats.Lines != 1 || s.Stats.Events+s.Stats.Unrecognised > 1 {
			t.Fatalf("%+v", s.Stats)
		}
		_ = Analyze(nil, s, Options{})
	})
}
