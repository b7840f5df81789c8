package cmd

import (
	"encoding/json"
	"testing"

	"github.com/kvcache-ops/mc/pkg/store/mooncake"
)

// TestVersionNamesMooncakeWire: `mc version -o json` states the Mooncake
// commit and store version whose master wire mc speaks.
func TestVersionNamesMooncakeWire(t *testing.T) {
	out, _, err := runCmd(t, "version", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]string
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if v["mooncake_commit"] != mooncake.MooncakeCommit || len(v["mooncake_commit"]) != 40 || v["mooncake_store_version"] != mooncake.StoreVersion {
		t.Fatalf("version JSON %v lacks the Mooncake wire's commit and version", v)
	}
}
