package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/master"
	"github.com/kvcache-ops/mc/pkg/store/mooncake"
)

// A master restarted without HA re-adds a returning node's disk record
// of a key it knows nothing of. Whose version that is it cannot know: a
// writer whose upsert of the key was under way at the restart must not
// be told by its revoke that the object is complete, which mc's client
// takes for its End having landed (it would report the upsert stored,
// and readers would get the version before it). The revoke says that
// no put of the writer is under way and another version is held, and
// its End that its upsert was dropped.
func TestTierReAddedIsNoWritersEnd(t *testing.T) {
	c2, cl, dir := offloadThenRestart(t, master.Config{KVLeaseTTL: 100 * time.Millisecond}, map[string][]byte{"k": value(100_000, 1)})
	ctx := context.Background()
	_, tn2 := c2.tierNode(16<<20, dir, 64<<20)
	waitFor(t, "the node's tier to attach to the new master", 20*time.Second, func() bool { return tn2.Stats().Attached })
	if st := c2.m.Stats(); st.Keys != 1 {
		t.Fatalf("the new master has %d keys, want the re-added record", st.Keys)
	}
	wire := mooncake.NewClient(c2.addr, nil)
	defer wire.Close()
	w := mooncake.UUID{First: 5, Second: 5}
	err := wire.PutRevoke(ctx, w, "k", true)
	if codeOf(err) != store.ObjectNotFound {
		t.Fatalf("a writer's revoke of a re-added record's key: %v, want OBJECT_NOT_FOUND (INVALID_WRITE says its End landed)", err)
	}
	if err := wire.PutEnd(ctx, w, "k", true); codeOf(err) != store.InvalidWrite {
		t.Fatalf("a writer's End of a re-added record's key: %v, want INVALID_WRITE", err)
	}
	checkGets(t, cl, map[string][]byte{"k": value(100_000, 1)})
}

// codeOf is the code of an error Mooncake's wire answered.
func codeOf(err error) store.Code {
	var e *mooncake.Error
	if errors.As(err, &e) {
		return store.Code(e.Code)
	}
	return store.CodeOf(err)
}
