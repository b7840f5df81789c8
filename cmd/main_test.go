package cmd

import (
	"context"
	"os"
	"strings"
	"testing"
)

// TestMain lets this test binary stand in for mc where a command starts
// mc again (mc bench coll launches its ranks as os.Executable()): with
// MC_TEST_RUN_MC=1 in its environment, or a command name first among its
// arguments (go test passes only -test.* flags), it runs the command its
// arguments name, as main does, instead of the tests. Without the
// second, a test running a launcher without MC_TEST_RUN_MC had each rank
// run every test again, that test included: a fork bomb.
func TestMain(m *testing.M) {
	if os.Getenv("MC_TEST_RUN_MC") == "1" || len(os.Args) > 1 && !strings.HasPrefix(os.Args[1], "-") {
		os.Exit(Execute(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}
