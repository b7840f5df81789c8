package store

import (
	"fmt"
	"net"
	"strings"
)

const mooncakeScheme = "mooncake://"

// IsMooncakeAddress reports whether a master address names a Mooncake
// master (mooncake://HOST:PORT): the client then speaks Mooncake's
// coro_rpc + struct_pack instead of mc's gRPC.
func IsMooncakeAddress(s string) bool { return strings.HasPrefix(s, mooncakeScheme) }

// ParseMooncakeAddress returns the host:port of mooncake://HOST:PORT.
func ParseMooncakeAddress(s string) (string, error) {
	if !IsMooncakeAddress(s) {
		return "", fmt.Errorf("%q: want mooncake://HOST:PORT", s)
	}
	addr := strings.TrimSuffix(strings.TrimPrefix(s, mooncakeScheme), "/")
	if _, port, err := net.SplitHostPort(addr); err != nil || port == "" {
		return "", fmt.Errorf("%q: want mooncake://HOST:PORT (mooncake_master's --rpc_port, 50051 by default)", s)
	}
	return addr, nil
}
