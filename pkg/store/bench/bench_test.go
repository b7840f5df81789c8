package bench

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine"
	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/master"
	"github.com/kvcache-ops/mc/pkg/store/server"
)

func TestRunAgainstAStore(t *testing.T) {
	ctx := context.Background()
	// Big enough that no row fills it: a full store fails puts until the
	// background eviction catches up, which is not what this checks.
	srv, admin := startStoreWithAdmin(t, 1<<30)
	res, err := Run(ctx, Config{Master: srv.RPCAddr, Admin: admin, SegmentSize: 1 << 30, ValueSizes: []int64{4096, 100000}, Ops: []string{"get", "put", "mix"},
		GetRatio: 0.5, Concurrency: []int{1, 3}, Batch: 4, Duration: 150 * time.Millisecond, Verify: true, Engine: engineLoopback(), Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 2*3*2 {
		t.Fatalf("%d rows, want 12", len(res))
	}
	for _, r := range res {
		if r.Errors != 0 || r.OpsPerSec <= 0 || r.GBPerSec <= 0 || r.P50us <= 0 || r.P99us < r.P50us || r.P999us < r.P99us || r.Batch != 4 {
			t.Errorf("row %+v", r)
		}
		if got := r.GBPerSec * 1e9 / r.OpsPerSec; got < float64(r.ValueSize)*0.99 || got > float64(r.ValueSize)*1.01 {
			t.Errorf("row %+v: GB/s and ops/s disagree on the value size (%.0f)", r, got)
		}
		if r.Transport != "tcp" {
			t.Errorf("row %+v: a tcp client's engine moved the bytes through %q", r, r.Transport)
		}
	}
	// Every row removed what it wrote: the store is left as found.
	if n := srv.Master.KeyCount(); n != 0 {
		t.Fatalf("%d keys left behind", n)
	}
}

// TestVerifyReportsCorruption: a get that returns wrong bytes is counted
// as corrupt and named first, ahead of any other error. The keys the run
// will read are put beforehand with other bytes (the prefill accepts keys
// that already exist, as a rerun against a store would).
func TestVerifyReportsCorruption(t *testing.T) {
	ctx := context.Background()
	srv, admin := startStoreWithAdmin(t, 64<<20)
	newRunID = func() uint32 { return 0xbad }
	defer func() { newRunID = rand.Uint32 }()
	const keys = 8
	wrong := make([]byte, 4096)
	for i := range keys {
		if err := srv.Node.Put(ctx, (&runner{run: 0xbad}).getKey(4096, i), wrong); err != nil {
			t.Fatal(err)
		}
	}
	res, err := Run(ctx, Config{Master: srv.RPCAddr, Admin: admin, SegmentSize: 64 << 20, ValueSizes: []int64{4096}, Ops: []string{"get"},
		Keys: keys, Concurrency: []int{2}, Batch: 2, Duration: 100 * time.Millisecond, Verify: true, Engine: engineLoopback(), Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	r := res[0]
	if r.Corrupt == 0 || r.Corrupt > r.Errors || !strings.HasPrefix(r.FirstError, "verify ") {
		t.Fatalf("row %+v: want corrupt gets counted and named", r)
	}
}

// A client on the node's host under auto (the embedded node is under auto
// too) moves its bytes through shared memory, and each row says so from
// the client engine's counts; with VsTCP every row follows the same row
// from a tcp client, and gives its ratio to it.
func TestRunSameHostSHMVsTCP(t *testing.T) {
	ctx := context.Background()
	ecfg := engineLoopback()
	ecfg.Protocol = engine.ProtocolAuto
	res, err := Run(ctx, Config{SegmentSize: 64 << 20, ValueSizes: []int64{100000}, Ops: []string{"get", "put"},
		Concurrency: []int{2}, Duration: 150 * time.Millisecond, Verify: true, Engine: ecfg, VsTCP: true, Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 4 {
		t.Fatalf("%d rows, want 4 (tcp and shm, for get and put): %+v", len(res), res)
	}
	for i, r := range res {
		want := []string{"tcp", "shm"}[i%2]
		if r.Transport != want || r.Errors != 0 || r.GBPerSec <= 0 {
			t.Errorf("row %d %+v: want %s, no errors", i, r, want)
		}
		if (i%2 == 1) != (r.VsTCP > 0) {
			t.Errorf("row %d %+v: vs_tcp on the shm row only", i, r)
		}
	}
	if got := res[1].VsTCP; got != res[1].GBPerSec/res[0].GBPerSec {
		t.Errorf("vs_tcp %v, want %v / %v", got, res[1].GBPerSec, res[0].GBPerSec)
	}
}

func TestRunBadConfig(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "no value size"},
		{Config{ValueSizes: []int64{0}}, "value size"},
		{Config{ValueSizes: []int64{1}, Ops: []string{"del"}}, "op"},
		{Config{ValueSizes: []int64{1}, Concurrency: []int{0}}, "concurrency"},
		{Config{ValueSizes: []int64{1}, Batch: store.MaxBatchSize + 1}, "batch"},
		{Config{ValueSizes: []int64{1}, GetRatio: 2}, "get ratio"},
		{Config{ValueSizes: []int64{1}, OnDisk: true}, "disk tier directory"},
		{Config{ValueSizes: []int64{1}, Master: "127.0.0.1:1", SSDDir: "/tmp"}, "embedded node"},
		{Config{ValueSizes: []int64{1}, VsTCP: true}, `protocol is "", want auto or shm`},
		{Config{ValueSizes: []int64{1}, VsTCP: true, SSDDir: "/tmp", OnDisk: true, Engine: engine.Config{Protocol: "auto"}}, "one comparison per run"},
	} {
		if _, err := Run(context.Background(), c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Run(%+v) = %v, want an error about %q", c.cfg, err, c.want)
		}
	}
}

func TestPlot(t *testing.T) {
	var b strings.Builder
	rs := []Result{{ValueSize: 4096, Op: "get", Concurrency: 1, Batch: 1, OpsPerSec: 100, P99us: 50},
		{ValueSize: 4096, Op: "get", Concurrency: 4, Batch: 1, OpsPerSec: 300, P99us: 90}}
	if err := Plot(&b, rs); err != nil {
		t.Fatal(err)
	}
	if s := b.String(); !strings.Contains(s, "<svg") || !strings.Contains(s, "concurrency") || !strings.Contains(s, "4K get") {
		t.Fatalf("svg lacks its axis or legend: %.200s", s)
	}
	if err := Plot(&b, nil); err == nil {
		t.Fatal("plot of nothing accepted")
	}
}

// startStore runs a master with a node of segSize bytes on loopback.
func startStore(t *testing.T, segSize uint64) *server.Server {
	t.Helper()
	srv, err := server.Start(context.Background(), server.Config{RPCAddress: "127.0.0.1:0", SegmentSize: segSize,
		Engine: engineLoopback(), Master: master.Config{Logger: quietLog()}, Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close(context.Background()) })
	return srv
}

// TestMasterGoneDoesNotSpin: when the master goes away mid-row, workers
// pause between failed calls instead of spinning through millions of
// errors (a 12 s row against a failing-over master once counted 3.9M).
func TestMasterGoneDoesNotSpin(t *testing.T) {
	srv := startStore(t, 0) // a master alone: closing it is quick
	node, err := store.New(context.Background(), store.Config{Master: srv.RPCAddr, SegmentSize: 64 << 20,
		EngineConfig: engineLoopback(), Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close(context.Background())
	go func() {
		time.Sleep(300 * time.Millisecond)
		srv.Close(context.Background())
	}()
	res, err := Run(context.Background(), Config{Master: srv.RPCAddr, AllowEvict: true, SegmentSize: 64 << 20, ValueSizes: []int64{4096}, Ops: []string{"get"},
		Keys: 8, Concurrency: []int{2}, Batch: 1, Duration: 1500 * time.Millisecond, Engine: engineLoopback(), Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	// About 1.2 s without a master, 2 workers, one call per pause.
	if e := res[0].Errors; e == 0 || e > 1000 {
		t.Fatalf("%d errors after the master left (want some, at most 1000): %s", e, res[0].FirstError)
	}
}

// TestGetsReadWhatASmallStoreKept: against a remote store smaller than the
// default working set (sized from the embedded segment, which says
// nothing about the remote one), the prefill overflows it and the
// watermark evicts part of the working set after the puts returned. Gets
// then read the keys the store kept, not evicted ones counted as errors
// of the store (a 64 MiB `mc serve store` once showed 650 errors a row).
// That is a run allowed to evict (without it the working set is sized to
// the store's room from the start).
func TestGetsReadWhatASmallStoreKept(t *testing.T) {
	srv := startStore(t, 16<<20)
	res, err := Run(context.Background(), Config{Master: srv.RPCAddr, AllowEvict: true, ValueSizes: []int64{64 << 10}, Ops: []string{"get"},
		Concurrency: []int{2}, Batch: 2, Duration: 200 * time.Millisecond, Verify: true, Engine: engineLoopback(), Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	r := res[0]
	if r.Errors != 0 || r.OpsPerSec <= 0 {
		t.Fatalf("row %+v: want every get to find its key", r)
	}
	if written := 4096; r.Keys <= 0 || r.Keys >= written || uint64(r.Keys)*(64<<10) > 16<<20 {
		t.Fatalf("row read %d keys: want fewer than the %d written, as many as 16 MiB holds at most", r.Keys, written)
	}
}
