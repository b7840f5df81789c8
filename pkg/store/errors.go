package store

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/kvcache-ops/mc/pkg/store/mooncake"
)

// Code is Mooncake Store's ErrorCode: the same numbers, so logs, metrics
// and scripts read the same in mc and Mooncake.
type Code int32

// Mooncake's error codes (store.md).
const (
	OK                         Code = 0
	InternalError              Code = -1
	SegmentNotFound            Code = -101
	SegmentAlreadyExists       Code = -102
	ClientNotFound             Code = -103
	NoAvailableHandle          Code = -200
	InvalidVersion             Code = -300
	InvalidKey                 Code = -400
	InvalidParams              Code = -600
	InvalidWrite               Code = -700
	InvalidRead                Code = -701
	InvalidReplica             Code = -702
	ReplicaIsNotReady          Code = -703
	ObjectNotFound             Code = -704
	ObjectAlreadyExists        Code = -705
	ObjectHasLease             Code = -706
	LeaseExpired               Code = -707
	TransferFail               Code = -800
	RPCFail                    Code = -900
	RPCTimeout                 Code = -901
	UnavailableInCurrentStatus Code = -1010
	UnavailableInCurrentMode   Code = -1011
	JobNotFound                Code = -1402
	PersistentFail             Code = -1503
	TenantQuotaExceeded        Code = -1700
	TenantNotRegistered        Code = -1701
	TenantNotEmpty             Code = -1702
)

var codeNames = map[Code]string{
	OK:                         "OK",
	InternalError:              "INTERNAL_ERROR",
	SegmentNotFound:            "SEGMENT_NOT_FOUND",
	SegmentAlreadyExists:       "SEGMENT_ALREADY_EXISTS",
	ClientNotFound:             "CLIENT_NOT_FOUND",
	NoAvailableHandle:          "NO_AVAILABLE_HANDLE",
	InvalidVersion:             "INVALID_VERSION",
	InvalidKey:                 "INVALID_KEY",
	InvalidParams:              "INVALID_PARAMS",
	InvalidWrite:               "INVALID_WRITE",
	InvalidRead:                "INVALID_READ",
	InvalidReplica:             "INVALID_REPLICA",
	ReplicaIsNotReady:          "REPLICA_IS_NOT_READY",
	ObjectNotFound:             "OBJECT_NOT_FOUND",
	ObjectAlreadyExists:        "OBJECT_ALREADY_EXISTS",
	ObjectHasLease:             "OBJECT_HAS_LEASE",
	LeaseExpired:               "LEASE_EXPIRED",
	TransferFail:               "TRANSFER_FAIL",
	RPCFail:                    "RPC_FAIL",
	RPCTimeout:                 "RPC_TIMEOUT",
	UnavailableInCurrentStatus: "UNAVAILABLE_IN_CURRENT_STATUS",
	UnavailableInCurrentMode:   "UNAVAILABLE_IN_CURRENT_MODE",
	PersistentFail:             "PERSISTENT_FAIL",
	TenantQuotaExceeded:        "TENANT_QUOTA_EXCEEDED",
	TenantNotRegistered:        "TENANT_NOT_REGISTERED",
	TenantNotEmpty:             "TENANT_NOT_EMPTY",
}

// String is Mooncake's name for the code (OBJECT_NOT_FOUND), or the number
// when it has none.
func (c Code) String() string {
	if n, ok := codeNames[c]; ok {
		return n
	}
	// A Mooncake master may answer codes mc's master never uses.
	if n := mooncake.ErrorCode(c).String(); !strings.HasPrefix(n, "ERROR_CODE(") {
		return n
	}
	return fmt.Sprintf("ERROR_%d", int32(c))
}

// Error is a store error: a Mooncake code and a message saying why.
// errors.Is(err, store.ErrObjectNotFound) matches by code, so callers
// branch on the sentinel values below.
type Error struct {
	Code Code
	Msg  string
}

func (e *Error) Error() string {
	if e.Msg == "" {
		return e.Code.String()
	}
	return e.Code.String() + ": " + e.Msg
}

// Is matches another *Error with the same code.
func (e *Error) Is(target error) bool {
	var t *Error
	return errors.As(target, &t) && t.Code == e.Code
}

// Errorf builds an *Error with a formatted message.
func Errorf(c Code, format string, args ...any) *Error {
	return &Error{Code: c, Msg: fmt.Sprintf(format, args...)}
}

// Sentinels to match with errors.Is.
var (
	ErrObjectNotFound      = &Error{Code: ObjectNotFound}
	ErrObjectAlreadyExists = &Error{Code: ObjectAlreadyExists}
	ErrObjectHasLease      = &Error{Code: ObjectHasLease}
	ErrReplicaIsNotReady   = &Error{Code: ReplicaIsNotReady}
	ErrNoAvailableHandle   = &Error{Code: NoAvailableHandle}
	ErrSegmentNotFound     = &Error{Code: SegmentNotFound}
	ErrSegmentExists       = &Error{Code: SegmentAlreadyExists}
	ErrInvalidParams       = &Error{Code: InvalidParams}
	ErrInvalidKey          = &Error{Code: InvalidKey}
	ErrTransferFail        = &Error{Code: TransferFail}
	ErrUnavailable         = &Error{Code: UnavailableInCurrentMode}
)

// CodeOf returns the code of err: OK for nil, the code of a store *Error
// in its chain, InternalError otherwise.
func CodeOf(err error) Code {
	if err == nil {
		return OK
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return InternalError
}

// Limits on what the master accepts, so a bad or hostile request is
// refused with a message that names the limit instead of exhausting it.
const (
	MaxKeyLength = 4096     // bytes
	MaxBatchSize = 16384    // items in one batch call
	MaxMsgSize   = 64 << 20 // bytes in one RPC message
	MaxReplicas  = 16       // replica_num
	MaxValueSize = 1 << 40  // one object
)

// gRPC flow-control windows of the store's connections. Set explicitly
// (which turns off gRPC's BDP probing) and large enough that a batch
// answer of thousands of replica lists never waits for a window update.
const (
	RPCWindow     = 4 << 20
	RPCConnWindow = 16 << 20
)

// CheckKey validates a key against mc's key rule, the same on every path:
// the client refuses a key that breaks it before any RPC, and the master
// refuses it on both wires (INVALID_KEY either way). A key is
//   - not empty (mooncake_master refuses an empty key's put too, as
//     INVALID_PARAMS),
//   - at most MaxKeyLength bytes (mooncake_master has no limit),
//   - valid UTF-8: mc's gRPC carries keys as protobuf strings, which
//     must be, so an invalid key could reach the master by one wire and
//     never be listed, read or removed through the other,
//   - free of control characters (C0, DEL, C1; NUL among them), so a key
//     prints as one line in `mc store ls`, the admin API's key list and
//     the logs, and never as two keys.
//
// mooncake_master (at 3b5a594) refuses only the empty key; mc is stricter
// on purpose, and a key it accepts means the same to both.
func CheckKey(key string) error {
	switch {
	case key == "":
		return Errorf(InvalidKey, "empty key")
	case len(key) > MaxKeyLength:
		return Errorf(InvalidKey, "key of %d bytes exceeds the limit of %d", len(key), MaxKeyLength)
	}
	for i := 0; i < len(key); {
		b := key[i]
		if b < utf8.RuneSelf {
			switch {
			case b == 0:
				return Errorf(InvalidKey, "key contains a NUL byte at %d", i)
			case b < 0x20 || b == 0x7f:
				return Errorf(InvalidKey, "key contains control character %q at byte %d", rune(b), i)
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(key[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			return Errorf(InvalidKey, "key is not valid UTF-8 (byte 0x%02x at %d)", b, i)
		case unicode.IsControl(r):
			return Errorf(InvalidKey, "key contains control character %q at byte %d", r, i)
		}
		i += n
	}
	return nil
}
