package replay

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// traceDir is the shared traces folder (not part of the repository).
var traceDir = filepath.Join("..", "..", "..", "..", "shared", "traces")

func loadTrace(tb testing.TB, name string) *Trace {
	tb.Helper()
	f, err := os.Open(filepath.Join(traceDir, name))
	if os.IsNotExist(err) {
		tb.Skipf("trace %s not found in %s (the shared traces folder is outside the repository): skipping", name, traceDir)
	}
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	t, err := Read(f)
	if err != nil {
		tb.Fatal(err)
	}
	return t
}

// The issue's reference figures: LRU on the conversation trace.
func TestLRUConversationHitRatios(t *testing.T) {
	tr := loadTrace(t, "conversation_trace.jsonl")
	if len(tr.Requests) != 12031 {
		t.Fatalf("%d requests, want 12031", len(tr.Requests))
	}
	want := map[int]float64{0: 0.366, 100000: 0.364, 50000: 0.355, 30000: 0.326, 10000: 0.212, 1000: 0.045}
	for capacity, w := range want {
		r, err := Run(tr, "lru", capacity)
		if err != nil {
			t.Fatal(err)
		}
		if math.Abs(r.HitRatio-w) > 0.0005 {
			t.Errorf("capacity %d: hit ratio %.4f, want %.3f", capacity, r.HitRatio, w)
		}
		if r.PrefixHitRatio > r.HitRatio || r.Requests != 12031 {
			t.Errorf("capacity %d: %+v", capacity, r)
		}
	}
}

const tiny = `{"timestamp": 5, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]}
{"timestamp": 0, "input_length": 1536, "output_length": 1, "hash_ids": [1, 2, 3]}

{"timestamp": 5, "input_length": 1536, "output_length": 1, "hash_ids": [1, 9, 3]}
{"timestamp": 7, "input_length": 512, "output_length": 1, "hash_ids": [3]}
`

// Hand-computed: requests in timestamp order, file order within one.
func TestRunTiny(t *testing.T) {
	tr, err := Read(strings.NewReader(tiny))
	if err != nil {
		t.Fatal(err)
	}
	if tr.Requests[0].Timestamp != 0 || tr.Requests[1].InputLength != 1024 || tr.Requests[2].InputLength != 1536 {
		t.Fatalf("order %+v", tr.Requests)
	}
	// Unbounded: [1 2 3] miss all; [1 2] hit 2; [1 9 3] hit 1,3 (prefix 1);
	// [3] hit. 9 blocks, 5 hits, prefix hits 2+1+1 = 4.
	r, _ := Run(tr, "lru", 0)
	if r.Blocks != 9 || r.HitBlocks != 5 || r.prefixHits != 4 || r.Requests != 4 {
		t.Fatalf("unbounded: %+v", r)
	}
	// Two blocks, LRU: [1 2 3] -> {2 3}; [1 2] hits 2 (on arrival), then
	// 1 evicts 2 and 2 evicts 3 -> {1 2}; [1 9 3] hits 1, then 9 evicts
	// 2, 3 evicts 1 -> {9 3}; [3] hits. 3 hits, prefix 0+1+1.
	r, _ = Run(tr, "lru", 2)
	if r.HitBlocks != 3 || r.prefixHits != 2 {
		t.Fatalf("lru 2: %+v", r)
	}
	// LFU, two blocks: [1 2 3] -> 3 evicts 1 -> {2:1 3:1}; [1 2] hits 2;
	// 1 evicts 3 (fewest uses, then least recent) -> {2:1 1:1}, 2 touched
	// -> {1:1 2:2}; [1 9 3] hits 1 -> {1:2 2:2}, 9 evicts 1 (older of the
	// twos) -> {2:2 9:1}, 3 evicts 9 -> {2:2 3:1}; [3] hits. 3 hits.
	r, _ = Run(tr, "lfu", 2)
	if r.HitBlocks != 3 || r.prefixHits != 2 {
		t.Fatalf("lfu 2: %+v", r)
	}
}

func TestReadErrors(t *testing.T) {
	for in, want := range map[string]string{
		"": "no request",
		"{\"timestamp\": 1, \"input_length\": 0, \"output_length\": 0, \"hash_ids\": []}\nnot json": "line 2",
		`{"timestamp": -1, "input_length": 0, "output_length": 0, "hash_ids": []}`:                  "negative timestamp",
		`{"hash_ids": ["x"]}`: "line 1",
		`{"garbage": 1}`:      "line 1: missing required field(s) timestamp",
	} {
		if _, err := Read(strings.NewReader(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Read(%q) = %v, want an error with %q", in, err, want)
		}
	}
	if _, err := Run(&Trace{}, "mru", 1); err == nil {
		t.Error("unknown policy accepted")
	}
}

// BenchmarkReplay is one replay of the conversation trace at one
// capacity, per policy (the issue wants well under a second).
func BenchmarkReplay(b *testing.B) {
	tr := loadTrace(b, "conversation_trace.jsonl")
	for _, p := range []string{"lru", "lfu", "length-aware"} {
		b.Run(p, func(b *testing.B) {
			for b.Loop() {
				if _, err := Run(tr, p, 10000); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func ExampleRun() {
	tr, _ := Read(strings.NewReader(tiny))
	r, _ := Run(tr, "lru", 0)
	fmt.Printf("%d/%d blocks hit\n", r.HitBlocks, r.Blocks)
	// Output: 5/9 blocks hit
}
