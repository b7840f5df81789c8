package metascan

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine/handshake"
	"github.com/kvcache-ops/mc/pkg/engine/meta"
)

// State is what a probe concluded about a segment's engine.
type State string

const (
	// Alive: the handshake listener answered.
	Alive State = "alive"
	// Dead: the handshake listener's host refused the connection (and,
	// for a TCP segment, its data port too): no process listens there.
	Dead State = "dead"
	// Unknown: no conclusive answer (timeout, unreachable host, no
	// address to probe). Never deleted: a partitioned engine is not dead.
	Unknown State = "unknown"
	// Mismatch: a peer answered with a descriptor other than the stored
	// one (another engine now owns the address, or the name).
	Mismatch State = "mismatch"
	// InvalidValue: the stored value is not a descriptor; not probed.
	InvalidValue State = "invalid"
)

// Result is one probe's outcome.
type Result struct {
	State State
	// RTT is the first handshake exchange's round trip (connect, request,
	// reply); 0 when nothing answered.
	RTT time.Duration
	// Err says why the state is not alive.
	Err error
	// Note says what an alive probe could not check.
	Note string
}

// Defaults for ProbeOptions.
const (
	DefaultProbeTimeout     = 2 * time.Second
	DefaultProbeConcurrency = 256
)

// ProbeOptions bounds Probe.
type ProbeOptions struct {
	// Timeout bounds one segment's probe; 0 means DefaultProbeTimeout.
	Timeout time.Duration
	// Concurrency is the most probes in flight; 0 means
	// DefaultProbeConcurrency. Each holds one socket.
	Concurrency int
	// MaxLength bounds a reply frame (MC_HANDSHAKE_MAX_LENGTH); 0 means
	// handshake.DefaultMaxLength.
	MaxLength int
}

// Probe fills in segs[i].Probe for every segment, at most o.Concurrency at
// a time. Invalid values are not probed. With N segments that all time out
// it takes about ceil(N/Concurrency) x Timeout.
func Probe(ctx context.Context, segs []Segment, o ProbeOptions) {
	if o.Timeout <= 0 {
		o.Timeout = DefaultProbeTimeout
	}
	if o.Concurrency <= 0 {
		o.Concurrency = DefaultProbeConcurrency
	}
	next := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < min(o.Concurrency, len(segs)); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				segs[i].Probe = probeOne(ctx, &segs[i], o)
			}
		}()
	}
	for i := range segs {
		if ctx.Err() != nil {
			segs[i].Probe = Result{State: Unknown, Err: fmt.Errorf("%w: %w", errUnprobed, ctx.Err())}
			continue
		}
		next <- i
	}
	close(next)
	wg.Wait()
}

// notServed notes a live peer that keeps its descriptor in the store
// only: Mooncake and mc engines in etcd or HTTP mode.
const notServed = "descriptor not compared: the peer does not serve it"

// request is handshake.Request; tests count calls in flight through it.
var request = handshake.Request

// probeOne asks the peer's handshake listener. The Probe frame goes first:
// every implementation read answers it or closes the connection, whereas
// older Mooncake engines in etcd mode have no Metadata handler and may
// abort on a Metadata frame. Only a peer that answered the Probe (it
// dispatches by type) is asked for its descriptor.
func probeOne(ctx context.Context, s *Segment, o ProbeOptions) Result {
	if s.Invalid != nil {
		return Result{State: InvalidValue, Err: s.Invalid}
	}
	addr, err := s.RPCAddress()
	if err != nil {
		return Result{State: Unknown, Err: err}
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	start := time.Now()
	_, err = request(ctx, addr, handshake.Probe, []byte("{}"), o.MaxLength)
	rtt := time.Since(start)
	switch {
	case err == nil:
		return compare(ctx, s, addr, rtt, o)
	case errors.Is(err, handshake.ErrNoReply):
		return Result{State: Alive, RTT: rtt, Note: "descriptor not compared: the peer closed the Probe unanswered (older Mooncake)"}
	case errors.Is(err, syscall.ECONNREFUSED):
		return refused(ctx, s, addr)
	case errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil:
		return Result{State: Unknown, Err: fmt.Errorf("handshake with %s: no answer within %v", addr, o.Timeout)}
	}
	return Result{State: Unknown, Err: err}
}

// compare asks a live peer for its descriptor and compares it with the
// stored one, timestamps aside (every publication restamps).
func compare(ctx context.Context, s *Segment, addr string, rtt time.Duration, o ProbeOptions) Result {
	alive := Result{State: Alive, RTT: rtt}
	reply, err := request(ctx, addr, handshake.Metadata, []byte("{}"), o.MaxLength)
	if err != nil {
		if errors.Is(err, handshake.ErrNoReply) {
			alive.Note = notServed
		} else {
			alive.Note = fmt.Sprintf("metadata request failed (%v); descriptor not compared", err)
		}
		return alive
	}
	switch string(bytes.TrimSpace(reply)) {
	case "", "null", "{}":
		// Mooncake in etcd mode answers with an empty value.
		alive.Note = notServed
		return alive
	}
	peer, err := meta.DecodeSegment(reply)
	if err != nil {
		return Result{State: Mismatch, RTT: rtt, Err: fmt.Errorf("peer %s answers with an invalid descriptor: %w", addr, err)}
	}
	if diff := differ(s.Desc, peer); diff != "" {
		return Result{State: Mismatch, RTT: rtt, Err: fmt.Errorf("peer %s: %s", addr, diff)}
	}
	return alive
}

// refused double-checks a refused handshake port: a TCP engine whose data
// port still accepts is alive (Mooncake releases that ran TCP without a
// handshake listener).
func refused(ctx context.Context, s *Segment, addr string) Result {
	dead := Result{State: Dead, Err: fmt.Errorf("connection refused at %s", addr)}
	if s.Desc.Protocol != meta.ProtocolTCP || s.Desc.TCPDataPort == 0 {
		return dead
	}
	host, _, _ := net.SplitHostPort(addr)
	data := net.JoinHostPort(host, strconv.Itoa(s.Desc.TCPDataPort))
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", data)
	if err == nil {
		c.Close()
		return Result{State: Alive, Note: fmt.Sprintf("handshake port %s refused, TCP data port %s accepts", addr, data)}
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		dead.Err = fmt.Errorf("connection refused at %s (handshake) and %s (tcp data)", addr, data)
		return dead
	}
	return Result{State: Unknown, Err: fmt.Errorf("handshake port %s refused; tcp data port %s: %w", addr, data, err)}
}

// differ names the first difference between the stored descriptor and the
// peer's, or returns "" when they describe the same segment.
func differ(stored, peer *meta.SegmentDesc) string {
	switch {
	case stored.Name != peer.Name:
		return fmt.Sprintf("describes segment %q, not %q", peer.Name, stored.Name)
	case stored.Protocol != peer.Protocol:
		return fmt.Sprintf("protocol %s, stored %s", peer.Protocol, stored.Protocol)
	case stored.TCPDataPort != peer.TCPDataPort:
		return fmt.Sprintf("tcp_data_port %d, stored %d", peer.TCPDataPort, stored.TCPDataPort)
	}
	a, b := canonical(stored), canonical(peer)
	if bytes.Equal(a, b) {
		return ""
	}
	sb, pb := (&Segment{Desc: stored}), (&Segment{Desc: peer})
	if sb.Buffers() != pb.Buffers() || sb.Bytes() != pb.Bytes() {
		return fmt.Sprintf("%d buffers (%d bytes), stored %d (%d bytes)", pb.Buffers(), pb.Bytes(), sb.Buffers(), sb.Bytes())
	}
	return "descriptor differs from the stored one (buffers, devices or priority matrix)"
}

func canonical(d *meta.SegmentDesc) []byte {
	c := *d
	c.Timestamp = "-"
	b, err := meta.EncodeSegment(&c)
	if err != nil {
		// Both were decoded, hence valid; keep the comparison total anyway.
		b, _ = json.Marshal(c)
	}
	return b
}
