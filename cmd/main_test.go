package cmd

import (
	"context"
	"os"
	"testing"
)

// TestMain lets this test binary stand in for mc where a command starts
// mc again (mc bench coll launches its ranks as os.Executable()): with
// MC_TEST_RUN_MC=1 in its environment, it runs the command its arguments
// name, as main does, instead of the tests.
func TestMain(m *testing.M) {
	if os.Getenv("MC_TEST_RUN_MC") == "1" {
		os.Exit(Execute(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}
