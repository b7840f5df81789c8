package cmd

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

func TestZZSweepStringFlags(t *testing.T) {
	isolateEnv(t)
	root := newRootCmd(&printer{Out: &bytes.Buffer{}, Err: &bytes.Buffer{}})
	extra := map[string][]string{
		"store get": {"k"}, "store exists": {"k"}, "store put": {"k", "/etc/hostname"}, "store query": {"k"},
		"meta show": {"x"}, "store rm": {"k"}, "store drain": {"seg"},
	}
	walkFlags(root, func(c *cobra.Command, f *pflag.Flag) {
		if f.Value.Type() != "string" && f.Value.Type() != "stringSlice" || c.HasSubCommands() || f.Name == "help" {
			return
		}
		path := strings.Fields(c.CommandPath())[1:]
		if path[0] == "completion" || path[0] == "help" {
			return
		}
		args := append(append(append([]string(nil), path...), extra[strings.Join(path, " ")]...), "--"+f.Name+"=@bogus@")
		if path[0] == "store" || path[0] == "bench" && path[1] == "store" {
			args = append(args, "--master", "127.0.0.1:1", "--admin", "http://127.0.0.1:1")
		}
		var out, errb bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
		code := Execute(ctx, args, &out, &errb)
		cancel()
		line := strings.SplitN(errb.String(), "\n", 2)[0]
		fmt.Printf("%3d  mc %s  | %.200s\n", code, strings.Join(args, " "), line)
	})
}
