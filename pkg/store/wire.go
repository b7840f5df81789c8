package store

import (
	"context"
	"fmt"
	"time"

	"github.com/kvcache-ops/mc/pkg/store/storepb"
)

// Conversions between the store's types and its RPC messages, shared by
// the client here and the master's server.

// UUIDToPB converts u to its message.
func UUIDToPB(u UUID) *storepb.UUID { return &storepb.UUID{First: u.First, Second: u.Second} }

// UUIDFromPB converts a message (nil is the zero UUID).
func UUIDFromPB(p *storepb.UUID) UUID {
	if p == nil {
		return UUID{}
	}
	return UUID{p.First, p.Second}
}

// SegmentToPB converts s to its message.
func SegmentToPB(s SegmentInfo) *storepb.Segment {
	return &storepb.Segment{Id: UUIDToPB(s.ID), Name: s.Name, Base: s.Base, Size: s.Size, TeEndpoint: s.Endpoint, Protocol: s.Protocol}
}

// SegmentFromPB converts a message (nil is the zero SegmentInfo).
func SegmentFromPB(p *storepb.Segment) SegmentInfo {
	if p == nil {
		return SegmentInfo{}
	}
	return SegmentInfo{ID: UUIDFromPB(p.Id), Name: p.Name, Base: p.Base, Size: p.Size, Endpoint: p.TeEndpoint, Protocol: p.Protocol}
}

// FillReplicaPB sets the fields of a zero message p from r (the master
// allocates a batch's messages in bulk).
func FillReplicaPB(p *storepb.Replica, r Replica) {
	st := storepb.ReplicaStatus_PROCESSING
	if r.Complete {
		st = storepb.ReplicaStatus_COMPLETE
	}
	p.SegmentName, p.TeEndpoint, p.Protocol, p.Address, p.Length, p.Status = r.Segment, r.Endpoint, r.Protocol, r.Addr, r.Len, st
}

// ReplicaFromPB converts a message.
func ReplicaFromPB(p *storepb.Replica) Replica {
	return Replica{Segment: p.SegmentName, Endpoint: p.TeEndpoint, Protocol: p.Protocol, Addr: p.Address, Len: p.Length, Complete: p.Status == storepb.ReplicaStatus_COMPLETE}
}

// ConfigToPB converts c to its message.
func ConfigToPB(c ReplicateConfig) *storepb.ReplicateConfig {
	return &storepb.ReplicateConfig{
		ReplicaNum: int32(c.ReplicaNum), PreferredSegments: c.PreferredSegments, PreferAllocInSameNode: c.PreferLocal,
		WithSoftPin: c.SoftPin, SoftPinTtlMs: uint64(c.SoftPinTTL / time.Millisecond), WithHardPin: c.HardPin,
	}
}

// ConfigFromPB converts a message (nil is the default config).
func ConfigFromPB(p *storepb.ReplicateConfig) ReplicateConfig {
	if p == nil {
		return ReplicateConfig{ReplicaNum: 1}
	}
	return ReplicateConfig{
		ReplicaNum: int(p.ReplicaNum), PreferredSegments: p.PreferredSegments, PreferLocal: p.PreferAllocInSameNode,
		SoftPin: p.WithSoftPin, SoftPinTTL: time.Duration(min(p.SoftPinTtlMs, uint64(1<<62)/uint64(time.Millisecond))) * time.Millisecond, HardPin: p.WithHardPin,
	}
}

// ResultToPB converts an error to a per-item result.
func ResultToPB(err error) *storepb.Result {
	if err == nil {
		return &storepb.Result{}
	}
	return &storepb.Result{Code: int32(CodeOf(err)), Message: err.Error()}
}

// ResultFromPB converts a per-item result to an error (nil for OK).
func ResultFromPB(r *storepb.Result) error {
	if r == nil || r.Code == 0 {
		return nil
	}
	return resultErr(r.Code, r.Message)
}

func resultErr(code int32, msg string) error {
	if code == 0 {
		return nil
	}
	c := Code(code)
	// The server's message already starts with the code's name.
	if p := c.String() + ": "; len(msg) >= len(p) && msg[:len(p)] == p {
		msg = msg[len(p):]
	}
	return &Error{Code: c, Msg: msg}
}

// ReplicaListFromPB converts one item of a replica-list answer.
func ReplicaListFromPB(p *storepb.ReplicaList) ([]Replica, time.Duration, error) {
	if p == nil {
		return nil, 0, Errorf(RPCFail, "missing item in the master's answer")
	}
	if err := resultErr(p.Code, p.Message); err != nil {
		return nil, 0, err
	}
	out := make([]Replica, len(p.Replicas))
	for i, r := range p.Replicas {
		out[i] = ReplicaFromPB(r)
		out[i].Staged = p.Staged
		out[i].Lease = time.Duration(p.LeaseTtlMs) * time.Millisecond
	}
	return out, time.Duration(p.LeaseTtlMs) * time.Millisecond, nil
}

// replicaTableFromPB decodes a Session's replica table for n keys: each
// key's replicas (all in one array) or its error. A table whose columns
// do not add up is refused whole.
func replicaTableFromPB(t *storepb.ReplicaTable, n int) ([][]Replica, []error, error) {
	bad := func(what string) ([][]Replica, []error, error) {
		return nil, nil, Errorf(RPCFail, "malformed replica table from the master: %s", what)
	}
	if len(t.GetCodes()) != n || len(t.LeaseTtlMs) != n || len(t.ReplicaCounts) != n {
		return bad(fmt.Sprintf("%d/%d/%d per-key entries for %d keys", len(t.GetCodes()), len(t.LeaseTtlMs), len(t.ReplicaCounts), n))
	}
	total := len(t.Segment)
	if len(t.Address) != total || len(t.Length) != total || len(t.Status) != total {
		return bad(fmt.Sprintf("replica columns of %d/%d/%d/%d entries", total, len(t.Address), len(t.Length), len(t.Status)))
	}
	if len(t.Staged) != 0 && len(t.Staged) != n {
		return bad(fmt.Sprintf("%d staged ids for %d keys", len(t.Staged), n))
	}
	if len(t.DiskVersion) != 0 && (len(t.DiskVersion) != n || len(t.DiskService) != n || len(t.DiskTier) != n || (len(t.DiskKey) != 0 && len(t.DiskKey) != n)) {
		return bad(fmt.Sprintf("%d/%d/%d/%d disk records for %d keys", len(t.DiskVersion), len(t.DiskService), len(t.DiskTier), len(t.DiskKey), n))
	}
	slab := make([]Replica, total)
	reps := make([][]Replica, n)
	errs := make([]error, n)
	at, msg := 0, 0
	for i, code := range t.Codes {
		if code != 0 {
			if msg == len(t.Messages) {
				return bad("fewer messages than failed keys")
			}
			errs[i] = resultErr(code, t.Messages[msg])
			msg++
			continue
		}
		k := int(t.ReplicaCounts[i])
		if k > total-at {
			return bad(fmt.Sprintf("key %d counts %d replicas past the %d listed", i, k, total))
		}
		out := slab[at : at+k : at+k]
		for j := range out {
			si := t.Segment[at+j]
			if int(si) >= len(t.Segments) {
				return bad(fmt.Sprintf("segment index %d of %d", si, len(t.Segments)))
			}
			s := t.Segments[si]
			out[j] = Replica{Segment: s.GetSegmentName(), Endpoint: s.GetTeEndpoint(), Protocol: s.GetProtocol(),
				Addr: t.Address[at+j], Len: t.Length[at+j], Complete: t.Status[at+j] == storepb.ReplicaStatus_COMPLETE}
			if len(t.Staged) != 0 {
				out[j].Staged = t.Staged[i]
			}
			out[j].Lease = time.Duration(t.LeaseTtlMs[i]) * time.Millisecond
		}
		if len(t.DiskVersion) != 0 && t.DiskVersion[i] != 0 {
			if k != 1 || t.DiskService[i] == "" {
				return bad(fmt.Sprintf("key %d: a disk record with %d replicas and service %q", i, k, t.DiskService[i]))
			}
			out[0].Disk = &DiskRecord{Service: t.DiskService[i], Tier: t.DiskTier[i], Version: t.DiskVersion[i]}
			if len(t.DiskKey) != 0 {
				out[0].Disk.Key = t.DiskKey[i]
			}
		}
		reps[i] = out
		at += k
	}
	if at != total || msg != len(t.Messages) {
		return bad(fmt.Sprintf("%d of %d replicas and %d of %d messages used", at, total, msg, len(t.Messages)))
	}
	return reps, errs, nil
}

// callClock is when a call to the master began and which deadline bounds
// it: the caller's, when that comes before the client's RPC timeout. A
// timeout names the one that applied and the time that really passed (a
// put with a 100 ms deadline once said "no answer within 5s" after 0.2 s).
type callClock struct {
	start      time.Time
	caller     time.Time // the caller's deadline, zero without one
	rpcTimeout time.Duration
	// untilCaller: the call ran to the caller's deadline even past the
	// RPC timeout (a put start waiting for read leases to end).
	untilCaller bool
}

func startClock(ctx context.Context, timeout time.Duration) callClock {
	dl, _ := ctx.Deadline()
	return callClock{start: time.Now(), caller: dl, rpcTimeout: timeout}
}

// callerBound reports whether the caller's deadline, not the RPC timeout,
// ends the call.
func (k callClock) callerBound() bool {
	return !k.caller.IsZero() && (k.untilCaller || k.caller.Before(k.start.Add(k.rpcTimeout)))
}

// timeoutErr is RPC_TIMEOUT for a call to master that ran out of time.
func (k callClock) timeoutErr(what, master string) error {
	took := time.Since(k.start).Round(time.Millisecond)
	if k.callerBound() {
		left := max(k.caller.Sub(k.start), 0).Round(time.Millisecond)
		return Errorf(RPCTimeout, "%s: master %s: no answer before the caller's deadline, which left the call %s: gave up after %s (the RPC timeout, %s, did not apply)",
			what, master, left, took, k.rpcTimeout)
	}
	return Errorf(RPCTimeout, "%s: master %s: no answer within the RPC timeout of %s: gave up after %s", what, master, k.rpcTimeout, took)
}

type clockKey struct{}

// withClock bounds ctx by the RPC timeout and remembers the call's clock
// for timeoutErr (clockOf).
func withClock(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	k := startClock(ctx, timeout)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	return context.WithValue(ctx, clockKey{}, k), cancel
}

// clockOf is the clock withClock put in ctx (a clock starting now
// without one).
func clockOf(ctx context.Context, timeout time.Duration) callClock {
	if k, ok := ctx.Value(clockKey{}).(callClock); ok {
		return k
	}
	return startClock(ctx, timeout)
}
