// Package rdmatransport is the engine's RDMA transport, Mooncake's
// RdmaTransport on top of pkg/rdma: one rdma.Context per NIC, memory
// registered on every NIC (the descriptor carries one rkey per device),
// connection setup carried in handshake Connection frames, and requests
// cut into slices that are spread over local and peer NICs chosen from the
// NIC priority matrices, retried on another path when they fail.
//
// Plug it into an engine with engine.Config{Protocol: "rdma", Transports:
// []engine.TransportFactory{rdmatransport.Factory(cfg)}}.
package rdmatransport

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine"
	"github.com/kvcache-ops/mc/pkg/engine/handshake"
	"github.com/kvcache-ops/mc/pkg/engine/meta"
	"github.com/kvcache-ops/mc/pkg/rdma"
	"github.com/kvcache-ops/mc/pkg/rdma/providers"
	"github.com/kvcache-ops/mc/pkg/rdma/soft"
	"github.com/kvcache-ops/mc/pkg/topo"
)

// Mooncake's defaults (compat.md §5).
const (
	DefaultSliceSize     = 65536 // MC_SLICE_SIZE
	DefaultFragmentRatio = 4     // MC_FRAGMENT_RATIO
	DefaultRetryCount    = 9     // MC_RETRY_CNT
	DefaultRailPause     = 30 * time.Second
	// Rail errors: this many remote errors within railWindow pause a rail.
	railErrors = 5
	railWindow = 5 * time.Second
)

// ErrNoPath fails a slice for which no usable local or peer NIC is left.
var ErrNoPath = errors.New("no usable RDMA path")

// Config configures the transport. Zero fields take Mooncake's defaults.
type Config struct {
	// Provider supplies the NICs. Nil opens one with OpenProvider(Devices),
	// and the transport closes it.
	Provider rdma.Provider
	// Devices are the NICs to use (--device_name); empty means all.
	Devices []string
	// SysfsRoot is the directory holding sys/ ("" is "/"): where the
	// default provider checks that Devices not named soft* exist.
	SysfsRoot string
	// RDMA parameterises the contexts (rdma.ConfigFromEnv()); the
	// transport sets ServerName and Exchange.
	RDMA rdma.Config
	// Matrix is the local NIC priority matrix; nil builds one from the
	// devices' NUMA nodes.
	Matrix        topo.Matrix
	SliceSize     int
	FragmentRatio int
	// RetryCount is how often a failed slice is retried on another path;
	// negative means never (MC_RETRY_CNT=0).
	RetryCount int
	RailPause  time.Duration
	RoundRobin bool // MC_PATH_ROUNDROBIN
	// ConnectTimeout bounds one connection exchange (default 5 s).
	ConnectTimeout time.Duration
}

// ConfigFromEnv reads MC_SLICE_SIZE, MC_FRAGMENT_RATIO, MC_RETRY_CNT,
// MC_RDMA_RAIL_PAUSE_SECONDS, MC_PATH_ROUNDROBIN and pkg/rdma's variables.
func ConfigFromEnv() (Config, error) {
	var c Config
	var err error
	if c.RDMA, err = rdma.ConfigFromEnv(); err != nil {
		return c, err
	}
	ints := []struct {
		name string
		dst  *int
		zero bool // 0 allowed
	}{
		{"MC_SLICE_SIZE", &c.SliceSize, false},
		{"MC_FRAGMENT_RATIO", &c.FragmentRatio, false},
		{"MC_RETRY_CNT", &c.RetryCount, true},
	}
	for _, v := range ints {
		s := strings.TrimSpace(os.Getenv(v.name))
		if s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 || (n == 0 && !v.zero) {
			return c, fmt.Errorf("%s=%q: want a positive integer", v.name, s)
		}
		*v.dst = n
		if n == 0 && v.name == "MC_RETRY_CNT" {
			c.RetryCount = -1 // explicit zero: no retry
		}
	}
	if s := strings.TrimSpace(os.Getenv("MC_RDMA_RAIL_PAUSE_SECONDS")); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			return c, fmt.Errorf("MC_RDMA_RAIL_PAUSE_SECONDS=%q: want a positive integer", s)
		}
		c.RailPause = time.Duration(n) * time.Second
	}
	if s := strings.TrimSpace(os.Getenv("MC_PATH_ROUNDROBIN")); s != "" && s != "0" && !strings.EqualFold(s, "false") {
		c.RoundRobin = true
	}
	return c, nil
}

func (c Config) withDefaults() Config {
	if c.SliceSize <= 0 {
		c.SliceSize = DefaultSliceSize
	}
	if c.FragmentRatio <= 0 {
		c.FragmentRatio = DefaultFragmentRatio
	}
	if c.RetryCount == 0 {
		c.RetryCount = DefaultRetryCount
	} else if c.RetryCount < 0 {
		c.RetryCount = 0
	}
	if c.RailPause <= 0 {
		c.RailPause = DefaultRailPause
	}
	if c.ConnectTimeout <= 0 {
		c.ConnectTimeout = 5 * time.Second
	}
	return c
}

// OpenProvider opens the provider MC_RDMA_PROVIDER names (default auto:
// ibverbs when built in and it finds devices, else soft, for devices
// named soft* only: providers.OpenFor). With the soft provider, devices
// declares the soft NICs to create: each takes its attributes from
// MC_SOFT_NICS when declared there, defaults otherwise. Each call creates
// its own soft NICs, so two engines of one process have separate devices
// even with the same names.
func OpenProvider(devices []string) (rdma.Provider, error) {
	return OpenProviderAt(devices, "")
}

// OpenProviderAt is OpenProvider reading sysfs beneath sysfsRoot.
func OpenProviderAt(devices []string, sysfsRoot string) (rdma.Provider, error) {
	p, err := providers.OpenFor("", devices, sysfsRoot)
	if err != nil {
		return nil, err
	}
	if p.Name() != "soft" || len(devices) == 0 {
		return p, nil
	}
	closeProvider(p)
	declared := map[string]soft.DeviceConfig{}
	if env := os.Getenv("MC_SOFT_NICS"); env != "" {
		ds, err := soft.ParseDevices(env)
		if err != nil {
			return nil, fmt.Errorf("MC_SOFT_NICS: %w", err)
		}
		for _, d := range ds {
			declared[d.Name] = d
		}
	}
	var cfg soft.Config
	for _, n := range devices {
		d, ok := declared[n]
		if !ok {
			d = soft.DeviceConfig{Name: n, NUMANode: -1, MaxQP: soft.DefaultMaxQP, PortState: rdma.PortActive}
		}
		cfg.Devices = append(cfg.Devices, d)
	}
	sp, err := soft.New(cfg)
	if err != nil {
		return nil, err // a nil rdma.Provider, not a nil *soft.Provider in one
	}
	return sp, nil
}

// ParseDevices splits a --device_name list.
func ParseDevices(s string) ([]string, error) {
	var out []string
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if slices.Contains(out, f) {
			return nil, fmt.Errorf("device %q listed twice", f)
		}
		out = append(out, f)
	}
	return out, nil
}

// Factory returns the TransportFactory for engine.Config.Transports.
func Factory(cfg Config) engine.TransportFactory {
	return func(e *engine.Engine) (engine.Transport, error) {
		t, err := New(e, cfg)
		if err != nil {
			return nil, err // a nil engine.Transport, not a nil *Transport in one
		}
		return t, nil
	}
}

// Transport is the RDMA transport of one engine.
type Transport struct {
	cfg       Config
	e         *engine.Engine
	p         rdma.Provider
	ownsP     bool
	ctxs      []*rdma.Context
	closed    atomic.Bool
	rr        atomic.Uint64
	connCtx   context.Context
	connStop  context.CancelFunc
	slicesOut sync.WaitGroup

	regMu sync.RWMutex
	regs  []*region // sorted by addr

	peerMu sync.Mutex
	peers  map[string]string // peer server name -> handshake address

	railMu sync.Mutex
	rails  map[string]*rail // peer NIC path
}

type region struct {
	m   *engine.Memory
	mrs []rdma.MR // per context
}

type rail struct {
	errs        []time.Time
	pausedUntil time.Time
}

// New opens the contexts and installs the Connection handler on e's
// handshake server.
func New(e *engine.Engine, cfg Config) (*Transport, error) {
	cfg = cfg.withDefaults()
	t := &Transport{cfg: cfg, e: e, p: cfg.Provider, peers: map[string]string{}, rails: map[string]*rail{}}
	if t.p == nil {
		p, err := OpenProviderAt(cfg.Devices, cfg.SysfsRoot)
		if err != nil {
			return nil, fmt.Errorf("rdma transport: %w", err)
		}
		t.p, t.ownsP = p, true
	}
	rc := cfg.RDMA
	rc.ServerName = e.SegmentName()
	rc.Exchange = t.exchange
	ctxs, err := rdma.OpenContexts(t.p, cfg.Devices, rc)
	if err != nil {
		if t.ownsP {
			closeProvider(t.p)
		}
		return nil, fmt.Errorf("rdma transport: %w", err)
	}
	t.ctxs = ctxs
	t.connCtx, t.connStop = context.WithCancel(context.Background())
	e.Handshake().Handle(handshake.Connection, t.accept)
	return t, nil
}

// Contexts are the transport's NICs, in descriptor order.
func (t *Transport) Contexts() []*rdma.Context { return t.ctxs }

// Collector exports the contexts' metrics.
func (t *Transport) Collector() *rdma.Collector {
	return rdma.NewProviderCollector(t.p.Name(), t.ctxs...)
}

// Protocol is "rdma".
func (t *Transport) Protocol() string { return meta.ProtocolRDMA }

// Provider names the rdma.Provider that moves the bytes: "ibverbs", or
// "soft" (the software NIC, over TCP sockets), which results must name
// (engine.ProviderNamer).
func (t *Transport) Provider() string { return t.p.Name() }

func (t *Transport) accept(_ context.Context, payload []byte) ([]byte, error) {
	var req rdma.ConnectionDesc
	if err := json.Unmarshal(payload, &req); err != nil {
		return nil, fmt.Errorf("connection request: %w", err)
	}
	if t.closed.Load() {
		return json.Marshal(rdma.ConnectionDesc{PeerNICPath: req.LocalNICPath, ReplyMsg: "transport closed"})
	}
	return json.Marshal(rdma.AcceptOn(t.ctxs, req))
}

// exchange sends a connection request as a Connection frame to the
// handshake listener of the peer server named in req.PeerNICPath.
func (t *Transport) exchange(ctx context.Context, req rdma.ConnectionDesc) (rdma.ConnectionDesc, error) {
	var reply rdma.ConnectionDesc
	i := strings.LastIndexByte(req.PeerNICPath, '@')
	if i < 0 {
		return reply, fmt.Errorf("peer nic path %q: want <server>@<device>", req.PeerNICPath)
	}
	t.peerMu.Lock()
	addr := t.peers[req.PeerNICPath[:i]]
	t.peerMu.Unlock()
	if addr == "" {
		return reply, fmt.Errorf("peer server %q: handshake address unknown", req.PeerNICPath[:i])
	}
	payload, err := json.Marshal(req)
	if err != nil {
		return reply, err
	}
	b, err := handshake.Request(ctx, addr, handshake.Connection, payload, 0)
	if err != nil {
		return reply, err
	}
	if err := json.Unmarshal(b, &reply); err != nil {
		return reply, fmt.Errorf("connection reply from %s: %w", addr, err)
	}
	return reply, nil
}

// Describe lists the NICs (lid, gid) and the priority matrix.
func (t *Transport) Describe(d *meta.SegmentDesc) {
	for _, c := range t.ctxs {
		p := c.Port()
		d.Devices = append(d.Devices, meta.DeviceDesc{Name: c.Name(), LID: p.LID, GID: meta.FormatGID(p.GID)})
	}
	if t.cfg.Matrix != nil {
		d.PriorityMatrix = t.cfg.Matrix
		return
	}
	locs := []string{"cpu:0"}
	t.regMu.RLock()
	for _, r := range t.regs {
		if !slices.Contains(locs, r.m.Location()) {
			locs = append(locs, r.m.Location())
		}
	}
	t.regMu.RUnlock()
	d.PriorityMatrix = topo.Matrix{}
	for _, l := range locs {
		d.PriorityMatrix[l] = t.defaultEntry(l)
	}
}

// defaultEntry prefers the NICs on the location's NUMA node (cpu:<n>),
// all NICs when none is there or the node is unknown.
func (t *Transport) defaultEntry(loc string) topo.Entry {
	var e topo.Entry
	node := -2
	if n, ok := strings.CutPrefix(loc, "cpu:"); ok {
		if v, err := strconv.Atoi(n); err == nil {
			node = v
		}
	}
	for _, c := range t.ctxs {
		if c.Device().Info().NUMANode == node {
			e.Preferred = append(e.Preferred, c.Name())
		} else {
			e.Accessible = append(e.Accessible, c.Name())
		}
	}
	if len(e.Preferred) == 0 {
		e.Preferred, e.Accessible = e.Accessible, nil
	}
	return e
}

// DescribeBuffer names the buffer by location with one rkey/lkey per NIC.
func (t *Transport) DescribeBuffer(m *engine.Memory) meta.BufferDesc {
	b := meta.BufferDesc{Name: m.Location(), Addr: m.Addr(), Length: uint64(m.Len())}
	if r := t.lookup(m.Addr(), 1); r != nil {
		for _, mr := range r.mrs {
			b.Rkey = append(b.Rkey, mr.RKey())
			b.Lkey = append(b.Lkey, mr.LKey())
		}
	}
	return b
}

// RegisterMemory registers m on every NIC.
func (t *Transport) RegisterMemory(m *engine.Memory) error {
	r := &region{m: m}
	for _, c := range t.ctxs {
		mr, err := c.RegisterMemory(m.Bytes())
		if err != nil {
			for _, done := range r.mrs {
				done.Deregister()
			}
			return err
		}
		r.mrs = append(r.mrs, mr)
	}
	t.regMu.Lock()
	i, _ := slices.BinarySearchFunc(t.regs, m.Addr(), func(r *region, a uint64) int { return cmp(r.m.Addr(), a) })
	t.regs = slices.Insert(t.regs, i, r)
	t.regMu.Unlock()
	return nil
}

// UnregisterMemory deregisters m from every NIC.
func (t *Transport) UnregisterMemory(m *engine.Memory) error {
	t.regMu.Lock()
	i := slices.IndexFunc(t.regs, func(r *region) bool { return r.m == m })
	if i < 0 {
		t.regMu.Unlock()
		return fmt.Errorf("memory 0x%x not registered with the rdma transport", m.Addr())
	}
	r := t.regs[i]
	t.regs = slices.Delete(t.regs, i, i+1)
	t.regMu.Unlock()
	var errs []error
	for _, mr := range r.mrs {
		errs = append(errs, mr.Deregister())
	}
	return errors.Join(errs...)
}

func (t *Transport) lookup(addr, n uint64) *region {
	t.regMu.RLock()
	defer t.regMu.RUnlock()
	i, _ := slices.BinarySearchFunc(t.regs, addr, func(r *region, a uint64) int {
		if r.m.Addr() <= a {
			return -1
		}
		return 1
	})
	if i == 0 {
		return nil
	}
	r := t.regs[i-1]
	off := addr - r.m.Addr()
	if off >= uint64(r.m.Len()) || n > uint64(r.m.Len())-off {
		return nil
	}
	return r
}

// Dial learns where the peer's handshake listener is and indexes its
// buffers.
func (t *Transport) Dial(_ context.Context, s engine.SegmentInfo) (engine.Route, error) {
	d := s.Desc
	if len(d.Devices) == 0 {
		return nil, fmt.Errorf("rdma segment %q lists no devices", s.Name)
	}
	for _, b := range d.Buffers {
		if len(b.Rkey) != len(d.Devices) {
			return nil, fmt.Errorf("rdma segment %q: buffer at 0x%x has %d rkeys for %d devices", s.Name, b.Addr, len(b.Rkey), len(d.Devices))
		}
	}
	if s.RPC.IPOrHostName == "" || s.RPC.RPCPort <= 0 {
		return nil, fmt.Errorf("rdma segment %q: no handshake address", s.Name)
	}
	t.peerMu.Lock()
	t.peers[d.Name] = net.JoinHostPort(s.RPC.IPOrHostName, strconv.Itoa(s.RPC.RPCPort))
	t.peerMu.Unlock()
	r := &route{t: t, desc: d, bufs: slices.Clone(d.Buffers), devIdx: map[string]int{}}
	slices.SortFunc(r.bufs, func(a, b meta.BufferDesc) int { return cmp(a.Addr, b.Addr) })
	for i, dev := range d.Devices {
		r.devIdx[dev.Name] = i
	}
	return r, nil
}

// Close fails the slices in flight and closes the NICs.
func (t *Transport) Close() error {
	if !t.closed.CompareAndSwap(false, true) {
		return nil
	}
	t.connStop()
	var errs []error
	for _, c := range t.ctxs {
		errs = append(errs, c.Close())
	}
	t.slicesOut.Wait()
	if t.ownsP {
		errs = append(errs, closeProvider(t.p))
	}
	return errors.Join(errs...)
}

func cmp(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// pick applies Mooncake's path choice to one matrix entry: try 0 takes a
// random preferred NIC (round-robin with MC_PATH_ROUNDROBIN), falling back
// to any accessible one; try k>0 takes index (k-1) mod (|preferred| +
// |accessible|) over preferred then accessible. Candidates usable()
// rejects are skipped, and so is avoid (the NIC that just failed) while
// another candidate is usable. It returns "" when nothing is usable.
func pick(e topo.Entry, try int, rr uint64, roundRobin bool, avoid string, usable func(string) bool) string {
	ok := func(n string) bool { return n != avoid && usable(n) }
	all := append(slices.Clip(e.Preferred), e.Accessible...)
	if try == 0 {
		for _, list := range [][]string{e.Preferred, e.Accessible} {
			var cand []string
			for _, n := range list {
				if ok(n) {
					cand = append(cand, n)
				}
			}
			if len(cand) > 0 {
				if roundRobin {
					return cand[rr%uint64(len(cand))]
				}
				return cand[rand.IntN(len(cand))]
			}
		}
	} else if len(all) > 0 {
		start := (try - 1) % len(all)
		for k := range all {
			if n := all[(start+k)%len(all)]; ok(n) {
				return n
			}
		}
	}
	if avoid != "" && usable(avoid) && slices.Contains(all, avoid) {
		return avoid
	}
	return ""
}

// localEntry is the local matrix row for a location.
func (t *Transport) localEntry(loc string) topo.Entry {
	if t.cfg.Matrix != nil {
		if e, ok := t.cfg.Matrix[loc]; ok {
			return e
		}
	}
	return t.defaultEntry(loc)
}

func (t *Transport) ctxByName(name string) (int, *rdma.Context) {
	for i, c := range t.ctxs {
		if c.Name() == name {
			return i, c
		}
	}
	return -1, nil
}

func (t *Transport) railPaused(path string) bool {
	t.railMu.Lock()
	defer t.railMu.Unlock()
	r := t.rails[path]
	return r != nil && time.Now().Before(r.pausedUntil)
}

// railError counts a remote error on a peer NIC path; five within five
// seconds pause the rail for RailPause.
func (t *Transport) railError(path string) {
	now := time.Now()
	t.railMu.Lock()
	r := t.rails[path]
	if r == nil {
		r = &rail{}
		t.rails[path] = r
	}
	r.errs = slices.DeleteFunc(r.errs, func(at time.Time) bool { return now.Sub(at) > railWindow })
	r.errs = append(r.errs, now)
	n := len(r.errs)
	pause := n >= railErrors && !now.Before(r.pausedUntil)
	if pause {
		r.pausedUntil = now.Add(t.cfg.RailPause)
		r.errs = nil
	}
	t.railMu.Unlock()
	if pause {
		slog.Warn(fmt.Sprintf("Rail paused: peer=%s error_count=%d pause_ms=%d", path, n, t.cfg.RailPause.Milliseconds()))
	}
}

func closeProvider(p rdma.Provider) error {
	if c, ok := p.(interface{ Close() error }); ok {
		return c.Close()
	}
	return nil
}
