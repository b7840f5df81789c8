package master

import (
	"context"
	"flag"
	"fmt"
	"net"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/store"
	pb "github.com/kvcache-ops/mc/pkg/store/storepb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

var scaleKeys = flag.String("scale.keys", "10000,1000000,10000000", "BenchmarkMasterScale: key counts")

// scaleMaster is a master with one 16 TiB segment (numbers only: the
// master never touches segment memory) and n complete 4 KiB objects.
func scaleMaster(tb testing.TB, n int) (*Master, store.UUID) {
	m, writer, _ := scaleMasterOwner(tb, n)
	return m, writer
}

func scaleMasterOwner(tb testing.TB, n int) (*Master, store.UUID, store.UUID) {
	tb.Helper()
	m, err := New(Config{Logger: discardLogger()})
	if err != nil {
		tb.Fatal(err)
	}
	owner := store.NewUUID()
	seg := store.SegmentInfo{ID: store.NewUUID(), Name: "big", Base: 0x7f0000000000, Size: 16 << 40, Endpoint: "127.0.0.1:1"}
	if err := m.MountSegment(owner, seg); err != nil {
		tb.Fatal(err)
	}
	writer := store.NewUUID()
	const batch = 1000
	items := make([]PutItem, 0, batch)
	keys := make([]string, 0, batch)
	for i := 0; i < n; i += batch {
		items, keys = items[:0], keys[:0]
		for j := i; j < min(i+batch, n); j++ {
			k := scaleKey(j)
			items = append(items, PutItem{Key: k, Size: 4096})
			keys = append(keys, k)
		}
		for _, r := range m.BatchPutStart(writer, "", items, store.ReplicateConfig{ReplicaNum: 1}) {
			if r.Err != nil {
				tb.Fatal(r.Err)
			}
		}
		for _, err := range m.BatchPutEnd(writer, keys) {
			if err != nil {
				tb.Fatal(err)
			}
		}
	}
	return m, writer, owner
}

// scaleKey is a KV-cache-like key: a model prefix and a block hash, 40 bytes.
func scaleKey(i int) string { return fmt.Sprintf("llama-70b/tp8/%026d", i) }

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// BenchmarkMasterScale is issue 11's scale check of the master: for each
// key count it prints the metadata heap per object (after GC, key bytes
// counted separately) and the latency of PutStart (+PutEnd of the same
// key, so the count stays), GetReplicaList and ExistKey on a full master,
// reading keys spread over the whole table. Against it, in the same run,
// the least any lookup can cost: a bare Go map of as many keys to small
// objects, probed with the same keys. Both grow with the table as caches
// and TLBs stop covering it; the master's ratio to the bare map says
// whether its own work grows.
// Run: go test ./pkg/store/master -run '^$' -bench MasterScale -benchtime 1x
func BenchmarkMasterScale(b *testing.B) {
	var counts []int
	for _, f := range splitComma(*scaleKeys) {
		n, err := strconv.Atoi(f)
		if err != nil {
			b.Fatal(err)
		}
		counts = append(counts, n)
	}
	var rows []string
	for _, n := range counts {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			before := heapInUse()
			m, writer := scaleMaster(b, n)
			perObj := float64(heapInUse()-before) / float64(n)
			keyLen := float64(len(scaleKey(0)))
			const ops = 200000
			// Keys made beforehand, so that the timings are the lookups'.
			probes := make([]string, ops)
			fresh := make([]string, ops)
			for i := range probes {
				probes[i] = scaleKey(i * 7919 % n)
				fresh[i] = "new/" + scaleKey(i)
			}
			put := timeOps(ops, func(i int) {
				if r := m.BatchPutStart(writer, "", []PutItem{{Key: fresh[i], Size: 4096}}, store.ReplicateConfig{ReplicaNum: 1}); r[0].Err != nil {
					b.Fatal(r[0].Err)
				}
				m.BatchPutRevoke(writer, fresh[i:i+1])
			})
			get := timeOps(ops, func(i int) {
				if r := m.BatchGetReplicaList(probes[i : i+1]); r[0].Err != nil {
					b.Fatal(r[0].Err)
				}
			})
			exist := timeOps(ops, func(i int) {
				if ex, _ := m.BatchExistKey(probes[i : i+1]); !ex[0] {
					b.Fatal("missing key")
				}
			})
			type bareObject struct {
				key   string
				state uint8
			}
			bare := make(map[string]*bareObject, n)
			for i := range n {
				k := scaleKey(i)
				bare[k] = &bareObject{key: k, state: 1}
			}
			bareNs := timeOps(ops, func(i int) {
				if o := bare[probes[i]]; o == nil || o.state != 1 {
					b.Fatal("missing key")
				}
			})
			b.ReportMetric(perObj, "B/object")
			b.ReportMetric(perObj-keyLen, "B/object-excl-key")
			b.ReportMetric(float64(put.Nanoseconds()), "putstart-ns")
			b.ReportMetric(float64(get.Nanoseconds()), "getreplicalist-ns")
			b.ReportMetric(float64(exist.Nanoseconds()), "existkey-ns")
			b.ReportMetric(float64(bareNs.Nanoseconds()), "baremap-ns")
			rows = append(rows, fmt.Sprintf("| %10d | %8.0f | %8.0f | %8d | %8d | %8d | %8d | %5.1f | %5.1f |", n, perObj, perObj-keyLen,
				put.Nanoseconds(), get.Nanoseconds(), exist.Nanoseconds(), bareNs.Nanoseconds(),
				float64(get)/float64(bareNs), float64(exist)/float64(bareNs)))
			runtime.KeepAlive(m)
			runtime.KeepAlive(bare)
		})
	}
	if len(rows) > 0 {
		fmt.Printf("\nmaster metadata at scale (one 16 TiB segment, 4 KiB objects, 40-byte keys; heap after GC; latency of single-key calls on the Go API over keys spread across the table, median of 5 rounds of %d calls; bare map: a Go map of as many keys, same probes)\n"+
			"|       keys | B/object | excl key | PutStart+Revoke ns | GetReplicaList ns | ExistKey ns | bare map ns | Get/bare | Exist/bare |\n|------------|----------|----------|----------|----------|----------|----------|-------|-------|\n%s\n",
			200000/5, strings.Join(rows, "\n"))
	}
}

// timeOps returns the mean time of f over n calls: the median of five
// rounds of n/5, so that one stall of a shared machine does not move it.
func timeOps(n int, f func(i int)) time.Duration {
	const rounds = 5
	per := n / rounds
	means := make([]time.Duration, rounds)
	for r := range means {
		t0 := time.Now()
		for i := r * per; i < (r+1)*per; i++ {
			f(i)
		}
		means[r] = time.Since(t0) / time.Duration(per)
	}
	slices.Sort(means)
	return means[rounds/2]
}

func splitComma(s string) []string {
	var out []string
	start := 0
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == ',' {
			if i > start {
				out = append(out, s[start:i])
			}
			start = i + 1
		}
	}
	return out
}

// BenchmarkPingUnderLoad: 100 clients join at once (mount a segment each,
// then ping every 100 ms over real gRPC) while the master holds 1M keys and
// 8 goroutines run a put/get load; it reports ping p99 and checks that no
// healthy client was dropped (client_ttl 2 s); the goal for ping p99 is
// under 100 ms. Run with -benchtime 1x.
func BenchmarkPingUnderLoad(b *testing.B) {
	m, writer, owner := scaleMasterOwner(b, 1_000_000)
	m.cfg.ClientTTL = 2 * time.Second
	m.Ping(owner) // filling took longer than the TTL
	m.Ping(writer)
	m.Start()
	defer m.Close()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := Serve(m, lis)
	defer srv.Stop()
	// Every node and every load client has its own connection, as
	// separate processes do.
	dial := func() pb.MasterClient {
		conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { conn.Close() })
		return pb.NewMasterClient(conn)
	}
	rpc := dial()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// The big segment's owner and the writer ping like healthy nodes.
	go func() {
		for ctx.Err() == nil {
			rpc.Ping(ctx, &pb.PingRequest{ClientId: store.UUIDToPB(owner)})
			rpc.Ping(ctx, &pb.PingRequest{ClientId: store.UUIDToPB(writer)})
			time.Sleep(200 * time.Millisecond)
		}
	}()
	var load sync.WaitGroup
	var loadOps atomic.Int64
	for g := 0; g < 8; g++ {
		load.Add(1)
		rpc := dial()
		go func() {
			defer load.Done()
			id := store.UUIDToPB(writer)
			for i := 0; ctx.Err() == nil; i++ {
				k := fmt.Sprintf("load/%d/%d", g, i)
				rpc.BatchPutStart(ctx, &pb.BatchPutStartRequest{ClientId: id, Items: []*pb.PutStartItem{{Key: k, Length: 4096}}})
				rpc.BatchPutEnd(ctx, &pb.BatchKeysRequest{ClientId: id, Keys: []string{k}})
				rpc.BatchGetReplicaList(ctx, &pb.BatchKeysRequest{Keys: []string{scaleKey(i * 104729 % 1_000_000)}})
				loadOps.Add(3)
			}
		}()
	}
	const clients = 100
	var mu sync.Mutex
	var lat []time.Duration
	var wg sync.WaitGroup
	start := time.Now()
	for c := 0; c < clients; c++ {
		wg.Add(1)
		rpc := dial()
		go func() {
			defer wg.Done()
			id := store.NewUUID()
			seg := store.SegmentInfo{ID: store.NewUUID(), Name: "node-" + strconv.Itoa(c), Base: 1 << 40, Size: 1 << 30, Endpoint: "127.0.0.1:" + strconv.Itoa(20000+c)}
			if r, err := rpc.MountSegment(ctx, &pb.MountSegmentRequest{ClientId: store.UUIDToPB(id), Segment: store.SegmentToPB(seg)}); err != nil || r.Code != 0 {
				b.Errorf("mount: %v %v", r, err)
				return
			}
			for time.Since(start) < 5*time.Second {
				t0 := time.Now()
				resp, err := rpc.Ping(ctx, &pb.PingRequest{ClientId: store.UUIDToPB(id)})
				d := time.Since(t0)
				if err != nil || resp.ClientStatus != pb.ClientStatus_OK {
					b.Errorf("ping: %v %v", resp, err)
					return
				}
				mu.Lock()
				lat = append(lat, d)
				mu.Unlock()
				time.Sleep(100 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	cancel()
	load.Wait()
	slices.Sort(lat)
	p99 := lat[len(lat)*99/100]
	segs := len(m.Segments())
	if m.KeyCount() < 1_000_000 {
		b.Fatalf("%d keys held at the end, want at least 1M", m.KeyCount())
	}
	b.ReportMetric(float64(p99.Microseconds()), "ping-p99-us")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "ping-p50-us")
	b.ReportMetric(float64(loadOps.Load())/time.Since(start).Seconds(), "load-rpc/s")
	fmt.Printf("\n%d clients joining, 1M keys held, 8 goroutines of put/get RPCs (%.0f RPC/s): ping p50 %s, p99 %s, max %s over %d pings; segments mounted at the end: %d of %d\n",
		clients, float64(loadOps.Load())/time.Since(start).Seconds(), lat[len(lat)/2], p99, lat[len(lat)-1], len(lat), segs-1, clients)
	if segs-1 != clients {
		b.Fatalf("%d of %d healthy clients' segments dropped", clients-(segs-1), clients)
	}
	if p99 > 100*time.Millisecond {
		// Reported, not failed: a timing on a shared machine is not a
		// verdict. The goal is under 100 ms.
		fmt.Printf("ping p99 %s is over the 100 ms goal\n", p99)
	}
}
