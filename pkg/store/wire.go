package store

import (
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
	out, err := replicasFromPB(p, make([]Replica, len(p.GetReplicas())))
	if err != nil {
		return nil, 0, err
	}
	return out, time.Duration(p.LeaseTtlMs) * time.Millisecond, nil
}

// replicasFromPB converts p's replicas into the front of buf (which must
// have room for them) and returns that part as a slice of its own.
func replicasFromPB(p *storepb.ReplicaList, buf []Replica) ([]Replica, error) {
	if p == nil {
		return nil, Errorf(RPCFail, "missing item in the master's answer")
	}
	if err := resultErr(p.Code, p.Message); err != nil {
		return nil, err
	}
	n := len(p.Replicas)
	out := buf[:n:n]
	for i, r := range p.Replicas {
		out[i] = ReplicaFromPB(r)
	}
	return out, nil
}
