package engine

import (
	"context"
	"log/slog"
	"net"
	"time"
)

// Name resolution and interface listing, replaced in tests so that no
// test depends on (or queries) the host's DNS.
var (
	lookupHost     = net.DefaultResolver.LookupHost
	interfaceAddrs = net.InterfaceAddrs
)

// resolveTimeout bounds the start-up check of the advertised name.
const resolveTimeout = 2 * time.Second

// reachableHost returns host when peers can resolve it as this engine
// does, else an address of this host to advertise instead, with a warning.
// Peers connect to whatever the engine advertises: a name only its own
// /etc/hosts knows (or none does, like "node1" on a fresh host) fails on
// every initiator with "no such host" while the target looks healthy.
func reachableHost(ctx context.Context, host string) string {
	if host == "" || net.ParseIP(host) != nil {
		return host
	}
	ctx, cancel := context.WithTimeout(ctx, resolveTimeout)
	defer cancel()
	_, err := lookupHost(ctx, host)
	if err == nil {
		return host
	}
	ip := hostAddress()
	slog.Warn("local server name does not resolve: advertising an address instead (give --local-server-name a resolvable name, or --bind-address, to choose)",
		"name", host, "err", err, "advertised", ip)
	return ip
}

// hostAddress picks the address to advertise: the first global unicast
// address (IPv4 before IPv6), else loopback.
func hostAddress() string {
	addrs, err := interfaceAddrs()
	if err != nil {
		return "127.0.0.1"
	}
	var v6 string
	for _, a := range addrs {
		n, ok := a.(*net.IPNet)
		if !ok || !n.IP.IsGlobalUnicast() {
			continue
		}
		if n.IP.To4() != nil {
			return n.IP.String()
		}
		if v6 == "" {
			v6 = n.IP.String()
		}
	}
	if v6 != "" {
		return v6
	}
	return "127.0.0.1"
}
