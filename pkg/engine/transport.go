package engine

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync/atomic"

	"github.com/kvcache-ops/mc/pkg/engine/meta"
	"github.com/kvcache-ops/mc/pkg/engine/tcp"
)

// Transport moves bytes to and from segments of one descriptor protocol
// ("tcp"; "rdma" later). The engine picks it from the protocol of the
// segment being opened.
type Transport interface {
	// Protocol is the descriptor protocol served.
	Protocol() string
	// Describe adds what peers need to reach this engine (TCP: data port
	// and protocol version) to the local descriptor.
	Describe(d *meta.SegmentDesc)
	// DescribeBuffer is the descriptor entry for a registered buffer.
	DescribeBuffer(m *Memory) meta.BufferDesc
	// Dial prepares a route to a remote segment.
	Dial(ctx context.Context, s SegmentInfo) (Route, error)
	// Close fails transfers in flight and stops listeners.
	Close() error
}

// SegmentInfo is what the engine learnt about a remote segment.
type SegmentInfo struct {
	Name string
	Desc *meta.SegmentDesc
	RPC  meta.RPCMeta // where the peer's handshake listener is (its host)
}

// Route carries tasks to one segment. Submit must complete every task
// (Task.Complete), possibly before it returns.
type Route interface {
	Submit(tasks []*Task)
	Close() error
}

// Segment is an open segment: the target of requests.
type Segment struct {
	name     string
	desc     *meta.SegmentDesc
	route    Route
	localSeg bool
	via      string // the protocol that moves the bytes
	viaIdx   int8   // via's place in StatsTransports
	e        *Engine
	closed   atomic.Bool
	ranges   []meta.BufferDesc // desc.Buffers sorted by address
}

// Name is the name the segment was opened with.
func (s *Segment) Name() string { return s.name }

// Descriptor is the segment's descriptor (this engine's own for the local
// segment).
func (s *Segment) Descriptor() *meta.SegmentDesc {
	if s.localSeg {
		return s.e.Descriptor()
	}
	return s.desc
}

// Transport is the protocol that moves the segment's bytes: "local" (this
// engine's own segment, a memcpy), "shm" (a same-host peer's memory,
// mapped), or the descriptor's "tcp" or "rdma".
func (s *Segment) Transport() string { return s.via }

// Provider names the provider that moves the segment's bytes ("soft",
// "ibverbs" under rdma); "" for transports without one.
func (s *Segment) Provider() string {
	if s.localSeg || s.via != meta.ProtocolRDMA {
		return ""
	}
	return s.e.Provider(s.via)
}

// aborter is a Route that can fail what is in flight to its peer at once.
type aborter interface{ Abort(err error) }

// Abort fails every transfer in flight to the segment's peer with err, on
// this handle and on every other one sharing its connections, and closes
// the handle. It is for a peer known to be gone (the store's master
// dropped it) that would otherwise hold transfers until their timeout.
// Routes that cannot hang on a silent peer (local, shm: the copy is this
// process's own) and those without it (rdma: the NIC's retry limit ends
// them) just close.
func (s *Segment) Abort(err error) {
	if a, ok := s.route.(aborter); ok {
		a.Abort(fmt.Errorf("segment %q: %w", s.name, err))
	}
	s.Close()
}

// Close closes the handle; later requests on it fail with ErrSegmentClosed.
// Connections are shared per peer and stay for other handles; a shm
// mapping is the handle's own and is unmapped once copies in flight end.
func (s *Segment) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	return s.route.Close()
}

func (s *Segment) index() {
	s.ranges = slices.Clone(s.desc.Buffers)
	slices.SortFunc(s.ranges, func(a, b meta.BufferDesc) int { return cmpU64(a.Addr, b.Addr) })
}

// holds reports whether [addr, addr+n) lies inside one of the segment's
// buffers. Checking before sending keeps a bad address from costing the
// lane (the server closes the connection after rejecting).
// Holds reports whether the segment's descriptor, as this handle read it,
// has a buffer holding [addr, addr+n): false means the handle is stale
// (the peer registered new memory since) or the range is bad.
func (s *Segment) Holds(addr, n uint64) bool { return s.holds(addr, n) }

func (s *Segment) holds(addr, n uint64) bool {
	if s.localSeg {
		return s.e.reg.find(addr, n) != nil
	}
	i, _ := slices.BinarySearchFunc(s.ranges, addr, func(b meta.BufferDesc, a uint64) int {
		if b.Addr <= a {
			return -1
		}
		return 1
	})
	if i == 0 {
		return false
	}
	b := s.ranges[i-1]
	off := addr - b.Addr
	return off <= b.Length && n <= b.Length-off
}

func (s *Segment) submit(tasks []*Task) { s.route.Submit(tasks) }

// localTransport serves the engine's own segment with memcpy.
type localTransport struct{ e *Engine }

func (l *localTransport) Submit(tasks []*Task) {
	for _, t := range tasks {
		m := l.e.reg.find(t.op.Addr, uint64(len(t.op.Buf)))
		if m == nil || !m.acquire() {
			t.Complete(fmt.Errorf("target range [0x%x, +%d) of the local segment: %w", t.op.Addr, len(t.op.Buf), ErrOutOfRange))
			continue
		}
		target := m.slice(t.op.Addr, uint64(len(t.op.Buf)))
		if t.op.Write {
			copy(target, t.op.Buf)
		} else {
			copy(t.op.Buf, target)
		}
		m.Release()
		t.Complete(nil)
	}
}

func (l *localTransport) Close() error { return nil }

// tcpTransport is Mooncake's TCP transport: a data server over this
// engine's registered memory, and a client with persistent lanes.
type tcpTransport struct {
	e      *Engine
	server *tcp.Server
	client *tcp.Client
	port   int
}

func newTCPTransport(e *Engine) (*tcpTransport, error) {
	ln, err := tcp.Listen(context.Background(), net.JoinHostPort(e.cfg.BindAddress, "0"))
	if err != nil {
		return nil, fmt.Errorf("tcp data listener on %s: %w", e.cfg.BindAddress, err)
	}
	t := &tcpTransport{
		e:      e,
		server: tcp.NewServer(ln, &e.reg, tcp.ServerOptions{EventLoops: e.cfg.TCPEventLoops}),
		client: tcp.NewClient(tcp.ClientOptions{Lanes: e.cfg.TCPLanes, StatusTimeout: e.cfg.TCPStatusTimeout, PerRequest: e.cfg.TCPPerRequest}),
		port:   ln.Addr().(*net.TCPAddr).Port,
	}
	return t, nil
}

func (t *tcpTransport) Protocol() string { return meta.ProtocolTCP }

func (t *tcpTransport) Describe(d *meta.SegmentDesc) {
	d.TCPDataPort = t.port
	d.TCPProtoVersion = 2
}

func (t *tcpTransport) DescribeBuffer(m *Memory) meta.BufferDesc {
	// Mooncake's TCP transport names every buffer after the server.
	return meta.BufferDesc{Name: t.e.cfg.LocalServerName, Addr: m.addr, Length: uint64(len(m.b))}
}

func (t *tcpTransport) Dial(ctx context.Context, s SegmentInfo) (Route, error) {
	host := s.RPC.IPOrHostName
	if host == "" {
		return nil, fmt.Errorf("no host for the tcp data port")
	}
	return &tcpRoute{
		t:    t,
		addr: net.JoinHostPort(host, strconv.Itoa(s.Desc.TCPDataPort)),
		v2:   s.Desc.TCPProtoVersion >= 2,
	}, nil
}

func (t *tcpTransport) Close() error {
	err := t.client.Close()
	if serr := t.server.Close(); err == nil {
		err = serr
	}
	return err
}

type tcpRoute struct {
	t    *tcpTransport
	addr string
	v2   bool
}

func (r *tcpRoute) Submit(tasks []*Task) {
	// A fresh slice per batch: a sync.Pool here showed no gain in
	// BenchmarkBatch (one 1 KiB allocation per 128 requests).
	ops := make([]*tcp.Op, 0, len(tasks))
	for _, t := range tasks {
		ops = append(ops, &t.op)
	}
	r.t.client.Submit(context.Background(), r.addr, r.v2, ops)
}

func (r *tcpRoute) Close() error { return nil }

func (r *tcpRoute) Abort(err error) { r.t.client.Abort(r.addr, err) }
