// Package rdma is mc's RDMA layer: a small verbs-like interface (devices,
// protection domains, memory regions, completion queues, RC queue pairs,
// async events) implemented by two providers, and on top of it the objects
// Mooncake's transfer engine keeps per NIC: a Context (one per device) with
// its endpoint store, completion workers and monitor.
//
// Providers:
//   - pkg/rdma/soft: a userspace software NIC whose bytes cross loopback TCP
//     sockets; used by tests and demos because no machine here has RDMA
//     hardware.
//   - pkg/rdma/ibverbs: libibverbs through cgo, behind the `ibverbs` build
//     tag.
//
// The endpoint store reclaims retired endpoints from each context's monitor
// tick and at shutdown, never only from the insert path: Mooncake once
// reclaimed only after inserts, and under peer failure (evictions and
// deletes continue, inserts stop) queue pairs leaked until the NIC's pool
// was exhausted. See shared/spec/rdma.md.
//
// A transport uses it like this (see Example):
//
//   - providers.Open("auto") or soft.NewFromEnv(); then OpenContexts(p,
//     devices, cfg) with cfg from ConfigFromEnv() plus ServerName and an
//     Exchange that sends a ConnectionDesc as a handshake Connection frame.
//   - The handshake server answers Connection frames with AcceptOn(ctxs,
//     req). Segment descriptors list each context's Port().LID/GID and,
//     per buffer, the RKey/LKey of RegisterMemory on every context.
//   - Per slice: skip contexts that are not Active(); ep, err :=
//     ctx.Endpoint(ctx, peerNICPath); ep.Post(Slice{...}, done). done runs
//     on a completion worker with the WC. ErrQueueFull means retry later;
//     ErrEndpointInactive or ErrContextInactive mean pick again.
//   - On a failed WC: WCWRFlushErr retries quietly; Status.Remote() errors
//     should pause the peer rail and DeleteEndpoint(ep); others move the
//     slice to another local NIC. The worker already logged Mooncake's
//     "Process failed for slice" line for every non-flush failure.
//   - Export NewCollector(ctxs...) where a server runs; Close each
//     context at shutdown (it waits for in-flight WRs, then reclaims).
package rdma

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// ErrNoDevices is returned (wrapped) when a provider finds no RDMA device.
// libibverbs reports that as a NULL device list with errno ENOSYS.
var ErrNoDevices = errors.New("no RDMA devices")

// Provider lists and opens devices.
type Provider interface {
	// Name is "soft" or "ibverbs".
	Name() string
	Devices() ([]DeviceInfo, error)
	Open(name string) (Device, error)
}

// PortState mirrors enum ibv_port_state.
type PortState int

// Port states, numbered as in verbs.h.
const (
	PortNop         PortState = 0
	PortDown        PortState = 1
	PortInit        PortState = 2
	PortArmed       PortState = 3
	PortActive      PortState = 4
	PortActiveDefer PortState = 5
)

func (s PortState) String() string {
	switch s {
	case PortNop:
		return "NOP"
	case PortDown:
		return "DOWN"
	case PortInit:
		return "INIT"
	case PortArmed:
		return "ARMED"
	case PortActive:
		return "ACTIVE"
	case PortActiveDefer:
		return "ACTIVE_DEFER"
	}
	return "PortState(" + strconv.Itoa(int(s)) + ")"
}

// MarshalText writes "up" for an active port and the lower-case state
// name otherwise, the spellings configuration uses.
func (s PortState) MarshalText() ([]byte, error) {
	if s == PortActive {
		return []byte("up"), nil
	}
	return []byte(strings.ToLower(s.String())), nil
}

// UnmarshalText accepts what ParsePortState does.
func (s *PortState) UnmarshalText(b []byte) error {
	v, err := ParsePortState(string(b))
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// ParsePortState accepts "up"/"active" and "down" (any case).
func ParsePortState(s string) (PortState, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "up", "active":
		return PortActive, nil
	case "down":
		return PortDown, nil
	case "init":
		return PortInit, nil
	case "armed":
		return PortArmed, nil
	}
	return 0, fmt.Errorf("unknown port state %q (want up or down)", s)
}

// GID is a port's 16-byte global identifier. For RoCE it is an IPv6
// address, IPv4 ones mapped as ::ffff:a.b.c.d.
type GID [16]byte

// String formats g as Mooncake's metadata does: 16 two-digit hex bytes
// joined by ':'.
func (g GID) String() string {
	const hex = "0123456789abcdef"
	b := make([]byte, 0, 47)
	for i, c := range g {
		if i > 0 {
			b = append(b, ':')
		}
		b = append(b, hex[c>>4], hex[c&15])
	}
	return string(b)
}

// ParseGID parses the String form (and tolerates upper-case hex).
func ParseGID(s string) (GID, error) {
	var g GID
	parts := strings.Split(s, ":")
	if len(parts) != 16 {
		return g, fmt.Errorf("parse gid %q: want 16 hex bytes joined by ':'", s)
	}
	for i, p := range parts {
		v, err := strconv.ParseUint(p, 16, 8)
		if err != nil || len(p) != 2 {
			return g, fmt.Errorf("parse gid %q: byte %d %q is not two hex digits", s, i, p)
		}
		g[i] = byte(v)
	}
	return g, nil
}

// Addr interprets g as an IP address (RoCE v2 GIDs are IP addresses).
func (g GID) Addr() netip.Addr {
	return netip.AddrFrom16(g).Unmap()
}

// GIDFromAddr builds a GID from an IP address (v4 addresses are mapped).
func GIDFromAddr(a netip.Addr) GID {
	return GID(a.As16())
}

// PortInfo describes one port of a device.
type PortInfo struct {
	Num       int
	State     PortState
	LinkLayer string // "InfiniBand" or "Ethernet"
	LID       uint16
	GID       GID // at MC_GID_INDEX
	MTU       int // active MTU in bytes
}

// DeviceInfo describes a device as a device list reports it.
type DeviceInfo struct {
	Name     string
	Ports    []PortInfo
	PCIAddr  string // e.g. 0000:3b:00.0; empty when unknown
	NUMANode int    // -1 when unknown
	MaxQP    int
	MaxCQE   int
	MaxMRLen uint64
}

// Device is an opened NIC (ibv_context).
type Device interface {
	Info() DeviceInfo
	QueryPort(port int) (PortInfo, error)
	AllocPD() (PD, error)
	CreateCQ(depth int) (CQ, error)
	// Events delivers async events (ibv_get_async_event). The channel is
	// closed by Close.
	Events() <-chan AsyncEvent
	Close() error
}

// Access flags for memory regions and queue pairs, as in verbs.h.
type Access uint32

// Access bits.
const (
	AccessLocalWrite  Access = 1
	AccessRemoteWrite Access = 2
	AccessRemoteRead  Access = 4
)

// AccessAll is what the transfer engine registers buffers with.
const AccessAll = AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead

// PD is a protection domain: memory regions and queue pairs in one PD may
// be used together.
type PD interface {
	// RegMR registers buf. buf must stay alive and must not move until the
	// MR is deregistered (use memory not managed by the Go allocator, or
	// keep a reference; the soft provider keeps one).
	RegMR(buf []byte, access Access) (MR, error)
	CreateQP(init QPInit) (QP, error)
	Close() error
}

// MR is a registered memory region.
type MR interface {
	LKey() uint32
	RKey() uint32
	// Addr is the virtual address of the region's first byte: what a peer
	// puts in RemoteAddr and what the local side puts in SGE.Addr.
	Addr() uint64
	Len() int
	Deregister() error
}

// QPInit are the attributes of a new RC queue pair.
type QPInit struct {
	SendCQ    CQ
	RecvCQ    CQ
	MaxSendWR int // MC_MAX_WR; posting more outstanding WRs fails with ENOMEM
	MaxRecvWR int
	MaxSGE    int // MC_MAX_SGE
	MaxInline int // MC_MAX_INLINE
}

// QPState mirrors enum ibv_qp_state.
type QPState int

// QP states, numbered as in verbs.h.
const (
	QPStateReset QPState = 0
	QPStateInit  QPState = 1
	QPStateRTR   QPState = 2
	QPStateRTS   QPState = 3
	QPStateSQD   QPState = 4
	QPStateSQE   QPState = 5
	QPStateErr   QPState = 6
)

func (s QPState) String() string {
	switch s {
	case QPStateReset:
		return "RESET"
	case QPStateInit:
		return "INIT"
	case QPStateRTR:
		return "RTR"
	case QPStateRTS:
		return "RTS"
	case QPStateSQD:
		return "SQD"
	case QPStateSQE:
		return "SQE"
	case QPStateErr:
		return "ERR"
	}
	return "QPState(" + strconv.Itoa(int(s)) + ")"
}

// RemoteQP is where an RC queue pair sends: what the connection handshake
// exchanges (local_lid, local_gid, qp_num).
type RemoteQP struct {
	LID uint16
	GID GID
	QPN uint32
}

// QPAttr is the target of a state transition. Fields other than State are
// read only by the transition that needs them (INIT: Port, Access;
// RTR: Remote, MTU).
type QPAttr struct {
	State  QPState
	Port   int    // INIT; default 1 (MC_IB_PORT)
	Access Access // INIT; remote access allowed on this QP
	Remote RemoteQP
	MTU    int // RTR; default 4096 (MC_MTU)
}

// QP is a reliable-connected queue pair. Transitions follow the verbs
// state machine: RESET -> INIT -> RTR -> RTS, any state -> ERR or RESET.
type QP interface {
	Num() uint32
	State() QPState
	Modify(attr QPAttr) error
	// PostSend posts RDMA READ/WRITE work requests. Every request is
	// signalled: it produces exactly one completion on the send CQ. It
	// fails with ENOMEM when MaxSendWR requests are already outstanding and
	// with EINVAL when the QP is not in RTS or ERR; requests posted in ERR
	// complete with WRFlushErr.
	PostSend(wrs ...WR) error
	Destroy() error
}

// Opcode is a work request's (and completion's) operation.
type Opcode int

// Opcodes, numbered as Mooncake logs them (opcode: 0 is READ).
const (
	OpRead  Opcode = 0
	OpWrite Opcode = 1
)

func (o Opcode) String() string {
	switch o {
	case OpRead:
		return "READ"
	case OpWrite:
		return "WRITE"
	}
	return "Opcode(" + strconv.Itoa(int(o)) + ")"
}

// SGE is one scatter/gather element of local memory.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// WR is an RDMA READ or WRITE work request with one SGE.
type WR struct {
	ID         uint64
	Op         Opcode
	Local      SGE
	RemoteAddr uint64
	RKey       uint32
}

// WCStatus mirrors enum ibv_wc_status.
type WCStatus int

// Completion statuses, numbered as in verbs.h.
const (
	WCSuccess           WCStatus = 0
	WCLocLenErr         WCStatus = 1
	WCLocQPOpErr        WCStatus = 2
	WCLocEECOpErr       WCStatus = 3
	WCLocProtErr        WCStatus = 4
	WCWRFlushErr        WCStatus = 5
	WCMWBindErr         WCStatus = 6
	WCBadRespErr        WCStatus = 7
	WCLocAccessErr      WCStatus = 8
	WCRemInvReqErr      WCStatus = 9
	WCRemAccessErr      WCStatus = 10
	WCRemOpErr          WCStatus = 11
	WCRetryExcErr       WCStatus = 12
	WCRnrRetryExcErr    WCStatus = 13
	WCLocRDDViolErr     WCStatus = 14
	WCRemInvRDReqErr    WCStatus = 15
	WCRemAbortErr       WCStatus = 16
	WCInvEECNErr        WCStatus = 17
	WCInvEECStateErr    WCStatus = 18
	WCFatalErr          WCStatus = 19
	WCRespTimeoutErr    WCStatus = 20
	WCGeneralErr        WCStatus = 21
	wcStatusStringCount          = 22
)

// The strings of ibv_wc_status_str, which Mooncake's slice-failure lines
// end with.
var wcStatusStrings = [wcStatusStringCount]string{
	"success",
	"local length error",
	"local QP operation error",
	"local EE context operation error",
	"local protection error",
	"Work Request Flushed Error",
	"memory management operation error",
	"bad response error",
	"local access error",
	"remote invalid request error",
	"remote access error",
	"remote operation error",
	"transport retry counter exceeded",
	"RNR retry counter exceeded",
	"local RDD violation error",
	"remote invalid RD request",
	"aborted error",
	"invalid EE context number",
	"invalid EE context state",
	"fatal error",
	"response timeout error",
	"general error",
}

func (s WCStatus) String() string {
	if s >= 0 && int(s) < len(wcStatusStrings) {
		return wcStatusStrings[s]
	}
	return "unknown"
}

// Remote reports whether the peer caused the failure (the engine pauses
// the peer rail and deletes the endpoint for these).
func (s WCStatus) Remote() bool {
	switch s {
	case WCRemInvReqErr, WCRemAccessErr, WCRemOpErr, WCRetryExcErr, WCRnrRetryExcErr, WCRemInvRDReqErr, WCRemAbortErr:
		return true
	}
	return false
}

// WC is a work completion.
type WC struct {
	WRID    uint64
	Status  WCStatus
	Op      Opcode
	ByteLen uint32
	QPNum   uint32
}

// CQ is a completion queue.
type CQ interface {
	// Poll moves up to len(wc) completions into wc and returns how many.
	Poll(wc []WC) int
	// Notify returns a channel that receives a value after completions are
	// added; pollers wait on it when Poll returns 0. It is never closed.
	Notify() <-chan struct{}
	Close() error
}

// EventType mirrors enum ibv_event_type.
type EventType int

// Async event types, numbered as in verbs.h.
const (
	EventCQErr          EventType = 0
	EventQPFatal        EventType = 1
	EventQPReqErr       EventType = 2
	EventQPAccessErr    EventType = 3
	EventCommEst        EventType = 4
	EventSQDrained      EventType = 5
	EventPathMig        EventType = 6
	EventPathMigErr     EventType = 7
	EventDeviceFatal    EventType = 8
	EventPortActive     EventType = 9
	EventPortErr        EventType = 10
	EventLIDChange      EventType = 11
	EventPKeyChange     EventType = 12
	EventSMChange       EventType = 13
	EventSRQErr         EventType = 14
	EventSRQLimit       EventType = 15
	EventQPLastWQE      EventType = 16
	EventClientRereg    EventType = 17
	EventGIDChange      EventType = 18
	eventTypeStringSize           = 19
)

// The strings of ibv_event_type_str.
var eventStrings = [eventTypeStringSize]string{
	"CQ error", "local work queue catastrophic error", "invalid request local work queue error",
	"local access violation work queue error", "communication established", "send queue drained",
	"path migrated", "path migration request error", "local catastrophic error", "port active",
	"port error", "LID change", "P_Key change", "SM change", "SRQ catastrophic error",
	"SRQ limit reached", "last WQE reached", "client reregistration", "GID table change",
}

func (e EventType) String() string {
	if e >= 0 && int(e) < len(eventStrings) {
		return eventStrings[e]
	}
	return "unknown"
}

// Fatal reports whether the event makes a context unusable until the port
// comes back (Mooncake: device fatal, CQ error, port error).
func (e EventType) Fatal() bool {
	return e == EventDeviceFatal || e == EventCQErr || e == EventPortErr
}

// AsyncEvent is one async event of a device.
type AsyncEvent struct {
	Type  EventType
	Port  int    // port events
	QPNum uint32 // QP events
}

// Connect moves a fresh QP through INIT, RTR and RTS to talk to remote.
func Connect(qp QP, port int, mtu int, remote RemoteQP) error {
	if err := qp.Modify(QPAttr{State: QPStateInit, Port: port, Access: AccessAll}); err != nil {
		return fmt.Errorf("qp %d to INIT: %w", qp.Num(), err)
	}
	if err := qp.Modify(QPAttr{State: QPStateRTR, Remote: remote, MTU: mtu}); err != nil {
		return fmt.Errorf("qp %d to RTR: %w", qp.Num(), err)
	}
	if err := qp.Modify(QPAttr{State: QPStateRTS}); err != nil {
		return fmt.Errorf("qp %d to RTS: %w", qp.Num(), err)
	}
	return nil
}
