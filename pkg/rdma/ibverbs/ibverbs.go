//go:build ibverbs && cgo

package ibverbs

/*
#cgo LDFLAGS: -libverbs
#include <infiniband/verbs.h>
#include <errno.h>
#include <poll.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>

static struct ibv_device **mc_get_device_list(int *n, int *err) {
	errno = 0;
	struct ibv_device **l = ibv_get_device_list(n);
	*err = errno;
	return l;
}

static struct ibv_device *mc_device_at(struct ibv_device **l, int i) { return l[i]; }

static int mc_query_port(struct ibv_context *c, uint8_t port, struct ibv_port_attr *a) {
	return ibv_query_port(c, port, a);
}

static int mc_nonblock(int fd) {
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0) return -1;
	return fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

// mc_get_async waits up to timeout_ms for one async event. 1: event
// returned; 0: timeout; -1: error.
static int mc_get_async(struct ibv_context *c, int timeout_ms, int *type, int *port, uint32_t *qpn) {
	struct pollfd p = { .fd = c->async_fd, .events = POLLIN };
	int r = poll(&p, 1, timeout_ms);
	if (r <= 0) return r < 0 && errno != EINTR ? -1 : 0;
	struct ibv_async_event ev;
	if (ibv_get_async_event(c, &ev)) return errno == EAGAIN ? 0 : -1;
	*type = ev.event_type;
	*port = 0;
	*qpn = 0;
	switch (ev.event_type) {
	case IBV_EVENT_PORT_ACTIVE: case IBV_EVENT_PORT_ERR: case IBV_EVENT_LID_CHANGE:
	case IBV_EVENT_PKEY_CHANGE: case IBV_EVENT_SM_CHANGE: case IBV_EVENT_CLIENT_REREGISTER:
	case IBV_EVENT_GID_CHANGE:
		*port = ev.element.port_num;
		break;
	case IBV_EVENT_QP_FATAL: case IBV_EVENT_QP_REQ_ERR: case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST: case IBV_EVENT_SQ_DRAINED: case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR: case IBV_EVENT_QP_LAST_WQE_REACHED:
		if (ev.element.qp) *qpn = ev.element.qp->qp_num;
		break;
	default:
		break;
	}
	ibv_ack_async_event(&ev);
	return 1;
}

// mc_wait_cq waits up to timeout_ms for a completion event on ch, acks it
// and re-arms the CQ. 1: event; 0: timeout; -1: error.
static int mc_wait_cq(struct ibv_comp_channel *ch, int timeout_ms) {
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	int r = poll(&p, 1, timeout_ms);
	if (r <= 0) return r < 0 && errno != EINTR ? -1 : 0;
	struct ibv_cq *cq;
	void *ctx;
	if (ibv_get_cq_event(ch, &cq, &ctx)) return errno == EAGAIN ? 0 : -1;
	ibv_ack_cq_events(cq, 1);
	if (ibv_req_notify_cq(cq, 0)) return -1;
	return 1;
}

static int mc_req_notify(struct ibv_cq *cq) { return ibv_req_notify_cq(cq, 0); }

static int mc_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc) { return ibv_poll_cq(cq, n, wc); }

static struct ibv_qp *mc_create_qp(struct ibv_pd *pd, struct ibv_cq *scq, struct ibv_cq *rcq,
		uint32_t max_send_wr, uint32_t max_recv_wr, uint32_t max_sge, uint32_t max_inline, int *err) {
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof a);
	a.send_cq = scq;
	a.recv_cq = rcq;
	a.qp_type = IBV_QPT_RC;
	a.sq_sig_all = 1;
	a.cap.max_send_wr = max_send_wr;
	a.cap.max_recv_wr = max_recv_wr;
	a.cap.max_send_sge = max_sge;
	a.cap.max_recv_sge = max_sge;
	a.cap.max_inline_data = max_inline;
	errno = 0;
	struct ibv_qp *qp = ibv_create_qp(pd, &a);
	*err = errno;
	return qp;
}

static int mc_qp_init(struct ibv_qp *qp, uint8_t port, int access) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_INIT;
	a.port_num = port;
	a.pkey_index = 0;
	a.qp_access_flags = access;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

static int mc_qp_rtr(struct ibv_qp *qp, uint8_t port, int mtu, uint16_t lid, const uint8_t *gid, int gid_index, uint32_t qpn) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = mtu;
	a.dest_qp_num = qpn;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 16;
	a.min_rnr_timer = 12;
	a.ah_attr.dlid = lid;
	a.ah_attr.port_num = port;
	a.ah_attr.sl = 0;
	int zero = 1;
	for (int i = 0; i < 16; i++) if (gid[i]) zero = 0;
	if (!zero) {
		a.ah_attr.is_global = 1;
		memcpy(a.ah_attr.grh.dgid.raw, gid, 16);
		a.ah_attr.grh.sgid_index = gid_index;
		a.ah_attr.grh.hop_limit = 255;
	}
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
		IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

static int mc_qp_rts(struct ibv_qp *qp) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 0;
	a.max_rd_atomic = 16;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
		IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

static int mc_qp_state(struct ibv_qp *qp, int state) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = state;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE);
}

static int mc_qp_query_state(struct ibv_qp *qp) {
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	if (ibv_query_qp(qp, &a, IBV_QP_STATE, &ia)) return -1;
	return a.qp_state;
}

static int mc_post(struct ibv_qp *qp, uint64_t id, int read, uint64_t laddr, uint32_t len, uint32_t lkey, uint64_t raddr, uint32_t rkey) {
	struct ibv_sge sge = { .addr = laddr, .length = len, .lkey = lkey };
	struct ibv_send_wr wr, *bad = NULL;
	memset(&wr, 0, sizeof wr);
	wr.wr_id = id;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = read ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	return ibv_post_send(qp, &wr, &bad);
}

static struct ibv_mr *mc_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access, int *err) {
	errno = 0;
	struct ibv_mr *mr = ibv_reg_mr(pd, addr, len, access);
	*err = errno;
	return mr;
}
*/
import "C"

import (
	"fmt"
	"sync"
	"syscall"
	"unsafe"

	"github.com/kvcache-ops/mc/pkg/rdma"
)

// Provider binds libibverbs.
type Provider struct {
	opts Options
}

var _ rdma.Provider = (*Provider)(nil)

// New returns the libibverbs provider.
func New(opts Options) (rdma.Provider, error) {
	return &Provider{opts: opts}, nil
}

// Name is "ibverbs".
func (p *Provider) Name() string { return "ibverbs" }

func errnoErr(what string, e C.int) error {
	if e == 0 {
		e = C.int(syscall.EIO)
	}
	return fmt.Errorf("%s: %w", what, syscall.Errno(e))
}

// deviceList calls ibv_get_device_list. A NULL list with ENOSYS means the
// kernel has no RDMA support: no devices, not a failure.
func deviceList() (**C.struct_ibv_device, int, error) {
	var n, e C.int
	l := C.mc_get_device_list(&n, &e)
	if l == nil {
		if syscall.Errno(e) == syscall.ENOSYS {
			return nil, 0, fmt.Errorf("ibv_get_device_list: kernel has no RDMA support (ENOSYS): %w", rdma.ErrNoDevices)
		}
		if e == 0 {
			return nil, 0, fmt.Errorf("ibv_get_device_list: %w", rdma.ErrNoDevices)
		}
		return nil, 0, errnoErr("ibv_get_device_list", e)
	}
	if n == 0 {
		C.ibv_free_device_list(l)
		return nil, 0, fmt.Errorf("ibv_get_device_list: empty: %w", rdma.ErrNoDevices)
	}
	return l, int(n), nil
}

// Devices lists the RDMA devices with their ports.
func (p *Provider) Devices() ([]rdma.DeviceInfo, error) {
	l, n, err := deviceList()
	if err != nil {
		return nil, err
	}
	defer C.ibv_free_device_list(l)
	var out []rdma.DeviceInfo
	for i := 0; i < n; i++ {
		name := C.GoString(C.ibv_get_device_name(C.mc_device_at(l, C.int(i))))
		d, err := p.Open(name)
		if err != nil {
			return nil, err
		}
		out = append(out, d.Info())
		d.Close()
	}
	return out, nil
}

// Open opens a device by name.
func (p *Provider) Open(name string) (rdma.Device, error) {
	l, n, err := deviceList()
	if err != nil {
		return nil, err
	}
	defer C.ibv_free_device_list(l)
	for i := 0; i < n; i++ {
		dev := C.mc_device_at(l, C.int(i))
		if C.GoString(C.ibv_get_device_name(dev)) != name {
			continue
		}
		ctx := C.ibv_open_device(dev)
		if ctx == nil {
			return nil, fmt.Errorf("ibv_open_device %q: %w", name, syscall.EIO)
		}
		d := &device{p: p, name: name, ctx: ctx, events: make(chan rdma.AsyncEvent, 1024), stop: make(chan struct{})}
		var attr C.struct_ibv_device_attr
		if C.ibv_query_device(ctx, &attr) != 0 {
			C.ibv_close_device(ctx)
			return nil, fmt.Errorf("ibv_query_device %q: %w", name, syscall.EIO)
		}
		d.info = rdma.DeviceInfo{Name: name, MaxQP: int(attr.max_qp), MaxCQE: int(attr.max_cqe), MaxMRLen: uint64(attr.max_mr_size)}
		d.info.PCIAddr, d.info.NUMANode = placement(p.opts.SysRoot, name)
		for port := 1; port <= int(attr.phys_port_cnt); port++ {
			pi, err := d.QueryPort(port)
			if err != nil {
				C.ibv_close_device(ctx)
				return nil, err
			}
			d.info.Ports = append(d.info.Ports, pi)
		}
		C.mc_nonblock(ctx.async_fd)
		d.wg.Add(1)
		go d.asyncLoop()
		return d, nil
	}
	return nil, fmt.Errorf("rdma device %q: %w", name, syscall.ENODEV)
}

type device struct {
	p      *Provider
	name   string
	ctx    *C.struct_ibv_context
	info   rdma.DeviceInfo
	events chan rdma.AsyncEvent
	stop   chan struct{}
	wg     sync.WaitGroup
	once   sync.Once
}

func (d *device) Info() rdma.DeviceInfo { return d.info }

func mtuBytes(m C.enum_ibv_mtu) int {
	switch m {
	case C.IBV_MTU_256:
		return 256
	case C.IBV_MTU_512:
		return 512
	case C.IBV_MTU_1024:
		return 1024
	case C.IBV_MTU_2048:
		return 2048
	case C.IBV_MTU_4096:
		return 4096
	}
	return 0
}

func mtuEnum(b int) C.int {
	switch {
	case b >= 4096:
		return C.IBV_MTU_4096
	case b >= 2048:
		return C.IBV_MTU_2048
	case b >= 1024:
		return C.IBV_MTU_1024
	case b >= 512:
		return C.IBV_MTU_512
	}
	return C.IBV_MTU_256
}

func (d *device) QueryPort(port int) (rdma.PortInfo, error) {
	var a C.struct_ibv_port_attr
	if rc := C.mc_query_port(d.ctx, C.uint8_t(port), &a); rc != 0 {
		return rdma.PortInfo{}, errnoErr(fmt.Sprintf("ibv_query_port %s:%d", d.name, port), rc)
	}
	pi := rdma.PortInfo{Num: port, State: rdma.PortState(a.state), LID: uint16(a.lid), MTU: mtuBytes(a.active_mtu), LinkLayer: "InfiniBand"}
	if a.link_layer == C.IBV_LINK_LAYER_ETHERNET {
		pi.LinkLayer = "Ethernet"
	}
	var gid C.union_ibv_gid
	if C.ibv_query_gid(d.ctx, C.uint8_t(port), C.int(d.p.opts.GIDIndex), &gid) == 0 {
		copy(pi.GID[:], C.GoBytes(unsafe.Pointer(&gid), 16))
	}
	return pi, nil
}

func (d *device) AllocPD() (rdma.PD, error) {
	pd := C.ibv_alloc_pd(d.ctx)
	if pd == nil {
		return nil, fmt.Errorf("ibv_alloc_pd %s: %w", d.name, syscall.ENOMEM)
	}
	return &protDomain{d: d, pd: pd}, nil
}

func (d *device) CreateCQ(depth int) (rdma.CQ, error) {
	ch := C.ibv_create_comp_channel(d.ctx)
	if ch == nil {
		return nil, fmt.Errorf("ibv_create_comp_channel %s: %w", d.name, syscall.ENOMEM)
	}
	cq := C.ibv_create_cq(d.ctx, C.int(depth), nil, ch, 0)
	if cq == nil {
		C.ibv_destroy_comp_channel(ch)
		return nil, fmt.Errorf("ibv_create_cq %s depth %d: %w", d.name, depth, syscall.ENOMEM)
	}
	C.mc_nonblock(ch.fd)
	C.mc_req_notify(cq)
	c := &compQueue{cq: cq, ch: ch, notify: make(chan struct{}, 1), stop: make(chan struct{})}
	c.wg.Add(1)
	go c.waitLoop()
	return c, nil
}

func (d *device) Events() <-chan rdma.AsyncEvent { return d.events }

func (d *device) asyncLoop() {
	defer d.wg.Done()
	defer close(d.events)
	for {
		select {
		case <-d.stop:
			return
		default:
		}
		var typ, port C.int
		var qpn C.uint32_t
		switch C.mc_get_async(d.ctx, 200, &typ, &port, &qpn) {
		case 1:
			select {
			case d.events <- rdma.AsyncEvent{Type: rdma.EventType(typ), Port: int(port), QPNum: uint32(qpn)}:
			default:
			}
		case -1:
			return
		}
	}
}

func (d *device) Close() error {
	d.once.Do(func() {
		close(d.stop)
		d.wg.Wait()
		C.ibv_close_device(d.ctx)
	})
	return nil
}

type protDomain struct {
	d  *device
	pd *C.struct_ibv_pd
}

func (p *protDomain) RegMR(buf []byte, access rdma.Access) (rdma.MR, error) {
	if len(buf) == 0 {
		return nil, fmt.Errorf("ibv_reg_mr %s: empty buffer: %w", p.d.name, syscall.EINVAL)
	}
	var e C.int
	mr := C.mc_reg_mr(p.pd, unsafe.Pointer(&buf[0]), C.size_t(len(buf)), C.int(access), &e)
	if mr == nil {
		return nil, errnoErr(fmt.Sprintf("ibv_reg_mr %s (%d bytes)", p.d.name, len(buf)), e)
	}
	return &memRegion{mr: mr, addr: uint64(uintptr(unsafe.Pointer(&buf[0]))), n: len(buf)}, nil
}

func (p *protDomain) CreateQP(init rdma.QPInit) (rdma.QP, error) {
	s, ok := init.SendCQ.(*compQueue)
	if !ok {
		return nil, fmt.Errorf("ibv_create_qp %s: send CQ is not an ibverbs CQ: %w", p.d.name, syscall.EINVAL)
	}
	r := s
	if init.RecvCQ != nil {
		if r, ok = init.RecvCQ.(*compQueue); !ok {
			return nil, fmt.Errorf("ibv_create_qp %s: recv CQ is not an ibverbs CQ: %w", p.d.name, syscall.EINVAL)
		}
	}
	maxWR, maxRecv, maxSGE := init.MaxSendWR, init.MaxRecvWR, init.MaxSGE
	if maxWR <= 0 {
		maxWR = rdma.DefaultMaxWR
	}
	if maxRecv <= 0 {
		maxRecv = 1
	}
	if maxSGE <= 0 {
		maxSGE = 1
	}
	var e C.int
	qp := C.mc_create_qp(p.pd, s.cq, r.cq, C.uint32_t(maxWR), C.uint32_t(maxRecv), C.uint32_t(maxSGE), C.uint32_t(init.MaxInline), &e)
	if qp == nil {
		return nil, errnoErr("ibv_create_qp "+p.d.name, e)
	}
	return &queuePair{d: p.d, qp: qp}, nil
}

func (p *protDomain) Close() error {
	if rc := C.ibv_dealloc_pd(p.pd); rc != 0 {
		return errnoErr("ibv_dealloc_pd "+p.d.name, rc)
	}
	return nil
}

type memRegion struct {
	mr   *C.struct_ibv_mr
	addr uint64
	n    int
}

func (m *memRegion) LKey() uint32 { return uint32(m.mr.lkey) }
func (m *memRegion) RKey() uint32 { return uint32(m.mr.rkey) }
func (m *memRegion) Addr() uint64 { return m.addr }
func (m *memRegion) Len() int     { return m.n }
func (m *memRegion) Deregister() error {
	if rc := C.ibv_dereg_mr(m.mr); rc != 0 {
		return errnoErr("ibv_dereg_mr", rc)
	}
	return nil
}

type compQueue struct {
	cq     *C.struct_ibv_cq
	ch     *C.struct_ibv_comp_channel
	notify chan struct{}
	stop   chan struct{}
	wg     sync.WaitGroup
	once   sync.Once
}

// waitLoop turns completion-channel events into Notify signals.
func (c *compQueue) waitLoop() {
	defer c.wg.Done()
	for {
		select {
		case <-c.stop:
			return
		default:
		}
		if C.mc_wait_cq(c.ch, 200) == 1 {
			select {
			case c.notify <- struct{}{}:
			default:
			}
		}
	}
}

func (c *compQueue) Poll(out []rdma.WC) int {
	if len(out) == 0 {
		return 0
	}
	wcs := make([]C.struct_ibv_wc, len(out))
	n := int(C.mc_poll_cq(c.cq, C.int(len(out)), &wcs[0]))
	for i := 0; i < n; i++ {
		w := &wcs[i]
		op := rdma.OpWrite
		if w.opcode == C.IBV_WC_RDMA_READ {
			op = rdma.OpRead
		}
		out[i] = rdma.WC{WRID: uint64(w.wr_id), Status: rdma.WCStatus(w.status), Op: op, ByteLen: uint32(w.byte_len), QPNum: uint32(w.qp_num)}
	}
	if n < 0 {
		return 0
	}
	return n
}

func (c *compQueue) Notify() <-chan struct{} { return c.notify }

func (c *compQueue) Close() error {
	var err error
	c.once.Do(func() {
		close(c.stop)
		c.wg.Wait()
		if rc := C.ibv_destroy_cq(c.cq); rc != 0 {
			err = errnoErr("ibv_destroy_cq", rc)
		}
		C.ibv_destroy_comp_channel(c.ch)
	})
	return err
}

type queuePair struct {
	d  *device
	qp *C.struct_ibv_qp
}

func (q *queuePair) Num() uint32 { return uint32(q.qp.qp_num) }

func (q *queuePair) State() rdma.QPState {
	s := C.mc_qp_query_state(q.qp)
	if s < 0 {
		return rdma.QPStateErr
	}
	return rdma.QPState(s)
}

func (q *queuePair) Modify(a rdma.QPAttr) error {
	var rc C.int
	switch a.State {
	case rdma.QPStateInit:
		port := a.Port
		if port == 0 {
			port = rdma.DefaultPort
		}
		rc = C.mc_qp_init(q.qp, C.uint8_t(port), C.int(a.Access))
	case rdma.QPStateRTR:
		port := a.Port
		if port == 0 {
			port = rdma.DefaultPort
		}
		gid := a.Remote.GID
		rc = C.mc_qp_rtr(q.qp, C.uint8_t(port), C.int(mtuEnum(a.MTU)), C.uint16_t(a.Remote.LID),
			(*C.uint8_t)(unsafe.Pointer(&gid[0])), C.int(q.d.p.opts.GIDIndex), C.uint32_t(a.Remote.QPN))
	case rdma.QPStateRTS:
		rc = C.mc_qp_rts(q.qp)
	default:
		rc = C.mc_qp_state(q.qp, C.int(a.State))
	}
	if rc != 0 {
		return errnoErr(fmt.Sprintf("ibv_modify_qp %d to %v", q.Num(), a.State), rc)
	}
	return nil
}

func (q *queuePair) PostSend(wrs ...rdma.WR) error {
	for _, wr := range wrs {
		read := C.int(0)
		if wr.Op == rdma.OpRead {
			read = 1
		}
		if rc := C.mc_post(q.qp, C.uint64_t(wr.ID), read, C.uint64_t(wr.Local.Addr), C.uint32_t(wr.Local.Length),
			C.uint32_t(wr.Local.LKey), C.uint64_t(wr.RemoteAddr), C.uint32_t(wr.RKey)); rc != 0 {
			return errnoErr(fmt.Sprintf("ibv_post_send on qp %d", q.Num()), rc)
		}
	}
	return nil
}

func (q *queuePair) Destroy() error {
	if rc := C.ibv_destroy_qp(q.qp); rc != 0 {
		return errnoErr(fmt.Sprintf("ibv_destroy_qp %d", q.Num()), rc)
	}
	return nil
}
