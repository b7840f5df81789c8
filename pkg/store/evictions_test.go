package store_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/master"
)

// A writer whose region another writer's put takes (phase 3) learns the
// evicted keys through Client.Evictions, fed by its pings.
func TestEvictionsReachTheOwner(t *testing.T) {
	c := startMaster(t, master.Config{RegionSize: 1 << 20, HighWatermark: 1})
	owner := c.client(4 << 20)
	events := owner.Evictions()
	ctx := context.Background()
	var mine []string
	for i := range 12 { // four 1 MiB regions of three 300 KiB values
		k := fmt.Sprint("owner/", i)
		if err := owner.Put(ctx, k, value(300<<10, byte(i))); err != nil {
			t.Fatalf("put %s: %v", k, err)
		}
		mine = append(mine, k)
	}
	other := c.client(0)
	if err := other.Put(ctx, "other/0", value(300<<10, 99)); err != nil {
		t.Fatalf("put into the full pool: %v", err)
	}
	var got []string
	deadline := time.After(5 * time.Second)
	for len(got) < 3 {
		select {
		case keys := <-events:
			got = append(got, keys...)
		case <-deadline:
			t.Fatalf("owner told of %v within 5 s, want 3 keys", got)
		}
	}
	if len(got) != 3 {
		t.Fatalf("owner told of %v, want one region's 3 keys", got)
	}
	for _, k := range got {
		if !slices.Contains(mine, k) {
			t.Errorf("owner told of %q, not one of its keys", k)
		}
		if _, err := owner.Get(ctx, k); !errors.Is(err, store.ErrObjectNotFound) {
			t.Errorf("get evicted %q: %v, want OBJECT_NOT_FOUND", k, err)
		}
	}
	if n := owner.Stats().EvictedKeys; n != 3 {
		t.Errorf("owner stats count %d evicted keys, want 3", n)
	}
	select {
	case keys := <-other.Evictions():
		t.Errorf("the writer that evicted was told %v", keys)
	case <-time.After(200 * time.Millisecond):
	}
}
