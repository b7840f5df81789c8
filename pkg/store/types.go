// Package store is mc's KV-cache pool, modelled on Mooncake Store: a
// master (package master) keeps metadata only (segments, objects and their
// replicas, leases, pins), nodes contribute memory segments registered with
// the transfer engine, and clients move bytes straight to and from those
// segments through pkg/engine, never through the master.
//
// This package is the client side and the vocabulary both sides share:
// Client (Put, Get, Exist, Remove and their batch forms, optionally
// contributing a segment, as Mooncake's client does), Mooncake's error
// codes (Code, Error), and the types the master hands out (Replica,
// SegmentInfo, ReplicateConfig). The RPC messages live in storepb.
//
// A Client talks to its master through one of two wires (masterWire): mc's
// gRPC, whose data-path calls go as mc::Session::<kind> frames on the
// master's coro_rpc side when it serves them (else on gRPC Session streams),
// or Mooncake's coro_rpc + struct_pack for mooncake:// masters. Everything
// above the wire (staging memory, transfers, replica order, the ping loop)
// is one code path, so both wires behave alike. The node side lives here
// too: a Client given a segment size contributes it, TierNode attaches a
// disk tier (package tier) and serves staged disk reads from a pool
// registered with its engine, and the drain loop copies what the master
// asks.
//
// Fencing, the client's part: a master that no longer knows a segment
// cannot know what it granted in it, so the segment is renewed
// (engine.Renew) before it is mounted again; a read that outlives its read
// lease, or the TTL a node gave a staged disk read, fails LEASE_EXPIRED
// rather than return bytes the range may no longer hold.
package store

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// UUID is Mooncake's 128-bit id of a client or segment, written
// "first-second" in decimal as Mooncake's admin API prints it.
type UUID struct{ First, Second uint64 }

// NewUUID returns a random UUID.
func NewUUID() UUID {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return UUID{binary.LittleEndian.Uint64(b[:8]), binary.LittleEndian.Uint64(b[8:])}
}

// IsZero reports whether u is the zero UUID (unset).
func (u UUID) IsZero() bool { return u == UUID{} }

func (u UUID) String() string {
	return strconv.FormatUint(u.First, 10) + "-" + strconv.FormatUint(u.Second, 10)
}

// ParseUUID reads the "first-second" form.
func ParseUUID(s string) (UUID, error) {
	a, b, ok := strings.Cut(s, "-")
	if !ok {
		return UUID{}, fmt.Errorf("uuid %q: want first-second", s)
	}
	f, err1 := strconv.ParseUint(a, 10, 64)
	g, err2 := strconv.ParseUint(b, 10, 64)
	if err1 != nil || err2 != nil {
		return UUID{}, fmt.Errorf("uuid %q: want two decimal numbers first-second", s)
	}
	return UUID{f, g}, nil
}

// SegmentInfo describes a mounted segment: where its bytes are and how a
// client reaches them.
type SegmentInfo struct {
	ID   UUID
	Name string
	Base uint64
	Size uint64
	// Endpoint is the transfer-engine segment name a client opens
	// ("host:port" of the owner's handshake listener under P2PHANDSHAKE).
	Endpoint string
	Protocol string
}

// Replica is one copy of an object: Len bytes at Addr in the segment
// reached through Endpoint.
type Replica struct {
	Segment  string
	Endpoint string
	Protocol string
	Addr     uint64
	Len      uint64
	Complete bool
	// Staged, when not 0, says the replica is a staged read of the
	// object's disk copy, in its node's staging pool: the reader hands it
	// back (by this id) once the bytes are moved, so the range serves the
	// next read at once.
	Staged uint64
	// StagedAt, with Staged, is the TierRead endpoint of the node that
	// holds the staged read (the reader asked it directly): the batch
	// is handed back there; "": the master's.
	StagedAt string
	// Disk, when set, says this replica is the object's record on a
	// node's disk (Addr means nothing): the reader asks the node for a
	// staged read of it first (stageDisk).
	Disk *DiskRecord
	// Lease is the read lease the master granted with this list (0: none,
	// an admin read). Past it the object may be evicted and its range
	// given to another: a read that ends later is not trusted (Get).
	Lease time.Duration
	// moved: the staged read's bytes are in the reader's memory already,
	// moved while the node read them (BatchGetStagedStream), checked by
	// the node's answer.
	moved bool
}

// ReplicateConfig is Mooncake's ReplicateConfig: how many copies, where.
type ReplicateConfig struct {
	// ReplicaNum copies on distinct segments, best effort: a put succeeds
	// with at least one (default 1).
	ReplicaNum int
	// PreferredSegments are tried first, in order (segment names).
	PreferredSegments []string
	// PreferLocal places the copy on a segment of the writer's own host
	// (Mooncake's prefer_alloc_in_same_node).
	PreferLocal bool
	// SoftPin keeps the object out of eviction until SoftPinTTL passes
	// (0: the master's default), unless nothing else is evictable.
	SoftPin    bool
	SoftPinTTL time.Duration
	// HardPin keeps the object out of eviction until it is removed.
	HardPin bool
}

// ClientStatus is what a Ping tells a client.
type ClientStatus int

const (
	ClientOK ClientStatus = iota + 1
	// ClientNeedRemount: the master does not know this client (it
	// restarted, or dropped the client after client_ttl): re-mount.
	ClientNeedRemount
)
