package master

import (
	"testing"

	"github.com/kvcache-ops/mc/pkg/store"
)

// BatchRemoveIf removes the versions of the checksums it is given, not
// newer ones, and refuses sums that do not pair with the keys.
func TestBatchRemoveIfVersion(t *testing.T) {
	m, _ := newTestMaster(t, Config{})
	mount(t, m, "node", "seg", "h", 0x10000000, 1<<20)
	for i, k := range []string{"a", "b"} {
		putStart(t, m, "w", k, 4096)
		if err := m.BatchPutEndSums(uuidOf("w"), []string{k}, []uint64{1<<32 | uint64(i+1)})[0]; err != nil {
			t.Fatal(err)
		}
	}
	errs := m.BatchRemoveIf([]string{"a", "b"}, true, []uint64{1<<32 | 1, 1<<32 | 7})
	if errs[0] != nil {
		t.Fatalf("remove a at its own version: %v", errs[0])
	}
	wantCode(t, "remove b at another version", errs[1], store.InvalidVersion)
	if r := get(m, "b"); r.Err != nil {
		t.Fatalf("b after a refused removal: %v", r.Err)
	}
	for _, err := range m.BatchRemoveIf([]string{"b"}, true, []uint64{1, 2}) {
		wantCode(t, "two sums for one key", err, store.InvalidParams)
	}
}
