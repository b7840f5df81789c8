package cmd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine"
	"github.com/kvcache-ops/mc/pkg/store"
)

// A bad --ssd-dir is one line and exit 1, before anything listens.
func TestServeStoreSSDBadInput(t *testing.T) {
	isolateEnv(t)
	dir := t.TempDir()
	unwritable := filepath.Join(dir, "ro")
	os.Mkdir(unwritable, 0o555)
	if os.Geteuid() == 0 {
		unwritable = "/sys/kernel" // permissions do not stop root
	}
	file := filepath.Join(dir, "file")
	os.WriteFile(file, nil, 0o644)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--ssd-dir", filepath.Join(dir, "missing")}, "directory does not exist"},
		{[]string{"--ssd-dir", file}, "not a directory"},
		{[]string{"--ssd-dir", unwritable, "--ssd-size", "1G"}, "is not writable"},
		{[]string{"--ssd-dir", dir, "--ssd-size", "lots"}, "--ssd-size"},
		{[]string{"--ssd-size", "1G"}, "without --ssd-dir"},
		{[]string{"--ssd-dir", dir, "--segment-size", "0"}, "needs a segment"},
		{[]string{"--ssd-dir", dir, "--master", "mooncake://127.0.0.1:1"}, "needs an mc master"},
		{[]string{"--promote-after", "-1"}, "--promote-after"},
		{[]string{"--ssd-dir", dir, "--ssd-staging-size", "1P"}, "--ssd-staging-size"},
		{[]string{"--ssd-staging-size", "64M"}, "without --ssd-dir"},
		{[]string{"--enable_offload"}, "/data/file_storage"},
		// Found by the master's config check at start: exit 1, the flag
		// not named (a CLI sweep).
		{[]string{"--eviction-policy", "bogus"}, "--eviction-policy"},
		{[]string{"--allocation-strategy", "bogus"}, "--allocation-strategy"},
	} {
		args := append([]string{"serve", "store", "--rpc_port", "1", "--metrics_port", "0"}, c.args...)
		_, errs, code := execMC(t, args...)
		wantCode := exitFailure // the directory's state, found at start
		switch c.want {
		case "--ssd-size", "without --ssd-dir", "needs a segment", "needs an mc master", "--promote-after", "--eviction-policy", "--allocation-strategy":
			wantCode = exitUsage
		}
		if code != wantCode || !strings.Contains(errs, c.want) || strings.Count(errs, "\n") != 1 {
			t.Errorf("mc %s: exit %d, stderr %q; want exit %d and one line naming %q", strings.Join(args, " "), code, errs, wantCode, c.want)
		}
	}
}

// `mc serve store --ssd-dir` as a user runs it: DRAM fills, objects go to
// disk, `mc store get` reads them unchanged; a second node on the same
// directory is refused; Mooncake's --enable_offload spelling works.
func TestServeStoreSSD(t *testing.T) {
	isolateEnv(t)
	dir := t.TempDir()
	rpc, admin, _, stop := startServeStore(t, "--segment-size", "16M", "--ssd-dir", dir, "--ssd-size", "256M", "--ssd-staging-size", "8M", "--default_kv_lease_ttl", "200")
	if _, errs, code := execMC(t, "serve", "store", "--rpc_port", "1", "--metrics_port", "0", "--ssd-dir", dir); code != 1 || !strings.Contains(errs, "in use by another node") {
		t.Fatalf("second node on the same --ssd-dir: exit %d, %q", code, errs)
	}
	ctx := context.Background()
	cl, err := store.New(ctx, store.Config{Master: rpc, EngineConfig: engine.Config{BindAddress: "127.0.0.1", HandshakeAddr: "127.0.0.1:0"}})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close(ctx)
	val := func(i int) []byte { return bytes.Repeat([]byte{byte(i), byte(i >> 8), 0x5a}, 350_000) }
	for i := range 40 {
		for try := 0; ; try++ {
			err := cl.Put(ctx, fmt.Sprintf("blk/%02d", i), val(i))
			if err == nil {
				break
			}
			if !errors.Is(err, store.ErrNoAvailableHandle) || try == 300 {
				t.Fatalf("put %d: %v", i, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.mct"))
	if len(files) == 0 {
		t.Fatal("40 MiB into a 16 MiB segment wrote nothing under --ssd-dir")
	}
	out := filepath.Join(t.TempDir(), "v")
	if _, errs, code := execMC(t, "store", "get", "blk/00", "-o", out, "--master", rpc, "--admin", admin); code != 0 {
		t.Fatalf("mc store get of an object on disk: %d %q", code, errs)
	}
	if got, _ := os.ReadFile(out); !bytes.Equal(got, val(0)) {
		t.Fatal("mc store get of an object on disk: wrong bytes")
	}
	// Visible: the query shows the disk replica, stat each node's tier.
	q, errs, code := execMC(t, "store", "query", "blk/03", "-o", "json", "--master", rpc, "--admin", admin)
	var qj struct {
		Replicas []any `json:"replicas"`
		Disk     []struct {
			Size     uint64 `json:"object_size"`
			Endpoint string `json:"transport_endpoint"`
			Version  uint64 `json:"version"`
		} `json:"disk_replicas"`
	}
	if code != 0 || json.Unmarshal([]byte(q), &qj) != nil || len(qj.Replicas) != 0 || len(qj.Disk) != 1 || qj.Disk[0].Size != 1_050_000 || qj.Disk[0].Version == 0 || qj.Disk[0].Endpoint == "" {
		t.Fatalf("mc store query of a disk object: %d %q %q", code, q, errs)
	}
	if q, _, _ := execMC(t, "store", "query", "blk/03", "--master", rpc, "--admin", admin); !strings.Contains(q, "local_disk") {
		t.Fatalf("mc store query table lacks the disk replica:\n%s", q)
	}
	var sj struct {
		Tiers []struct {
			Used      uint64 `json:"used_bytes"`
			Capacity  uint64 `json:"capacity_bytes"`
			Records   uint64 `json:"records"`
			Offloads  uint64 `json:"offloads"`
			DiskHits  uint64 `json:"disk_hits"`
			Connected bool   `json:"connected"`
			Staging   uint64 `json:"staging_size_bytes"`
			Staged    uint64 `json:"staging_used_bytes"`
		} `json:"disk_tiers"`
		Totals struct {
			Offloads uint64 `json:"offloads"`
			Released uint64 `json:"staged_released"`
		} `json:"disk_tier"`
	}
	// The node reports its tier's use and records in its own time after
	// the offloads land: read stat until they show.
	for deadline := time.Now().Add(15 * time.Second); ; {
		st, errs, code := execMC(t, "store", "stat", "-o", "json", "--master", rpc, "--admin", admin)
		if code != 0 || json.Unmarshal([]byte(st), &sj) != nil || len(sj.Tiers) != 1 {
			t.Fatalf("mc store stat: %d %q %q", code, st, errs)
		}
		if sj.Tiers[0].Records > 0 && sj.Tiers[0].Used > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if tr := sj.Tiers[0]; !tr.Connected || tr.Capacity != 256<<20 || tr.Used == 0 || tr.Records == 0 || tr.Offloads == 0 || tr.DiskHits != 1 || sj.Totals.Offloads != tr.Offloads {
		t.Fatalf("mc store stat disk tier: %+v, totals %+v", tr, sj.Totals)
	}
	// The get's staged read went through the 8 MiB staging pool and was
	// handed back.
	if tr := sj.Tiers[0]; tr.Staging != 8<<20 || tr.Staged != 0 || sj.Totals.Released != 1 {
		t.Fatalf("mc store stat staging: pool %d, in use %d, handed back %d; want 8 MiB, 0, 1", tr.Staging, tr.Staged, sj.Totals.Released)
	}
	st, _, _ := execMC(t, "store", "stat", "--master", rpc, "--admin", admin)
	if !strings.Contains(st, "DISK TIERS") && !strings.Contains(st, "disk tiers") {
		t.Fatalf("mc store stat table lacks the disk tiers:\n%s", st)
	}
	if !strings.Contains(st, "0 B / 8.0 MiB") || !strings.Contains(st, "staged reads handed back") {
		t.Fatalf("mc store stat table lacks the staging pool's use:\n%s", st)
	}
	resp, err := http.Get(admin + "/batch_query_keys?keys=blk/03,blk/39")
	if err != nil {
		t.Fatal(err)
	}
	var bj struct {
		Data map[string]struct {
			Values []any `json:"values"`
			Disk   []any `json:"local_disk_values"`
		} `json:"data"`
	}
	json.NewDecoder(resp.Body).Decode(&bj)
	resp.Body.Close()
	if d := bj.Data["blk/03"]; len(d.Values) != 0 || len(d.Disk) != 1 {
		t.Fatalf("/batch_query_keys blk/03: %+v, want one local_disk_values entry", d)
	}
	if d := bj.Data["blk/39"]; len(d.Values) != 1 || len(d.Disk) != 0 {
		t.Fatalf("/batch_query_keys blk/39 (in DRAM): %+v", d)
	}
	resp, err = http.Get(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	b.ReadFrom(resp.Body)
	resp.Body.Close()
	for _, m := range []string{"mc_store_tier_offloads_total", "master_total_file_capacity_bytes 2.68435456e+08", "file_cache_hit_nums_ 1", "file_cache_nums_ ", "mem_cache_nums_ "} {
		if !strings.Contains(b.String(), m) {
			t.Errorf("/metrics lacks %q", m)
		}
	}
	if code := stop(); code != 0 {
		t.Fatalf("exit %d", code)
	}

	// Mooncake's spelling: --enable_offload, the directory and size from
	// the environment. The records from before are there (a restart).
	t.Setenv("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", dir)
	t.Setenv("MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES", "300000000")
	rpc, admin, _, _ = startServeStore(t, "--segment-size", "16M", "--enable_offload")
	cl2, err := store.New(ctx, store.Config{Master: rpc, EngineConfig: engine.Config{BindAddress: "127.0.0.1", HandshakeAddr: "127.0.0.1:0"}})
	if err != nil {
		t.Fatal(err)
	}
	defer cl2.Close(ctx)
	waitUntil(t, "the node's records to come back", func() bool {
		got, err := cl2.Get(ctx, "blk/01")
		return err == nil && bytes.Equal(got, val(1))
	})
	resp, err = http.Get(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b.Reset()
	b.ReadFrom(resp.Body)
	resp.Body.Close()
	if !strings.Contains(b.String(), "master_total_file_capacity_bytes 3e+08") {
		t.Error("--enable_offload did not take its size from MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES")
	}
}

func waitUntil(t *testing.T, what string, f func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !f(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

type tieredReplayJSON struct {
	Results []struct {
		CapacityBlocks int     `json:"capacity_blocks"`
		SSDBlocks      int     `json:"ssd_capacity_blocks"`
		PromoteAfter   int     `json:"promote_after"`
		HitBlocks      int     `json:"hit_blocks"`
		DRAMHitBlocks  int     `json:"dram_hit_blocks"`
		DiskHitBlocks  int     `json:"disk_hit_blocks"`
		HitRatio       float64 `json:"hit_ratio"`
		DRAMHitRatio   float64 `json:"dram_hit_ratio"`
		DiskHitRatio   float64 `json:"disk_hit_ratio"`
	} `json:"results"`
	Online *struct {
		HitBlocks     int     `json:"hit_blocks"`
		DRAMHitBlocks int     `json:"dram_hit_blocks"`
		DiskHitBlocks int     `json:"disk_hit_blocks"`
		DiskHitRatio  float64 `json:"disk_hit_ratio"`
		SSDBlocks     int     `json:"ssd_capacity_blocks"`
	} `json:"online"`
}

// Two tiers offline: rows per (C, S) pair with the split; under lru with
// --promote-after 1 the tiers are one LRU of C+S and DRAM one of C.
func TestStoreReplayTwoTiers(t *testing.T) {
	isolateEnv(t)
	tr := writeTrace(t, tinyTrace)
	out, errs, code := execMC(t, "store", "replay", "--trace", tr, "--capacity-blocks", "2,4", "--ssd-capacity-blocks", "0,2", "--promote-after", "1", "-o", "json")
	var j tieredReplayJSON
	if err := json.Unmarshal([]byte(out), &j); err != nil || code != 0 || len(j.Results) != 4 {
		t.Fatalf("exit %d, %v: %s %s", code, err, out, errs)
	}
	dram2, tiered, big := j.Results[0], j.Results[1], j.Results[2]
	if dram2.SSDBlocks != 0 || tiered.CapacityBlocks != 2 || tiered.SSDBlocks != 2 || tiered.PromoteAfter != 1 || big.CapacityBlocks != 4 || big.SSDBlocks != 0 {
		t.Fatalf("rows out of order: %+v", j.Results)
	}
	if tiered.HitBlocks != big.HitBlocks || tiered.DRAMHitBlocks != dram2.HitBlocks || tiered.DiskHitBlocks != tiered.HitBlocks-tiered.DRAMHitBlocks || tiered.DiskHitBlocks == 0 {
		t.Fatalf("C=2 S=2: %+v; C=4 %+v; C=2 %+v", tiered, big, dram2)
	}
	if dram2.DRAMHitBlocks != dram2.HitBlocks || dram2.DiskHitRatio != 0 || dram2.DRAMHitRatio != dram2.HitRatio {
		t.Fatalf("DRAM-only row: %+v", dram2)
	}
	out, _, _ = execMC(t, "store", "replay", "--trace", tr, "--capacity-blocks", "2", "--ssd-capacity-blocks", "2")
	for _, want := range []string{"ssd (blocks)", "disk hit ratio", "DRAM hit ratio"} {
		if !strings.Contains(strings.ToLower(out), strings.ToLower(want)) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--ssd-capacity-blocks", "-1"}, "--ssd-capacity-blocks"},
		{[]string{"--ssd-capacity-blocks", "lots"}, "--ssd-capacity-blocks"},
		{[]string{"--promote-after", "-2"}, "--promote-after"},
		{[]string{"--online", "--ssd-capacity-blocks", "1,2"}, "at most one"},
	} {
		args := append([]string{"store", "replay", "--trace", tr}, c.args...)
		_, errs, code := execMC(t, args...)
		if code == 0 || !strings.Contains(errs, c.want) || strings.Count(errs, "\n") != 1 {
			t.Errorf("mc %s: exit %d, stderr %q; want one line naming %q", strings.Join(args, " "), code, errs, c.want)
		}
	}
}

// The online replay against a store with a disk tier prints the same
// split, from the master's hit counters.
func TestStoreReplayOnlineTwoTiers(t *testing.T) {
	isolateEnv(t)
	var b strings.Builder
	for i := range 80 {
		ids := make([]string, 8)
		for j := range ids {
			ids[j] = fmt.Sprint((i*5 + j*3) % 48)
		}
		fmt.Fprintf(&b, "{\"timestamp\": %d, \"input_length\": 4096, \"output_length\": 1, \"hash_ids\": [%s]}\n", i, strings.Join(ids, ", "))
	}
	tr := writeTrace(t, b.String())
	rpc, admin, _, _ := startServeStore(t, "--segment-size", "1M", "--ssd-dir", t.TempDir(), "--ssd-size", "16M", "--default_kv_lease_ttl", "100")
	out, errs, code := execMC(t, "store", "replay", "--trace", tr, "--online", "--block-bytes", "64K", "--capacity-blocks", "16",
		"--ssd-capacity-blocks", "48", "-o", "json", "--master", rpc, "--admin", admin)
	var j tieredReplayJSON
	if err := json.Unmarshal([]byte(out), &j); err != nil || code != 0 || j.Online == nil {
		t.Fatalf("exit %d, %v: %s %s", code, err, out, errs)
	}
	o := j.Online
	if o.SSDBlocks != 48 || o.DiskHitBlocks == 0 || o.DRAMHitBlocks+o.DiskHitBlocks > o.HitBlocks || o.DiskHitRatio <= 0 {
		t.Fatalf("online split: %+v", o)
	}
	if len(j.Results) != 1 || j.Results[0].SSDBlocks != 48 || j.Results[0].DiskHitBlocks == 0 {
		t.Fatalf("offline figures at the store's sizes: %+v", j.Results)
	}
}

func TestBenchStoreTierBadInput(t *testing.T) {
	isolateEnv(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--on-disk"}, "--ssd-dir"},
		{[]string{"--ssd-size", "1G"}, "without --ssd-dir"},
		{[]string{"--ssd-dir", t.TempDir(), "--master", "127.0.0.1:1"}, "no --master"},
		{[]string{"--ssd-dir", t.TempDir(), "--ssd-size", "big"}, "--ssd-size"},
		// Checked before the rows run: it failed after them, every row
		// thrown away, naming a hidden temporary file.
		{[]string{"--segment-size", "64M", "--duration", "1s", "--plot", filepath.Join(t.TempDir(), "nodir", "x.svg")}, "--plot: write "},
	} {
		args := append([]string{"bench", "store"}, c.args...)
		_, errs, code := execMC(t, args...)
		if code == 0 || !strings.Contains(errs, c.want) || strings.Count(errs, "\n") != 1 {
			t.Errorf("mc %s: exit %d, stderr %q; want one line naming %q", strings.Join(args, " "), code, errs, c.want)
		}
	}
}
