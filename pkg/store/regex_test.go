package store_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/master"
)

// Listing and removing one model's keys by pattern over the real RPC.
func TestRegexOverRPC(t *testing.T) {
	c := startMaster(t, master.Config{})
	c.client(16 << 20)
	cl := c.client(0)
	ctx := context.Background()
	var llama []string
	for i := range 3 {
		k := fmt.Sprintf("model:llama@rank%d/abc", i)
		llama = append(llama, k)
		for _, key := range []string{k, fmt.Sprintf("model:qwen@rank%d/abc", i)} {
			if err := cl.Put(ctx, key, value(1000, byte(i))); err != nil {
				t.Fatal(err)
			}
		}
	}
	got, err := cl.GetReplicaListByRegex(ctx, `^model:llama@`)
	if err != nil || !slices.Equal(got.Keys, llama) || got.Matched != 3 || len(got.Replicas) != 3 || len(got.Replicas[0]) != 1 {
		t.Fatalf("GetReplicaListByRegex = %+v, %v", got, err)
	}
	// A get holds a read lease on rank1: refused without force.
	if _, err := cl.Get(ctx, llama[1]); err != nil {
		t.Fatal(err)
	}
	dry, err := cl.RemoveByRegex(ctx, `^model:llama@`, false, true)
	if err != nil || dry.RemovedCount != 2 || dry.RefusedCount != 1 || dry.Refused[0] != llama[1] || !errors.Is(dry.RefusedErrs[0], store.ErrObjectHasLease) {
		t.Fatalf("dry run = %+v, %v", dry, err)
	}
	if ok, _ := cl.Exist(ctx, llama[0]); !ok {
		t.Fatal("a dry run removed a key")
	}
	rm, err := cl.RemoveByRegex(ctx, `^model:llama@`, true, false)
	if err != nil || rm.RemovedCount != 3 || !slices.Equal(rm.Removed, llama) || rm.RefusedCount != 0 {
		t.Fatalf("RemoveByRegex --force = %+v, %v", rm, err)
	}
	if got, _ := cl.GetReplicaListByRegex(ctx, `llama`); got.Matched != 0 {
		t.Fatalf("left after removal: %+v", got)
	}
	if got, _ := cl.GetReplicaListByRegex(ctx, `qwen`); got.Matched != 3 {
		t.Fatalf("the other model's keys: %+v", got)
	}
	if _, err := cl.RemoveByRegex(ctx, `(unclosed`, false, false); store.CodeOf(err) != store.InvalidParams {
		t.Fatalf("bad pattern: %v, want INVALID_PARAMS", err)
	}
	mf := c.m.Metrics()
	fams, err := mf.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{
		"master_remove_by_regex_requests_total": 3, "master_remove_by_regex_failures_total": 1,
		"master_get_replica_list_by_regex_requests_total": 3,
	}
	for _, f := range fams {
		if w, ok := want[f.GetName()]; ok {
			if got := f.GetMetric()[0].GetCounter().GetValue(); got != w {
				t.Errorf("%s = %v, want %v", f.GetName(), got, w)
			}
			delete(want, f.GetName())
		}
	}
	if len(want) > 0 {
		t.Errorf("not exported: %v", want)
	}
}
