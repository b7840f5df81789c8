package master

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/mooncake"
	"github.com/kvcache-ops/mc/pkg/structpack"
)

// The hand-written BatchGetReplicaList and BatchPutStart answers are byte for byte what
// struct_pack writes for the same lists: random batches of hits, misses,
// several replicas, both length widths (a batch or a string of 256 or
// more switches every length to two bytes).
func TestAppendListsEqualsStructpack(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	errs := []error{
		store.Errorf(store.ObjectNotFound, "key not found"),
		store.Errorf(store.ReplicaIsNotReady, "still being written"),
		store.Errorf(store.RPCTimeout, "did not load"),
	}
	s := &mooncakeServer{}
	for round, n := range []int{0, 1, 2, 7, 128, 255, 256, 300, 1000} {
		for variant := range 3 {
			rs := make([]ReplicaResult, n)
			for i := range rs {
				if rng.IntN(5) == 0 {
					rs[i].Err = errs[rng.IntN(len(errs))]
					continue
				}
				for range rng.IntN(4) {
					ep := fmt.Sprintf("10.0.%d.%d:%d", rng.IntN(256), rng.IntN(256), rng.IntN(65536))
					if variant == 2 && rng.IntN(10) == 0 {
						ep = strings.Repeat("h", 256+rng.IntN(300)) // a long name: wide lengths
					}
					rs[i].Replicas = append(rs[i].Replicas, store.Replica{Endpoint: ep, Protocol: []string{"tcp", "rdma", ""}[rng.IntN(3)],
						Addr: rng.Uint64(), Len: rng.Uint64N(1 << 40), Complete: rng.IntN(4) != 0})
				}
				rs[i].LeaseTTL = time.Duration(rng.Int64N(int64(time.Hour)))
			}
			next := rng.Uint64N(1 << 50)
			// BatchPutStart's answer: the general route's values, encoded.
			descs := make([]mooncake.ExpectDescs, n)
			id := next
			for i, r := range rs {
				if r.Err != nil {
					descs[i] = mooncake.ExpectDescs{Error: codeOf(r.Err), HasError: true}
					continue
				}
				d := s.descriptorsFrom(r.Replicas, id, nil)
				id += uint64(len(d))
				descs[i] = mooncake.ExpectDescs{Value: d}
			}
			wantDescs, err := structpack.Marshal(descs)
			if err != nil {
				t.Fatal(err)
			}
			gotDescs, _, ok := appendDescs(nil, rs, next)
			if !ok || !bytes.Equal(gotDescs, wantDescs) {
				t.Fatalf("round %d (%d results, variant %d): appendDescs differs from struct_pack\n got %x\nwant %x", round, n, variant, gotDescs[:min(len(gotDescs), 80)], wantDescs[:min(len(wantDescs), 80)])
			}
			want, wantFailed := s.listsFrom(rs, next)
			wantBytes, err := structpack.Marshal(want)
			if err != nil {
				t.Fatal(err)
			}
			got, failed, ok := appendLists([]byte("junk"), rs, next)
			if !ok {
				t.Fatalf("round %d: appendLists gave up", round)
			}
			if !bytes.Equal(got[4:], wantBytes) || failed != wantFailed || string(got[:4]) != "junk" {
				t.Fatalf("round %d (%d results, variant %d): appendLists differs from struct_pack (failed %v, want %v)\n got %x\nwant %x", round, n, variant, failed, wantFailed, got[4:min(len(got), 80)], wantBytes[:min(len(wantBytes), 76)])
			}
			// And it decodes as Mooncake's client decodes it.
			var back []mooncake.ExpectList
			if err := structpack.Unmarshal(got[4:], &back); err != nil || len(back) != n {
				t.Fatalf("round %d: decode: %v (%d lists)", round, err, len(back))
			}
		}
	}
	// A length past two bytes is left to the general route.
	huge := []ReplicaResult{{Replicas: []store.Replica{{Endpoint: strings.Repeat("x", 1<<16), Protocol: "tcp"}}}}
	if _, _, ok := appendLists(nil, huge, 0); ok {
		t.Fatal("a 64 KiB endpoint name was hand-encoded with two-byte lengths")
	}
}

// Over the wire: a batch whose answer takes the general route (an
// endpoint name past 64 KiB is not possible here, so both routes are
// driven through batchGetAnswer by a batch with a miss and a hit) answers
// as before, and pooled buffers carry nothing from one answer into the
// next.
func TestBatchGetAnswersThroughPool(t *testing.T) {
	m, addr, node := wireBenchMaster(t)
	_ = m
	ctx := context.Background()
	id := mooncake.UUID{First: 9, Second: 1}
	keys := []string{"a", "bb", "ccc"}
	if _, _, err := node.BatchPutStart(ctx, id, keys, []uint64{10, 20, 30}, mooncake.ReplicateConfig{ReplicaNum: 1, PreferredSegments: []string{}, PreferredNoFSegments: []string{}}, false); err != nil {
		t.Fatal(err)
	}
	if _, err := node.BatchPutEnd(ctx, id, keys, false); err != nil {
		t.Fatal(err)
	}
	c := mooncake.NewClient(addr, nil)
	defer c.Close()
	for range 50 {
		lists, errs, err := c.BatchGetReplicaList(ctx, []string{"ccc", "missing", "a"})
		if err != nil {
			t.Fatal(err)
		}
		if errs[1] == nil || errs[0] != nil || errs[2] != nil {
			t.Fatalf("errs %v", errs)
		}
		b0, ok0 := lists[0].Replicas[0].Memory()
		b2, ok2 := lists[2].Replicas[0].Memory()
		if !ok0 || !ok2 || b0.Size != 30 || b2.Size != 10 || lists[0].Replicas[0].ID == lists[2].Replicas[0].ID {
			t.Fatalf("answers %+v", lists)
		}
	}
}
