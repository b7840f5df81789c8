package bench

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/store"
)

// A value larger than any segment is refused before the run, at once:
// the embedded store's before it starts, a running store's by one put
// (issue 35.5: a row of zeros with exit 0 for the embedded store, 10.6 s
// of prefill retries against a running one).
func TestValueLargerThanSegmentRefusedAtOnce(t *testing.T) {
	ctx := context.Background()
	_, err := Run(ctx, Config{SegmentSize: 16 << 20, ValueSizes: []int64{32 << 20}, Ops: []string{"put"},
		Duration: 200 * time.Millisecond, Engine: engineLoopback(), Logger: quietLog()})
	if err == nil || !strings.Contains(err.Error(), "value size 32M is larger than the embedded store's segment (16M)") {
		t.Fatalf("embedded: %v, want the value refused for the segment", err)
	}
	srv := startStore(t, 16<<20)
	for _, op := range []string{"put", "get"} {
		t0 := time.Now()
		res, err := Run(ctx, Config{Master: srv.RPCAddr, AllowEvict: true, ValueSizes: []int64{32 << 20}, Ops: []string{op},
			Duration: 200 * time.Millisecond, Engine: engineLoopback(), Logger: quietLog()})
		if !errors.Is(err, store.ErrNoAvailableHandle) || !strings.Contains(err.Error(), "value size 32M does not fit the store") || len(res) != 0 {
			t.Fatalf("%s against a 16M store: %+v, %v; want no row and the value refused", op, res, err)
		}
		if d := time.Since(t0); d > 3*time.Second {
			t.Fatalf("%s: refused after %s, want at once", op, d)
		}
	}
	if n := srv.Master.KeyCount(); n != 0 {
		t.Fatalf("%d keys left behind", n)
	}
}

// A row in which no operation succeeded is an error row: Error says why,
// and Failed names it (issue 35.5: a put row of 72,745 errors exited 0).
func TestRowOfFailuresIsMarked(t *testing.T) {
	ctx := context.Background()
	srv := startStore(t, 16<<20)
	pinned := store.WithConfig(store.ReplicateConfig{ReplicaNum: 1, HardPin: true})
	v := make([]byte, 1<<20)
	n := 0
	for ; n < 32; n++ {
		if err := srv.Node.Put(ctx, "pinned/"+string(rune('a'+n)), v, pinned); err != nil {
			break
		}
	}
	if n == 0 || n == 32 {
		t.Fatalf("filled the store with %d hard-pinned values", n)
	}
	res, err := Run(ctx, Config{Master: srv.RPCAddr, AllowEvict: true, ValueSizes: []int64{1 << 20, 4096}, Ops: []string{"put"},
		Duration: 200 * time.Millisecond, Engine: engineLoopback(), Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 2 {
		t.Fatalf("%d rows, want both sizes' rows", len(res))
	}
	for _, r := range res {
		if r.OpsPerSec != 0 || r.Errors == 0 || !strings.HasPrefix(r.Error, "all ") || !strings.Contains(r.Error, "puts failed, the first: put bench/") || !strings.Contains(r.Error, "NO_AVAILABLE_HANDLE") {
			t.Errorf("row %+v: want it marked with why it measured nothing", r)
		}
	}
	err = Failed(res)
	if !errors.Is(err, ErrNothingMeasured) || !strings.Contains(err.Error(), "2 of 2 row(s) measured nothing (1M put x1, 4K put x1)") {
		t.Fatalf("Failed = %v", err)
	}
	if Failed([]Result{{OpsPerSec: 1}}) != nil {
		t.Fatal("a row that measured something failed")
	}
}

// prefill asks for at most 256 MiB of buffer, or one value (issue 35.5:
// --op get with a 4 GB value asked mmap for 64 GB).
func TestPrefillBuffer(t *testing.T) {
	for _, vs := range []int64{1, 4096, 1 << 20, 16 << 20, 128 << 20, 4 << 30} {
		c := prefillChunk(vs)
		if c < 1 || c > 1024 || int64(c)*vs > max(256<<20, vs) {
			t.Errorf("value of %d bytes: %d a call (%d bytes of buffer)", vs, c, int64(c)*vs)
		}
	}
}

// TestResultJSONKeepsEveryField: a row's JSON has every field, the
// ratios null when the row has none (issue 40: vs_tcp came and went).
func TestResultJSONKeepsEveryField(t *testing.T) {
	b, err := json.Marshal(Result{Op: "get", VsTCP: 1.5})
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"error", "first_error", "disk_reads", "vs_disk", "vs_tcp", "transport"} {
		if _, ok := m[k]; !ok {
			t.Fatalf("no %q in %s", k, b)
		}
	}
	if m["vs_disk"] != nil || m["vs_tcp"] != 1.5 {
		t.Fatalf("ratios: %s", b)
	}
}
