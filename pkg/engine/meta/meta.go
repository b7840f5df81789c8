// Package meta holds Mooncake's metadata model and the backends that store
// it: segment descriptors and RPC endpoints, under Mooncake's keys
// ("mooncake/ram/<segment>", "mooncake/rpc_meta/<server>") and JSON, in
// etcd, behind an HTTP metadata server, or exchanged peer to peer over the
// handshake socket (P2PHANDSHAKE). See shared/spec/compat.md §1 and §3.
package meta

import (
	"context"
	"errors"

	"github.com/kvcache-ops/mc/pkg/topo"
)

// ErrNotFound is returned (wrapped) when a key or segment does not exist.
var ErrNotFound = errors.New("metadata not found")

// BufferDesc is one registered buffer in a segment descriptor. For TCP the
// name is the server name; for RDMA it is the location ("cpu:0") and
// Rkey/Lkey hold one key per device, in Devices order.
type BufferDesc struct {
	Name   string   `json:"name"`
	Addr   uint64   `json:"addr"`
	Length uint64   `json:"length"`
	Rkey   []uint32 `json:"rkey,omitempty"`
	Lkey   []uint32 `json:"lkey,omitempty"`
}

// DeviceDesc is one RDMA NIC a segment is reachable through.
type DeviceDesc struct {
	Name string `json:"name"`
	LID  uint16 `json:"lid"`
	GID  string `json:"gid"` // 16 bytes, two-digit hex joined by ':'
}

// SegmentDesc is Mooncake's segment descriptor (compat.md §1).
type SegmentDesc struct {
	Name            string       `json:"name"`
	Protocol        string       `json:"protocol"` // "tcp" or "rdma"
	Timestamp       string       `json:"timestamp,omitempty"`
	TCPDataPort     int          `json:"tcp_data_port,omitempty"`
	TCPProtoVersion int          `json:"tcp_proto_version,omitempty"` // absent means 1
	Devices         []DeviceDesc `json:"devices,omitempty"`
	Buffers         []BufferDesc `json:"buffers"`
	PriorityMatrix  topo.Matrix  `json:"priority_matrix,omitempty"`
	// SHM is mc's same-host extension (key "mc_shm"), present when the
	// engine's memory can be mapped by a peer on its host. Mooncake's
	// decoders read only the keys they know, so its peers use the
	// descriptor as the tcp or rdma one it also is.
	SHM *SHMDesc `json:"mc_shm,omitempty"`
}

// SHMDesc says how a process on the same host maps a segment's buffers
// (package shm): the host (kernel boot id), the engine (a random token
// also written in every buffer's header), the owner process and user,
// and per buffer (in Buffers order) the memfd's descriptor number in the
// owner and the region id.
type SHMDesc struct {
	BootID  string          `json:"boot_id"`
	Token   string          `json:"token"`
	PID     int             `json:"pid"`
	UID     int             `json:"uid"`
	Buffers []SHMBufferDesc `json:"buffers"`
}

// SHMBufferDesc is one buffer of an SHMDesc.
type SHMBufferDesc struct {
	Addr uint64 `json:"addr"`
	FD   int    `json:"fd"`
	ID   uint64 `json:"id"`
}

// RPCMeta is where a server's handshake (RPC) listener can be reached.
type RPCMeta struct {
	IPOrHostName string `json:"ip_or_host_name"`
	RPCPort      int    `json:"rpc_port"`
}

// Backend stores and fetches descriptors. Implementations are safe for
// concurrent use. Get methods wrap ErrNotFound when nothing is stored.
type Backend interface {
	GetSegment(ctx context.Context, name string) (*SegmentDesc, error)
	PutSegment(ctx context.Context, d *SegmentDesc) error
	DeleteSegment(ctx context.Context, name string) error
	GetRPCMeta(ctx context.Context, server string) (RPCMeta, error)
	PutRPCMeta(ctx context.Context, server string, m RPCMeta) error
	DeleteRPCMeta(ctx context.Context, server string) error
	Close() error
}
