// Command mc is a transfer-engine toolkit and ops suite for disaggregated
// LLM serving. See README.md.
package main

import (
	"context"
	"os"

	"github.com/kvcache-ops/mc/cmd"
)

func main() {
	os.Exit(cmd.Execute(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}
