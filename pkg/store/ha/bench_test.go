package ha_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine"
	"github.com/kvcache-ops/mc/pkg/engine/meta"
	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/ha"
	"github.com/kvcache-ops/mc/pkg/store/master"
)

// BenchmarkPut compares put throughput with HA off (a plain master) and
// on (a candidate committing every PutEnd to an fsyncing etcd before it
// acknowledges), in the same run, at 4 KiB and 1 MiB, 8 concurrent
// writers. Each writer removes its keys every 16 puts so the store never
// evicts; the removes are timed too, in both modes.
//
//	go test -run '^$' -bench BenchmarkPut -benchtime 3s ./pkg/store/ha
func BenchmarkPut(b *testing.B) {
	e, err := meta.StartEtcd(context.Background(), meta.EtcdConfig{Listen: "127.0.0.1:0", DataDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	for _, mode := range []string{"ha=off", "ha=on"} {
		addr, stop := benchMaster(b, mode, e.Endpoints())
		node := benchClient(b, addr, 512<<20)
		cl := benchClient(b, addr, 0)
		for _, size := range []int{4 << 10, 1 << 20} {
			b.Run(fmt.Sprintf("%s/size=%dKiB", mode, size>>10), func(b *testing.B) {
				benchPuts(b, cl, size)
			})
		}
		cl.Close(context.Background())
		node.Close(context.Background())
		stop()
	}
}

func benchMaster(b *testing.B, mode string, eps []string) (string, func()) {
	if mode == "ha=off" {
		m, err := master.New(master.Config{})
		if err != nil {
			b.Fatal(err)
		}
		m.Start()
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		srv := master.Serve(m, lis)
		return lis.Addr().String(), func() { srv.Stop(); m.Close() }
	}
	c, err := ha.Start(context.Background(), ha.Config{Endpoints: eps, ClusterID: "bench", RPCAddress: "127.0.0.1:0"})
	if err != nil {
		b.Fatal(err)
	}
	for !c.Leading() {
		time.Sleep(10 * time.Millisecond)
	}
	return "etcd://" + eps[0], c.Close
}

func benchClient(b *testing.B, addr string, seg uint64) *store.Client {
	cl, err := store.New(context.Background(), store.Config{
		Master: addr, ClusterID: "bench", SegmentSize: seg, StagingSize: 64 << 20,
		EngineConfig: engine.Config{BindAddress: "127.0.0.1", HandshakeAddr: "127.0.0.1:0"},
	})
	if err != nil {
		b.Fatal(err)
	}
	return cl
}

func benchPuts(b *testing.B, cl *store.Client, size int) {
	const writers = 8
	val := make([]byte, size)
	var next atomic.Int64
	var failed atomic.Int64
	b.SetBytes(int64(size))
	b.ResetTimer()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			var mine []string
			for next.Add(1) <= int64(b.N) {
				k := fmt.Sprintf("bench-%d-%d-%d", size, w, len(mine))
				if err := cl.Put(ctx, k, val); err != nil {
					failed.Add(1)
				}
				mine = append(mine, k)
				if len(mine)%16 == 0 {
					cl.BatchRemove(ctx, mine[len(mine)-16:], true)
				}
			}
			if n := len(mine) % 16; n > 0 {
				cl.BatchRemove(ctx, mine[len(mine)-n:], true)
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "puts/s")
	if f := failed.Load(); f > 0 {
		b.Fatalf("%d of %d puts failed", f, b.N)
	}
}

// BenchmarkFailover measures kill -> first acknowledged put over 10 kills
// of the leader, with the default 5 s lease and an fsyncing etcd: three
// candidates, a node, a writer putting 4 KiB values continuously.
//
//	go test -run '^$' -bench BenchmarkFailover -benchtime 1x ./pkg/store/ha
func BenchmarkFailover(b *testing.B) {
	e, err := meta.StartEtcd(context.Background(), meta.EtcdConfig{Listen: "127.0.0.1:0", DataDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	eps := e.Endpoints()
	var mu sync.Mutex
	var cands []*ha.Candidate
	start := func() {
		c, err := ha.Start(context.Background(), ha.Config{Endpoints: eps, ClusterID: "failover", RPCAddress: "127.0.0.1:0"})
		if err != nil {
			b.Fatal(err)
		}
		mu.Lock()
		cands = append(cands, c)
		mu.Unlock()
	}
	leader := func() *ha.Candidate {
		for {
			mu.Lock()
			for _, c := range cands {
				if c.Leading() {
					mu.Unlock()
					return c
				}
			}
			mu.Unlock()
			time.Sleep(5 * time.Millisecond)
		}
	}
	for range 3 {
		start()
	}
	leader()
	cfg := store.Config{Master: "etcd://" + eps[0], ClusterID: "failover", RPCTimeout: time.Second,
		EngineConfig: engine.Config{BindAddress: "127.0.0.1", HandshakeAddr: "127.0.0.1:0"}}
	nodeCfg := cfg
	nodeCfg.SegmentSize = 256 << 20
	node, err := store.New(context.Background(), nodeCfg)
	if err != nil {
		b.Fatal(err)
	}
	defer node.Close(context.Background())
	cl, err := store.New(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close(context.Background())
	// Unix nanos of the start and end of the latest acknowledged put.
	var lastStart, lastEnd atomic.Int64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		val := make([]byte, 4096)
		for n := 0; ; n++ {
			select {
			case <-stop:
				return
			default:
			}
			k := fmt.Sprintf("f-%d", n)
			start := time.Now().UnixNano()
			if cl.Put(context.Background(), k, val) == nil {
				lastEnd.Store(time.Now().UnixNano())
				lastStart.Store(start)
				_ = cl.Remove(context.Background(), k, true)
			} else {
				time.Sleep(5 * time.Millisecond)
			}
		}
	}()
	var times []time.Duration
	for i := range 10 {
		// Kill at a random point of the lease's renewal cycle.
		time.Sleep(time.Second + time.Duration(rand.Int64N(int64(2*time.Second))))
		old := leader()
		killed := time.Now()
		mu.Lock()
		for j, c := range cands {
			if c == old {
				cands = append(cands[:j], cands[j+1:]...)
				break
			}
		}
		mu.Unlock()
		old.Kill()
		start()
		for lastStart.Load() < killed.UnixNano() {
			if time.Since(killed) > 30*time.Second {
				b.Fatalf("kill %d: no put within 30 s", i+1)
			}
			time.Sleep(2 * time.Millisecond)
		}
		d := time.Duration(lastEnd.Load() - killed.UnixNano())
		times = append(times, d)
		b.Logf("kill %d: first acknowledged put after %s", i+1, d.Round(time.Millisecond))
	}
	close(stop)
	<-done
	sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
	var sum time.Duration
	for _, d := range times {
		sum += d
	}
	b.ReportMetric(float64(sum.Milliseconds())/float64(len(times)), "mean-ms")
	b.ReportMetric(float64(times[len(times)/2].Milliseconds()), "p50-ms")
	b.ReportMetric(float64(times[len(times)-1].Milliseconds()), "max-ms")
	b.ReportMetric(float64(times[0].Milliseconds()), "min-ms")
	mu.Lock()
	for _, c := range cands {
		c.Close()
	}
	mu.Unlock()
}
