// Package mooncake speaks Mooncake Store's master RPC: coro_rpc frames
// (pkg/cororpc) carrying struct_pack bodies (pkg/structpack) of the types
// Mooncake's headers declare, at the Mooncake commit in MooncakeCommit.
//
// It mirrors those types (Segment, Replica::Descriptor and its variant,
// ReplicateConfig, ObjectMeta, PingResponse, GetReplicaListResponse,
// ErrorCode, ...) field for field in the order struct_pack serializes them
// (the YLT_REFL lists, or declaration order for plain aggregates), names
// each handler as coro_rpc hashes it, and offers a typed Client for the
// calls a store client and a node make. It knows nothing of mc's store:
// pkg/store adapts it to its Client, and mc's master answers it.
//
// The C++ sources followed, all at MooncakeCommit: the handler list in
// mooncake-store/src/rpc_service.cpp, their signatures in
// mooncake-store/include/rpc_service.h, the types in rpc_types.h,
// replica.h, allocator.h and types.h, and how the real client calls them
// (every argument, defaults included) in mooncake-store/src/master_client.cpp.
package mooncake

import (
	"fmt"
	"strconv"

	"github.com/kvcache-ops/mc/pkg/structpack"
)

// The Mooncake this package speaks: the commit its types were read from and
// the store version its master reports from ServiceReady (a Mooncake client
// refuses a master of another version).
const (
	MooncakeCommit = "3b5a594133958449a1feaf1c9e0fc1b553e34a28"
	StoreVersion   = "2.0.0"
	// DefaultTenant is the tenant_id Mooncake's client sends unless told
	// otherwise.
	DefaultTenant = "default"
)

// UUID is Mooncake's std::pair<uint64_t, uint64_t> id of a client, segment
// or replica task.
type UUID = structpack.Pair[uint64, uint64]

// Segment is mooncake::Segment: memory a client contributes.
type Segment struct {
	ID   UUID
	Name string // the node's local_hostname
	Base uint64
	Size uint64
	// TEEndpoint is the transfer-engine segment a peer opens to reach
	// the memory: "ip:port" under P2PHANDSHAKE, else the segment name.
	TEEndpoint string
	Protocol   string
	HostID     string
}

// BufferDescriptor is AllocatedBuffer::Descriptor: where a memory replica's
// bytes are.
type BufferDescriptor struct {
	Size              uint64
	BufferAddress     uint64
	Protocol          string
	TransportEndpoint string
}

// The alternatives of Replica::Descriptor's descriptor_variant.
type (
	MemoryDescriptor struct{ Buffer BufferDescriptor }
	NoFDescriptor    struct{ Buffer BufferDescriptor }
	DiskDescriptor   struct {
		FilePath   string
		ObjectSize uint64
	}
	LocalDiskDescriptor struct {
		ClientID          UUID
		ObjectSize        uint64
		TransportEndpoint string
	}
	DFSDescriptor struct {
		FilePath    string
		Offset      uint64
		ObjectSize  uint64
		AlignedSize uint64
		ShardIdx    int32
	}
)

// DescriptorVariant is std::variant<MemoryDescriptor, NoFDescriptor,
// DiskDescriptor, LocalDiskDescriptor, DistributedFSDescriptor>.
type DescriptorVariant struct{ Value any }

// VariantAlternatives lists the alternatives in their C++ order.
func (DescriptorVariant) VariantAlternatives() []any {
	return []any{MemoryDescriptor{}, NoFDescriptor{}, DiskDescriptor{}, LocalDiskDescriptor{}, DFSDescriptor{}}
}

// ReplicaDescriptor is Replica::Descriptor.
type ReplicaDescriptor struct {
	ID         uint64
	Descriptor DescriptorVariant
	Status     ReplicaStatus
}

// Memory returns the memory replica's buffer (ok false for other kinds).
func (d ReplicaDescriptor) Memory() (BufferDescriptor, bool) {
	m, ok := d.Descriptor.Value.(MemoryDescriptor)
	return m.Buffer, ok
}

// ReplicaStatus is mooncake::ReplicaStatus.
type ReplicaStatus int32

const (
	ReplicaUndefined ReplicaStatus = iota
	ReplicaInitialized
	ReplicaProcessing
	ReplicaComplete
	ReplicaRemoved
	ReplicaFailed
)

// ReplicaType is mooncake::ReplicaType: which replicas a PutEnd/PutRevoke
// finalizes.
type ReplicaType int32

const (
	ReplicaTypeMemory    ReplicaType = 0
	ReplicaTypeDisk      ReplicaType = 1
	ReplicaTypeLocalDisk ReplicaType = 2
	ReplicaTypeNoFSSD    ReplicaType = 3
	ReplicaTypeAll       ReplicaType = 4
	ReplicaTypeDFS       ReplicaType = 100
)

// SoftPinAction is mooncake::SoftPinAction.
type SoftPinAction uint8

const (
	SoftPinPreserve SoftPinAction = 0
	SoftPinEnable   SoftPinAction = 1
	SoftPinDisable  SoftPinAction = 2
)

// ObjectDataType is mooncake::ObjectDataType.
type ObjectDataType uint8

// ReplicateConfig is mooncake::ReplicateConfig, a plain aggregate
// serialized in declaration order.
type ReplicateConfig struct {
	ReplicaNum            uint64
	NoFReplicaNum         uint64
	DFSReplicaNum         uint64
	SoftPinAction         SoftPinAction
	SoftPinTTLms          structpack.Optional[uint64]
	WithHardPin           bool
	PreferredSegments     []string
	PreferredSegment      string // deprecated upstream, still on the wire
	PreferredNoFSegments  []string
	PreferAllocInSameNode bool
	DataType              ObjectDataType
	HostID                string
	GroupIDs              structpack.Optional[[]string]
}

// ObjectMeta is what a PutEnd finalizes.
type ObjectMeta struct {
	Key      string
	Checksum structpack.Optional[uint64]
}

// PingResponse is mooncake::PingResponse.
type PingResponse struct {
	ViewVersion  int64
	ClientStatus ClientStatus
}

// ClientStatus is mooncake::ClientStatus.
type ClientStatus int32

const (
	ClientUndefined   ClientStatus = 0
	ClientOK          ClientStatus = 1
	ClientNeedRemount ClientStatus = 2
)

// GetReplicaListResponse is mooncake::GetReplicaListResponse.
type GetReplicaListResponse struct {
	Replicas   []ReplicaDescriptor
	LeaseTTLms uint64
	Checksum   structpack.Optional[uint64]
}

// GetStorageConfigResponse is mooncake::GetStorageConfigResponse.
type GetStorageConfigResponse struct {
	FSDir              string
	EnableDiskEviction bool
	QuotaBytes         uint64
}

// ErrorCode is mooncake::ErrorCode (int32 on the wire).
type ErrorCode int32

// Mooncake's error codes (types.h).
const (
	OK                         ErrorCode = 0
	InternalError              ErrorCode = -1
	BufferOverflow             ErrorCode = -10
	ShardIndexOutOfRange       ErrorCode = -100
	SegmentNotFound            ErrorCode = -101
	SegmentAlreadyExists       ErrorCode = -102
	ClientNotFound             ErrorCode = -103
	NoAvailableHandle          ErrorCode = -200
	InvalidVersion             ErrorCode = -300
	InvalidKey                 ErrorCode = -400
	WriteFail                  ErrorCode = -500
	InvalidParams              ErrorCode = -600
	IllegalClient              ErrorCode = -601
	InvalidWrite               ErrorCode = -700
	InvalidRead                ErrorCode = -701
	InvalidReplica             ErrorCode = -702
	ReplicaIsNotReady          ErrorCode = -703
	ObjectNotFound             ErrorCode = -704
	ObjectAlreadyExists        ErrorCode = -705
	ObjectHasLease             ErrorCode = -706
	LeaseExpired               ErrorCode = -707
	ObjectHasReplicationTask   ErrorCode = -708
	ObjectNoReplicationTask    ErrorCode = -709
	ReplicaNotFound            ErrorCode = -710
	ReplicaAlreadyExists       ErrorCode = -711
	ReplicaIsGone              ErrorCode = -712
	ReplicaNotInLocalMemory    ErrorCode = -713
	ObjectReplicaBusy          ErrorCode = -714
	TransferFail               ErrorCode = -800
	ChecksumMismatch           ErrorCode = -801
	RPCFail                    ErrorCode = -900
	RPCTimeout                 ErrorCode = -901
	EtcdOperationError         ErrorCode = -1000
	EtcdKeyNotExist            ErrorCode = -1001
	EtcdTransactionFail        ErrorCode = -1002
	EtcdCtxCancelled           ErrorCode = -1003
	OplogEntryNotFound         ErrorCode = -1004
	UnavailableInCurrentStatus ErrorCode = -1010
	UnavailableInCurrentMode   ErrorCode = -1011
	NotSupported               ErrorCode = -1012
	FileNotFound               ErrorCode = -1100
	TaskNotFound               ErrorCode = -1400
	JobNotFound                ErrorCode = -1402
)

var errorNames = map[ErrorCode]string{
	OK: "OK", InternalError: "INTERNAL_ERROR", BufferOverflow: "BUFFER_OVERFLOW",
	ShardIndexOutOfRange: "SHARD_INDEX_OUT_OF_RANGE", SegmentNotFound: "SEGMENT_NOT_FOUND",
	SegmentAlreadyExists: "SEGMENT_ALREADY_EXISTS", ClientNotFound: "CLIENT_NOT_FOUND",
	NoAvailableHandle: "NO_AVAILABLE_HANDLE", InvalidVersion: "INVALID_VERSION", InvalidKey: "INVALID_KEY",
	WriteFail: "WRITE_FAIL", InvalidParams: "INVALID_PARAMS", IllegalClient: "ILLEGAL_CLIENT",
	InvalidWrite: "INVALID_WRITE", InvalidRead: "INVALID_READ", InvalidReplica: "INVALID_REPLICA",
	ReplicaIsNotReady: "REPLICA_IS_NOT_READY", ObjectNotFound: "OBJECT_NOT_FOUND",
	ObjectAlreadyExists: "OBJECT_ALREADY_EXISTS", ObjectHasLease: "OBJECT_HAS_LEASE",
	LeaseExpired: "LEASE_EXPIRED", ObjectHasReplicationTask: "OBJECT_HAS_REPLICATION_TASK",
	ObjectNoReplicationTask: "OBJECT_NO_REPLICATION_TASK", ReplicaNotFound: "REPLICA_NOT_FOUND",
	ReplicaAlreadyExists: "REPLICA_ALREADY_EXISTS", ReplicaIsGone: "REPLICA_IS_GONE",
	ReplicaNotInLocalMemory: "REPLICA_NOT_IN_LOCAL_MEMORY", ObjectReplicaBusy: "OBJECT_REPLICA_BUSY",
	TransferFail: "TRANSFER_FAIL", ChecksumMismatch: "CHECKSUM_MISMATCH", RPCFail: "RPC_FAIL",
	RPCTimeout: "RPC_TIMEOUT", EtcdOperationError: "ETCD_OPERATION_ERROR", EtcdKeyNotExist: "ETCD_KEY_NOT_EXIST",
	EtcdTransactionFail: "ETCD_TRANSACTION_FAIL", EtcdCtxCancelled: "ETCD_CTX_CANCELLED",
	OplogEntryNotFound: "OPLOG_ENTRY_NOT_FOUND", UnavailableInCurrentStatus: "UNAVAILABLE_IN_CURRENT_STATUS",
	UnavailableInCurrentMode: "UNAVAILABLE_IN_CURRENT_MODE", NotSupported: "NOT_SUPPORTED",
	FileNotFound: "FILE_NOT_FOUND", TaskNotFound: "TASK_NOT_FOUND", JobNotFound: "JOB_NOT_FOUND",
}

// String is the code's name in Mooncake's spelling (the number for codes
// this package does not name).
func (c ErrorCode) String() string {
	if n, ok := errorNames[c]; ok {
		return n
	}
	return "ERROR_CODE(" + strconv.Itoa(int(c)) + ")"
}

// Error is an error code a Mooncake master answered for one call or item.
type Error struct {
	Code ErrorCode
	Call string
}

func (e *Error) Error() string { return fmt.Sprintf("%s: %s", e.Call, e.Code) }

// The expected<T, ErrorCode> shapes of the answers.
type (
	ExpectVoid          = structpack.ExpectedVoid[ErrorCode]
	ExpectBool          = structpack.Expected[bool, ErrorCode]
	ExpectString        = structpack.Expected[string, ErrorCode]
	ExpectInt64         = structpack.Expected[int64, ErrorCode]
	ExpectPing          = structpack.Expected[PingResponse, ErrorCode]
	ExpectConfig        = structpack.Expected[GetStorageConfigResponse, ErrorCode]
	ExpectList          = structpack.Expected[GetReplicaListResponse, ErrorCode]
	ExpectDescs         = structpack.Expected[[]ReplicaDescriptor, ErrorCode]
	ExpectByRegex       = structpack.Expected[map[string][]ReplicaDescriptor, ErrorCode]
	ExpectTasks         = structpack.Expected[[]TaskAssignment, ErrorCode]
	ExpectSegmentStatus = structpack.Expected[SegmentStatus, ErrorCode]
	ExpectUUID          = structpack.Expected[UUID, ErrorCode]
	ExpectStrings       = structpack.Expected[[]string, ErrorCode]
)

// TaskAssignment is mooncake::TaskAssignment, a replica task the master
// hands a client through FetchTasks (mc's master hands none).
type TaskAssignment struct {
	ID               UUID
	Type             int32
	Payload          string
	CreatedAtMs      int64
	MaxRetryAttempts uint32
}

// SegmentStatus is mooncake::SegmentStatus (segment.h).
type SegmentStatus int32

const (
	SegmentUndefined SegmentStatus = iota
	SegmentOK
	SegmentDraining
	SegmentDrained
	SegmentGracefullyUnmounting
	SegmentUnmounting
)
