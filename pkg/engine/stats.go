package engine

import (
	"strings"
	"sync/atomic"

	"github.com/kvcache-ops/mc/pkg/engine/meta"
)

// StatsTransports names the entries of Stats.TransportBytes, in order.
var StatsTransports = [...]string{ProtocolLocal, ProtocolSHM, meta.ProtocolTCP, meta.ProtocolRDMA}

// Stats counts the tasks this engine initiated since it started, by
// operation: what an operator graphs as the engine's throughput and its
// failed tasks (mc bench initiator --metrics-listen exports them).
type Stats struct {
	Completed [2]uint64 // tasks completed, indexed by Opcode (Read, Write)
	Failed    [2]uint64 // tasks failed, by Opcode
	Bytes     [2]uint64 // bytes moved, by Opcode (a failed task's partial bytes too)
	// TransportBytes is Bytes summed over both operations, by the
	// transport of the task's segment (StatsTransports order): which
	// transport actually moved them, whatever the engine was asked for.
	TransportBytes [len(StatsTransports)]uint64
}

// Sub is s minus an earlier snapshot o: what happened in between.
func (s Stats) Sub(o Stats) Stats {
	for i := range s.Completed {
		s.Completed[i] -= o.Completed[i]
		s.Failed[i] -= o.Failed[i]
		s.Bytes[i] -= o.Bytes[i]
	}
	for i := range s.TransportBytes {
		s.TransportBytes[i] -= o.TransportBytes[i]
	}
	return s
}

// Transport names the transports that moved bytes, "+"-joined in
// StatsTransports order ("shm", "shm+tcp"); "" when none did.
func (s Stats) Transport() string {
	var names []string
	for i, n := range s.TransportBytes {
		if n > 0 {
			names = append(names, StatsTransports[i])
		}
	}
	return strings.Join(names, "+")
}

// ProviderNamer is implemented by a transport whose bytes a provider
// moves (rdma: "ibverbs", or "soft", the software NIC over TCP sockets).
type ProviderNamer interface {
	Provider() string
}

// Provider names the provider under the engine's transport for protocol
// ("soft", "ibverbs"); "" when that transport has none.
func (e *Engine) Provider(protocol string) string {
	if pn, ok := e.transports[protocol].(ProviderNamer); ok {
		return pn.Provider()
	}
	return ""
}

// TransportLabel is how a result names the transports in via (as
// Stats.Transport joins them): as they are, except rdma moved by a
// provider other than a real NIC's ("rdma (soft)"), so that no result
// calls bytes sent over TCP by the software NIC an RDMA result.
func TransportLabel(via, provider string) string {
	if provider == "" || provider == "ibverbs" || via == "" {
		return via
	}
	parts := strings.Split(via, "+")
	for i, p := range parts {
		if p == meta.ProtocolRDMA {
			parts[i] = p + " (" + provider + ")"
		}
	}
	return strings.Join(parts, "+")
}

// TransportLabel is TransportLabel(via, e.Provider("rdma")).
func (e *Engine) TransportLabel(via string) string {
	return TransportLabel(via, e.Provider(meta.ProtocolRDMA))
}

// transportIndex is p's place in StatsTransports, or -1.
func transportIndex(p string) int8 {
	for i, n := range StatsTransports {
		if n == p {
			return int8(i)
		}
	}
	return -1
}

// taskCounters are Stats while they change. One add per finished task:
// nothing next to the per-byte work of a transfer.
type taskCounters struct {
	completed, failed, bytes [2]atomic.Uint64
	via                      [len(StatsTransports)]atomic.Uint64
}

func (c *taskCounters) finish(op Opcode, ok bool, moved uint64, via int8) {
	if int(op) >= len(c.bytes) {
		return
	}
	if ok {
		c.completed[op].Add(1)
	} else {
		c.failed[op].Add(1)
	}
	c.bytes[op].Add(moved)
	if via >= 0 && moved > 0 {
		c.via[via].Add(moved)
	}
}

// Stats returns the engine's task counts.
func (e *Engine) Stats() Stats {
	var s Stats
	for op := range s.Bytes {
		s.Completed[op] = e.tasks.completed[op].Load()
		s.Failed[op] = e.tasks.failed[op].Load()
		s.Bytes[op] = e.tasks.bytes[op].Load()
	}
	for i := range s.TransportBytes {
		s.TransportBytes[i] = e.tasks.via[i].Load()
	}
	return s
}
