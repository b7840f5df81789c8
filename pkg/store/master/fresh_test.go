package master

import (
	"fmt"
	"testing"
	"time"
)

// Issue 34, item 7: a writer whose own older objects are all being read
// used to evict the objects it had just put (phase 1 takes the writer's
// own regions first) while another writer's older objects sat unread.
// An object put within the last lease TTL goes only after every older
// evictable one.
func TestFreshObjectsEvictedLast(t *testing.T) {
	m, clk := fullPool(t, Config{}, plain(), plain())
	clk.Advance(DefaultKVLeaseTTL + time.Second) // a's and b's objects are old
	for _, k := range names("a", 0, 1, 2, 3, 4, 5) {
		if r := get(m, k); r.Err != nil { // a reads all its own: leased
			t.Fatal(r.Err)
		}
	}
	var fresh []string
	for i := 6; i < 12; i++ {
		key := fmt.Sprint("a", i)
		put(t, m, "a", key, 300*KiB)
		fresh = append(fresh, key)
		wantPresent(t, m, true, fresh...)
	}
	wantPresent(t, m, true, names("a", 0, 1, 2, 3, 4, 5)...)
	wantPresent(t, m, false, names("b", 0, 1, 2, 3, 4, 5)...)
	mustInvariants(t, m)
}

// With nothing older left to take, fresh objects do go (in policy
// order) rather than the put failing.
func TestFreshObjectsGoWhenNothingOlder(t *testing.T) {
	m, clk := fullPool(t, Config{}, plain(), plain())
	clk.Advance(time.Second) // everything is fresh
	put(t, m, "a", "a6", 300*KiB)
	wantPresent(t, m, false, "a0")
	wantPresent(t, m, true, "a1", "a6")
	mustInvariants(t, m)
}

// The watermark loop too takes old objects before fresh ones: under lfu
// an object just put has the fewest uses of all, and was its first
// victim.
func TestWatermarkEvictsFreshLast(t *testing.T) {
	m, clk := newTestMaster(t, Config{EvictionPolicy: "lfu"})
	mount(t, m, "node", "seg", "127.0.0.1", 0, 4*MiB)
	for i := range 6 {
		key := fmt.Sprint("b", i)
		put(t, m, "b", key, 300*KiB)
		get(m, key)
		get(m, key)
	}
	clk.Advance(DefaultKVLeaseTTL + time.Second) // leases over, b's old
	put(t, m, "a", "a0", 300*KiB)
	if freed := m.Evict(300 * KiB); freed == 0 {
		t.Fatal("nothing evicted")
	}
	wantPresent(t, m, true, "a0")
	mustInvariants(t, m)
}
