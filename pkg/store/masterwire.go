package store

import (
	"context"
	"time"
)

// masterWire is a Client's conversation with its master, one
// implementation per wire: mc's gRPC (grpcWire) and Mooncake's coro_rpc +
// struct_pack (mooncakeWire). The Client above it owns everything else
// (staging memory, transfers, replica order, the ping loop), so the data
// path is the same code over either wire.
//
// Per-item failures come back in the item's slot; an error that sinks the
// whole call (master unreachable, timeout) comes back as the call's error.
// Every method bounds itself by the client's RPC timeout and returns store
// errors (*Error) that name the master.
type masterWire interface {
	// mount registers the client with a new segment (a fresh
	// incarnation: new id, new memory) and is a node's first contact.
	mount(ctx context.Context, seg SegmentInfo) error
	// remount registers the client again with its segments (none for a
	// pure client, for which it is also the first contact: it fails when
	// the master is not there or speaks another version). A segment the
	// master does not know fails with SEGMENT_NOT_FOUND: the master
	// cannot know what it (or its predecessor) granted in that memory,
	// so the node must renew it and mount it anew.
	remount(ctx context.Context, segs []SegmentInfo) error
	// ping tells the master the client is alive, and how many checksum
	// mismatches it saw since the last ping (a wire that can carry it);
	// dropsSeen is the last pingResult.dropsSeq.
	ping(ctx context.Context, mismatches, dropsSeen uint64) (pingResult, error)
	// unmount takes a segment away gracefully (reads in flight finish).
	unmount(ctx context.Context, seg UUID) error
	// unregister tells the master the client leaves (best effort).
	unregister(ctx context.Context) error
	putStart(ctx context.Context, items []putItem, rc ReplicateConfig, upsert bool) ([][]Replica, []error, error)
	// putEnd ends puts; sums (nil, or one per key) are the writer's
	// checksums of the values, for a wire that carries them; failed are
	// replicas the writer could not write (a wire that endsPartial only).
	putEnd(ctx context.Context, keys []string, sums []uint64, failed []failedReplica, upsert bool) []error
	// putRevoke gives grants back; unreachable names the segments the
	// writer could not write to, for a wire that can tell the master.
	putRevoke(ctx context.Context, keys []string, upsert bool, unreachable []string) []error
	// endsPartial reports whether putEnd can complete a put with some
	// of its replicas (the master drops the failed ones): mc's gRPC
	// can, Mooncake's wire cannot (such a put is revoked and fails).
	endsPartial() bool
	// replicaLists answers where keys' complete replicas are, granting
	// read leases.
	// The sums are the writers' checksums (nil, or per key: 0 for none).
	replicaLists(ctx context.Context, keys []string) ([][]Replica, []uint64, []error, error)
	exist(ctx context.Context, keys []string) ([]bool, []error)
	remove(ctx context.Context, keys []string, force bool) []error
	removeAll(ctx context.Context) (uint64, error)
	// query is an admin read of one key's replicas (no lease).
	query(ctx context.Context, key string) ([]Replica, error)
	replicaListByRegex(ctx context.Context, pattern string) (RegexMatch, error)
	removeByRegex(ctx context.Context, pattern string, force, dryRun bool) (RegexRemoval, error)
	// leader is the master address calls go to now.
	leader() string
	// views signals a new HA leader (nil: never).
	views() <-chan struct{}
	close()
}

// failedReplica is a replica its writer could not write: key indexes
// the putEnd's keys.
type failedReplica struct {
	key     int
	segment string
}

// stagedReleaser is a wire that can hand staged reads of disk objects
// back (mc's; Mooncake's master has no such call: the TTL frees them).
type stagedReleaser interface {
	releaseStaged(ctx context.Context, ids []uint64) error
}

// condRemover is a wire that can remove a version rather than a key
// (mc's; Mooncake's master has no such call, and gives no checksums to
// read by).
type condRemover interface {
	// removeIf force-removes keys whose objects are still the versions
	// of the writers' checksums sums (one per key); another version
	// fails INVALID_VERSION and stays.
	removeIf(ctx context.Context, keys []string, sums []uint64) []error
}

// putItem is one key of a put start.
type putItem struct {
	key string
	n   uint64
}

// pingResult is what a ping tells the client.
type pingResult struct {
	view    uint64
	status  ClientStatus
	evicted []string
	// dropped are the transfer endpoints the master dropped (their owner
	// went silent) since dropsSeen; dropsSeq the number to send next.
	dropsSeq uint64
	dropped  []string
}

// wireConfig is what every wire needs from the client's Config.
type wireConfig struct {
	id        UUID
	master    string // as the user wrote it
	timeout   time.Duration
	clusterID string
	host      string // the writer's host, for local-first placement
	tenant    string // Config.Tenant, resolved
	// roster is the client's tierRoster (mc's wire keeps it).
	roster *tierRoster
}
