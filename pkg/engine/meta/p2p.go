package meta

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"

	"github.com/kvcache-ops/mc/pkg/engine/handshake"
)

// p2p is the P2PHANDSHAKE backend: nothing is stored centrally. A segment
// is named by the "host:port" of its owner's handshake listener; the owner
// answers Metadata frames with its descriptor, and readers ask it directly.
type p2p struct {
	opts Options

	mu    sync.Mutex
	local []byte // encoded local descriptor served to peers; nil before PutSegment
	name  string // its segment name
}

func newP2P(opts Options) *p2p { return &p2p{opts: opts} }

// serveMetadata answers a peer's Metadata request with the local
// descriptor. Mooncake's request carries the asker's own descriptor; mc
// does not need it.
func (p *p2p) serveMetadata(ctx context.Context, _ []byte) ([]byte, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.local == nil {
		return nil, fmt.Errorf("no local segment registered")
	}
	return p.local, nil
}

func (p *p2p) PutSegment(ctx context.Context, d *SegmentDesc) error {
	if p.opts.Handshake == nil {
		return fmt.Errorf("publish segment %q: P2PHANDSHAKE needs a local handshake listener", d.Name)
	}
	b, err := EncodeSegment(d)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.local, p.name = b, d.Name
	p.mu.Unlock()
	p.opts.Handshake.Handle(handshake.Metadata, p.serveMetadata)
	return nil
}

func (p *p2p) GetSegment(ctx context.Context, name string) (*SegmentDesc, error) {
	p.mu.Lock()
	local, localName := p.local, p.name
	p.mu.Unlock()
	if local != nil && (name == localName || p.opts.Handshake != nil && name == p.opts.Handshake.Addr()) {
		return DecodeSegment(local)
	}
	if err := checkHostPort(name); err != nil {
		return nil, fmt.Errorf("segment %q: %w", name, err)
	}
	ctx, cancel := context.WithTimeout(ctx, p.opts.timeout())
	defer cancel()
	req := local
	if req == nil {
		req = []byte("{}")
	}
	reply, err := handshake.Request(ctx, name, handshake.Metadata, req, p.opts.MaxLength)
	if err != nil {
		if errors.Is(err, handshake.ErrNoReply) {
			return nil, fmt.Errorf("segment %q: peer has no segment to describe: %w", name, ErrNotFound)
		}
		var oe *net.OpError
		if errors.As(err, &oe) && oe.Op == "dial" || errors.Is(err, context.DeadlineExceeded) {
			return nil, fmt.Errorf("segment %q: %w", name, &unreachableError{what: "peer", addr: name, err: errors.Unwrap(err)})
		}
		return nil, fmt.Errorf("segment %q: %w", name, err)
	}
	// A Mooncake peer with no local segment still replies: its encoder
	// leaves the JSON value null.
	switch string(bytes.TrimSpace(reply)) {
	case "", "null", "{}":
		return nil, fmt.Errorf("segment %q: peer has no segment to describe: %w", name, ErrNotFound)
	}
	d, err := DecodeSegment(reply)
	if err != nil {
		return nil, fmt.Errorf("descriptor from peer %s: %w", name, err)
	}
	return d, nil
}

func (p *p2p) DeleteSegment(ctx context.Context, name string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.local != nil && name == p.name {
		p.local, p.name = nil, ""
	}
	return nil
}

// GetRPCMeta needs no lookup in P2P mode: the server name is already
// "host:port" of its handshake listener.
func (p *p2p) GetRPCMeta(ctx context.Context, server string) (RPCMeta, error) {
	host, port, err := net.SplitHostPort(server)
	if err != nil {
		return RPCMeta{}, fmt.Errorf("rpc meta of %q: P2PHANDSHAKE server names are host:port", server)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 || host == "" {
		return RPCMeta{}, fmt.Errorf("rpc meta of %q: P2PHANDSHAKE server names are host:port", server)
	}
	return RPCMeta{IPOrHostName: host, RPCPort: n}, nil
}

// PutRPCMeta and DeleteRPCMeta have nothing to store in P2P mode.
func (p *p2p) PutRPCMeta(ctx context.Context, server string, m RPCMeta) error { return nil }
func (p *p2p) DeleteRPCMeta(ctx context.Context, server string) error         { return nil }

// Close stops answering Metadata requests; the handshake listener itself
// belongs to the caller.
func (p *p2p) Close() error {
	p.mu.Lock()
	had := p.local != nil
	p.local, p.name = nil, ""
	p.mu.Unlock()
	if had && p.opts.Handshake != nil {
		p.opts.Handshake.Handle(handshake.Metadata, nil)
	}
	return nil
}

func checkHostPort(name string) error {
	host, port, err := net.SplitHostPort(name)
	if err == nil {
		var n int
		n, err = strconv.Atoi(port)
		if err == nil && (n < 1 || n > 65535 || host == "") {
			err = errors.New("bad port")
		}
	}
	if err != nil {
		return fmt.Errorf("name is not host:port (P2PHANDSHAKE names a segment by its owner's handshake address)")
	}
	return nil
}
