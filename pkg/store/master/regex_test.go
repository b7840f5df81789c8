package master

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/kvcache-ops/mc/pkg/store"
)

// regexFixture: two models' keys, one of them being read, and a key of
// the first model still being written.
func regexFixture(t *testing.T) *Master {
	m, _ := newTestMaster(t, Config{})
	mount(t, m, "node-a", "seg-a", "127.0.0.1", 0x10000, 64*MiB)
	for i := range 3 {
		put(t, m, "w", fmt.Sprintf("llama-70b/rank%d/blk", i), 100)
		put(t, m, "w", fmt.Sprintf("qwen-7b/rank%d/blk", i), 100)
	}
	if r := get(m, "llama-70b/rank1/blk"); r.Err != nil {
		t.Fatal(r.Err)
	}
	putStart(t, m, "w", "llama-70b/rank9/blk", 100)
	return m
}

func TestGetReplicaListByRegex(t *testing.T) {
	m := regexFixture(t)
	keys, res, matched, err := m.GetReplicaListByRegex(`^llama-70b/`, 100)
	want := []string{"llama-70b/rank0/blk", "llama-70b/rank1/blk", "llama-70b/rank2/blk"}
	if err != nil || !slices.Equal(keys, want) || matched != 3 || len(res) != 3 {
		t.Fatalf("= %q, %d results, %d matched, %v; want %q (complete keys only, sorted)", keys, len(res), matched, err, want)
	}
	for i, r := range res {
		if r.Err != nil || len(r.Replicas) != 1 || r.LeaseTTL != 0 {
			t.Errorf("%s: %+v, want one replica and no lease", keys[i], r)
		}
	}
	// Found anywhere in the key, as std::regex_search; the listing took
	// no lease, so the keys remove without force.
	keys, _, matched, _ = m.GetReplicaListByRegex(`rank[02]`, 1)
	if matched != 4 || !slices.Equal(keys, []string{"llama-70b/rank0/blk"}) {
		t.Errorf("limit 1: %q of %d", keys, matched)
	}
	if err := remove(m, "llama-70b/rank0/blk", false); err != nil {
		t.Errorf("remove after the listing: %v", err)
	}
	for _, bad := range []string{`(`, `a{2,1}`, strings.Repeat("a", store.MaxKeyLength+1)} {
		if _, _, _, err := m.GetReplicaListByRegex(bad, 10); store.CodeOf(err) != store.InvalidParams {
			t.Errorf("pattern %.20q: %v, want INVALID_PARAMS", bad, err)
		}
	}
}

func TestRemoveByRegex(t *testing.T) {
	m := regexFixture(t)
	llama := []string{"llama-70b/rank0/blk", "llama-70b/rank2/blk"}
	// A dry run says what would go and what not, and removes nothing.
	rm, err := m.RemoveByRegex(`^llama-70b/`, false, true)
	if err != nil || !slices.Equal(rm.Removed, llama) || !slices.Equal(rm.Refused, []string{"llama-70b/rank1/blk"}) ||
		!errors.Is(rm.RefusedErrs[0], store.ErrObjectHasLease) {
		t.Fatalf("dry run: %+v, %v", rm, err)
	}
	if s := m.Stats(); s.Keys != 6 {
		t.Fatalf("dry run removed keys: %+v", s)
	}
	// The real thing leaves the key being read (and the one being
	// written, which no pattern matches before its put ends).
	rm, err = m.RemoveByRegex(`^llama-70b/`, false, false)
	if err != nil || !slices.Equal(rm.Removed, llama) || len(rm.Refused) != 1 {
		t.Fatalf("remove: %+v, %v", rm, err)
	}
	if s := m.Stats(); s.Keys != 4 || s.Processing != 1 {
		t.Fatalf("after remove: %+v", s)
	}
	rm, err = m.RemoveByRegex(`^llama-70b/`, true, false)
	if err != nil || !slices.Equal(rm.Removed, []string{"llama-70b/rank1/blk"}) || len(rm.Refused) != 0 {
		t.Fatalf("remove --force: %+v, %v", rm, err)
	}
	keys, _, _, _ := m.GetReplicaListByRegex(``, 100)
	if !slices.Equal(keys, []string{"qwen-7b/rank0/blk", "qwen-7b/rank1/blk", "qwen-7b/rank2/blk"}) {
		t.Fatalf("left: %q", keys)
	}
	if _, err := m.RemoveByRegex(`[`, false, false); store.CodeOf(err) != store.InvalidParams {
		t.Fatalf("bad pattern: %v", err)
	}
}
