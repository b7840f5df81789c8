// Package metascan takes inventory of the segments a metadata server
// (etcd, Mooncake's HTTP server) holds, probes the engine behind each over
// its handshake socket, and removes the descriptors engines left behind
// when they died without withdrawing them (a SIGKILL, an OOM kill, a lost
// host). A stale descriptor sends initiators to a dead peer.
//
// List reads every segment under the cluster's prefix (Lookup reads named
// ones, for HTTP, which cannot list); Probe classifies each as alive, dead,
// unknown or mismatch, in parallel with a bound; GC selects the dead and
// deletes each with a compare-and-delete on exactly the values read, so an
// engine that re-registers meanwhile is left alone.
package metascan

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"

	"github.com/kvcache-ops/mc/pkg/engine/meta"
)

// Segment is one segment descriptor as read from the store, with where
// its engine's handshake listener should be and what a probe found there.
type Segment struct {
	// Name is the segment name (Mooncake's local_server_name).
	Name string
	// Record is the descriptor key with the exact value read.
	Record meta.KeyValue
	// Desc is the decoded descriptor; nil when Invalid is set.
	Desc *meta.SegmentDesc
	// Invalid says why the value is not a usable descriptor (garbage,
	// broken rules, a key where Mooncake keeps no segment).
	Invalid error
	// RPC is "rpc_meta/<name>" as read; nil when absent.
	RPC *meta.KeyValue
	// Probe is what Probe found; the zero Result before it ran.
	Probe Result
}

// Buffers is the number of registered buffers the descriptor lists.
func (s *Segment) Buffers() int {
	if s.Desc == nil {
		return 0
	}
	return len(s.Desc.Buffers)
}

// Bytes is the total length of the registered buffers.
func (s *Segment) Bytes() uint64 {
	var n uint64
	if s.Desc != nil {
		for _, b := range s.Desc.Buffers {
			n += b.Length
		}
	}
	return n
}

// Devices are the RDMA NICs the segment is reachable through.
func (s *Segment) Devices() []string {
	if s.Desc == nil {
		return nil
	}
	out := make([]string, 0, len(s.Desc.Devices))
	for _, d := range s.Desc.Devices {
		out = append(out, d.Name)
	}
	return out
}

// RPCAddress is the handshake listener's "host:port": from rpc_meta, or
// the name itself when it is host:port (P2PHANDSHAKE names segments so).
func (s *Segment) RPCAddress() (string, error) {
	if s.RPC != nil {
		m, err := meta.DecodeRPCMeta(s.Name, s.RPC.Value)
		if err != nil {
			return "", fmt.Errorf("%s: %w", s.RPC.Key, err)
		}
		return net.JoinHostPort(m.IPOrHostName, strconv.Itoa(m.RPCPort)), nil
	}
	if host, port, err := net.SplitHostPort(s.Name); err == nil && host != "" {
		if n, err := strconv.Atoi(port); err == nil && n > 0 && n < 65536 {
			return s.Name, nil
		}
	}
	return "", fmt.Errorf("no rpc_meta/%s, and the name is not host:port", s.Name)
}

// List reads every segment under st's prefix, with its rpc_meta, sorted by
// name. Keys of other clusters (when st has no cluster id) and NVMe-oF file
// segments are not segments of an engine and are left out; any other key
// under the prefix that holds no valid descriptor is listed with Invalid
// set. Over HTTP it fails with meta.ErrNoList: use Lookup.
func List(ctx context.Context, st meta.Store) ([]Segment, error) {
	prefix := st.Prefix()
	kvs, err := st.ListKeys(ctx, prefix)
	if err != nil {
		return nil, fmt.Errorf("list segments under %s: %w", prefix, err)
	}
	rpc := map[string]meta.KeyValue{}
	var segs []Segment
	for _, kv := range kvs {
		kind, name := classify(strings.TrimPrefix(kv.Key, prefix), st.ClusterID() == "")
		switch kind {
		case kindRPC:
			rpc[name] = kv
		case kindSegment:
			segs = append(segs, decode(name, kv))
		case kindStray:
			if name == "" {
				// The prefix itself ("mooncake/") as a key: named by
				// it, not by nothing, in what ls and gc print.
				name = kv.Key
			}
			segs = append(segs, Segment{Name: name, Record: kv,
				Invalid: fmt.Errorf("key %s is not where Mooncake keeps a segment (%sram/<name>)", kv.Key, prefix)})
		}
	}
	for i := range segs {
		if segs[i].Invalid == nil || strings.HasPrefix(segs[i].Record.Key, prefix+"ram/") {
			if kv, ok := rpc[segs[i].Name]; ok {
				segs[i].RPC = &kv
			}
		}
	}
	sort.SliceStable(segs, func(i, j int) bool { return segs[i].Name < segs[j].Name })
	return segs, nil
}

// Lookup reads the named segments, for stores that cannot list (HTTP).
// Names with no descriptor are returned in missing.
func Lookup(ctx context.Context, st meta.Store, names []string) (segs []Segment, missing []string, err error) {
	for _, name := range names {
		kv, found, err := st.ReadKey(ctx, meta.SegmentKey(st.ClusterID(), name))
		if err != nil {
			return nil, nil, fmt.Errorf("segment %q: %w", name, err)
		}
		if !found {
			missing = append(missing, name)
			continue
		}
		s := decode(name, kv)
		rkv, found, err := st.ReadKey(ctx, meta.RPCMetaKey(st.ClusterID(), name))
		if err != nil {
			return nil, nil, fmt.Errorf("rpc meta of %q: %w", name, err)
		}
		if found {
			s.RPC = &rkv
		}
		segs = append(segs, s)
	}
	return segs, missing, nil
}

func decode(name string, kv meta.KeyValue) Segment {
	s := Segment{Name: name, Record: kv}
	d, err := meta.DecodeSegment(kv.Value)
	switch {
	case err != nil:
		s.Invalid = err
	case d.Name != name:
		s.Invalid = fmt.Errorf("descriptor names segment %q but is stored at %s", d.Name, kv.Key)
	default:
		s.Desc = d
	}
	return s
}

type keyKind int

const (
	kindSkip    keyKind = iota
	kindSegment         // a descriptor
	kindRPC             // rpc_meta/<server>
	kindStray           // under the prefix, but no Mooncake key
)

// classify sorts a key (without the prefix) as Mooncake lays them out:
// ram/<name>, rpc_meta/<server>, nvmeof/<name>, and <name> itself for a
// name that contains '/'. Without a cluster id the prefix "mooncake/" also
// holds every cluster's keys ("<cluster>/ram/..."): those are skipped.
func classify(rest string, rootPrefix bool) (keyKind, string) {
	switch {
	case strings.HasPrefix(rest, "rpc_meta/") && len(rest) > len("rpc_meta/"):
		return kindRPC, strings.TrimPrefix(rest, "rpc_meta/")
	case strings.HasPrefix(rest, "ram/") && len(rest) > len("ram/"):
		return kindSegment, strings.TrimPrefix(rest, "ram/")
	case strings.HasPrefix(rest, "nvmeof/"):
		return kindSkip, ""
	case rootPrefix && otherCluster(rest):
		return kindSkip, ""
	case strings.Contains(rest, "/") && !strings.HasPrefix(rest, "ram/") && !strings.HasPrefix(rest, "rpc_meta/"):
		return kindSegment, rest
	}
	return kindStray, rest
}

func otherCluster(rest string) bool {
	for _, k := range []string{"/ram/", "/rpc_meta/", "/nvmeof/"} {
		if i := strings.Index(rest, k); i > 0 {
			return true
		}
	}
	return false
}

// Action is what GC did, or would do, with a stale segment.
type Action string

const (
	WouldDelete Action = "would_delete" // dry run
	Deleted     Action = "deleted"
	// Changed: a key changed (or vanished) after it was read, typically an
	// engine re-registering; nothing was deleted.
	Changed Action = "changed"
	Failed  Action = "failed" // the store returned an error
)

// Removal is GC's outcome for one stale segment.
type Removal struct {
	Name   string
	State  State
	Keys   []string // the keys deleted, or to be deleted
	Action Action
	Err    error
}

// GCOptions configures GC.
type GCOptions struct {
	// Delete deletes; without it GC only reports (a dry run).
	Delete bool
	// IncludeInvalid also removes values that are not descriptors. They
	// are never probed, so this is the operator's call.
	IncludeInvalid bool
}

// Report is what GC found and did.
type Report struct {
	DryRun   bool
	Removals []Removal
}

// Remaining counts stale segments still in the store: not deleted in a
// dry run, or failed.
func (r *Report) Remaining() int {
	n := 0
	for _, x := range r.Removals {
		if x.Action == WouldDelete || x.Action == Failed {
			n++
		}
	}
	return n
}

// Failed counts deletions the store refused or could not be asked.
func (r *Report) Failed() int {
	n := 0
	for _, x := range r.Removals {
		if x.Action == Failed {
			n++
		}
	}
	return n
}

// Stale reports whether GC removes s: its engine refused the connection
// (dead), or, with includeInvalid, its value is not a descriptor. Alive,
// mismatched and unknown segments are never stale.
func Stale(s *Segment, includeInvalid bool) bool {
	switch s.Probe.State {
	case Dead:
		return true
	case InvalidValue:
		return includeInvalid
	}
	return false
}

// GC removes the stale segments of segs (probed by Probe). A dead
// segment's descriptor and rpc_meta go together in one compare-and-delete
// on the values read; an invalid value goes alone (its rpc_meta may belong
// to a live engine). With a store whose delete is not atomic (HTTP) a write
// in the last round trip before the delete is not detected.
func GC(ctx context.Context, st meta.Store, segs []Segment, o GCOptions) Report {
	rep := Report{DryRun: !o.Delete}
	for i := range segs {
		s := &segs[i]
		if !Stale(s, o.IncludeInvalid) {
			continue
		}
		kvs := []meta.KeyValue{s.Record}
		if s.Probe.State == Dead && s.RPC != nil {
			kvs = append(kvs, *s.RPC)
		}
		r := Removal{Name: s.Name, State: s.Probe.State}
		for _, kv := range kvs {
			r.Keys = append(r.Keys, kv.Key)
		}
		if !o.Delete {
			r.Action = WouldDelete
			rep.Removals = append(rep.Removals, r)
			continue
		}
		ok, err := st.CompareAndDelete(ctx, kvs...)
		switch {
		case err != nil:
			r.Action, r.Err = Failed, fmt.Errorf("delete segment %q: %w", s.Name, err)
		case !ok:
			r.Action = Changed
		default:
			r.Action = Deleted
		}
		rep.Removals = append(rep.Removals, r)
	}
	return rep
}

// errUnprobed marks a segment whose probe never ran (context ended).
var errUnprobed = errors.New("not probed")
