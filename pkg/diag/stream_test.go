package diag

import (
	"io"
	"runtime"
	"strings"
	"testing"
)

// repeatReader yields head, then body n times, then tail, without ever
// holding more than one copy: a stand-in for a file far larger than the
// memory the parser may use.
type repeatReader struct {
	parts []string
	n     int
	i     int
	cur   *strings.Reader
}

func newRepeat(head, body string, n int, tail string) *repeatReader {
	return &repeatReader{parts: []string{head, body, tail}, n: n, cur: strings.NewReader("")}
}

func (r *repeatReader) Read(p []byte) (int, error) {
	for {
		if r.cur.Len() > 0 {
			return r.cur.Read(p)
		}
		switch {
		case r.i == 0:
			r.cur.Reset(r.parts[0])
			r.i = 1
		case r.i <= r.n:
			r.cur.Reset(r.parts[1])
			r.i++
		case r.i == r.n+1:
			r.cur.Reset(r.parts[2])
			r.i++
		default:
			return 0, io.EOF
		}
	}
}

func allocDuring(f func()) uint64 {
	var a, b runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&a)
	f()
	runtime.ReadMemStats(&b)
	return b.TotalAlloc - a.TotalAlloc
}

// Parsers stream: what they allocate does not grow with the input.
func TestParsersStream(t *testing.T) {
	const mb = 1 << 20
	logBody := "I0307 09:00:00.000001  4101 transfer_engine.cpp:312] Submitted batch 1 with 4 requests\n" +
		"I0307 09:00:00.000002  4101 rdma_endpoint_store.cpp:171] decode-3@mlx5_0 evicted\n" +
		"[2026-03-07 10:00:00] INFO: 10.0.0.1 - \"POST /generate HTTP/1.1\" 200 OK\n"
	n := 32 * mb / len(logBody)
	var sc *LogScanner
	alloc := allocDuring(func() {
		sc = NewLogScanner()
		sc.Year = 2026
		if err := sc.Scan(newRepeat("", logBody, n, ""), "big"); err != nil {
			t.Fatal(err)
		}
	})
	if sc.st.Evictions != n {
		t.Fatalf("evictions %d want %d", sc.st.Evictions, n)
	}
	if alloc > 4*mb {
		t.Errorf("scanning 32 MB of log allocated %d bytes; the scanner must stream", alloc)
	}

	qp := `{"ifindex":0,"ifname":"mlx5_0","port":1,"lqpn":5,"type":"RC","state":"ERR","pid":4242,"comm":"python3"},` + "\n"
	n = 16 * mb / len(qp)
	var s *Snapshot
	alloc = allocDuring(func() {
		var err error
		s, err = ReadSnapshot(newRepeat("[", qp, n, `{"ifindex":0,"ifname":"mlx5_0","lqpn":1,"type":"GSI","state":"RTS","comm":"ib_core"}]`), "big.json")
		if err != nil {
			t.Fatal(err)
		}
	})
	if got := s.QPByNIC["mlx5_0"]; got != int64(n+1) {
		t.Fatalf("QPs %d want %d", got, n+1)
	}
	// The JSON decoder allocates per object (strings) but retains only
	// the tallies: the live heap after the read stays small.
	if alloc > uint64(n)*600 || s.Lines != n+1 {
		t.Errorf("per-QP JSON: %d bytes allocated for %d objects", alloc, n+1)
	}
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	if ms.HeapAlloc > 8*mb {
		t.Errorf("live heap %d bytes after reading 16 MB of per-QP JSON", ms.HeapAlloc)
	}
	runtime.KeepAlive(s)
	t.Logf("qp JSON %d objects: %d B allocated", n+1, alloc)
}
