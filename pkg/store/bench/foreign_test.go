package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/master"
	"github.com/kvcache-ops/mc/pkg/store/server"
)

// startStoreWithAdmin runs a master (with its admin API) and a node of
// segSize bytes on loopback, handing out 4 MiB regions.
func startStoreWithAdmin(t *testing.T, segSize uint64) (*server.Server, string) {
	t.Helper()
	srv, err := server.Start(context.Background(), server.Config{RPCAddress: "127.0.0.1:0", AdminAddress: "127.0.0.1:0", SegmentSize: segSize,
		Engine: engineLoopback(), Master: master.Config{Logger: quietLog(), RegionSize: 4 << 20}, Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close(context.Background()) })
	return srv, "http://" + srv.AdminAddr
}

// Against a store it did not start, a run evicts none of the store's
// other keys: puts that would write several times the store (1 s of 1 MiB
// puts) keep their keys within the room below the watermark, the keys gets
// read are sized to it, and at the end nothing of the run is left; one
// line says what it did (issue 35.4: a run evicted the user's objects).
func TestForeignStoreKeepsOtherKeys(t *testing.T) {
	ctx := context.Background()
	srv, admin := startStoreWithAdmin(t, 96<<20)
	v := make([]byte, 1<<20)
	var mine []string
	for i := range 40 {
		k := fmt.Sprintf("user/%d", i)
		if err := srv.Node.Put(ctx, k, v); err != nil {
			t.Fatal(err)
		}
		mine = append(mine, k)
	}
	var line string
	res, err := Run(ctx, Config{Master: srv.RPCAddr, Admin: admin, ValueSizes: []int64{1 << 20}, Ops: []string{"put", "get", "mix"},
		Concurrency: []int{2}, Batch: 2, Duration: time.Second, Engine: engineLoopback(), Logger: quietLog(),
		Report: func(s string) { line = s }})
	if err != nil {
		t.Fatal(err)
	}
	t.Log(line)
	var wrote float64
	for _, r := range res {
		t.Logf("%s x%d: %.0f ops/s, %d keys, %d errors", r.Op, r.Concurrency, r.OpsPerSec, r.Keys, r.Errors)
		if r.Error != "" || r.Errors != 0 {
			t.Errorf("row %+v", r)
		}
		if r.Op == "put" {
			wrote = r.OpsPerSec
		}
	}
	if wrote < 2*96 {
		t.Logf("the put row wrote %.0f MiB/s only: less than twice the store a second", wrote)
	}
	ok, errs := srv.Node.BatchExist(ctx, mine)
	for i, k := range mine {
		if errs[i] != nil || !ok[i] {
			t.Errorf("%s gone after the run (%v)", k, errs[i])
		}
	}
	if s := srv.Master.Stats(); s.EvictedKeys != 0 || s.Keys != len(mine) {
		t.Errorf("the store evicted %d keys and holds %d, want none evicted and the %d it held", s.EvictedKeys, s.Keys, len(mine))
	}
	if !strings.HasPrefix(line, `bench store: wrote under "bench/`) || !strings.Contains(line, "on a store it did not start") ||
		!strings.Contains(line, "the store evicted 0 keys meanwhile") || !strings.Contains(line, "removed ") {
		t.Errorf("report %q", line)
	}
}

// A row that cannot fit the room below the watermark is refused before
// anything is written, naming --allow-evict; with it the run goes on.
func TestForeignStoreRefusesWhatDoesNotFit(t *testing.T) {
	ctx := context.Background()
	srv, admin := startStoreWithAdmin(t, 64<<20)
	v := make([]byte, 1<<20)
	for i := range 50 {
		if err := srv.Node.Put(ctx, fmt.Sprintf("user/%d", i), v); err != nil {
			t.Fatal(err)
		}
	}
	cfg := Config{Master: srv.RPCAddr, Admin: admin, ValueSizes: []int64{4 << 20}, Ops: []string{"put"},
		Concurrency: []int{2}, Duration: 200 * time.Millisecond, Engine: engineLoopback(), Logger: quietLog()}
	res, err := Run(ctx, cfg)
	if !errors.Is(err, ErrNoRoom) || !strings.Contains(err.Error(), "--allow-evict") || len(res) != 0 {
		t.Fatalf("%+v, %v: want the run refused for want of room", res, err)
	}
	if s := srv.Master.Stats(); s.Keys != 50 || s.EvictedKeys != 0 {
		t.Fatalf("after the refusal the store holds %d keys, evicted %d", s.Keys, s.EvictedKeys)
	}
	cfg.ValueSizes = []int64{128 << 20}
	if _, err := Run(ctx, cfg); err == nil || !strings.Contains(err.Error(), "value size 128M is larger than any segment of the store (the largest is 64M)") {
		t.Fatalf("a value larger than the segment: %v", err)
	}
	cfg.Admin = ""
	if _, err := Run(ctx, cfg); err == nil || !strings.Contains(err.Error(), "admin API is needed") {
		t.Fatalf("no admin API: %v", err)
	}
}

// An interrupt mid-row leaves nothing of the run in the store.
func TestForeignStoreCleansUpOnInterrupt(t *testing.T) {
	srv, admin := startStoreWithAdmin(t, 96<<20)
	if err := srv.Node.Put(context.Background(), "user/kept", make([]byte, 4096)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var rows int
	_, err := Run(ctx, Config{Master: srv.RPCAddr, Admin: admin, ValueSizes: []int64{64 << 10}, Ops: []string{"get", "put"},
		Concurrency: []int{2}, Duration: 5 * time.Second, Engine: engineLoopback(), Logger: quietLog(),
		Progress: func(p Progress) {
			if p.Elapsed > 300*time.Millisecond {
				cancel()
			}
		},
		RowDone: func(Result) { rows++ }})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("%v, want the run interrupted", err)
	}
	keys, err := store.NewAdmin(admin)
	if err != nil {
		t.Fatal(err)
	}
	left, err := keys.Keys(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 || left[0] != "user/kept" {
		t.Fatalf("after an interrupt the store holds %d keys (%.3v), want only user/kept", len(left), left)
	}
	if rows != 0 {
		t.Fatalf("%d rows finished before the interrupt", rows)
	}
}
