package meta

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine/shm"
	"github.com/kvcache-ops/mc/pkg/topo"
)

// ErrMalformed is matched (errors.Is) by every DescriptorError: a
// descriptor that is not valid JSON or breaks Mooncake's rules.
var ErrMalformed = errors.New("malformed segment descriptor")

// DescriptorError says which field of which segment descriptor is wrong.
type DescriptorError struct {
	Segment string // the descriptor's name, or "" when unknown
	Field   string // e.g. "buffers[2].addr"; "" for a JSON syntax error
	Reason  string
	Err     error // underlying JSON error, if any
}

func (e *DescriptorError) Error() string {
	var b strings.Builder
	if e.Segment != "" {
		fmt.Fprintf(&b, "segment %q: ", e.Segment)
	} else {
		b.WriteString("segment descriptor: ")
	}
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteByte(' ')
	}
	b.WriteString(e.Reason)
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

func (e *DescriptorError) Is(target error) bool { return target == ErrMalformed }
func (e *DescriptorError) Unwrap() error        { return e.Err }

// Protocols mc understands in a segment descriptor.
const (
	ProtocolTCP  = "tcp"
	ProtocolRDMA = "rdma"
)

// EncodeSegment returns d as Mooncake's compact descriptor JSON. It refuses
// a descriptor that DecodeSegment would reject, so mc never publishes one a
// peer cannot use. An empty Timestamp is filled with the current time, as
// Mooncake stamps every update; d itself is not modified.
func EncodeSegment(d *SegmentDesc) ([]byte, error) {
	if d == nil {
		return nil, &DescriptorError{Reason: "is nil"}
	}
	if err := Validate(d); err != nil {
		return nil, err
	}
	w := segmentWire{
		Name:            d.Name,
		Protocol:        d.Protocol,
		Timestamp:       d.Timestamp,
		TCPDataPort:     d.TCPDataPort,
		TCPProtoVersion: d.TCPProtoVersion,
		Devices:         d.Devices,
		Buffers:         d.Buffers,
		SHM:             d.SHM,
	}
	if w.Timestamp == "" {
		w.Timestamp = Timestamp(time.Now())
	}
	if w.Buffers == nil {
		w.Buffers = []BufferDesc{} // Mooncake always writes an array
	}
	if d.Protocol == ProtocolRDMA {
		m := d.PriorityMatrix
		if m == nil {
			m = topo.Matrix{}
		}
		w.PriorityMatrix = &m
	}
	return json.Marshal(w)
}

// segmentWire is the descriptor as Mooncake's encoder writes it:
// tcp_data_port always (0 for rdma), devices and priority_matrix only for
// rdma.
type segmentWire struct {
	Name            string       `json:"name"`
	Protocol        string       `json:"protocol"`
	Timestamp       string       `json:"timestamp"`
	TCPDataPort     int          `json:"tcp_data_port"`
	TCPProtoVersion int          `json:"tcp_proto_version,omitempty"`
	Devices         []DeviceDesc `json:"devices,omitempty"`
	Buffers         []BufferDesc `json:"buffers"`
	PriorityMatrix  *topo.Matrix `json:"priority_matrix,omitempty"`
	SHM             *SHMDesc     `json:"mc_shm,omitempty"`
}

// rawSegment distinguishes absent fields from zero values while decoding.
type rawSegment struct {
	SegmentDesc
	TCPProtoVersion *int `json:"tcp_proto_version"`
}

// DecodeSegment parses a descriptor as Mooncake writes it and enforces its
// rejection rules. Unknown fields are ignored (newer Mooncake versions add
// some). An absent (or 0) tcp_proto_version means 1. Errors are *DescriptorError
// naming the segment and the bad field, e.g.
// `segment "x": buffers[2].addr is 0`.
func DecodeSegment(b []byte) (*SegmentDesc, error) {
	var raw rawSegment
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, &DescriptorError{Segment: peekName(b), Reason: "is not valid descriptor JSON", Err: err}
	}
	d := raw.SegmentDesc
	// Absent means 1 (peers older than the status frames); so does 0,
	// which no version uses and which the encoder leaves out.
	d.TCPProtoVersion = 1
	if raw.TCPProtoVersion != nil && *raw.TCPProtoVersion != 0 {
		d.TCPProtoVersion = *raw.TCPProtoVersion
	}
	if err := Validate(&d); err != nil {
		return nil, err
	}
	return &d, nil
}

// peekName recovers the segment name from JSON that failed to decode, so
// the error can still say which segment is broken.
func peekName(b []byte) string {
	var n struct {
		Name string `json:"name"`
	}
	if json.Unmarshal(b, &n) == nil {
		return n.Name
	}
	return ""
}

// Validate applies Mooncake's descriptor rules (compat.md §1) plus the
// checks mc needs to use a segment safely: a known protocol, a usable TCP
// data port, well-formed GIDs, buffers that do not wrap the address space.
func Validate(d *SegmentDesc) error {
	bad := func(field, format string, a ...any) error {
		return &DescriptorError{Segment: d.Name, Field: field, Reason: fmt.Sprintf(format, a...)}
	}
	switch d.Protocol {
	case ProtocolTCP:
		if d.TCPDataPort < 1 || d.TCPDataPort > 65535 {
			return bad("tcp_data_port", "%d is not a port (1-65535)", d.TCPDataPort)
		}
		if d.TCPProtoVersion < 0 {
			return bad("tcp_proto_version", "%d is negative", d.TCPProtoVersion)
		}
	case ProtocolRDMA:
		if len(d.Devices) == 0 {
			return bad("devices", "is empty (an rdma segment needs at least one device)")
		}
		for i, dev := range d.Devices {
			f := fmt.Sprintf("devices[%d]", i)
			if dev.Name == "" {
				return bad(f+".name", "is empty")
			}
			if dev.GID == "" {
				return bad(f+".gid", "is empty")
			}
			if _, err := ParseGID(dev.GID); err != nil {
				return bad(f+".gid", "%v", err)
			}
		}
	case "":
		return bad("protocol", "is missing")
	default:
		return bad("protocol", "%q is not supported by mc (want tcp or rdma)", d.Protocol)
	}
	for i, buf := range d.Buffers {
		f := fmt.Sprintf("buffers[%d]", i)
		if buf.Name == "" {
			return bad(f+".name", "is empty")
		}
		if buf.Addr == 0 {
			return bad(f+".addr", "is 0")
		}
		if buf.Length == 0 {
			return bad(f+".length", "is 0")
		}
		if buf.Addr+buf.Length < buf.Addr {
			return bad(f, "addr %#x + length %d wraps past the end of the address space", buf.Addr, buf.Length)
		}
		if d.Protocol == ProtocolRDMA {
			if len(buf.Rkey) != len(d.Devices) {
				return bad(f+".rkey", "has %d keys, want %d (one per device)", len(buf.Rkey), len(d.Devices))
			}
			if len(buf.Lkey) != len(d.Devices) {
				return bad(f+".lkey", "has %d keys, want %d (one per device)", len(buf.Lkey), len(d.Devices))
			}
		}
	}
	if d.SHM != nil {
		return validateSHM(d, bad)
	}
	return nil
}

// validateSHM checks mc_shm: a peer maps exactly the buffers listed, so
// every buffer has its entry, in order.
func validateSHM(d *SegmentDesc, bad func(field, format string, a ...any) error) error {
	s := d.SHM
	if !shm.ValidBootID(s.BootID) {
		return bad("mc_shm.boot_id", "%q is not a boot id (a lower-case UUID)", s.BootID)
	}
	if _, err := shm.ParseToken(s.Token); err != nil {
		return bad("mc_shm.token", "%v", err)
	}
	if s.PID < 1 {
		return bad("mc_shm.pid", "%d is not a process id", s.PID)
	}
	if s.UID < 0 {
		return bad("mc_shm.uid", "%d is negative", s.UID)
	}
	if len(s.Buffers) != len(d.Buffers) {
		return bad("mc_shm.buffers", "has %d entries, want %d (one per buffer)", len(s.Buffers), len(d.Buffers))
	}
	for i, b := range s.Buffers {
		f := fmt.Sprintf("mc_shm.buffers[%d]", i)
		if b.Addr != d.Buffers[i].Addr {
			return bad(f+".addr", "%#x is not buffers[%d].addr %#x", b.Addr, i, d.Buffers[i].Addr)
		}
		if b.FD < 0 {
			return bad(f+".fd", "%d is negative", b.FD)
		}
		if b.ID == 0 {
			return bad(f+".id", "is 0")
		}
	}
	return nil
}

// ParseGID parses Mooncake's GID text: 16 bytes as two-digit hex joined by
// ':' ("fe:80:00:...:01").
func ParseGID(s string) ([16]byte, error) {
	var g [16]byte
	parts := strings.Split(s, ":")
	if len(parts) != 16 {
		return g, fmt.Errorf("%q is not 16 two-digit hex bytes joined by ':'", s)
	}
	for i, p := range parts {
		if len(p) != 2 {
			return g, fmt.Errorf("%q is not 16 two-digit hex bytes joined by ':'", s)
		}
		if _, err := hex.Decode(g[i:i+1], []byte(p)); err != nil {
			return g, fmt.Errorf("%q is not 16 two-digit hex bytes joined by ':'", s)
		}
	}
	return g, nil
}

// FormatGID writes a GID the way Mooncake does (lower-case hex).
func FormatGID(g [16]byte) string {
	var b strings.Builder
	b.Grow(47)
	for i, c := range g {
		if i > 0 {
			b.WriteByte(':')
		}
		b.WriteString(hex.EncodeToString([]byte{c}))
	}
	return b.String()
}

// Timestamp formats t as Mooncake's descriptor timestamp
// ("YYYY-mm-dd HH:MM:SS.uuuuuu", in t's location).
func Timestamp(t time.Time) string { return t.Format("2006-01-02 15:04:05.000000") }

// EncodeRPCMeta returns Mooncake's rpc_meta JSON.
func EncodeRPCMeta(m RPCMeta) ([]byte, error) {
	if err := validateRPCMeta("", m); err != nil {
		return nil, err
	}
	return json.Marshal(m)
}

// DecodeRPCMeta parses Mooncake's rpc_meta JSON for server.
func DecodeRPCMeta(server string, b []byte) (RPCMeta, error) {
	var m RPCMeta
	if err := json.Unmarshal(b, &m); err != nil {
		return RPCMeta{}, fmt.Errorf("rpc meta of %q is not valid JSON: %w", server, err)
	}
	return m, validateRPCMeta(server, m)
}

func validateRPCMeta(server string, m RPCMeta) error {
	if m.IPOrHostName == "" {
		return fmt.Errorf("rpc meta of %q: ip_or_host_name is empty", server)
	}
	if m.RPCPort < 1 || m.RPCPort > 65535 {
		return fmt.Errorf("rpc meta of %q: rpc_port %d is not a port (1-65535)", server, m.RPCPort)
	}
	return nil
}

// SegmentKey is where Mooncake stores a segment descriptor:
// "mooncake/[<cluster>/]ram/<name>", or "mooncake/[<cluster>/]<name>" when
// the name already contains a '/'.
func SegmentKey(clusterID, name string) string {
	if strings.Contains(name, "/") {
		return keyPrefix(clusterID) + name
	}
	return keyPrefix(clusterID) + "ram/" + name
}

// RPCMetaKey is where Mooncake stores a server's RPC endpoint:
// "mooncake/[<cluster>/]rpc_meta/<server>".
func RPCMetaKey(clusterID, server string) string {
	return keyPrefix(clusterID) + "rpc_meta/" + server
}

// keyPrefix mirrors Mooncake: MC_METADATA_CLUSTER_ID gets a trailing '/'
// unless it already has one.
func keyPrefix(clusterID string) string {
	if clusterID == "" {
		return "mooncake/"
	}
	if !strings.HasSuffix(clusterID, "/") {
		clusterID += "/"
	}
	return "mooncake/" + clusterID
}
