package bench

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine"
)

func TestParseSize(t *testing.T) {
	good := map[string]int64{
		"4096": 4096, "4K": 4096, "4k": 4096, "64K": 65536, "1M": 1 << 20, "1G": 1 << 30,
		"2GiB": 2 << 30, "16KB": 16 << 10, " 8K ": 8192, "1T": 1 << 40, "2TiB": 2 << 40,
		"4 GB": 4 << 30, "1.5M": 3 << 19, "1P": 1 << 50,
	}
	for in, want := range good {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0", "-1", "K", "0.1K", "1X", "abc", "99999999999999G", "9999999T"} {
		if _, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) accepted", in)
		}
	}
	l, err := ParseSizeList("4K,64K,1M")
	if err != nil || len(l) != 3 || l[2] != 1<<20 {
		t.Fatalf("list: %v %v", l, err)
	}
	if _, err := ParseSizeList(","); err == nil {
		t.Error("empty list accepted")
	}
	for n, want := range map[int64]string{4096: "4K", 1 << 20: "1M", 3 << 30: "3G", 1000: "1000", 1536: "1536"} {
		if got := FormatSize(n); got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestUnits(t *testing.T) {
	cases := map[string]float64{"GB": 1, "GiB": 1e9 / float64(1<<30), "Gb": 8, "MB": 1e3, "Mb": 8e3, "KiB": 1e9 / 1024}
	for name, want := range cases {
		u, err := ParseUnit(name)
		if err != nil {
			t.Fatal(err)
		}
		if got := u.Per(1e9); got < want*0.9999 || got > want*1.0001 {
			t.Errorf("%s: 1e9 B/s = %v, want %v", name, got, want)
		}
	}
	if _, err := ParseUnit("gb"); err == nil || !strings.Contains(err.Error(), "GB, GiB, Gb") {
		t.Errorf("bad unit: %v", err)
	}
}

func TestPattern(t *testing.T) {
	b := make([]byte, 100)
	FillPattern(b, 13, 7) // unaligned start and end
	for i := range b {
		if b[i] != PatternByte(uint64(13+i), 7) {
			t.Fatalf("byte %d", i)
		}
	}
	c := make([]byte, 100)
	FillPattern(c, 13, 8)
	if string(b) == string(c) {
		t.Fatal("seed does not change the pattern")
	}
	FillPattern(c, 14, 7)
	if string(b) == string(c) {
		t.Fatal("offset does not change the pattern")
	}
	scratch := make([]byte, 100)
	if i := checkPattern(b, scratch, 13, 7); i != -1 {
		t.Fatalf("clean block mismatches at %d", i)
	}
	b[42] ^= 1
	if i := checkPattern(b, scratch, 13, 7); i != 42 {
		t.Fatalf("mismatch found at %d, want 42", i)
	}
}

func TestPercentile(t *testing.T) {
	var v []time.Duration
	for i := 1; i <= 1000; i++ {
		v = append(v, time.Duration(i))
	}
	if Percentile(v, 0.5) != 500 || Percentile(v, 0.99) != 990 || Percentile(v, 0.999) != 999 || Percentile(nil, 0.5) != 0 {
		t.Fatal(Percentile(v, 0.5), Percentile(v, 0.99), Percentile(v, 0.999))
	}
}

func newInitiator(t *testing.T) *engine.Engine {
	e, err := engine.New(context.Background(), engine.Config{LocalServerName: "i", BindAddress: "127.0.0.1", HandshakeAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func TestRunSweepAndVerify(t *testing.T) {
	ctx := context.Background()
	tgt, err := StartLoopbackTarget(ctx, engine.Config{}, 2<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer tgt.Close()
	e := newInitiator(t)
	for _, op := range []engine.Opcode{engine.Write, engine.Read} {
		res, err := Run(ctx, InitiatorConfig{Engine: e, Segment: tgt.Engine.SegmentName(), Op: op, BatchSize: 8,
			BlockSizes: []int64{4096, 65536}, BufferSize: 2 << 20, Duration: 150 * time.Millisecond, Threads: 2, Verify: true})
		if err != nil {
			t.Fatal(err)
		}
		if len(res) != 2 || res[1].BlockSize != 65536 {
			t.Fatalf("results %+v", res)
		}
		for _, r := range res {
			if r.BatchCount == 0 || r.Bytes != r.BatchCount*8*uint64(r.BlockSize) || r.FailedTasks != 0 || r.LatencyP50 <= 0 {
				t.Fatalf("%+v", r)
			}
		}
	}
	// The write run put the target's pattern back.
	if i := checkPattern(tgt.Buffers[0].Bytes(), make([]byte, 2<<20), 0, 0); i != -1 {
		t.Fatalf("target pattern broken at %d after a write verify", i)
	}
}

func TestRunVerifyMismatchNamesTheByte(t *testing.T) {
	ctx := context.Background()
	tgt, err := StartLoopbackTarget(ctx, engine.Config{}, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer tgt.Close()
	const off = 3*4096 + 77
	buf := tgt.Buffers[0]
	want := buf.Bytes()[off]
	e := newInitiator(t)
	// Corrupt the target once the pattern has been written to it.
	res, err := Run(ctx, InitiatorConfig{Engine: e, Segment: tgt.Engine.SegmentName(), Op: engine.Read, BatchSize: 16,
		BlockSizes: []int64{4096}, BufferSize: 1 << 20, Duration: time.Second, Threads: 1, Verify: true,
		afterPrime: func() { buf.Bytes()[off] ^= 0xff }})
	var me *MismatchError
	if !errors.As(err, &me) {
		t.Fatalf("err %v", err)
	}
	if me.Offset != off || me.Expected != want || me.Actual != want^0xff || me.Addr != buf.Addr()+off ||
		me.Segment != tgt.Engine.SegmentName() {
		t.Fatalf("mismatch %+v", me)
	}
	if len(res) != 1 || res[0].Err == nil {
		t.Fatalf("results %+v", res)
	}
	if !strings.Contains(err.Error(), "offset 12365") || !strings.Contains(err.Error(), "expected 0x") {
		t.Fatalf("message: %v", err)
	}
}

func TestRunRejectsOversizedSpan(t *testing.T) {
	ctx := context.Background()
	tgt, err := StartLoopbackTarget(ctx, engine.Config{}, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer tgt.Close()
	e := newInitiator(t)
	_, err = Run(ctx, InitiatorConfig{Engine: e, Segment: tgt.Engine.SegmentName(), Op: engine.Read, BatchSize: 128,
		BlockSizes: []int64{65536}, BufferSize: 1 << 30, Duration: time.Second, Threads: 1})
	// In the flags' names and sizes a user reads (it was batch_size 128
	// x block_size 65536 ... buffer <hostname>).
	if err == nil || !strings.Contains(err.Error(), "does not fit in the target's buffer (segment") || !strings.Contains(err.Error(), "--batch-size 128 x the largest --block-size 64K") {
		t.Fatalf("err %v", err)
	}
}

// A target that is not mc (Mooncake's bench target) does not hold mc's
// pattern: read verification writes it first instead of reporting a
// mismatch at offset 0.
func TestRunReadVerifyForeignTarget(t *testing.T) {
	ctx := context.Background()
	tgt, err := StartLoopbackTarget(ctx, engine.Config{}, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer tgt.Close()
	clear(tgt.Buffers[0].Bytes())
	e := newInitiator(t)
	res, err := Run(ctx, InitiatorConfig{Engine: e, Segment: tgt.Engine.SegmentName(), Op: engine.Read, BatchSize: 16,
		BlockSizes: []int64{4096, 65536}, BufferSize: 1 << 20, Duration: 100 * time.Millisecond, Threads: 1, Verify: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 2 || !res[0].Verified || res[1].BatchCount == 0 {
		t.Fatalf("results %+v", res)
	}
}

// As transfer_engine_bench, the initiator has a buffer per NUMA node and
// thread tid works from buffer tid % nodes on the target's buffer
// tid % buffers.
func TestRunBuffersPerNUMANode(t *testing.T) {
	ctx := context.Background()
	te, err := engine.New(ctx, engine.Config{LocalServerName: "t", BindAddress: "127.0.0.1", HandshakeAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer te.Close()
	tgt, err := StartTarget(ctx, te, TargetConfig{BufferSize: 1 << 20, Nodes: []int{0, 1}})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range tgt.Buffers {
		clear(m.Bytes())
	}
	e := newInitiator(t)
	locs := map[string]bool{}
	var mu sync.Mutex
	_, err = Run(ctx, InitiatorConfig{Engine: e, Segment: te.SegmentName(), Op: engine.Write, BatchSize: 4,
		BlockSizes: []int64{4096}, BufferSize: 1 << 20, Duration: 300 * time.Millisecond, Threads: 2, Nodes: []int{0, 1},
		Progress: func(Progress) {
			mu.Lock()
			defer mu.Unlock()
			for _, m := range e.Memory() {
				locs[m.Location()] = true
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	if !locs["cpu:0"] || !locs["cpu:1"] {
		t.Fatalf("initiator buffers at %v, want cpu:0 and cpu:1", locs)
	}
	// Thread 1's first block (offset 4096) landed in the target's second
	// buffer, thread 0's (offset 0) in the first; neither in the other.
	b0, b1 := tgt.Buffers[0].Bytes(), tgt.Buffers[1].Bytes()
	if tgt.Buffers[0].Addr() > tgt.Buffers[1].Addr() {
		b0, b1 = b1, b0 // the descriptor lists buffers by address
	}
	if checkPattern(b0[:4096], make([]byte, 4096), 0, 0) != -1 || checkPattern(b1[4096:8192], make([]byte, 4096), 4096, 0) != -1 {
		t.Fatal("threads did not write their own target buffer")
	}
	if b0[4096] != 0 || b1[0] != 0 {
		t.Fatal("a thread wrote the other thread's target buffer")
	}
}

func TestPlotSweep(t *testing.T) {
	rs := []Result{
		{Operation: "read", BlockSize: 4096, Threads: 1, BatchSize: 128, BytesPerSec: 1.5e9, LatencyP99: 300 * time.Microsecond},
		{Operation: "read", BlockSize: 65536, Threads: 1, BatchSize: 128, BytesPerSec: 2.5e9, LatencyP99: 4 * time.Millisecond},
		{Operation: "read", BlockSize: 1 << 20, Threads: 1, BatchSize: 128, BytesPerSec: 2.9e9, LatencyP99: 50 * time.Millisecond},
	}
	u, _ := ParseUnit("GB")
	var buf strings.Builder
	if err := PlotSweep(&buf, rs, u); err != nil {
		t.Fatal(err)
	}
	svg := buf.String()
	for _, want := range []string{"<svg", "block size", "GB/s", "p99 batch latency", ">4K<", ">64K<", ">1M<", "read, 1 thread, batch 128", "</svg>"} {
		if !strings.Contains(svg, want) {
			t.Fatalf("svg lacks %q", want)
		}
	}
	if err := PlotSweep(&buf, rs[:1], u); err != nil {
		t.Fatalf("one point: %v", err)
	}
	if err := PlotSweep(&buf, nil, u); err == nil {
		t.Fatal("empty sweep plotted")
	}
}
