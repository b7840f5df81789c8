package mooncake

import (
	"context"
	"errors"
	"fmt"

	"github.com/kvcache-ops/mc/pkg/cororpc"
	"github.com/kvcache-ops/mc/pkg/structpack"
)

// Service is the C++ class whose methods the master registers; a handler's
// function id hashes "Service::Method".
const Service = "mooncake::WrappedMasterService"

// FunctionID is the coro_rpc function id of a master handler.
func FunctionID(method string) uint32 { return cororpc.FunctionID(Service + "::" + method) }

// Client makes Mooncake master calls on one coro_rpc client (several calls
// in flight on one connection, reconnecting after the master restarts).
// Every argument a handler declares is sent, defaults included, as
// Mooncake's own client does: coro_rpc packs the full parameter list.
type Client struct {
	rpc    *cororpc.Client
	Tenant string
	// MasterVersion is what ServiceReady answered ("" before it was
	// asked); errors that suggest a version mismatch quote it.
	MasterVersion string
}

// NewClient returns a client of the master at addr (host:port); it
// connects on its first call.
func NewClient(addr string, opts *cororpc.Options) *Client {
	return &Client{rpc: cororpc.NewClient(addr, opts), Tenant: DefaultTenant}
}

// Addr is the master's address.
func (c *Client) Addr() string { return c.rpc.Addr() }

// Close closes the connection; calls in flight fail.
func (c *Client) Close() error { return c.rpc.Close() }

// VersionError says the master speaks another Mooncake version than this
// package: it did not know a handler, or answered a type this package
// does not know.
type VersionError struct {
	Call          string
	MasterVersion string // from ServiceReady; "" when unknown
	Err           error
}

func (e *VersionError) Error() string {
	mv := e.MasterVersion
	if mv == "" {
		mv = "unknown"
	}
	return fmt.Sprintf("%s: the master speaks another Mooncake version (master store version %s; mc speaks %s, Mooncake %s): %v",
		e.Call, mv, StoreVersion, MooncakeCommit[:7], e.Err)
}

func (e *VersionError) Unwrap() error { return e.Err }

// call sends args to method and decodes the answer into resp.
func (c *Client) call(ctx context.Context, method string, resp any, args ...any) error {
	body, err := structpack.MarshalArgs(args...)
	if err != nil {
		return fmt.Errorf("%s: encode request: %w", method, err)
	}
	out, err := c.rpc.Call(ctx, FunctionID(method), body)
	if err != nil {
		var re *cororpc.RPCError
		if errors.As(err, &re) && (re.Code == cororpc.ErrcFunctionNotRegistered || re.Code == cororpc.ErrcInvalidRPCArguments) {
			// An unknown handler, or arguments the master could not
			// decode: both mean its signature differs from ours.
			return &VersionError{Call: method, MasterVersion: c.MasterVersion, Err: err}
		}
		return fmt.Errorf("%s: %w", method, err)
	}
	if err := structpack.Unmarshal(out, resp); err != nil {
		var he *structpack.HashMismatchError
		if errors.As(err, &he) {
			return &VersionError{Call: method, MasterVersion: c.MasterVersion, Err: err}
		}
		return fmt.Errorf("%s: decode answer: %w", method, err)
	}
	return nil
}

func expectErr(call string, hasErr bool, code ErrorCode) error {
	if !hasErr {
		return nil
	}
	return &Error{Code: code, Call: call}
}

// ServiceReady asks the master's store version and remembers it.
func (c *Client) ServiceReady(ctx context.Context) (string, error) {
	var r ExpectString
	if err := c.call(ctx, "ServiceReady", &r); err != nil {
		return "", err
	}
	if err := expectErr("ServiceReady", r.HasError, r.Error); err != nil {
		return "", err
	}
	c.MasterVersion = r.Value
	return r.Value, nil
}

// GetStorageConfig asks the master's storage settings.
func (c *Client) GetStorageConfig(ctx context.Context) (GetStorageConfigResponse, error) {
	var r ExpectConfig
	if err := c.call(ctx, "GetStorageConfig", &r); err != nil {
		return GetStorageConfigResponse{}, err
	}
	return r.Value, expectErr("GetStorageConfig", r.HasError, r.Error)
}

// MountSegment mounts one segment of client.
func (c *Client) MountSegment(ctx context.Context, seg Segment, client UUID) error {
	return c.voidCall(ctx, "MountSegment", seg, client)
}

// ReMountSegment mounts a client's segments again (after the master asked
// through a ping, or restarted); an empty list registers the client.
func (c *Client) ReMountSegment(ctx context.Context, segs []Segment, client UUID) error {
	if segs == nil {
		segs = []Segment{}
	}
	return c.voidCall(ctx, "ReMountSegment", segs, client)
}

// QuerySegmentStatusById asks a segment's status; SEGMENT_NOT_FOUND (an
// *Error) when the master does not know it.
func (c *Client) QuerySegmentStatusById(ctx context.Context, seg UUID) (SegmentStatus, error) {
	var r ExpectSegmentStatus
	if err := c.call(ctx, "QuerySegmentStatusById", &r, seg); err != nil {
		return SegmentUndefined, err
	}
	return r.Value, expectErr("QuerySegmentStatusById", r.HasError, r.Error)
}

// UnmountSegment unmounts a segment at once.
func (c *Client) UnmountSegment(ctx context.Context, seg, client UUID) error {
	return c.voidCall(ctx, "UnmountSegment", seg, client)
}

// GracefulUnmountSegment unmounts a segment once reads in flight end
// (within graceMs).
func (c *Client) GracefulUnmountSegment(ctx context.Context, seg, client UUID, graceMs uint64) error {
	return c.voidCall(ctx, "GracefulUnmountSegment", seg, client, graceMs)
}

// Ping reports the client alive and asks whether it must re-mount.
func (c *Client) Ping(ctx context.Context, client UUID) (PingResponse, error) {
	var r ExpectPing
	if err := c.call(ctx, "Ping", &r, client); err != nil {
		return PingResponse{}, err
	}
	return r.Value, expectErr("Ping", r.HasError, r.Error)
}

// ExistKey reports whether key is stored.
func (c *Client) ExistKey(ctx context.Context, key string) (bool, error) {
	var r ExpectBool
	if err := c.call(ctx, "ExistKey", &r, key, c.Tenant); err != nil {
		return false, err
	}
	return r.Value, expectErr("ExistKey", r.HasError, r.Error)
}

// BatchExistKey reports per key whether it is stored; err sinks the whole
// call, per-item failures are in errs.
func (c *Client) BatchExistKey(ctx context.Context, keys []string) (ex []bool, errs []error, err error) {
	var r []ExpectBool
	if err := c.call(ctx, "BatchExistKey", &r, nonNil(keys), c.Tenant); err != nil {
		return nil, nil, err
	}
	if err := countCheck("BatchExistKey", len(r), len(keys)); err != nil {
		return nil, nil, err
	}
	ex, errs = make([]bool, len(r)), make([]error, len(r))
	for i, e := range r {
		ex[i], errs[i] = e.Value, expectErr("BatchExistKey", e.HasError, e.Error)
	}
	return ex, errs, nil
}

// GetReplicaList returns key's replicas, granting a read lease.
func (c *Client) GetReplicaList(ctx context.Context, key string) (GetReplicaListResponse, error) {
	var r ExpectList
	if err := c.call(ctx, "GetReplicaList", &r, key, c.Tenant); err != nil {
		return GetReplicaListResponse{}, err
	}
	return r.Value, expectErr("GetReplicaList", r.HasError, r.Error)
}

// BatchGetReplicaList returns each key's replicas, granting read leases.
func (c *Client) BatchGetReplicaList(ctx context.Context, keys []string) ([]GetReplicaListResponse, []error, error) {
	return c.batchList(ctx, "BatchGetReplicaList", keys)
}

// BatchGetReplicaListForAdmin is BatchGetReplicaList without leases (an
// admin read).
func (c *Client) BatchGetReplicaListForAdmin(ctx context.Context, keys []string) ([]GetReplicaListResponse, []error, error) {
	return c.batchList(ctx, "BatchGetReplicaListForAdmin", keys)
}

func (c *Client) batchList(ctx context.Context, method string, keys []string) ([]GetReplicaListResponse, []error, error) {
	var r []ExpectList
	if err := c.call(ctx, method, &r, nonNil(keys), c.Tenant); err != nil {
		return nil, nil, err
	}
	if err := countCheck(method, len(r), len(keys)); err != nil {
		return nil, nil, err
	}
	out, errs := make([]GetReplicaListResponse, len(r)), make([]error, len(r))
	for i, e := range r {
		out[i], errs[i] = e.Value, expectErr(method, e.HasError, e.Error)
	}
	return out, errs, nil
}

// PutStart allocates the replicas of one object of n bytes (UpsertStart
// with upsert).
func (c *Client) PutStart(ctx context.Context, client UUID, key string, n uint64, rc ReplicateConfig, upsert bool) ([]ReplicaDescriptor, error) {
	method := pick(upsert, "UpsertStart", "PutStart")
	var r ExpectDescs
	if err := c.call(ctx, method, &r, client, key, n, rc, c.Tenant); err != nil {
		return nil, err
	}
	return r.Value, expectErr(method, r.HasError, r.Error)
}

// BatchPutStart allocates the replicas of several objects (BatchUpsertStart
// with upsert).
func (c *Client) BatchPutStart(ctx context.Context, client UUID, keys []string, sizes []uint64, rc ReplicateConfig, upsert bool) ([][]ReplicaDescriptor, []error, error) {
	method := pick(upsert, "BatchUpsertStart", "BatchPutStart")
	var r []ExpectDescs
	if err := c.call(ctx, method, &r, client, nonNil(keys), nonNil(sizes), rc, c.Tenant); err != nil {
		return nil, nil, err
	}
	if err := countCheck(method, len(r), len(keys)); err != nil {
		return nil, nil, err
	}
	out, errs := make([][]ReplicaDescriptor, len(r)), make([]error, len(r))
	for i, e := range r {
		out[i], errs[i] = e.Value, expectErr(method, e.HasError, e.Error)
	}
	return out, errs, nil
}

// PutEnd makes a written object visible (UpsertEnd with upsert).
func (c *Client) PutEnd(ctx context.Context, client UUID, key string, upsert bool) error {
	return c.voidCall(ctx, pick(upsert, "UpsertEnd", "PutEnd"), client, ObjectMeta{Key: key}, ReplicaTypeAll, c.Tenant)
}

// PutRevoke gives back the space of a put that failed (UpsertRevoke with
// upsert).
func (c *Client) PutRevoke(ctx context.Context, client UUID, key string, upsert bool) error {
	return c.voidCall(ctx, pick(upsert, "UpsertRevoke", "PutRevoke"), client, key, ReplicaTypeAll, c.Tenant)
}

// BatchPutEnd ends several puts (BatchUpsertEnd with upsert).
func (c *Client) BatchPutEnd(ctx context.Context, client UUID, keys []string, upsert bool) ([]error, error) {
	metas := make([]ObjectMeta, len(keys))
	for i, k := range keys {
		metas[i] = ObjectMeta{Key: k}
	}
	if upsert {
		// BatchUpsertEnd takes no replica type.
		return c.batchVoid(ctx, "BatchUpsertEnd", len(keys), client, metas, c.Tenant)
	}
	return c.batchVoid(ctx, "BatchPutEnd", len(keys), client, metas, ReplicaTypeAll, c.Tenant)
}

// BatchPutRevoke revokes several puts (BatchUpsertRevoke with upsert).
func (c *Client) BatchPutRevoke(ctx context.Context, client UUID, keys []string, upsert bool) ([]error, error) {
	if upsert {
		return c.batchVoid(ctx, "BatchUpsertRevoke", len(keys), client, nonNil(keys), c.Tenant)
	}
	return c.batchVoid(ctx, "BatchPutRevoke", len(keys), client, nonNil(keys), ReplicaTypeAll, c.Tenant)
}

// Remove removes key (force: even while a read lease holds it).
func (c *Client) Remove(ctx context.Context, key string, force bool) error {
	return c.voidCall(ctx, "Remove", key, force, c.Tenant)
}

// BatchRemove removes several keys.
func (c *Client) BatchRemove(ctx context.Context, keys []string, force bool) ([]error, error) {
	return c.batchVoid(ctx, "BatchRemove", len(keys), nonNil(keys), force, c.Tenant)
}

// RemoveAll removes every object and returns how many went. Mooncake's
// handler returns a plain long, not an expected.
func (c *Client) RemoveAll(ctx context.Context, force bool) (int64, error) {
	var n int64
	if err := c.call(ctx, "RemoveAll", &n, force, c.Tenant); err != nil {
		return 0, err
	}
	return n, nil
}

// RemoveByRegex removes the keys matching re (RE2 on mc, std::regex on
// Mooncake) and returns how many went.
func (c *Client) RemoveByRegex(ctx context.Context, re string, force bool) (int64, error) {
	var r ExpectInt64
	if err := c.call(ctx, "RemoveByRegex", &r, re, force, c.Tenant); err != nil {
		return 0, err
	}
	return r.Value, expectErr("RemoveByRegex", r.HasError, r.Error)
}

// GetReplicaListByRegex returns the replicas of every key matching re.
func (c *Client) GetReplicaListByRegex(ctx context.Context, re string) (map[string][]ReplicaDescriptor, error) {
	var r ExpectByRegex
	if err := c.call(ctx, "GetReplicaListByRegex", &r, re, c.Tenant); err != nil {
		return nil, err
	}
	return r.Value, expectErr("GetReplicaListByRegex", r.HasError, r.Error)
}

func (c *Client) voidCall(ctx context.Context, method string, args ...any) error {
	var r ExpectVoid
	if err := c.call(ctx, method, &r, args...); err != nil {
		return err
	}
	return expectErr(method, r.HasError, r.Error)
}

func (c *Client) batchVoid(ctx context.Context, method string, n int, args ...any) ([]error, error) {
	var r []ExpectVoid
	if err := c.call(ctx, method, &r, args...); err != nil {
		return nil, err
	}
	if err := countCheck(method, len(r), n); err != nil {
		return nil, err
	}
	errs := make([]error, len(r))
	for i, e := range r {
		errs[i] = expectErr(method, e.HasError, e.Error)
	}
	return errs, nil
}

func countCheck(method string, got, want int) error {
	if got != want {
		return fmt.Errorf("%s: the master answered %d items for %d", method, got, want)
	}
	return nil
}

func pick(cond bool, a, b string) string {
	if cond {
		return a
	}
	return b
}

// nonNil keeps a nil slice from meaning anything but an empty one.
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
