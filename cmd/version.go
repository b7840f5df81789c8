package cmd

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/kvcache-ops/mc/pkg/store/mooncake"
)

// Set by the Makefile through -ldflags "-X ...". A plain `go build` falls
// back to what the Go toolchain embedded (module version, VCS revision).
var (
	version = ""
	commit  = ""
)

type versionInfo struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	GoVersion string `json:"go_version"`
	Platform  string `json:"platform"`
	// The Mooncake master wire mc speaks (mooncake:// masters, and
	// Mooncake clients on mc serve store).
	MooncakeCommit       string `json:"mooncake_commit"`
	MooncakeStoreVersion string `json:"mooncake_store_version"`
}

func currentVersion() versionInfo {
	v := versionInfo{Version: version, Commit: commit, GoVersion: runtime.Version(),
		Platform: runtime.GOOS + "/" + runtime.GOARCH, MooncakeCommit: mooncake.MooncakeCommit, MooncakeStoreVersion: mooncake.StoreVersion}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && v.Commit == "" {
				v.Commit = s.Value
			}
		}
	}
	if v.Version == "" {
		v.Version = "dev"
	}
	if v.Commit == "" {
		v.Commit = "unknown"
	}
	return v
}

func newVersionCmd(p *printer) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print mc's version, commit and Go version",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return runVersion(currentVersion(), p)
		},
	}
}

func runVersion(v versionInfo, p *printer) error {
	if p.JSON() {
		return p.PrintJSON(v)
	}
	_, err := fmt.Fprintf(p.Out, "mc %s\ncommit: %s\ngo: %s\nplatform: %s\nmooncake wire: store %s (Mooncake %s)\n", v.Version, v.Commit, v.GoVersion, v.Platform, v.MooncakeStoreVersion, v.MooncakeCommit)
	return err
}
