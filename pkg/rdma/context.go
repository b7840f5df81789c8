package rdma

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Context is one NIC: its device handle, protection domain, completion
// queue, endpoint store, completion workers and monitor.
//
// The monitor reaps async events (a fatal one marks the context inactive
// and retires its endpoints; "port active" re-enables it after
// ReenableDelay) and reclaims retired endpoints on every tick, so
// reclaim never depends on inserts happening.
type Context struct {
	cfg  Config
	name string
	dev  Device
	pd   PD
	cq   CQ

	store *EndpointStore

	active      atomic.Bool
	reenableAt  atomic.Int64 // unix nanos; 0 none
	allocated   atomic.Int64 // QPs created and not destroyed
	evictions   atomic.Uint64
	reclaimed   atomic.Uint64
	createFails atomic.Uint64
	ticks       atomic.Uint64

	// hold is write-locked by tests to stall completion processing, as
	// busy workers do in production; workers read-lock it per batch.
	hold sync.RWMutex

	// cqOutstanding counts WRs whose completion has not been polled: a CQ
	// that overflows is a fatal error on a real NIC, so posts beyond
	// CQDepth wait (ErrQueueFull), as Mooncake's max_cqe check does.
	cqOutstanding atomic.Int64

	nextID  atomic.Uint64
	pendMu  sync.Mutex
	pending map[uint64]pendingSlice

	ownMu sync.Mutex
	owner map[uint32]*Endpoint // qpn -> endpoint, for QP async events

	stop      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
}

type pendingSlice struct {
	ep    *Endpoint
	qp    int
	slice Slice
	done  func(WC)
}

// Stats is a context's view for operators (and metrics).
type Stats struct {
	Device        string `json:"device"`
	Active        bool   `json:"active"`
	LiveEndpoints int    `json:"live_endpoints"` // in the map
	Waiting       int    `json:"waiting"`        // retired, not yet destroyed
	AllocatedQPs  int    `json:"allocated_qps"`
	MaxEndpoints  int    `json:"max_endpoints"`
	Evictions     uint64 `json:"evictions"`
	Reclaimed     uint64 `json:"reclaimed"`
	QPCreateFails uint64 `json:"qp_create_failures"`
}

// storeAnnounced holds the store types already logged at info.
var storeAnnounced sync.Map

// NewContext opens device on p and starts its workers and monitor.
func NewContext(p Provider, device string, cfg Config) (*Context, error) {
	cfg = cfg.withDefaults()
	dev, err := p.Open(device)
	if err != nil {
		return nil, fmt.Errorf("open rdma device %q: %w", device, err)
	}
	c := &Context{cfg: cfg, name: device, dev: dev, pending: map[uint64]pendingSlice{}, owner: map[uint32]*Endpoint{}, stop: make(chan struct{})}
	fail := func(what string, err error) (*Context, error) {
		dev.Close()
		return nil, fmt.Errorf("rdma context %q: %s: %w", device, what, err)
	}
	if c.pd, err = dev.AllocPD(); err != nil {
		return fail("alloc pd", err)
	}
	if c.cq, err = dev.CreateCQ(cfg.CQDepth); err != nil {
		return fail("create cq", err)
	}
	port, err := dev.QueryPort(cfg.Port)
	if err != nil {
		return fail("query port", err)
	}
	info := dev.Info()
	maxEP := cfg.MaxEndpoints
	if info.MaxQP > 0 && maxEP > info.MaxQP/cfg.QPsPerEndpoint {
		maxEP = info.MaxQP / cfg.QPsPerEndpoint
	}
	c.store = newEndpointStore(cfg.StoreType, maxEP, cfg.ReclaimGrace, c.newEndpoint, c.destroyEndpoint)
	c.store.leaky = cfg.reclaimAfterInsertOnly
	c.store.device = device
	c.store.evicted = func() { c.evictions.Add(1) }
	c.store.reclaims = func(n int) { c.reclaimed.Add(uint64(n)) }
	c.active.Store(port.State == PortActive)
	// Mooncake's line, plus the NIC as an attribute (mc diag reads it):
	// at info once per process and store type, then at debug per NIC, as
	// an engine opens one context per NIC and the default level should
	// not list them all.
	level := slog.LevelDebug
	if _, seen := storeAnnounced.LoadOrStore(cfg.StoreType, true); !seen {
		level = slog.LevelInfo
	}
	slog.Log(context.Background(), level, "Using "+cfg.StoreType.String()+" endpoint store", "local_nic", device)
	for i := 0; i < cfg.Workers; i++ {
		c.wg.Add(1)
		go c.worker()
	}
	c.wg.Add(1)
	go c.monitor()
	return c, nil
}

// Name is the device name.
func (c *Context) Name() string { return c.name }

// NICPath is "<ServerName>@<device>".
func (c *Context) NICPath() string { return c.cfg.ServerName + "@" + c.name }

// Device is the context's device handle.
func (c *Context) Device() Device { return c.dev }

// Active reports whether the context may carry traffic.
func (c *Context) Active() bool { return c.active.Load() }

// Port queries the context's port (LID and GID go into the segment
// descriptor's devices list).
func (c *Context) Port() PortInfo {
	p, _ := c.dev.QueryPort(c.cfg.Port)
	return p
}

// Store is the context's endpoint store.
func (c *Context) Store() *EndpointStore { return c.store }

// RegisterMemory registers buf for local and remote access on this NIC.
func (c *Context) RegisterMemory(buf []byte) (MR, error) {
	mr, err := c.pd.RegMR(buf, AccessAll)
	if err != nil {
		return nil, fmt.Errorf("register %d bytes on %s: %w", len(buf), c.name, err)
	}
	return mr, nil
}

// Stats reports the context's counters.
func (c *Context) Stats() Stats {
	return Stats{
		Device:        c.name,
		Active:        c.active.Load(),
		LiveEndpoints: c.store.Len(),
		Waiting:       c.store.Waiting(),
		AllocatedQPs:  int(c.allocated.Load()),
		MaxEndpoints:  c.store.Max(),
		Evictions:     c.evictions.Load(),
		Reclaimed:     c.reclaimed.Load(),
		QPCreateFails: c.createFails.Load(),
	}
}

// Endpoint returns a connected endpoint to peerPath, creating and
// connecting it when needed. A failed connection retires the endpoint.
func (c *Context) Endpoint(ctx context.Context, peerPath string) (*Endpoint, error) {
	if !c.active.Load() {
		return nil, fmt.Errorf("endpoint %s on %s: %w", peerPath, c.name, ErrContextInactive)
	}
	e := c.store.Get(peerPath)
	if e == nil {
		var err error
		if e, err = c.store.Insert(peerPath); err != nil {
			return nil, fmt.Errorf("endpoint %s on %s: %w", peerPath, c.name, err)
		}
	}
	if e.Connected() {
		return e, nil
	}
	if err := e.Connect(ctx); err != nil {
		slog.Warn(fmt.Sprintf("Worker: Cannot make connection for endpoint: %s, mark it inactive", peerPath))
		c.store.Remove(e)
		return nil, err
	}
	return e, nil
}

// Connected returns the endpoint to peerPath if it is connected (what
// Endpoint would return without a connection exchange), else nil.
func (c *Context) Connected(peerPath string) *Endpoint {
	if !c.active.Load() {
		return nil
	}
	if e := c.store.Get(peerPath); e != nil && e.Connected() {
		return e
	}
	return nil
}

// DeleteEndpoint retires e (error paths). It is silent, as in Mooncake.
func (c *Context) DeleteEndpoint(e *Endpoint) bool { return c.store.Remove(e) }

// Accept is the passive side of connection setup, called by the
// handshake server with a peer's request: it creates an endpoint to the
// requesting NIC, connects its QPs to the peer's and returns the reply.
// An existing endpoint to that NIC is retired, not reset: in-flight
// slices may still reference it.
func (c *Context) Accept(req ConnectionDesc) ConnectionDesc {
	port := c.Port()
	reply := ConnectionDesc{LocalNICPath: c.NICPath(), LocalLID: port.LID, LocalGID: port.GID.String(), PeerNICPath: req.LocalNICPath}
	if req.PeerNICPath != c.NICPath() {
		reply.ReplyMsg = fmt.Sprintf("peer nic path %q is not this NIC (%s)", req.PeerNICPath, c.NICPath())
		return reply
	}
	if !c.active.Load() {
		reply.ReplyMsg = "rdma context " + c.name + " inactive"
		return reply
	}
	if old := c.store.Get(req.LocalNICPath); old != nil {
		if r, ok := c.acceptOn(old, req, reply); ok {
			return r
		}
		if old.Connected() {
			slog.Warn(fmt.Sprintf("Retiring endpoint instead of resetting it (triggered by: passive re-handshake): EndPoint: local %s, peer %s", c.NICPath(), req.LocalNICPath))
		}
		c.store.Remove(old)
	}
	// Insert may return an endpoint our own side created a moment ago.
	e, err := c.store.Insert(req.LocalNICPath)
	if err != nil {
		reply.ReplyMsg = err.Error()
		return reply
	}
	r, ok := c.acceptOn(e, req, reply)
	if !ok {
		c.store.Remove(e)
		r.ReplyMsg = fmt.Sprintf("cannot pair endpoint %s with %s", c.NICPath(), req.LocalNICPath)
	}
	return r
}

// acceptOn answers req with the existing endpoint e when that keeps both
// sides consistent: e is not paired yet (our own Connect to the same peer
// is in flight: both sides opened at once, and pairing e with the
// requester's QPs now lets both Connects finish on the same pair), or e
// is already paired with exactly the requester's QPs (the other half of
// such a crossing). Otherwise (the peer re-handshakes with new QPs) it
// returns false and e is replaced.
func (c *Context) acceptOn(e *Endpoint, req, reply ConnectionDesc) (ConnectionDesc, bool) {
	e.stateMu.Lock()
	defer e.stateMu.Unlock()
	if !e.active.Load() {
		return reply, false
	}
	if e.remoteQPN != nil {
		if !slices.Equal(e.remoteQPN, req.QPNums) {
			return reply, false
		}
	} else {
		// Paired, not connected: only a reply from the peer says its QPs
		// are up too, so this side posts nothing before its own Connect
		// (in flight when both sides opened at once, or done on first
		// use: the peer then answers from the pair as it stands).
		if err := e.init(); err != nil {
			return reply, false
		}
		if err := e.toRTS(req); err != nil {
			return reply, false
		}
	}
	reply.QPNums = e.QPNums()
	return reply, true
}

// newEndpoint constructs an endpoint with its QPs (called under the
// store's lock).
func (c *Context) newEndpoint(path string) (*Endpoint, error) {
	e := &Endpoint{ctx: c, peer: path, depth: make([]atomic.Int32, c.cfg.QPsPerEndpoint)}
	e.active.Store(true)
	for i := 0; i < c.cfg.QPsPerEndpoint; i++ {
		q, err := c.pd.CreateQP(QPInit{SendCQ: c.cq, RecvCQ: c.cq, MaxSendWR: c.cfg.MaxWR, MaxRecvWR: c.cfg.MaxWR, MaxSGE: c.cfg.MaxSGE, MaxInline: c.cfg.MaxInline})
		if err != nil {
			c.createFails.Add(1)
			slog.Error("Failed to create QP"+plogSuffix(err), "local_nic", c.name)
			for _, q := range e.qps {
				q.Destroy()
				c.allocated.Add(-1)
			}
			return nil, fmt.Errorf("create QP for %s on %s: %w", path, c.name, err)
		}
		c.allocated.Add(1)
		e.qps = append(e.qps, q)
	}
	c.ownMu.Lock()
	for _, q := range e.qps {
		c.owner[q.Num()] = e
	}
	c.ownMu.Unlock()
	return e, nil
}

func (c *Context) destroyEndpoint(e *Endpoint) {
	if e.Outstanding() > 0 {
		// Forced: the NIC never completed these. Fail them so their
		// callers do not wait forever; not here, as the store's lock is
		// held and callbacks may delete endpoints.
		var lost []pendingSlice
		c.pendMu.Lock()
		for id, p := range c.pending {
			if p.ep == e {
				lost = append(lost, p)
				delete(c.pending, id)
			}
		}
		c.pendMu.Unlock()
		if len(lost) > 0 {
			go func() {
				for _, p := range lost {
					p.ep.depth[p.qp].Add(-1)
					c.cqOutstanding.Add(-1)
					if p.done != nil {
						p.done(WC{Status: WCWRFlushErr, Op: p.slice.Op})
					}
				}
			}()
		}
	}
	c.ownMu.Lock()
	for _, q := range e.qps {
		if c.owner[q.Num()] == e {
			delete(c.owner, q.Num())
		}
	}
	c.ownMu.Unlock()
	for _, q := range e.qps {
		if err := q.Destroy(); err == nil {
			c.allocated.Add(-1)
		}
	}
}

// plogSuffix formats an error as glog's PLOG does: ": <strerror> [<errno>]".
func plogSuffix(err error) string {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return ": " + err.Error()
	}
	s := errno.Error()
	if s != "" && s[0] >= 'a' && s[0] <= 'z' {
		s = string(s[0]-'a'+'A') + s[1:] // Go lower-cases glibc's strerror
	}
	return ": " + s + " [" + strconv.Itoa(int(errno)) + "]"
}

func (c *Context) track(e *Endpoint, qi int, s Slice, done func(WC)) uint64 {
	id := c.nextID.Add(1)
	c.pendMu.Lock()
	c.pending[id] = pendingSlice{ep: e, qp: qi, slice: s, done: done}
	c.pendMu.Unlock()
	return id
}

func (c *Context) untrack(id uint64) {
	c.pendMu.Lock()
	delete(c.pending, id)
	c.pendMu.Unlock()
}

// worker polls the CQ and completes slices.
func (c *Context) worker() {
	defer c.wg.Done()
	wcs := make([]WC, 64)
	// Providers without a reliable notification still get polled.
	idle := time.NewTimer(time.Hour)
	defer idle.Stop()
	for {
		c.hold.RLock()
		n := c.cq.Poll(wcs)
		for _, wc := range wcs[:n] {
			c.complete(wc)
		}
		c.hold.RUnlock()
		if n > 0 {
			continue
		}
		idle.Reset(20 * time.Millisecond)
		select {
		case <-c.stop:
			return
		case <-c.cq.Notify():
		case <-idle.C:
		}
	}
}

func (c *Context) complete(wc WC) {
	c.pendMu.Lock()
	p, ok := c.pending[wc.WRID]
	delete(c.pending, wc.WRID)
	c.pendMu.Unlock()
	if !ok {
		return
	}
	c.cqOutstanding.Add(-1)
	p.ep.depth[p.qp].Add(-1)
	if wc.Status != WCSuccess && wc.Status != WCWRFlushErr {
		p.ep.logSliceFailure(p.slice, wc.Status)
	}
	if p.done != nil {
		p.done(wc)
	}
}

// monitor reaps async events and reclaims retired endpoints every tick.
func (c *Context) monitor() {
	defer c.wg.Done()
	t := time.NewTicker(c.cfg.MonitorInterval)
	defer t.Stop()
	events := c.dev.Events()
	for {
		select {
		case <-c.stop:
			return
		case ev, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			c.handleEvent(ev)
		case <-t.C:
			c.tick()
		}
	}
}

func (c *Context) tick() {
	if at := c.reenableAt.Load(); at != 0 && time.Now().UnixNano() >= at {
		if c.Port().State == PortActive && c.reenableAt.CompareAndSwap(at, 0) {
			c.active.Store(true)
			slog.Info(fmt.Sprintf("Context %s re-enabled: port active", c.name))
		}
	}
	if !c.cfg.reclaimAfterInsertOnly {
		c.store.Reclaim()
	}
	c.ticks.Add(1)
}

func (c *Context) handleEvent(ev AsyncEvent) {
	switch {
	case ev.Type.Fatal():
		slog.Warn(fmt.Sprintf("Worker: Received context async event %s for context %s, mark it inactive", ev.Type, c.name))
		c.reenableAt.Store(0)
		c.active.Store(false)
		c.store.DeleteAll()
	case ev.Type == EventPortActive:
		slog.Info(fmt.Sprintf("Worker: Received context async event %s for context %s, re-enable after %v", ev.Type, c.name, c.cfg.ReenableDelay))
		c.reenableAt.Store(time.Now().Add(c.cfg.ReenableDelay).UnixNano())
	case ev.Type == EventQPFatal || ev.Type == EventQPReqErr || ev.Type == EventQPAccessErr:
		c.ownMu.Lock()
		e := c.owner[ev.QPNum]
		c.ownMu.Unlock()
		slog.Warn(fmt.Sprintf("Worker: Received context async event %s for context %s (qp %d)", ev.Type, c.name, ev.QPNum))
		if e != nil {
			c.store.Remove(e)
		}
	default:
		slog.Info(fmt.Sprintf("Worker: Received context async event %s for context %s", ev.Type, c.name))
	}
}

// Close retires every endpoint, waits up to ReclaimGrace for their work
// requests to drain (destroying the rest with a warning), then stops the
// workers and closes the device.
func (c *Context) Close() error {
	c.closeOnce.Do(func() {
		c.active.Store(false)
		c.store.DeleteAll()
		deadline := time.Now().Add(c.cfg.ReclaimGrace)
		for {
			c.store.Reclaim()
			if c.store.Waiting() == 0 {
				break
			}
			if time.Now().After(deadline) {
				c.store.reclaimAll()
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		close(c.stop)
		c.wg.Wait()
		c.cq.Close()
		c.pd.Close()
		c.dev.Close()
	})
	return nil
}

// OpenContexts opens one context per device name (all devices of p when
// names is empty). On error the contexts already opened are closed.
func OpenContexts(p Provider, names []string, cfg Config) ([]*Context, error) {
	if len(names) == 0 {
		devs, err := p.Devices()
		if err != nil {
			return nil, err
		}
		for _, d := range devs {
			names = append(names, d.Name)
		}
	}
	var out []*Context
	for _, n := range names {
		c, err := NewContext(p, n, cfg)
		if err != nil {
			for _, o := range out {
				o.Close()
			}
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// AcceptOn routes a connection request to the context whose NIC path it
// targets: what a handshake server does with a Connection frame.
func AcceptOn(ctxs []*Context, req ConnectionDesc) ConnectionDesc {
	for _, c := range ctxs {
		if c.NICPath() == req.PeerNICPath {
			return c.Accept(req)
		}
	}
	return ConnectionDesc{PeerNICPath: req.LocalNICPath, ReplyMsg: fmt.Sprintf("no local NIC %s", req.PeerNICPath)}
}
