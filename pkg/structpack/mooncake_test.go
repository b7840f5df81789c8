package structpack_test

// Go mirrors of the C++ types of the Mooncake master calls captured in
// testdata/mooncake-captures.jsonl (Mooncake 3b5a594:
// mooncake-store/include/rpc_service.h, rpc_types.h, replica.h, types.h,
// allocator.h, task_manager.h). They live in a test: the codec itself
// knows no store types.

import (
	"reflect"

	"github.com/kvcache-ops/mc/pkg/structpack"
)

// UUID is std::pair<uint64_t, uint64_t>.
type UUID = structpack.Pair[uint64, uint64]

// ErrorCode is enum class ErrorCode : int32_t.
type ErrorCode int32

type Segment struct {
	ID         UUID
	Name       string
	Base       uint64 // uintptr_t
	Size       uint64 // size_t
	TEEndpoint string
	Protocol   string
	HostID     string
}

// PingResponse is YLT_REFL'd, so not memcpy'd although both members are
// trivially copyable: no alignment trailer in its literal.
type PingResponse struct {
	ViewVersionID int64
	ClientStatus  int32 // enum class ClientStatus (int)
}

type GetStorageConfigResponse struct {
	FSDir              string
	EnableDiskEviction bool
	QuotaBytes         uint64
}

type TaskAssignment struct {
	ID               UUID
	Type             int32 // enum class TaskType
	Payload          string
	CreatedAtMsEpoch int64
	MaxRetryAttempts uint32
}

type ReplicateConfig struct {
	ReplicaNum            uint64
	NofReplicaNum         uint64
	DfsReplicaNum         uint64
	SoftPinAction         uint8 // enum class SoftPinAction : uint8_t
	SoftPinTTLMs          structpack.Optional[uint64]
	WithHardPin           bool
	PreferredSegments     []string
	PreferredSegment      string
	PreferredNofSegments  []string
	PreferAllocInSameNode bool
	DataType              uint8 // ObjectDataType
	HostID                string
	GroupIDs              structpack.Optional[[]string]
}

// BufferDescriptor is AllocatedBuffer::Descriptor.
type BufferDescriptor struct {
	Size              uint64
	BufferAddress     uint64
	Protocol          string
	TransportEndpoint string
}

type MemoryDescriptor struct{ BufferDescriptor BufferDescriptor }

type NoFDescriptor struct{ BufferDescriptor BufferDescriptor }

type DiskDescriptor struct {
	FilePath   string
	ObjectSize uint64
}

type LocalDiskDescriptor struct {
	ClientID          UUID
	ObjectSize        uint64
	TransportEndpoint string
}

type DistributedFSDescriptor struct {
	FilePath    string
	Offset      uint64
	ObjectSize  uint64
	AlignedSize uint64
	ShardIdx    int32
}

// DescriptorAlt is implemented by the alternatives of DescriptorVariant,
// so the compiler keeps other types out of it.
type DescriptorAlt interface{ isDescriptor() }

func (MemoryDescriptor) isDescriptor()        {}
func (NoFDescriptor) isDescriptor()           {}
func (DiskDescriptor) isDescriptor()          {}
func (LocalDiskDescriptor) isDescriptor()     {}
func (DistributedFSDescriptor) isDescriptor() {}

// DescriptorVariant is std::variant<MemoryDescriptor, NoFDescriptor,
// DiskDescriptor, LocalDiskDescriptor, DistributedFSDescriptor>.
type DescriptorVariant struct{ Value DescriptorAlt }

func (DescriptorVariant) VariantAlternatives() []any {
	return []any{MemoryDescriptor{}, NoFDescriptor{}, DiskDescriptor{}, LocalDiskDescriptor{}, DistributedFSDescriptor{}}
}

// ReplicaDescriptor is Replica::Descriptor.
type ReplicaDescriptor struct {
	ID         uint64
	Descriptor DescriptorVariant
	Status     int32 // enum class ReplicaStatus
}

type ObjectMeta struct {
	Key            string
	ObjectChecksum structpack.Optional[uint64]
}

type GetReplicaListResponse struct {
	Replicas       []ReplicaDescriptor
	LeaseTTLMs     uint64
	ObjectChecksum structpack.Optional[uint64]
}

// call describes one captured master call: fresh pointers for its
// arguments, a Go struct type standing for their tuple (nil for one or no
// argument), and a fresh pointer for its result.
type call struct {
	args  func() []any
	tuple reflect.Type
	resp  func() any
}

func ptrs(vs ...any) func() []any {
	return func() []any {
		out := make([]any, len(vs))
		for i, v := range vs {
			out[i] = reflect.New(reflect.TypeOf(v)).Interface()
		}
		return out
	}
}

func result[T any]() func() any { return func() any { return new(T) } }

var mooncakeCalls = map[string]call{
	"ServiceReady": {
		args: ptrs(),
		resp: result[structpack.Expected[string, ErrorCode]](),
	},
	"GetStorageConfig": {
		args: ptrs(),
		resp: result[structpack.Expected[GetStorageConfigResponse, ErrorCode]](),
	},
	"MountSegment": {
		args: ptrs(Segment{}, UUID{}),
		tuple: reflect.TypeFor[struct {
			Segment  Segment
			ClientID UUID
		}](),
		resp: result[structpack.ExpectedVoid[ErrorCode]](),
	},
	"ReMountSegment": {
		args: ptrs([]Segment{}, UUID{}),
		tuple: reflect.TypeFor[struct {
			Segments []Segment
			ClientID UUID
		}](),
		resp: result[structpack.ExpectedVoid[ErrorCode]](),
	},
	"FetchTasks": {
		args: ptrs(UUID{}, uint64(0)),
		tuple: reflect.TypeFor[struct {
			ClientID  UUID
			BatchSize uint64
		}](),
		resp: result[structpack.Expected[[]TaskAssignment, ErrorCode]](),
	},
	"Ping": {
		args: ptrs(UUID{}),
		resp: result[structpack.Expected[PingResponse, ErrorCode]](),
	},
	"PutStart": {
		args: ptrs(UUID{}, "", uint64(0), ReplicateConfig{}, ""),
		tuple: reflect.TypeFor[struct {
			ClientID    UUID
			Key         string
			SliceLength uint64
			Config      ReplicateConfig
			TenantID    string
		}](),
		resp: result[structpack.Expected[[]ReplicaDescriptor, ErrorCode]](),
	},
	"PutEnd": {
		args: ptrs(UUID{}, ObjectMeta{}, int32(0), ""),
		tuple: reflect.TypeFor[struct {
			ClientID    UUID
			Meta        ObjectMeta
			ReplicaType int32
			TenantID    string
		}](),
		resp: result[structpack.ExpectedVoid[ErrorCode]](),
	},
	"GetReplicaList": {
		args: ptrs("", ""),
		tuple: reflect.TypeFor[struct {
			Key      string
			TenantID string
		}](),
		resp: result[structpack.Expected[GetReplicaListResponse, ErrorCode]](),
	},
	"ExistKey": {
		args: ptrs("", ""),
		tuple: reflect.TypeFor[struct {
			Key      string
			TenantID string
		}](),
		resp: result[structpack.Expected[bool, ErrorCode]](),
	},
	"Remove": {
		args: ptrs("", false, ""),
		tuple: reflect.TypeFor[struct {
			Key      string
			Force    bool
			TenantID string
		}](),
		resp: result[structpack.ExpectedVoid[ErrorCode]](),
	},
}
