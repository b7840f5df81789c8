// Package engine is mc's transfer engine, modelled on Mooncake's Transfer
// Engine: local memory is registered (mmap'd, so addresses are stable and
// travel on the wire), remote memory is reached by opening a Segment by
// name through a metadata backend, and bytes move in Batches of Tasks
// (READ or WRITE, local address, segment, target address, length) that are
// polled or waited on.
//
// The transport is chosen from the segment descriptor's protocol: a
// segment of this engine itself is served by a memcpy (the local
// transport); "tcp" by Mooncake's TCP data protocol (package tcp) over
// persistent, pipelined lanes. Other protocols (RDMA) plug in through
// Config.Transports: a Transport, optionally a MemoryRegistrar, and the
// handshake server for connection setup. With Config.Protocol "auto" or
// "shm", remote buffers are memfd regions (package shm) advertised in the
// descriptor, and a segment on the same host is mapped and served by
// memcpy (the shm transport) instead of its descriptor's protocol.
//
// A registered buffer's address (with its rkey or memfd region) is what a
// peer holds to reach it, so the address is the grant's epoch: buffers are
// placed by package vmem, and Renew revokes every grant of a buffer at once
// by moving it. Nothing asks the grantor; the check is made where the bytes
// land (the tcp server's registry lookup, the NIC's rkey and bounds, the shm
// region's retired header). A same-host peer copies without asking, so
// UnregisterMemory keeps an order that must not change: out of the registry,
// region header retired, transfers in flight waited for (ErrBusy revives the
// buffer), and only then RDMA deregistration, unmap, memfd close and a
// republished descriptor. The kernel frees the pages when the last peer
// mapping goes, and a memfd is never reused, so a late peer write lands in
// pages nobody reads.
//
// Main types: Engine, Memory, Segment, Batch, Request, TaskStatus.
package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine/handshake"
	"github.com/kvcache-ops/mc/pkg/engine/meta"
	"github.com/kvcache-ops/mc/pkg/engine/tcp"
)

// Defaults for Config.
const (
	DefaultMinRPCPort = 15000
	DefaultMaxRPCPort = 17000
	// DefaultUnregisterGrace is how long UnregisterMemory waits for
	// transfers using the buffer before refusing with ErrBusy.
	DefaultUnregisterGrace = 5 * time.Second
	// DefaultTCPLanes is the number of persistent connections per peer
	// (Mooncake's opt-in pool uses 4 too).
	DefaultTCPLanes = tcp.DefaultLanes
)

// ErrSegmentNotFound is matched when a segment name is not registered in
// the metadata backend (or a P2P peer has nothing to describe).
var ErrSegmentNotFound = errors.New("segment not found")

// notFoundError matches both ErrSegmentNotFound and the backend's
// meta.ErrNotFound without repeating "not found" in its one line.
type notFoundError struct {
	name string
	err  error
}

func (e *notFoundError) Error() string        { return fmt.Sprintf("open segment %q: %v", e.name, e.err) }
func (e *notFoundError) Is(target error) bool { return target == ErrSegmentNotFound }
func (e *notFoundError) Unwrap() error        { return e.err }

// Config configures an Engine.
type Config struct {
	// LocalServerName is this engine's name (Mooncake's local_server_name);
	// default the hostname. With etcd/http metadata it is the segment name.
	LocalServerName string
	// NameWithPort appends the handshake port to a defaulted
	// LocalServerName (host:port) with etcd/http metadata: a process
	// without a segment of its own (a client) then takes a name no other
	// process on its host holds. Two processes of one host under the
	// plain hostname claim one rpc_meta key, and the metadata server
	// refuses the second.
	NameWithPort bool
	// MetadataServer is Mooncake's --metadata_server; default P2PHANDSHAKE.
	MetadataServer string
	// Backend, when set, is used instead of opening MetadataServer; the
	// engine closes it.
	Backend meta.Backend
	// ClusterID is MC_METADATA_CLUSTER_ID.
	ClusterID string
	// MetadataHTTPToken is MC_METADATA_HTTP_TOKEN: the bearer token the
	// HTTP metadata backend sends.
	MetadataHTTPToken string
	// MetadataTimeout bounds each metadata call (default 5 s).
	MetadataTimeout time.Duration
	// BindAddress is the host the handshake and data listeners bind to
	// (MC_TCP_BIND_ADDRESS); default 0.0.0.0.
	BindAddress string
	// AdvertiseHost is the host peers are told to connect to; default
	// BindAddress when it is a specific address, else the host part of
	// LocalServerName.
	AdvertiseHost string
	// HandshakeAddr, when set, is the exact handshake listen address
	// ("127.0.0.1:0" in tests); otherwise a random port in
	// [MinRPCPort, MaxRPCPort] of BindAddress.
	HandshakeAddr          string
	MinRPCPort, MaxRPCPort int
	// HandshakeMaxLength bounds handshake frames, sent and received
	// (MC_HANDSHAKE_MAX_LENGTH; default 1 MiB, at most 128 MiB).
	HandshakeMaxLength int
	// TCPLanes is the number of persistent connections per peer.
	TCPLanes int
	// TCPPerRequest makes the client open a connection per request, as
	// Mooncake's does unless MC_TCP_ENABLE_CONNECTION_POOL=1 (TCPLanes is
	// then unused).
	TCPPerRequest bool
	// TCPStatusTimeout is MC_TCP_STATUS_TIMEOUT_SEC (default 30 s).
	TCPStatusTimeout time.Duration
	// TCPEventLoops is how many event loops serve the TCP data listener
	// (MC_TCP_EVENT_LOOPS; 0 means tcp.DefaultEventLoops).
	TCPEventLoops int
	// UnregisterGrace: see DefaultUnregisterGrace.
	UnregisterGrace time.Duration
	// Protocol is the protocol the local segment is published under; it
	// must be served by one of the engine's transports. Default "tcp".
	// ProtocolAuto and ProtocolSHM publish under rdma when an rdma
	// transport is given, else tcp, and add the same-host transport: this
	// engine's remote buffers become mappable by same-host peers of its
	// user, and same-host segments are reached through shared memory
	// (auto: when possible, else by their descriptor's protocol; shm: or
	// not at all, ErrNoSHM). Engine.Config reports the protocol published,
	// as peers (and a store's master) must be told a descriptor protocol.
	Protocol string
	// ProcFS is where procfs is mounted (default /proc): the boot id that
	// identifies the host and /proc/<pid>/fd of same-host peers are read
	// under it. Tests point it at a tree with another boot id.
	ProcFS string
	// Transports are started after the built-in tcp transport (the RDMA
	// transport plugs in here). A transport for a protocol already present
	// replaces it.
	Transports []TransportFactory
}

// TransportFactory starts a transport for e. It may use e.Handshake() to
// register handshake handlers (RDMA connection setup).
type TransportFactory func(e *Engine) (Transport, error)

// Engine is one transfer engine instance. Its methods are safe for
// concurrent use; a Batch is used by one goroutine at a time.
type Engine struct {
	cfg     Config
	hs      *handshake.Server
	backend meta.Backend
	segName string
	advHost string
	reg     registry
	closed  atomic.Bool
	// retiring counts old buffers of Renew still waiting for their last
	// transfer before they are released.
	retiring sync.WaitGroup

	local      *localTransport
	transports map[string]Transport
	primary    Transport     // publishes the local segment (Config.Protocol)
	shm        *shmTransport // with ProtocolAuto or ProtocolSHM
	sameHost   string        // ProtocolAuto, ProtocolSHM or ""

	pubMu sync.Mutex // serialises descriptor publication
	// What the metadata backend holds of this engine, so that shutdown
	// withdraws only that (under pubMu).
	// Written under pubMu; read by Republish (a node's ping loop) while
	// RegisterMemory (a disk tier's staging renewal) publishes.
	segPublished, rpcPublished atomic.Bool

	tasks taskCounters // Stats
}

// New starts an engine: the handshake listener, the metadata backend, the
// transports' listeners, and publishes this engine's (empty) segment.
func New(ctx context.Context, cfg Config) (*Engine, error) {
	defaultedName := cfg.LocalServerName == ""
	if cfg.LocalServerName == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("local server name: %w", err)
		}
		cfg.LocalServerName = h
	}
	if cfg.MetadataServer == "" {
		cfg.MetadataServer = meta.P2PHandshake
	}
	if cfg.BindAddress == "" {
		cfg.BindAddress = "0.0.0.0"
	}
	if cfg.MinRPCPort == 0 {
		cfg.MinRPCPort = DefaultMinRPCPort
	}
	if cfg.MaxRPCPort == 0 {
		cfg.MaxRPCPort = DefaultMaxRPCPort
	}
	if cfg.UnregisterGrace <= 0 {
		cfg.UnregisterGrace = DefaultUnregisterGrace
	}
	if cfg.TCPStatusTimeout <= 0 {
		cfg.TCPStatusTimeout = tcp.DefaultStatusTimeout
	}
	adv := cfg.AdvertiseHost
	if adv == "" {
		if ip := net.ParseIP(cfg.BindAddress); ip == nil || !ip.IsUnspecified() {
			adv = cfg.BindAddress
		} else if h, _, err := net.SplitHostPort(cfg.LocalServerName); err == nil {
			adv = h
		} else {
			adv = cfg.LocalServerName
		}
		adv = reachableHost(ctx, adv)
	}
	e := &Engine{cfg: cfg, advHost: adv, transports: make(map[string]Transport)}
	e.local = &localTransport{e: e}

	var err error
	if cfg.HandshakeAddr != "" {
		e.hs, err = handshake.Listen(cfg.HandshakeAddr, handshake.Options{MaxLength: cfg.HandshakeMaxLength})
	} else {
		e.hs, err = handshake.ListenRange(cfg.BindAddress, cfg.MinRPCPort, cfg.MaxRPCPort, handshake.Options{MaxLength: cfg.HandshakeMaxLength})
	}
	if err != nil {
		return nil, fmt.Errorf("start engine: %w", err)
	}
	_, hsPort, _ := net.SplitHostPort(e.hs.Addr())

	e.backend = cfg.Backend
	if e.backend == nil {
		e.backend, err = meta.Open(ctx, cfg.MetadataServer, meta.Options{
			ClusterID: cfg.ClusterID,
			Timeout:   cfg.MetadataTimeout,
			Handshake: e.hs,
			MaxLength: cfg.HandshakeMaxLength,
			HTTPToken: cfg.MetadataHTTPToken,
		})
		if err != nil {
			e.hs.Close()
			return nil, fmt.Errorf("start engine: %w", err)
		}
	}
	if cfg.MetadataServer == meta.P2PHandshake && cfg.Backend == nil {
		e.segName = net.JoinHostPort(adv, hsPort)
	} else if cfg.NameWithPort && defaultedName {
		e.cfg.LocalServerName = net.JoinHostPort(adv, hsPort)
		e.segName = e.cfg.LocalServerName
	} else {
		e.segName = cfg.LocalServerName
	}

	tr, err := newTCPTransport(e)
	if err != nil {
		e.backend.Close()
		e.hs.Close()
		return nil, fmt.Errorf("start engine: %w", err)
	}
	e.transports[tr.Protocol()] = tr
	for _, f := range cfg.Transports {
		tr, err := f(e)
		if err != nil {
			e.shutdown(ctx)
			return nil, fmt.Errorf("start engine: %w", err)
		}
		if old := e.transports[tr.Protocol()]; old != nil {
			old.Close()
		}
		e.transports[tr.Protocol()] = tr
	}
	proto := cfg.Protocol
	switch proto {
	case "":
		proto = meta.ProtocolTCP
	case ProtocolAuto, ProtocolSHM:
		e.sameHost = proto
		if e.shm, err = newSHMTransport(e); err != nil {
			if proto == ProtocolSHM {
				e.shutdown(ctx)
				return nil, fmt.Errorf("start engine: protocol shm: %w", err)
			}
			slog.Warn("same-host transport unavailable: every segment goes through its descriptor's protocol", "err", err)
		} else {
			e.transports[ProtocolSHM] = e.shm
		}
		proto = meta.ProtocolTCP
		if e.transports[meta.ProtocolRDMA] != nil {
			proto = meta.ProtocolRDMA
		}
	}
	if e.primary = e.transports[proto]; e.primary == nil {
		e.shutdown(ctx)
		return nil, fmt.Errorf("start engine: protocol %q has no transport", proto)
	}
	e.cfg.Protocol = proto

	if cfg.MetadataServer != meta.P2PHandshake || cfg.Backend != nil {
		port, _ := strconv.Atoi(hsPort)
		if err := e.backend.PutRPCMeta(ctx, e.segName, meta.RPCMeta{IPOrHostName: adv, RPCPort: port}); err != nil {
			e.shutdown(ctx)
			return nil, fmt.Errorf("start engine: publish rpc meta of %q: %w", e.segName, err)
		}
		slog.Debug("metadata: published rpc meta", "server", e.segName, "host", adv, "rpc_port", port, "metadata", cfg.MetadataServer)
		e.rpcPublished.Store(true)
	}
	if err := e.publish(ctx); err != nil {
		e.shutdown(ctx)
		return nil, fmt.Errorf("start engine: %w", err)
	}
	if cfg.MetadataServer != meta.P2PHandshake || cfg.Backend != nil {
		// With a central metadata server, still answer Metadata frames
		// with the live descriptor, so a prober (mc meta ls) can tell a
		// peer whose stored descriptor is stale from one that matches.
		e.hs.Handle(handshake.Metadata, func(context.Context, []byte) ([]byte, error) {
			d := e.Descriptor()
			d.Timestamp = meta.Timestamp(time.Now())
			return meta.EncodeSegment(d)
		})
	}
	slog.Debug("engine started", "segment", e.segName, "protocol", proto, "same_host", e.shm != nil, "handshake", e.hs.Addr(), "metadata", cfg.MetadataServer)
	return e, nil
}

// SegmentName is the name peers pass to OpenSegment (and Mooncake's bench
// to --segment_id): "host:port" of the handshake listener with
// P2PHANDSHAKE, the local server name otherwise.
func (e *Engine) SegmentName() string { return e.segName }

// HandshakeAddr is the handshake (RPC) listener's address.
func (e *Engine) HandshakeAddr() string { return e.hs.Addr() }

// Handshake is the engine's handshake server, for transports that answer
// handshake frames (RDMA Connection requests).
func (e *Engine) Handshake() *handshake.Server { return e.hs }

// Transport returns the engine's transport for protocol ("tcp", "rdma"),
// or nil when it has none; callers type-assert for transport-specific
// surfaces such as metrics.
func (e *Engine) Transport(protocol string) Transport { return e.transports[protocol] }

// Config returns the configuration the engine runs with (defaults filled).
func (e *Engine) Config() Config { return e.cfg }

// MemoryRegistrar is implemented by transports that must register memory
// with hardware before peers may use it (RDMA: ibv_reg_mr for the lkey and
// rkey). RegisterMemory calls it for every new buffer, UnregisterMemory
// after the last transfer ended and before the memory is unmapped.
type MemoryRegistrar interface {
	RegisterMemory(m *Memory) error
	UnregisterMemory(m *Memory) error
}

func (e *Engine) registrars() []MemoryRegistrar {
	var out []MemoryRegistrar
	for _, tr := range e.transports {
		if r, ok := tr.(MemoryRegistrar); ok {
			out = append(out, r)
		}
	}
	return out
}

// release unregisters m from the transports and unmaps it; m must be
// retired.
func (e *Engine) release(m *Memory) error {
	var errs []error
	for _, r := range e.registrars() {
		errs = append(errs, r.UnregisterMemory(m))
	}
	errs = append(errs, m.unmap())
	return errors.Join(errs...)
}

// Republish writes this engine's RPC endpoint and segment descriptor to
// the metadata server again: one kept in memory (Mooncake's HTTP metadata
// server inside mooncake_master) forgets them when it restarts, and a
// peer could no longer find this engine. Under P2PHANDSHAKE there is
// nothing to write.
func (e *Engine) Republish(ctx context.Context) error {
	if !e.rpcPublished.Load() && !e.segPublished.Load() {
		return nil
	}
	if e.rpcPublished.Load() {
		_, hsPort, _ := net.SplitHostPort(e.hs.Addr())
		port, _ := strconv.Atoi(hsPort)
		if err := e.backend.PutRPCMeta(ctx, e.segName, meta.RPCMeta{IPOrHostName: e.advHost, RPCPort: port}); err != nil {
			return fmt.Errorf("publish rpc meta of %q: %w", e.segName, err)
		}
	}
	if e.cfg.MetadataServer == meta.P2PHandshake && e.cfg.Backend == nil {
		return nil
	}
	return e.publish(ctx)
}

// Descriptor returns the descriptor this engine publishes.
func (e *Engine) Descriptor() *meta.SegmentDesc {
	d := &meta.SegmentDesc{Name: e.segName, Protocol: e.primary.Protocol(), Buffers: []meta.BufferDesc{}}
	e.primary.Describe(d)
	for _, m := range e.reg.list() {
		if m.remote {
			d.Buffers = append(d.Buffers, e.primary.DescribeBuffer(m))
		}
	}
	if e.shm != nil {
		e.shm.Describe(d)
	}
	return d
}

func (e *Engine) publish(ctx context.Context) error {
	e.pubMu.Lock()
	defer e.pubMu.Unlock()
	d := e.Descriptor()
	d.Timestamp = meta.Timestamp(time.Now())
	start := time.Now()
	if err := e.backend.PutSegment(ctx, d); err != nil {
		return fmt.Errorf("publish segment %q: %w", e.segName, err)
	}
	slog.Debug("metadata: published segment", "segment", e.segName, "buffers", len(d.Buffers), "took", time.Since(start))
	e.segPublished.Store(true)
	return nil
}

// closeMetadataTimeout bounds withdrawing the segment at Close: a
// metadata server that is gone must not hold up shutdown (descriptors left
// behind are overwritten when the engine starts again).
const closeMetadataTimeout = 2 * time.Second

// withdraw deletes what this engine published. After the server failed to
// answer once, the second key is not tried: it would only wait out the
// same timeout and add a second line saying the same.
func (e *Engine) withdraw(ctx context.Context) error {
	e.pubMu.Lock()
	defer e.pubMu.Unlock()
	if e.segPublished.Load() {
		e.segPublished.Store(false)
		if err := e.backend.DeleteSegment(ctx, e.segName); err != nil && !errors.Is(err, meta.ErrNotFound) {
			return fmt.Errorf("withdraw segment %q: %w", e.segName, err)
		}
	}
	if e.rpcPublished.Load() {
		e.rpcPublished.Store(false)
		if err := e.backend.DeleteRPCMeta(ctx, e.segName); err != nil && !errors.Is(err, meta.ErrNotFound) {
			return fmt.Errorf("withdraw rpc meta of %q: %w", e.segName, err)
		}
	}
	return nil
}

// RegisterMemory maps size bytes of memory at location ("cpu:0",
// "cuda:0"; mc allocates host memory for every location: it has no GPU
// allocator) and registers it. With remote set, peers may read and write
// it and the segment descriptor is republished to include it.
func (e *Engine) RegisterMemory(ctx context.Context, size int, location string, remote bool) (*Memory, error) {
	if e.closed.Load() {
		return nil, ErrEngineClosed
	}
	if location == "" {
		location = "cpu:0"
	}
	var m *Memory
	var err error
	if remote && e.shm != nil {
		m, err = allocateShared(e.shm, size, location)
	} else {
		m, err = allocate(size, location, remote)
	}
	if err != nil {
		return nil, err
	}
	var done []MemoryRegistrar
	undo := func() {
		for _, r := range done {
			r.UnregisterMemory(m)
		}
		m.unmap()
	}
	for _, r := range e.registrars() {
		if err := r.RegisterMemory(m); err != nil {
			undo()
			return nil, fmt.Errorf("register memory at %s: %w", location, err)
		}
		done = append(done, r)
	}
	e.reg.add(m)
	if remote {
		if err := e.publish(ctx); err != nil {
			e.reg.remove(m)
			m.retire(0)
			undo()
			return nil, fmt.Errorf("register memory: %w", err)
		}
	}
	return m, nil
}

// UnregisterMemory removes m: new requests touching it fail at once, and
// the call waits (up to Config.UnregisterGrace) for transfers already using
// it to end before unmapping it. If they do not end in time it returns
// ErrBusy and m stays registered.
func (e *Engine) UnregisterMemory(ctx context.Context, m *Memory) error {
	if !e.reg.remove(m) {
		return fmt.Errorf("unregister memory at 0x%x: not registered", m.addr)
	}
	// Same-host peers copy without asking: they see the buffer retired
	// from now on, as tcp requests find it gone from the registry.
	m.retireShared()
	if err := m.retire(e.cfg.UnregisterGrace); err != nil {
		m.reviveShared()
		e.reg.add(m)
		return fmt.Errorf("unregister memory at 0x%x: %w", m.addr, err)
	}
	if err := e.release(m); err != nil {
		return fmt.Errorf("unregister memory at 0x%x: %w", m.addr, err)
	}
	if m.remote && !e.closed.Load() {
		return e.publish(ctx)
	}
	return nil
}

// Renew replaces registered memory m with a new buffer of the same size
// and location at a new address, with new registrations (rkeys) and a new
// memfd, and takes m out of service at once. Its contents are not
// carried over.
//
// It is how an owner revokes every grant of its memory at once: a peer
// holding m's address, rkey or region, however late it acts, never
// reaches the new buffer. New requests for m fail at once (tcp: no
// registered buffer there; shm: a retired region); a transfer already
// under way into m (a writer stalled mid-payload) is not waited for: it
// finishes into m, which nobody reads any more, and m's pages are
// released (its RDMA registration last) once the last such transfer
// ends. So a stalled writer never holds up the renewal, at the cost of
// m's memory until it lets go.
func (e *Engine) Renew(ctx context.Context, m *Memory) (*Memory, error) {
	n, err := e.RegisterMemory(ctx, m.Len(), m.location, m.remote)
	if err != nil {
		return nil, fmt.Errorf("renew memory at 0x%x: %w", m.addr, err)
	}
	if !e.reg.remove(m) {
		_ = e.UnregisterMemory(ctx, n)
		return nil, fmt.Errorf("renew memory at 0x%x: not registered", m.addr)
	}
	m.retireShared()
	if m.remote {
		if err := e.publish(ctx); err != nil {
			// The descriptor still lists m: peers that read it fail on
			// it (it is out of the registry) and read it again.
			slog.Warn("renew memory: publish the descriptor without the old buffer", "err", err)
		}
	}
	if m.retire(0) == nil {
		if err := e.release(m); err != nil {
			return n, fmt.Errorf("renew memory: release the old buffer at 0x%x: %w", m.addr, err)
		}
		return n, nil
	}
	e.retiring.Add(1)
	go func() {
		defer e.retiring.Done()
		for wait := time.Millisecond; ; wait = min(2*wait, 100*time.Millisecond) {
			if m.refs.CompareAndSwap(0, -1) {
				if err := e.release(m); err != nil {
					slog.Warn("renew memory: release the old buffer", "addr", fmt.Sprintf("0x%x", m.addr), "err", err)
				}
				return
			}
			if e.closed.Load() {
				// Still written at shutdown: leave it mapped rather than
				// pull memory from under a copy (as shutdown does).
				return
			}
			time.Sleep(wait)
		}
	}()
	return n, nil
}

// Memory returns the registered buffers, by address.
func (e *Engine) Memory() []*Memory { return append([]*Memory(nil), e.reg.list()...) }

// ErrProtocolNotSupported is a segment whose descriptor names a
// transport this engine was not started with (an rdma node met by a tcp
// engine): callers name the setting that starts it (--protocol).
var ErrProtocolNotSupported = errors.New("protocol not supported by this engine")

// ProtocolError is OpenSegment's ErrProtocolNotSupported, with the
// protocols on each side.
type ProtocolError struct {
	Segment  string
	Protocol string // the segment's
	Engine   string // this engine's primary protocol
}

func (e *ProtocolError) Error() string {
	return fmt.Sprintf("open segment %q: protocol %q not supported by this engine (it speaks %s)", e.Segment, e.Protocol, e.Engine)
}

func (e *ProtocolError) Unwrap() error { return ErrProtocolNotSupported }

// OpenSegment looks name up and returns a handle for requests. The name of
// this engine's own segment (or its local server name) opens the local
// transport.
func (e *Engine) OpenSegment(ctx context.Context, name string) (*Segment, error) {
	if e.closed.Load() {
		return nil, ErrEngineClosed
	}
	if name == e.segName || name == e.cfg.LocalServerName {
		return &Segment{name: name, route: e.local, localSeg: true, via: ProtocolLocal, viaIdx: transportIndex(ProtocolLocal), e: e}, nil
	}
	start := time.Now()
	d, err := e.backend.GetSegment(ctx, name)
	slog.Debug("metadata: get segment", "segment", name, "took", time.Since(start), "err", err)
	if err != nil {
		if errors.Is(err, meta.ErrNotFound) {
			return nil, &notFoundError{name: name, err: err}
		}
		return nil, fmt.Errorf("open segment %q: %w", name, err)
	}
	if e.shm != nil {
		r, err := e.shm.Dial(ctx, SegmentInfo{Name: name, Desc: d})
		if err == nil {
			slog.Debug("segment opened", "segment", name, "protocol", ProtocolSHM, "pid", d.SHM.PID, "buffers", len(d.Buffers))
			s := &Segment{name: name, desc: d, route: r, via: ProtocolSHM, viaIdx: transportIndex(ProtocolSHM), e: e}
			s.index()
			return s, nil
		}
		if e.sameHost == ProtocolSHM {
			return nil, fmt.Errorf("open segment %q: %w: %w", name, ErrNoSHM, err)
		}
		slog.Debug("segment not reachable through shared memory: using its descriptor's protocol", "segment", name, "protocol", d.Protocol, "err", err)
	}
	tr := e.transports[d.Protocol]
	if tr == nil {
		return nil, &ProtocolError{Segment: name, Protocol: d.Protocol, Engine: e.cfg.Protocol}
	}
	rpc, err := e.backend.GetRPCMeta(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("open segment %q: %w", name, err)
	}
	slog.Debug("metadata: get rpc meta", "segment", name, "host", rpc.IPOrHostName, "rpc_port", rpc.RPCPort)
	r, err := tr.Dial(ctx, SegmentInfo{Name: name, Desc: d, RPC: rpc})
	if err != nil {
		return nil, fmt.Errorf("open segment %q: %w", name, err)
	}
	slog.Debug("segment opened", "segment", name, "protocol", d.Protocol, "buffers", len(d.Buffers), "tcp_data_port", d.TCPDataPort)
	s := &Segment{name: name, desc: d, route: r, via: d.Protocol, viaIdx: transportIndex(d.Protocol), e: e}
	s.index()
	return s, nil
}

// Close stops the engine: transfers in flight fail, listeners close, the
// segment is withdrawn from the metadata backend and memory is unmapped.
func (e *Engine) Close() error {
	if !e.closed.CompareAndSwap(false, true) {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), min(closeMetadataTimeout, e.metadataTimeout()))
	defer cancel()
	return e.shutdown(ctx)
}

func (e *Engine) metadataTimeout() time.Duration {
	if e.cfg.MetadataTimeout > 0 {
		return e.cfg.MetadataTimeout
	}
	return meta.DefaultTimeout
}

func (e *Engine) shutdown(ctx context.Context) error {
	e.closed.Store(true)
	var errs []error
	for _, tr := range e.transports {
		errs = append(errs, tr.Close())
	}
	if e.backend != nil {
		errs = append(errs, e.withdraw(ctx), e.backend.Close())
	}
	errs = append(errs, e.hs.Close())
	// Same-host peers stop first: they copy without going through any
	// transport closed above.
	for _, m := range e.reg.list() {
		m.retireShared()
	}
	for _, m := range e.reg.list() {
		e.reg.remove(m)
		if err := m.retire(e.cfg.UnregisterGrace); err != nil {
			// Still in use after the transports closed: leave it
			// mapped rather than pull memory from under a copy.
			errs = append(errs, fmt.Errorf("memory at 0x%x: %w", m.addr, err))
			continue
		}
		errs = append(errs, e.release(m))
	}
	e.retiring.Wait()
	return joinOneLine(errs...)
}

// oneLineError is errors.Join's result printed on one line: mc prints
// errors as one `mc: ...` line.
type oneLineError struct{ errs []error }

func (e *oneLineError) Error() string {
	s := make([]string, len(e.errs))
	for i, err := range e.errs {
		s[i] = err.Error()
	}
	return strings.Join(s, "; ")
}

func (e *oneLineError) Unwrap() []error { return e.errs }

func joinOneLine(errs ...error) error {
	var out []error
	for _, err := range errs {
		if err != nil {
			out = append(out, err)
		}
	}
	switch len(out) {
	case 0:
		return nil
	case 1:
		return out[0]
	}
	return &oneLineError{errs: out}
}

// prepare checks t's request and pins its local memory.
func (e *Engine) prepare(t *Task) error {
	r := &t.req
	if e.closed.Load() {
		return ErrEngineClosed
	}
	if r.Segment == nil {
		return fmt.Errorf("%w: no segment", ErrInvalidRequest)
	}
	if r.Segment.closed.Load() {
		return fmt.Errorf("segment %q: %w", r.Segment.name, ErrSegmentClosed)
	}
	if r.Length == 0 {
		return fmt.Errorf("%w: length 0", ErrInvalidRequest)
	}
	if r.Op != Read && r.Op != Write {
		return fmt.Errorf("%w: opcode %d", ErrInvalidRequest, r.Op)
	}
	m := e.reg.find(r.Source, r.Length)
	if m == nil || !m.acquire() {
		return fmt.Errorf("local range [0x%x, +%d): %w", r.Source, r.Length, ErrOutOfRange)
	}
	if !r.Segment.holds(r.Target, r.Length) {
		m.Release()
		return fmt.Errorf("target range [0x%x, +%d) of segment %q: %w", r.Target, r.Length, r.Segment.name, ErrOutOfRange)
	}
	t.local = m
	t.op = tcp.Op{Write: r.Op == Write, Addr: r.Target, Buf: m.slice(r.Source, r.Length), Done: t}
	return nil
}
