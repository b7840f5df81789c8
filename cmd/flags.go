package cmd

import (
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/kvcache-ops/mc/pkg/engine/meta"
	"github.com/kvcache-ops/mc/pkg/units"
)

// Every size and duration flag goes through pkg/units, whether the value
// comes from the command line, the environment, a config file or
// mooncake_master's --config_path: one set of forms, one message. pflag
// adds the flag's name ("invalid argument "4 GBs" for "--segment-size"
// flag: unknown unit ...") and config.apply the source.

// sizeHelp ends the help of every size flag.
const sizeHelp = ` (4096, 4K, 4KiB, "4 GB"; K = 1024)`

// sizeValue is an int64 byte count.
type sizeValue struct{ p *int64 }

func (v sizeValue) Set(s string) error {
	n, err := units.ParseSize(s)
	if err != nil {
		return err
	}
	*v.p = n
	return nil
}

func (v sizeValue) String() string {
	if v.p == nil {
		return "0"
	}
	return units.FormatSize(*v.p)
}

func (sizeValue) Type() string { return "size" }

// sizeVar defines a size flag; usage gets the accepted forms appended.
func sizeVar(fs *pflag.FlagSet, p *int64, name string, def int64, usage string) {
	sizeVarP(fs, p, name, "", def, usage)
}

func sizeVarP(fs *pflag.FlagSet, p *int64, name, short string, def int64, usage string) {
	*p = def
	fs.VarP(sizeValue{p}, name, short, usage+sizeHelp)
}

// sizeListValue is a comma-separated list of sizes.
type sizeListValue struct{ p *[]int64 }

func (v sizeListValue) Set(s string) error {
	ns, err := units.ParseSizeList(s)
	if err != nil {
		return err
	}
	*v.p = ns
	return nil
}

func (v sizeListValue) String() string {
	if v.p == nil {
		return ""
	}
	return units.FormatSizes(*v.p)
}

func (sizeListValue) Type() string { return "sizes" }

func sizeListVar(fs *pflag.FlagSet, p *[]int64, name string, def []int64, usage string) {
	*p = def
	fs.Var(sizeListValue{p}, name, usage+sizeHelp)
}

// durationValue is a duration whose bare numbers count units of bare.
type durationValue struct {
	p    *time.Duration
	bare time.Duration
}

func (v durationValue) Set(s string) error {
	d, err := units.ParseDuration(s, v.bare)
	if err != nil {
		return err
	}
	*v.p = d
	return nil
}

func (v durationValue) String() string {
	// "0", which pflag's help takes for no default (not "0s").
	if v.p == nil || *v.p == 0 {
		return "0"
	}
	// 30m, not Go's 30m0s.
	s := v.p.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

func (durationValue) Type() string { return "duration" }

// durationVar defines a duration flag whose bare numbers are seconds, as
// transfer_engine_bench's --duration; usage gets the forms appended.
func durationVar(fs *pflag.FlagSet, p *time.Duration, name string, def time.Duration, usage string) {
	*p = def
	fs.Var(durationValue{p, time.Second}, name, usage+" (seconds, or 500ms, 2m, 1h30m)")
}

// msDurationVar defines a duration flag whose bare numbers are
// milliseconds: mooncake_master's TTL flags (--default_kv_lease_ttl=10000).
func msDurationVar(fs *pflag.FlagSet, p *time.Duration, name string, def time.Duration, usage string) {
	*p = def
	fs.Var(durationValue{p, time.Millisecond}, name, usage+" (milliseconds, or 10s, 2m, 1h30m)")
}

// checkListen refuses a listen address that is not host:port with a
// port of 0-65535 (0: any free port), as a usage error naming flag;
// without it the mistake surfaced only when the listener was opened,
// as a failure (exit 1) after the rest had started.
func checkListen(flag, addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return usagef("invalid --%s %q: want host:port", flag, addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return usagef("invalid --%s %q: port %q is not 0-65535", flag, addr, port)
	}
	return nil
}

// checkHostIP refuses an address to listen on that is not an IP of
// this host (or localhost), naming flag.
func checkHostIP(flag, addr string) error {
	if net.ParseIP(addr) == nil && addr != "localhost" {
		return usagef("invalid --%s %q: want an IP address of this host (0.0.0.0 for every interface)", flag, addr)
	}
	return nil
}

// checkMetadataServer refuses a malformed metadata server address as a
// usage error naming flag, before any work (the engine opened it only
// when it started).
func checkMetadataServer(flag, server string) error {
	if err := meta.Check(server); err != nil {
		return usagef("invalid --%s: %w", flag, err)
	}
	return nil
}

// checkPortRange refuses a handshake port range the engine cannot bind
// in, naming both flags.
func checkPortRange(minFlag, maxFlag string, lo, hi int) error {
	if lo < 1 || hi > 65535 || lo > hi {
		return usagef("--%s %d and --%s %d: want 1 <= min <= max <= 65535", minFlag, lo, maxFlag, hi)
	}
	return nil
}
