package meta

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine/handshake"
)

// P2PHandshake is the --metadata_server value that selects peer-to-peer
// descriptor exchange over the handshake socket (no store).
const P2PHandshake = "P2PHANDSHAKE"

// DefaultTimeout bounds one metadata call, as Mooncake's 5 s etcd timeout.
const DefaultTimeout = 5 * time.Second

// ErrUnreachable is matched (errors.Is) when the metadata server or P2P
// peer cannot be reached in time.
var ErrUnreachable = errors.New("metadata server unreachable")

// ErrUnsupported is matched when --metadata_server names a backend mc does
// not implement (redis).
var ErrUnsupported = errors.New("metadata backend not supported")

// unreachableError reads "metadata server <addr> unreachable: <why>".
type unreachableError struct {
	what string // "metadata server" or "peer"
	addr string
	err  error
}

func (e *unreachableError) Error() string {
	return fmt.Sprintf("%s %s unreachable: %v", e.what, e.addr, e.err)
}
func (e *unreachableError) Is(target error) bool { return target == ErrUnreachable }
func (e *unreachableError) Unwrap() error        { return e.err }

// Options configures a backend.
type Options struct {
	// ClusterID is MC_METADATA_CLUSTER_ID: keys become
	// "mooncake/<cluster>/...".
	ClusterID string
	// Timeout bounds each call; 0 means DefaultTimeout (5 s).
	Timeout time.Duration
	// Handshake is the local handshake (RPC) listener. P2PHANDSHAKE needs
	// it to publish the local descriptor (PutSegment).
	Handshake *handshake.Server
	// MaxLength bounds handshake frames and HTTP bodies; 0 means
	// handshake.DefaultMaxLength for frames and 64 MiB for HTTP bodies.
	MaxLength int
	// HTTPToken, when set, is sent by the HTTP backend as
	// "Authorization: Bearer <token>" (Mooncake's MC_METADATA_HTTP_TOKEN).
	HTTPToken string
}

// callLimit is how long a call may take: the backend's timeout, or less
// when ctx ends sooner, so that "no answer within" names the time taken.
func callLimit(ctx context.Context, timeout time.Duration) time.Duration {
	if dl, ok := ctx.Deadline(); ok {
		if left := time.Until(dl).Round(10 * time.Millisecond); left < timeout {
			return max(left, 10*time.Millisecond)
		}
	}
	return timeout
}

func (o Options) timeout() time.Duration {
	if o.Timeout <= 0 {
		return DefaultTimeout
	}
	return o.Timeout
}

// Open returns the backend --metadata_server names (compat.md §1):
// "P2PHANDSHAKE", "http://host:port/path", "etcd://h:p;h:p" or
// "h:p[,h:p]" (no scheme means etcd). "redis://" is refused with
// ErrUnsupported. Open does not contact the server; the first call reports
// an unreachable one (ErrUnreachable, naming the address).
func Open(ctx context.Context, server string, opts Options) (Backend, error) {
	_ = ctx
	a, err := parseServer(server)
	if err != nil {
		return nil, err
	}
	switch a.scheme {
	case P2PHandshake:
		return newP2P(opts), nil
	case "etcd":
		e, err := newEtcd(a.endpoints, opts)
		if err != nil {
			return nil, err
		}
		return &kvBackend{kv: e, clusterID: opts.ClusterID}, nil
	default: // http, https
		h, err := newHTTP(a.server, opts)
		if err != nil {
			return nil, err
		}
		return &kvBackend{kv: h, clusterID: opts.ClusterID}, nil
	}
}

// Check reports whether Open would accept server, without opening
// anything: commands refuse a malformed --metadata-server as a usage
// error before any work, where Open's error would come only with the
// engine's start.
func Check(server string) error {
	_, err := parseServer(server)
	return err
}

type serverAddr struct {
	scheme    string // P2PHandshake, "etcd", "http" or "https"
	server    string // trimmed
	endpoints []string
}

func parseServer(server string) (serverAddr, error) {
	server = strings.TrimSpace(server)
	if server == "" {
		return serverAddr{}, fmt.Errorf("metadata server is empty: want P2PHANDSHAKE, http://host:port/path or host:port of etcd")
	}
	if server == P2PHandshake {
		return serverAddr{scheme: P2PHandshake, server: server}, nil
	}
	scheme, rest, hasScheme := strings.Cut(server, "://")
	if !hasScheme {
		scheme, rest = "etcd", server
	}
	switch strings.ToLower(scheme) {
	case "etcd":
		eps, err := splitEndpoints(rest)
		if err != nil {
			return serverAddr{}, fmt.Errorf("metadata server %q: %w", server, err)
		}
		return serverAddr{scheme: "etcd", server: server, endpoints: eps}, nil
	case "http", "https":
		if u, err := url.Parse(server); err != nil || u.Host == "" {
			return serverAddr{}, fmt.Errorf("metadata server %q is not a valid http URL (want http://host:port/path)", server)
		}
		return serverAddr{scheme: strings.ToLower(scheme), server: server}, nil
	case "redis", "rediss":
		return serverAddr{}, fmt.Errorf("metadata server %q: %w: redis (use etcd, http or P2PHANDSHAKE)", server, ErrUnsupported)
	}
	return serverAddr{}, fmt.Errorf("metadata server %q: unknown scheme %q: want P2PHANDSHAKE, http://, etcd:// or host:port", server, scheme)
}

// splitEndpoints splits etcd endpoints on ',' or ';' and checks each is
// host:port.
func splitEndpoints(s string) ([]string, error) {
	var eps []string
	for _, ep := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ';' }) {
		ep = strings.TrimSpace(ep)
		if ep == "" {
			continue
		}
		host, port, err := net.SplitHostPort(ep)
		if err != nil {
			return nil, fmt.Errorf("etcd endpoint %q is not host:port", ep)
		}
		if host == "" {
			return nil, fmt.Errorf("etcd endpoint %q has no host", ep)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("etcd endpoint %q: port %q is not 1-65535", ep, port)
		}
		eps = append(eps, ep)
	}
	if len(eps) == 0 {
		return nil, fmt.Errorf("no etcd endpoint")
	}
	return eps, nil
}

// notFound wraps ErrNotFound naming the segment and the key looked up.
func segmentNotFound(name, key string) error {
	return fmt.Errorf("segment %q not registered (key %s): %w", name, key, ErrNotFound)
}

func rpcMetaNotFound(server, key string) error {
	return fmt.Errorf("rpc meta of %q not registered (key %s): %w", server, key, ErrNotFound)
}
