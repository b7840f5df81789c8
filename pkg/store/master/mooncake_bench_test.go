package master

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/mooncake"
	pb "github.com/kvcache-ops/mc/pkg/store/storepb"
)

// BenchmarkWireBatchPut compares the two wires on one master, in the same
// run, with master_bench's BatchPut shape: 4 clients, batches of 128 keys
// of 4 KiB, 128 metadata-only segments of 64 GiB. It reports keys per
// second on each wire and their ratio; the Mooncake wire's figure is what
// Mooncake's master_bench sees of mc.
// wireBenchMaster is a master serving both wires on loopback with
// master_bench's 128 metadata-only segments of 64 GiB mounted over the
// Mooncake wire by node.
func wireBenchMaster(b testing.TB) (m *Master, addr string, node *mooncake.Client) {
	m, _ = newTestMaster(b, Config{RegionSize: 64 * MiB})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := Serve(m, lis)
	b.Cleanup(srv.Stop)
	addr = lis.Addr().String()
	node = mooncake.NewClient(addr, nil)
	b.Cleanup(func() { node.Close() })
	for i := range 128 {
		seg := mooncake.Segment{ID: mooncake.UUID{First: 7, Second: uint64(i + 1)}, Name: fmt.Sprintf("seg%d", i),
			Base: uint64(i+1) << 40, Size: 64 << 30, TEEndpoint: fmt.Sprintf("seg%d", i), Protocol: "tcp"}
		if err := node.MountSegment(context.Background(), seg, mooncake.UUID{First: 7, Second: 7}); err != nil {
			b.Fatal(err)
		}
	}
	return m, addr, node
}

func BenchmarkWireBatchPut(b *testing.B) {
	_, addr, _ := wireBenchMaster(b)
	ctx := context.Background()
	const clients, batch = 4, 128
	d := 3 * time.Second
	run := func(name string, put func(c int, keys []string) int) float64 {
		return closedLoop(clients, d, func(c int) func() int {
			keys := make([]string, batch)
			n := 0
			return func() int {
				for i := range keys {
					keys[i] = fmt.Sprintf("%s/%d/%d/%d", name, c, n, i)
				}
				n++
				return put(c, keys)
			}
		})
	}
	sizes := make([]uint64, batch)
	for i := range sizes {
		sizes[i] = 4096
	}
	mcs := make([]*mooncake.Client, clients)
	for i := range mcs {
		mcs[i] = mooncake.NewClient(addr, nil)
		defer mcs[i].Close()
	}
	_, gc, _ := grpcClient(b, addr)
	for b.Loop() {
		moon := run(fmt.Sprintf("moon%d", b.N), func(c int, keys []string) int {
			id := mooncake.UUID{First: 9, Second: uint64(c + 1)}
			_, errs, err := mcs[c].BatchPutStart(ctx, id, keys, sizes, mooncake.ReplicateConfig{ReplicaNum: 1, PreferredSegments: []string{}, PreferredNoFSegments: []string{}}, false)
			if err != nil {
				b.Fatal(err)
			}
			ok := 0
			for _, e := range errs {
				if e == nil {
					ok++
				}
			}
			endErrs, err := mcs[c].BatchPutEnd(ctx, id, keys, false)
			if err != nil {
				b.Fatal(err)
			}
			for _, e := range endErrs {
				if e != nil {
					ok--
				}
			}
			return ok
		})
		grpcRate := run(fmt.Sprintf("grpc%d", b.N), func(c int, keys []string) int {
			id := store.UUIDToPB(store.UUID{First: 10, Second: uint64(c + 1)})
			items := make([]*pb.PutStartItem, len(keys))
			for i, k := range keys {
				items[i] = &pb.PutStartItem{Key: k, Length: 4096}
			}
			if _, err := gc.BatchPutStart(ctx, &pb.BatchPutStartRequest{ClientId: id, Items: items}); err != nil {
				b.Fatal(err)
			}
			r, err := gc.BatchPutEnd(ctx, &pb.BatchKeysRequest{ClientId: id, Keys: keys})
			if err != nil {
				b.Fatal(err)
			}
			ok := 0
			for _, x := range r.Results {
				if x.Code == 0 {
					ok++
				}
			}
			return ok
		})
		b.ReportMetric(moon, "mooncake-keys/s")
		b.ReportMetric(grpcRate, "grpc-keys/s")
		b.ReportMetric(moon/grpcRate, "mooncake/grpc")
	}
}

// BenchmarkWireBatchGet is master_bench's BatchGet shape on the Mooncake
// wire: 4 clients, batches of 128 of 10000 prefilled 4 KiB keys, against
// the same gets through the Master's methods in the same run (the wire's
// cost over the metadata work). It reports keys per second of each.
func BenchmarkWireBatchGet(b *testing.B) {
	m, addr, node := wireBenchMaster(b)
	ctx := context.Background()
	const clients, batch = 4, 128
	nkeys := benchKeys()
	keys := make([]string, nkeys)
	sizes := make([]uint64, batch)
	for i := range sizes {
		sizes[i] = 4096
	}
	for i := range keys {
		keys[i] = fmt.Sprintf("key_%d", i)
	}
	id := mooncake.UUID{First: 9, Second: 1}
	for i := 0; i < nkeys; i += batch {
		ks := keys[i:min(i+batch, nkeys)]
		if _, _, err := node.BatchPutStart(ctx, id, ks, sizes[:len(ks)], mooncake.ReplicateConfig{ReplicaNum: 1, PreferredSegments: []string{}, PreferredNoFSegments: []string{}}, false); err != nil {
			b.Fatal(err)
		}
		if _, err := node.BatchPutEnd(ctx, id, ks, false); err != nil {
			b.Fatal(err)
		}
	}
	d := 3 * time.Second
	run := func(get func(c int, keys []string) int) float64 {
		return closedLoop(clients, d, func(c int) func() int {
			// Random keys, as master_bench's gets: with millions of
			// keys each one is a cache miss, not a neighbour's.
			rng := rand.New(rand.NewPCG(uint64(c), 1))
			ks := make([]string, batch)
			return func() int {
				for i := range ks {
					ks[i] = keys[rng.IntN(nkeys)]
				}
				return get(c, ks)
			}
		})
	}
	mcs := make([]*mooncake.Client, clients)
	for i := range mcs {
		mcs[i] = mooncake.NewClient(addr, nil)
		defer mcs[i].Close()
	}
	for b.Loop() {
		moon := run(func(c int, ks []string) int {
			_, errs, err := mcs[c].BatchGetReplicaList(ctx, ks)
			if err != nil {
				b.Fatal(err)
			}
			ok := 0
			for _, e := range errs {
				if e == nil {
					ok++
				}
			}
			return ok
		})
		direct := run(func(_ int, ks []string) int {
			ok := 0
			for _, r := range m.BatchGetReplicaList(ks) {
				if r.Err == nil {
					ok++
				}
			}
			return ok
		})
		b.ReportMetric(moon, "mooncake-keys/s")
		b.ReportMetric(direct, "direct-keys/s")
	}
}

// benchKeys is BenchmarkWireBatchGet's prefill: 10000 (master_bench's
// default), or MC_BENCH_KEYS (its large-count run: millions).
func benchKeys() int {
	if n, err := strconv.Atoi(os.Getenv("MC_BENCH_KEYS")); err == nil && n > 128 {
		return n
	}
	return 10000
}

// closedLoop runs clients callers for d, each repeating the call its
// newCall made for it, and returns the items per second the calls
// reported done.
func closedLoop(clients int, d time.Duration, newCall func(c int) func() int) float64 {
	var done atomic.Int64
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	for c := range clients {
		call := newCall(c)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				done.Add(int64(call()))
			}
		}()
	}
	wg.Wait()
	return float64(done.Load()) / d.Seconds()
}

// BenchmarkWireSingleCaller is what one of vLLM's workers sees of the
// master through Mooncake's client: one key per call, one call at a time
// (a put is PutStart then PutEnd, a get GetReplicaList). ns/op is the
// round trip of the calls on loopback, the master's work included.
func BenchmarkWireSingleCaller(b *testing.B) {
	_, addr, _ := wireBenchMaster(b)
	ctx := context.Background()
	c := mooncake.NewClient(addr, nil)
	defer c.Close()
	id := mooncake.UUID{First: 9, Second: 2}
	rc := mooncake.ReplicateConfig{ReplicaNum: 1, PreferredSegments: []string{}, PreferredNoFSegments: []string{}}
	i := 0 // across runs of the function: each put is of a new key
	b.Run("put", func(b *testing.B) {
		for b.Loop() {
			k := "single-put-" + strconv.Itoa(i)
			i++
			if _, err := c.PutStart(ctx, id, k, 4096, rc, false); err != nil {
				b.Fatal(err)
			}
			if err := c.PutEnd(ctx, id, k, false); err != nil {
				b.Fatal(err)
			}
		}
	})
	gets := 0
	b.Run("get", func(b *testing.B) {
		// The testing package may run this function more than once (-count,
		// its first probe): each run puts a key of its own.
		gets++
		k := "single-get-" + strconv.Itoa(gets)
		if _, err := c.PutStart(ctx, id, k, 4096, rc, false); err != nil {
			b.Fatal(err)
		}
		if err := c.PutEnd(ctx, id, k, false); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if _, err := c.GetReplicaList(ctx, k); err != nil {
				b.Fatal(err)
			}
		}
	})
}
