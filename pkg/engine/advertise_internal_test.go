package engine

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/kvcache-ops/mc/pkg/engine/meta"
)

// fakeNames makes every name but "resolvable" unknown, and gives the host
// the interface addresses addrs.
func fakeNames(t *testing.T, addrs ...string) {
	t.Helper()
	oldLookup, oldAddrs := lookupHost, interfaceAddrs
	t.Cleanup(func() { lookupHost, interfaceAddrs = oldLookup, oldAddrs })
	lookupHost = func(_ context.Context, host string) ([]string, error) {
		if host == "resolvable" {
			return []string{"127.0.0.1"}, nil
		}
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	interfaceAddrs = func() ([]net.Addr, error) {
		var out []net.Addr
		for _, a := range addrs {
			_, n, err := net.ParseCIDR(a)
			if err != nil {
				return nil, err
			}
			n.IP, _, _ = net.ParseCIDR(a)
			out = append(out, n)
		}
		return out, nil
	}
}

func captureLog(t *testing.T) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, nil)))
	t.Cleanup(func() { slog.SetDefault(old) })
	return &buf
}

func TestHostAddressPrefersGlobalIPv4(t *testing.T) {
	fakeNames(t, "127.0.0.1/8", "fe80::1/64", "fd00::2/64", "10.0.0.5/24")
	if got := hostAddress(); got != "10.0.0.5" {
		t.Fatalf("picked %s", got)
	}
	fakeNames(t, "127.0.0.1/8", "fd00::2/64")
	if got := hostAddress(); got != "fd00::2" {
		t.Fatalf("picked %s", got)
	}
	fakeNames(t, "127.0.0.1/8")
	if got := hostAddress(); got != "127.0.0.1" {
		t.Fatalf("picked %s", got)
	}
}

// The README's etcd example on a fresh host: --local_server_name node1,
// which no resolver knows. The target warns and advertises an address,
// and an initiator opening "node1" reaches it.
func TestUnresolvableServerNameIsAdvertisedAsAnAddress(t *testing.T) {
	fakeNames(t, "127.0.0.1/8") // loopback only: the test stays on loopback
	logs := captureLog(t)
	ctx := context.Background()
	be := meta.NewMemory()
	target, err := New(ctx, Config{LocalServerName: "node1", Backend: be, MetadataServer: "etcd-in-memory", BindAddress: "0.0.0.0", HandshakeAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	if !strings.Contains(logs.String(), "local server name does not resolve") || !strings.Contains(logs.String(), "name=node1") ||
		!strings.Contains(logs.String(), "advertised=127.0.0.1") {
		t.Fatalf("no warning naming node1: %s", logs.String())
	}
	rpc, err := be.GetRPCMeta(ctx, "node1")
	if err != nil || rpc.IPOrHostName != "127.0.0.1" {
		t.Fatalf("rpc meta %+v, %v", rpc, err)
	}
	tm, err := target.RegisterMemory(ctx, 4096, "cpu:0", true)
	if err != nil {
		t.Fatal(err)
	}
	copy(tm.Bytes(), "hello")
	init, err := New(ctx, Config{LocalServerName: "resolvable", Backend: be, MetadataServer: "etcd-in-memory", BindAddress: "127.0.0.1", HandshakeAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer init.Close()
	lm, err := init.RegisterMemory(ctx, 4096, "cpu:0", false)
	if err != nil {
		t.Fatal(err)
	}
	seg, err := init.OpenSegment(ctx, "node1")
	if err != nil {
		t.Fatal(err)
	}
	if err := init.Transfer(ctx, Request{Op: Read, Source: lm.Addr(), Segment: seg, Target: tm.Addr(), Length: 4096}); err != nil {
		t.Fatal(err)
	}
	if string(lm.Bytes()[:5]) != "hello" {
		t.Fatal("bytes differ")
	}
}

func TestResolvableServerNameIsKept(t *testing.T) {
	fakeNames(t, "127.0.0.1/8", "10.0.0.5/24")
	logs := captureLog(t)
	if got := reachableHost(context.Background(), "resolvable"); got != "resolvable" {
		t.Fatalf("advertised %q", got)
	}
	if got := reachableHost(context.Background(), "10.1.2.3"); got != "10.1.2.3" {
		t.Fatalf("advertised %q", got)
	}
	if logs.Len() != 0 {
		t.Fatalf("unexpected log: %s", logs.String())
	}
}
