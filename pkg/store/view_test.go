package store_test

import (
	"testing"

	"github.com/kvcache-ops/mc/pkg/store"
)

// The view key is read by Mooncake's clients and written by Mooncake's
// masters (EtcdLeaderCoordinator at 3b5a594): "mooncake-store/" + the
// cluster id less one trailing '/' + "/master_view". mc's candidates and
// clients must land on the same key for every cluster id.
func TestViewKeyAsMooncakeBuildsIt(t *testing.T) {
	for _, c := range []struct{ cluster, key string }{
		{"mooncake_cluster", "mooncake-store/mooncake_cluster/master_view"},
		{"prod/", "mooncake-store/prod/master_view"},
		{"a/b", "mooncake-store/a/b/master_view"},
		{"a/b/", "mooncake-store/a/b/master_view"},
		{"x//", "mooncake-store/x//master_view"}, // only one '/' goes
	} {
		if got := store.ViewKey(c.cluster); got != c.key {
			t.Errorf("ViewKey(%q) = %q, Mooncake reads %q", c.cluster, got, c.key)
		}
	}
	if store.KeyPrefix("prod/") != store.KeyPrefix("prod") {
		t.Errorf("cluster ids %q and %q keep HA state apart: %q vs %q", "prod/", "prod", store.KeyPrefix("prod/"), store.KeyPrefix("prod"))
	}
}
