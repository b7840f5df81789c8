package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/master"
)

// With an admin token, RemoveAll asks for it over gRPC as POST
// /api/v1/remove_all does over HTTP, and Mooncake's wire, which cannot
// carry it, is refused; the data plane's removals stay open (issue 40,
// item 1).
func TestRemoveAllNeedsAdminToken(t *testing.T) {
	c := startMaster(t, master.Config{AdminToken: "s3cret"})
	c.client(16 << 20)
	cl := c.client(0)
	ctx := context.Background()
	for _, k := range []string{"a", "b", "c"} {
		if err := cl.Put(ctx, k, value(100, 1)); err != nil {
			t.Fatal(err)
		}
	}
	for _, tok := range []string{"", "wrong"} {
		n, err := cl.RemoveAll(store.WithAdminToken(ctx, tok))
		if !errors.Is(err, store.ErrAdminUnauthorized) || n != 0 {
			t.Fatalf("remove all with token %q: %d, %v; want ErrAdminUnauthorized", tok, n, err)
		}
	}
	if _, err := cl.RemoveAll(ctx); !strings.Contains(err.Error(), "authorization: Bearer TOKEN") || !strings.Contains(err.Error(), "MC_ADMIN_TOKEN") {
		t.Fatalf("the refusal does not say how to send the token: %v", err)
	}
	mc := c.mooncakeClient(0)
	if n, err := mc.RemoveAll(ctx); err == nil || !strings.Contains(err.Error(), "/api/v1/remove_all") {
		t.Fatalf("remove all over Mooncake's wire on a master with a token: %d, %v", n, err)
	}
	if ex, _ := cl.BatchExist(ctx, []string{"a", "b", "c"}); !ex[0] || !ex[1] || !ex[2] {
		t.Fatalf("refused calls removed keys: %v", ex)
	}
	// Removals by name and by pattern are the data plane's: open.
	if err := cl.Remove(ctx, "c", true); err != nil {
		t.Fatalf("remove by name: %v", err)
	}
	n, err := cl.RemoveAll(store.WithAdminToken(ctx, "s3cret"))
	if err != nil || n != 2 {
		t.Fatalf("remove all with the token: %d, %v", n, err)
	}
}
