// Package soft is a userspace software NIC implementing rdma.Provider with
// RC semantics, so the whole RDMA path of mc runs where there is no RDMA
// hardware (and no kernel InfiniBand support for rxe or siw).
//
// Each device is declared by configuration (MC_SOFT_NICS or a Config) and
// owns a loopback TCP listener, its wire. Port attributes encode
// reachability the way RoCE v2 does: the GID is the listener's IP address
// (IPv4-mapped, ::ffff:127.0.0.1) and the LID is the listener's TCP port.
// A connection handshake that exchanges (lid, gid, qp_num) therefore works
// unchanged across processes: RTR with a remote (lid, gid) makes the QP
// send to gid:lid.
//
// What it checks like a NIC: QP pool size (ENOMEM), the QP state machine,
// outstanding WRs per QP (ENOMEM on post), local keys and bounds (local
// protection error), remote keys, PD, access and bounds on the responder
// (remote access error, both QPs to ERR), flushes in ERR, and a lost peer
// (transport retry counter exceeded after Config.RetryTimeout). Fault
// injection (SetPortState, ForceQPError, DropPeer, KillWire) raises the
// async events and completion errors a NIC would.
//
// Memory regions are Go byte slices. Addresses are resolved by looking up
// registered regions; an integer is never turned back into a pointer.
package soft

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/kvcache-ops/mc/pkg/rdma"
)

// Provider is the soft provider. It is safe for concurrent use.
type Provider struct {
	mu     sync.Mutex
	nics   map[string]*nic
	order  []string
	closed bool
}

var _ rdma.Provider = (*Provider)(nil)

// New starts the wires of the devices in cfg.
func New(cfg Config) (*Provider, error) {
	if len(cfg.Devices) == 0 {
		return nil, errors.New("soft provider: no devices configured")
	}
	host := cfg.ListenHost
	if host == "" {
		host = "127.0.0.1"
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return nil, fmt.Errorf("soft provider: listen host %q: %w", host, err)
	}
	rt := cfg.RetryTimeout
	if rt <= 0 {
		rt = DefaultRetryTimeout
	}
	p := &Provider{nics: map[string]*nic{}}
	for _, dc := range cfg.Devices {
		if dc.Name == "" {
			p.Close()
			return nil, errors.New("soft provider: device with empty name")
		}
		if _, dup := p.nics[dc.Name]; dup {
			p.Close()
			return nil, fmt.Errorf("soft provider: device %q declared twice", dc.Name)
		}
		if dc.MaxQP <= 0 {
			dc.MaxQP = DefaultMaxQP
		}
		if dc.PortState == 0 {
			dc.PortState = rdma.PortActive
		}
		n, err := newNIC(dc, ip, rt)
		if err != nil {
			p.Close()
			return nil, err
		}
		p.nics[dc.Name] = n
		p.order = append(p.order, dc.Name)
	}
	return p, nil
}

// NewFromEnv is New(ConfigFromEnv()).
func NewFromEnv() (*Provider, error) {
	cfg, err := ConfigFromEnv()
	if err != nil {
		return nil, err
	}
	return New(cfg)
}

// Name is "soft".
func (p *Provider) Name() string { return "soft" }

// Devices lists the configured devices in declaration order.
func (p *Provider) Devices() ([]rdma.DeviceInfo, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.order) == 0 || p.closed {
		return nil, rdma.ErrNoDevices
	}
	out := make([]rdma.DeviceInfo, 0, len(p.order))
	for _, name := range p.order {
		out = append(out, p.nics[name].info())
	}
	return out, nil
}

// Open opens a device. Several opens share the NIC (as ibv_open_device
// does); each handle has its own async event queue.
func (p *Provider) Open(name string) (rdma.Device, error) {
	n, err := p.nic(name)
	if err != nil {
		return nil, err
	}
	d, err := n.open()
	if err != nil {
		return nil, err // a nil rdma.Device, not a nil *device in one
	}
	return d, nil
}

func (p *Provider) nic(name string) (*nic, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := p.nics[name]
	if n == nil || p.closed {
		return nil, fmt.Errorf("soft device %q: %w", name, syscall.ENODEV)
	}
	return n, nil
}

// Close stops every device's wire and goroutines. Handles stay valid
// objects but their QPs are flushed and their event channels closed.
func (p *Provider) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	nics := make([]*nic, 0, len(p.nics))
	for _, n := range p.nics {
		nics = append(nics, n)
	}
	p.mu.Unlock()
	for _, n := range nics {
		n.shutdown()
	}
	return nil
}

// SetPortState brings a device's port down (async event "port error",
// every connected QP to ERR with its WRs flushed, incoming requests
// unanswered) or up again (async event "port active").
func (p *Provider) SetPortState(dev string, state rdma.PortState) error {
	n, err := p.nic(dev)
	if err != nil {
		return err
	}
	n.setPortState(state)
	return nil
}

// ForceQPError moves a QP to ERR as a local catastrophic error would:
// async event "local work queue catastrophic error", outstanding WRs
// flushed.
func (p *Provider) ForceQPError(dev string, qpn uint32) error {
	n, err := p.nic(dev)
	if err != nil {
		return err
	}
	return n.forceQPError(qpn)
}

// DropPeer makes dev silently lose every frame it sends to the device
// whose wire port (LID) is peerLID, as a dead peer or a cut cable would:
// requests then complete with "transport retry counter exceeded" after the
// retry timeout. RestorePeer undoes it.
func (p *Provider) DropPeer(dev string, peerLID uint16) error {
	n, err := p.nic(dev)
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.dropped[peerLID] = true
	n.mu.Unlock()
	return nil
}

// RestorePeer undoes DropPeer.
func (p *Provider) RestorePeer(dev string, peerLID uint16) error {
	n, err := p.nic(dev)
	if err != nil {
		return err
	}
	n.mu.Lock()
	delete(n.dropped, peerLID)
	n.mu.Unlock()
	return nil
}

// KillWire closes dev's listener and connections, as if its host died:
// peers' requests to it time out, and its own requests go nowhere.
func (p *Provider) KillWire(dev string) error {
	n, err := p.nic(dev)
	if err != nil {
		return err
	}
	n.killWire()
	return nil
}

// nic is one soft device, shared by all handles that opened it.
type nic struct {
	cfg          DeviceConfig
	ln           net.Listener
	lid          uint16
	gid          rdma.GID
	retryTimeout time.Duration
	stop         chan struct{}
	wg           sync.WaitGroup

	mu       sync.Mutex
	port     rdma.PortState
	qps      map[uint32]*qp
	nextQPN  uint32
	mrs      map[uint32]*mr
	nextKey  uint32
	handles  map[*device]struct{}
	links    map[netip.AddrPort]*link
	conns    map[net.Conn]struct{} // accepted and dialed, closed by killWire
	dropped  map[uint16]bool
	wireDead bool
	down     bool // shut down
}

func newNIC(dc DeviceConfig, ip netip.Addr, retry time.Duration) (*nic, error) {
	ln, err := net.Listen("tcp", netip.AddrPortFrom(ip, 0).String())
	if err != nil {
		return nil, fmt.Errorf("soft device %q: listen: %w", dc.Name, err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	n := &nic{
		cfg:          dc,
		ln:           ln,
		lid:          uint16(port),
		gid:          rdma.GIDFromAddr(ip),
		retryTimeout: retry,
		stop:         make(chan struct{}),
		port:         dc.PortState,
		qps:          map[uint32]*qp{},
		nextQPN:      0x100, // low QPNs are special (QP0/QP1) on real NICs
		mrs:          map[uint32]*mr{},
		// Keys start at random, as a real NIC's carry a variant byte: a
		// key from an earlier process (a peer's stale rkey) must not name
		// a region of this one.
		nextKey: 0x1000 + rand.Uint32N(1<<30),
		handles: map[*device]struct{}{},
		links:   map[netip.AddrPort]*link{},
		conns:   map[net.Conn]struct{}{},
		dropped: map[uint16]bool{},
	}
	n.wg.Add(2)
	go n.acceptLoop()
	go n.watchdog()
	return n, nil
}

func (n *nic) info() rdma.DeviceInfo {
	n.mu.Lock()
	defer n.mu.Unlock()
	return rdma.DeviceInfo{
		Name:     n.cfg.Name,
		Ports:    []rdma.PortInfo{n.portInfoLocked()},
		PCIAddr:  n.cfg.PCIAddr,
		NUMANode: n.cfg.NUMANode,
		MaxQP:    n.cfg.MaxQP,
		MaxCQE:   4194303,
		MaxMRLen: 1 << 46,
	}
}

func (n *nic) portInfoLocked() rdma.PortInfo {
	return rdma.PortInfo{Num: 1, State: n.port, LinkLayer: "Ethernet", LID: n.lid, GID: n.gid, MTU: 4096}
}

func (n *nic) open() (*device, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.down {
		return nil, fmt.Errorf("soft device %q: %w", n.cfg.Name, syscall.ENODEV)
	}
	d := &device{n: n, events: make(chan rdma.AsyncEvent, 1024)}
	n.handles[d] = struct{}{}
	return d, nil
}

// emitLocked queues an event for one handle (to != nil) or all. A full
// queue drops the event, as the kernel's per-file event queue would
// rather than stall the NIC.
func (n *nic) emitLocked(to *device, ev rdma.AsyncEvent) {
	send := func(d *device) {
		select {
		case d.events <- ev:
		default:
		}
	}
	if to != nil {
		if _, ok := n.handles[to]; ok {
			send(to)
		}
		return
	}
	for d := range n.handles {
		send(d)
	}
}

func (n *nic) setPortState(s rdma.PortState) {
	n.mu.Lock()
	old := n.port
	n.port = s
	var qps []*qp
	if s != rdma.PortActive && old == rdma.PortActive {
		for _, q := range n.qps {
			qps = append(qps, q)
		}
		n.emitLocked(nil, rdma.AsyncEvent{Type: rdma.EventPortErr, Port: 1})
	} else if s == rdma.PortActive && old != rdma.PortActive {
		n.emitLocked(nil, rdma.AsyncEvent{Type: rdma.EventPortActive, Port: 1})
	}
	n.mu.Unlock()
	for _, q := range qps {
		q.mu.Lock()
		if q.state != rdma.QPStateReset {
			q.toErrorLocked(rdma.WCWRFlushErr)
		}
		q.mu.Unlock()
	}
}

func (n *nic) forceQPError(qpn uint32) error {
	n.mu.Lock()
	q := n.qps[qpn]
	if q == nil {
		n.mu.Unlock()
		return fmt.Errorf("soft device %q: qp %d: %w", n.cfg.Name, qpn, syscall.ENOENT)
	}
	n.emitLocked(q.dev, rdma.AsyncEvent{Type: rdma.EventQPFatal, QPNum: qpn})
	n.mu.Unlock()
	q.mu.Lock()
	q.toErrorLocked(rdma.WCWRFlushErr)
	q.mu.Unlock()
	return nil
}

func (n *nic) qp(qpn uint32) *qp {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.qps[qpn]
}

func (n *nic) mr(key uint32) *mr {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.mrs[key]
}

func (n *nic) killWire() {
	n.mu.Lock()
	n.wireDead = true
	conns := make([]net.Conn, 0, len(n.conns))
	for c := range n.conns {
		conns = append(conns, c)
	}
	n.mu.Unlock()
	n.ln.Close()
	for _, c := range conns {
		c.Close()
	}
}

func (n *nic) shutdown() {
	n.mu.Lock()
	if n.down {
		n.mu.Unlock()
		return
	}
	n.down = true
	links := make([]*link, 0, len(n.links))
	for _, l := range n.links {
		links = append(links, l)
	}
	qps := make([]*qp, 0, len(n.qps))
	for _, q := range n.qps {
		qps = append(qps, q)
	}
	for d := range n.handles {
		delete(n.handles, d)
		close(d.events)
	}
	n.mu.Unlock()
	close(n.stop)
	n.killWire()
	for _, l := range links {
		l.close()
	}
	for _, q := range qps {
		q.mu.Lock()
		q.toErrorLocked(rdma.WCWRFlushErr)
		q.mu.Unlock()
	}
	n.wg.Wait()
}

// watchdog completes requests whose responder stopped answering with
// "transport retry counter exceeded", as an RC QP's ACK timeout does.
func (n *nic) watchdog() {
	defer n.wg.Done()
	period := n.retryTimeout / 4
	if period < 2*time.Millisecond {
		period = 2 * time.Millisecond
	}
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-n.stop:
			return
		case now := <-t.C:
			n.mu.Lock()
			qps := make([]*qp, 0, len(n.qps))
			for _, q := range n.qps {
				qps = append(qps, q)
			}
			n.mu.Unlock()
			for _, q := range qps {
				q.mu.Lock()
				if q.state == rdma.QPStateRTS && len(q.pending) > 0 && now.Sub(q.progress) > n.retryTimeout {
					q.toErrorLocked(rdma.WCRetryExcErr)
				}
				q.mu.Unlock()
			}
		}
	}
}

// device is an open handle (ibv_context) on a nic.
type device struct {
	n      *nic
	events chan rdma.AsyncEvent
}

func (d *device) Info() rdma.DeviceInfo { return d.n.info() }

func (d *device) QueryPort(port int) (rdma.PortInfo, error) {
	if port != 1 {
		return rdma.PortInfo{}, fmt.Errorf("soft device %q: port %d: %w", d.n.cfg.Name, port, syscall.EINVAL)
	}
	d.n.mu.Lock()
	defer d.n.mu.Unlock()
	return d.n.portInfoLocked(), nil
}

func (d *device) AllocPD() (rdma.PD, error) {
	return &pd{d: d}, nil
}

func (d *device) CreateCQ(depth int) (rdma.CQ, error) {
	if depth <= 0 {
		return nil, fmt.Errorf("soft device %q: cq depth %d: %w", d.n.cfg.Name, depth, syscall.EINVAL)
	}
	return &cq{depth: depth, notify: make(chan struct{}, 1)}, nil
}

func (d *device) Events() <-chan rdma.AsyncEvent { return d.events }

// Close destroys the QPs and memory regions made through this handle and
// closes its event channel.
func (d *device) Close() error {
	n := d.n
	n.mu.Lock()
	if _, ok := n.handles[d]; !ok {
		n.mu.Unlock()
		return nil
	}
	delete(n.handles, d)
	close(d.events)
	var qps []*qp
	for _, q := range n.qps {
		if q.dev == d {
			qps = append(qps, q)
		}
	}
	var mrs []*mr
	for _, m := range n.mrs {
		if m.pd.d == d {
			mrs = append(mrs, m)
		}
	}
	n.mu.Unlock()
	for _, q := range qps {
		q.Destroy()
	}
	for _, m := range mrs {
		m.Deregister()
	}
	return nil
}

type pd struct {
	d *device
}

func (p *pd) Close() error { return nil }

func (p *pd) RegMR(buf []byte, access rdma.Access) (rdma.MR, error) {
	if len(buf) == 0 {
		return nil, fmt.Errorf("soft device %q: register empty buffer: %w", p.d.n.cfg.Name, syscall.EINVAL)
	}
	n := p.d.n
	m := &mr{pd: p, buf: buf, addr: uint64(uintptr(unsafe.Pointer(&buf[0]))), access: access}
	n.mu.Lock()
	defer n.mu.Unlock()
	m.key = n.nextKey
	n.nextKey++
	n.mrs[m.key] = m
	return m, nil
}

// mr is a registered region. mu is held (shared) while the wire copies
// into or out of buf, so Deregister waits for copies in flight.
type mr struct {
	pd     *pd
	key    uint32
	buf    []byte
	addr   uint64
	access rdma.Access

	mu   sync.RWMutex
	dead bool
}

func (m *mr) LKey() uint32 { return m.key }
func (m *mr) RKey() uint32 { return m.key }
func (m *mr) Addr() uint64 { return m.addr }
func (m *mr) Len() int     { return len(m.buf) }

func (m *mr) Deregister() error {
	n := m.pd.d.n
	n.mu.Lock()
	delete(n.mrs, m.key)
	n.mu.Unlock()
	m.mu.Lock()
	m.dead = true
	m.mu.Unlock()
	return nil
}

// span returns the offset of [addr, addr+length) in m, or false when the
// range is not inside m.
func (m *mr) span(addr uint64, length uint32) (int, bool) {
	if addr < m.addr {
		return 0, false
	}
	off := addr - m.addr
	if off > uint64(len(m.buf)) || uint64(length) > uint64(len(m.buf))-off {
		return 0, false
	}
	return int(off), true
}

// cq is an unbounded completion queue: depth is accepted for the API but
// outstanding WRs per QP (MaxSendWR) are what bound it in practice.
type cq struct {
	depth  int
	notify chan struct{}

	mu sync.Mutex
	q  []rdma.WC
}

func (c *cq) push(wcs ...rdma.WC) {
	c.mu.Lock()
	c.q = append(c.q, wcs...)
	c.mu.Unlock()
	select {
	case c.notify <- struct{}{}:
	default:
	}
}

func (c *cq) Poll(out []rdma.WC) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := copy(out, c.q)
	if k == len(c.q) {
		c.q = c.q[:0]
	} else {
		c.q = append(c.q[:0], c.q[k:]...)
	}
	return k
}

func (c *cq) Notify() <-chan struct{} { return c.notify }
func (c *cq) Close() error            { return nil }
