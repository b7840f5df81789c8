package cmd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kvcache-ops/mc/pkg/engine/meta"
	"github.com/kvcache-ops/mc/pkg/metascan"
)

// newMetaCmd is the metadata-server inventory group: what segments are
// registered, whether their engines are still there, and cleaning up after
// the ones that are not.
func newMetaCmd(p *printer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "meta",
		Short: "List, probe and clean the segments in a metadata server",
		Long: `meta inspects the segment descriptors Mooncake Transfer Engine processes (and
mc) register in a metadata server: etcd (host:port, etcd://h:p;h:p) or
Mooncake's HTTP metadata server (http://host:port/metadata), under
mooncake/[<cluster>/]ram/<segment> with the handshake address in
mooncake/[<cluster>/]rpc_meta/<segment>.

Each segment's engine is probed over its handshake socket: a Probe frame,
then a Metadata request whose answer is compared with the stored
descriptor (timestamps aside). States:
  alive     the handshake listener answered
  dead      the connection was refused (for tcp segments the data port too):
            no process listens there any more
  unknown   no conclusive answer (timeout, unreachable host, no rpc_meta)
  mismatch  the peer answered with a different descriptor (another engine
            owns the address or the name now)
  invalid   the stored value is not a descriptor; not probed

The HTTP metadata protocol has no list call: with an http:// server name
the segments with --segment NAME (repeatable).`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(newMetaLsCmd(p), newMetaShowCmd(p), newMetaGCCmd(p))
	return cmd
}

// metaOptions are the flags every meta verb shares.
type metaOptions struct {
	MetadataServer   string
	ClusterID        string
	Segments         []string
	ProbeTimeout     time.Duration
	ProbeConcurrency int
}

func addMetaFlags(f *pflag.FlagSet, o *metaOptions, segments bool) {
	f.StringVar(&o.MetadataServer, "metadata-server", "", "metadata server: etcd host:port[,host:port], etcd://h:p;h:p or http://host:port/path")
	f.StringVar(&o.ClusterID, "metadata-cluster-id", "", "metadata key prefix mooncake/<id>/ (also --cluster-id)")
	envName(f, "metadata-cluster-id", "MC_METADATA_CLUSTER_ID")
	durationVar(f, &o.ProbeTimeout, "probe-timeout", metascan.DefaultProbeTimeout, "bound on one segment's probe")
	if segments {
		f.StringArrayVar(&o.Segments, "segment", nil, "only this segment (repeatable; required with an http:// server, which cannot list)")
		f.IntVar(&o.ProbeConcurrency, "probe-concurrency", metascan.DefaultProbeConcurrency, "most probes in flight (one socket each; 0: the default)")
	}
}

func (o metaOptions) probeOptions() metascan.ProbeOptions {
	return metascan.ProbeOptions{Timeout: o.ProbeTimeout, Concurrency: o.ProbeConcurrency}
}

func (o metaOptions) validate(verb string) error {
	if o.MetadataServer == "" {
		return usagef("meta %s: --metadata-server is required (etcd host:port or http://host:port/metadata)", verb)
	}
	if err := checkMetadataServer("metadata-server", o.MetadataServer); err != nil {
		return err
	}
	if o.ProbeTimeout <= 0 {
		return usagef("meta %s: --probe-timeout %v must be positive", verb, o.ProbeTimeout)
	}
	if o.ProbeConcurrency < 0 {
		return usagef("meta %s: --probe-concurrency %d is negative", verb, o.ProbeConcurrency)
	}
	return nil
}

// metadataTokenEnv is Mooncake's MC_METADATA_HTTP_TOKEN: the bearer token
// of an HTTP metadata server. Every verb that talks to a metadata server
// sends it (serve metadata requires it).
const metadataTokenEnv = "MC_METADATA_HTTP_TOKEN"

func metadataToken() string { return os.Getenv(metadataTokenEnv) }

// openStore checks the options and opens the metadata server's raw
// key-value view.
func openStore(ctx context.Context, verb string, o metaOptions) (meta.Backend, meta.Store, error) {
	if err := o.validate(verb); err != nil {
		return nil, nil, err
	}
	if verb != "show" && len(o.Segments) == 0 {
		if u, err := url.Parse(o.MetadataServer); err == nil && (strings.EqualFold(u.Scheme, "http") || strings.EqualFold(u.Scheme, "https")) {
			// Known from the address: no need to ask the server, and a
			// flag left out is a usage error (gc's 2 says its check
			// failed).
			return nil, nil, usagef("meta %s: an HTTP metadata server cannot list its segments: name them with --segment NAME (repeatable)", verb)
		}
	}
	b, err := meta.Open(ctx, o.MetadataServer, meta.Options{ClusterID: o.ClusterID, HTTPToken: metadataToken()})
	if err != nil {
		return nil, nil, fmt.Errorf("meta %s: %w", verb, err)
	}
	st, err := meta.StoreOf(b)
	if err != nil {
		b.Close()
		return nil, nil, fmt.Errorf("meta %s: %w: point --metadata-server at etcd or an HTTP metadata server", verb, err)
	}
	return b, st, nil
}

// scanAndProbe lists the segments (or looks up the named ones) and probes
// them; names not registered are noted on stderr.
func scanAndProbe(ctx context.Context, verb string, st meta.Store, o metaOptions, p *printer) ([]metascan.Segment, error) {
	segs, err := scan(ctx, verb, st, o, p)
	if err != nil {
		return nil, err
	}
	metascan.Probe(ctx, segs, o.probeOptions())
	return segs, nil
}

func scan(ctx context.Context, verb string, st meta.Store, o metaOptions, p *printer) ([]metascan.Segment, error) {
	if len(o.Segments) == 0 {
		segs, err := metascan.List(ctx, st)
		if errors.Is(err, meta.ErrNoList) {
			return nil, fmt.Errorf("meta %s: %w: name the segments with --segment NAME (repeatable)", verb, meta.ErrNoList)
		}
		if err != nil {
			return nil, fmt.Errorf("meta %s: %w", verb, err)
		}
		return segs, nil
	}
	segs, missing, err := metascan.Lookup(ctx, st, o.Segments)
	if err != nil {
		return nil, fmt.Errorf("meta %s: %w", verb, err)
	}
	for _, name := range missing {
		fmt.Fprintf(p.Err, "note: segment %q is not registered (no %s)\n", name, meta.SegmentKey(st.ClusterID(), name))
	}
	return segs, nil
}

// segmentJSON is one segment in `-o json`; fields are only ever added.
type segmentJSON struct {
	Name       string   `json:"name"`
	Key        string   `json:"key"`
	Protocol   string   `json:"protocol"`
	Buffers    int      `json:"buffers"`
	Bytes      uint64   `json:"bytes"`
	Devices    []string `json:"devices"`
	RPCAddress string   `json:"rpc_address"`
	State      string   `json:"state"`
	RTTMicros  *int64   `json:"rtt_us"`
	Error      string   `json:"error"`
	Note       string   `json:"note"`
}

func toJSON(s *metascan.Segment) segmentJSON {
	j := segmentJSON{Name: s.Name, Key: s.Record.Key, Buffers: s.Buffers(), Bytes: s.Bytes(),
		Devices: s.Devices(), State: string(s.Probe.State), Note: s.Probe.Note}
	if j.Devices == nil {
		j.Devices = []string{}
	}
	if s.Desc != nil {
		j.Protocol = s.Desc.Protocol
		j.RPCAddress, _ = s.RPCAddress()
	}
	if s.Probe.RTT > 0 {
		us := s.Probe.RTT.Microseconds()
		j.RTTMicros = &us
	}
	if s.Probe.Err != nil {
		j.Error = s.Probe.Err.Error()
	}
	return j
}

func segmentsJSON(segs []metascan.Segment) []segmentJSON {
	out := make([]segmentJSON, 0, len(segs))
	for i := range segs {
		out = append(out, toJSON(&segs[i]))
	}
	return out
}

// detail is the error, or else the note, for the table's last column.
func (j segmentJSON) detail() string {
	if j.Error != "" {
		return j.Error
	}
	return j.Note
}

func formatRTT(d time.Duration) string {
	switch {
	case d <= 0:
		return "-"
	case d < time.Millisecond:
		return fmt.Sprintf("%d µs", d.Microseconds())
	}
	return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
}

func segmentRows(segs []metascan.Segment) [][]string {
	rows := make([][]string, 0, len(segs))
	for i := range segs {
		j := toJSON(&segs[i])
		rows = append(rows, []string{j.Name, orDash(j.Protocol), strconv.Itoa(j.Buffers), humanBytes(j.Bytes),
			orDash(strings.Join(j.Devices, ",")), orDash(j.RPCAddress), j.State, formatRTT(segs[i].Probe.RTT), j.detail()})
	}
	return rows
}

var segmentHeader = []string{"name", "protocol", "buffers", "bytes", "devices", "rpc address", "state", "rtt", "detail"}

func newMetaLsCmd(p *printer) *cobra.Command {
	var o metaOptions
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List every segment with its buffers, devices, handshake address and liveness",
		Long: `ls lists the segments registered in the metadata server (every one under the
cluster's prefix with etcd; those named by --segment with an http:// server)
and probes each engine, --probe-concurrency at a time, each within
--probe-timeout. Keys under the prefix whose value is not a descriptor are
listed as invalid. Keys of other clusters (without --metadata-cluster-id)
and NVMe-oF file segments are left out.

-o json prints {"segments":[{"name","key","protocol","buffers","bytes",
"devices","rpc_address","state","rtt_us","error","note"}]}; rtt_us is null
when nothing answered.

Exit status: 0 when the segments could be listed, 1 on error, 64 on a
usage error.`,
		Example: `  mc meta ls --metadata-server 127.0.0.1:2379
  mc meta ls --metadata-server 10.0.0.1:2379 --metadata-cluster-id prod -o json
  mc meta ls --metadata-server http://10.0.0.1:8080/metadata --segment prefill-0 --segment decode-0`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runMetaLs(cmd.Context(), o, p)
		},
	}
	addMetaFlags(cmd.Flags(), &o, true)
	return cmd
}

func runMetaLs(ctx context.Context, o metaOptions, p *printer) error {
	b, st, err := openStore(ctx, "ls", o)
	if err != nil {
		return err
	}
	defer b.Close()
	segs, err := scanAndProbe(ctx, "ls", st, o, p)
	if err != nil {
		return err
	}
	if p.JSON() {
		return p.PrintJSON(struct {
			Segments []segmentJSON `json:"segments"`
		}{Segments: segmentsJSON(segs)})
	}
	p.Table("", segmentHeader, segmentRows(segs))
	return nil
}

func newMetaShowCmd(p *printer) *cobra.Command {
	var o metaOptions
	cmd := &cobra.Command{
		Use:   "show NAME",
		Short: "Print one segment descriptor in full",
		Long: `show prints one segment: its key, protocol, timestamp, handshake address and
liveness, every buffer (address, length, rkeys and lkeys), and for rdma the
devices and NIC priority matrix. -o json prints the stored value exactly as
it is in the metadata server.

Exit status: 0 when shown, 1 when the segment is not registered, its value
is not a descriptor, or the server fails; 64 on a usage error.`,
		Example: `  mc meta show prefill-0 --metadata-server 127.0.0.1:2379
  mc meta show prefill-0 --metadata-server http://10.0.0.1:8080/metadata -o json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runMetaShow(cmd.Context(), args[0], o, p)
		},
	}
	addMetaFlags(cmd.Flags(), &o, false)
	return cmd
}

func runMetaShow(ctx context.Context, name string, o metaOptions, p *printer) error {
	b, st, err := openStore(ctx, "show", o)
	if err != nil {
		return err
	}
	defer b.Close()
	segs, missing, err := metascan.Lookup(ctx, st, []string{name})
	if err != nil {
		return fmt.Errorf("meta show: %w", err)
	}
	if len(missing) > 0 {
		return fmt.Errorf("meta show: segment %q is not registered (no %s)", name, meta.SegmentKey(st.ClusterID(), name))
	}
	s := &segs[0]
	if s.Invalid != nil {
		return fmt.Errorf("meta show: %s holds no valid descriptor: %w", s.Record.Key, s.Invalid)
	}
	if p.JSON() {
		out := append(bytes.TrimSpace(s.Record.Value), '\n')
		if _, err := p.Out.Write(out); err != nil {
			return fmt.Errorf("write json: %w", err)
		}
		return nil
	}
	metascan.Probe(ctx, segs, o.probeOptions())
	printSegment(p, s)
	return nil
}

func printSegment(p *printer, s *metascan.Segment) {
	d, j := s.Desc, toJSON(s)
	detail := j.detail()
	rows := [][]string{
		{"key", s.Record.Key},
		{"protocol", d.Protocol},
		{"timestamp", orDash(d.Timestamp)},
		{"rpc address", orDash(j.RPCAddress)},
		{"state", j.State},
		{"rtt", formatRTT(s.Probe.RTT)},
	}
	if detail != "" {
		rows = append(rows, []string{"detail", detail})
	}
	if d.Protocol == meta.ProtocolTCP {
		rows = append(rows, []string{"tcp data port", strconv.Itoa(d.TCPDataPort)},
			[]string{"tcp proto version", strconv.Itoa(d.TCPProtoVersion)})
	}
	rows = append(rows, []string{"buffers", fmt.Sprintf("%d (%s)", j.Buffers, humanBytes(j.Bytes))})
	p.Table("segment "+s.Name, []string{"field", "value"}, rows)

	rows = rows[:0]
	for _, buf := range d.Buffers {
		rows = append(rows, []string{buf.Name, fmt.Sprintf("0x%x", buf.Addr), strconv.FormatUint(buf.Length, 10),
			orDash(joinKeys(buf.Rkey)), orDash(joinKeys(buf.Lkey))})
	}
	fmt.Fprintln(p.Out)
	p.Table("buffers", []string{"name", "addr", "length", "rkey", "lkey"}, rows)
	if d.Protocol == meta.ProtocolRDMA {
		fmt.Fprintln(p.Out)
		printSegmentTopo(p, d, d.PriorityMatrix)
	}
}

func joinKeys(ks []uint32) string {
	parts := make([]string, len(ks))
	for i, k := range ks {
		parts[i] = strconv.FormatUint(uint64(k), 10)
	}
	return strings.Join(parts, ",")
}

type metaGCOptions struct {
	metaOptions
	Yes            bool
	IncludeInvalid bool
}

func newMetaGCCmd(p *printer) *cobra.Command {
	var o metaGCOptions
	cmd := &cobra.Command{
		Use:   "gc",
		Short: "Delete the descriptors of dead engines (dry run unless --yes)",
		Long: `gc probes every segment as ls does and selects the dead ones: engines whose
handshake address refuses connections (for tcp segments the data port
too). Without --yes it prints what it would delete. With --yes it deletes
each dead segment's descriptor and rpc_meta keys in one compare-and-delete
on exactly the values it read (an etcd transaction on their revisions), so
an engine that re-registers in the meantime is left alone ("changed").
Alive, mismatched and unknown segments are never deleted. Values that are
not descriptors are reported and deleted only with --include-invalid.

Mooncake's HTTP metadata protocol has no list call and no conditional
delete: name the segments with --segment, and know that over HTTP the
value is compared and then deleted, so a write in that last round trip is
not detected.

-o json prints {"dry_run","segments":[as ls],"removals":[{"name","state",
"keys","action","error"}]}; action is would_delete, deleted, changed or
failed.

Exit status: 0 nothing stale, or every stale segment deleted (or found
re-registered); 1 stale segments remain (a dry run found some); 2 on error
(the metadata server failed, a deletion failed); 64 on a usage error.`,
		Example: `  mc meta gc --metadata-server 127.0.0.1:2379
  mc meta gc --metadata-server 127.0.0.1:2379 --yes
  mc meta gc --metadata-server 10.0.0.1:2379 --metadata-cluster-id prod --yes --include-invalid
  mc meta gc --metadata-server http://10.0.0.1:8080/metadata --segment decode-3 --yes`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runMetaGC(cmd.Context(), o, p)
		},
	}
	f := cmd.Flags()
	addMetaFlags(f, &o.metaOptions, true)
	f.BoolVar(&o.Yes, "yes", false, "delete (without it gc only reports)")
	f.BoolVar(&o.IncludeInvalid, "include-invalid", false, "also delete values under the prefix that are not descriptors")
	return cmd
}

// removalJSON is one stale segment in gc's `-o json`.
type removalJSON struct {
	Name   string   `json:"name"`
	State  string   `json:"state"`
	Keys   []string `json:"keys"`
	Action string   `json:"action"`
	Error  string   `json:"error"`
}

func runMetaGC(ctx context.Context, o metaGCOptions, p *printer) error {
	fail := func(err error) error { return &exitError{code: 2, err: err} }
	b, st, err := openStore(ctx, "gc", o.metaOptions)
	if err != nil {
		return fail(err)
	}
	defer b.Close()
	segs, err := scanAndProbe(ctx, "gc", st, o.metaOptions, p)
	if err != nil {
		return fail(err)
	}
	rep := metascan.GC(ctx, st, segs, metascan.GCOptions{Delete: o.Yes, IncludeInvalid: o.IncludeInvalid})

	if p.JSON() {
		out := struct {
			DryRun   bool          `json:"dry_run"`
			Segments []segmentJSON `json:"segments"`
			Removals []removalJSON `json:"removals"`
		}{DryRun: rep.DryRun, Segments: segmentsJSON(segs), Removals: []removalJSON{}}
		for _, r := range rep.Removals {
			j := removalJSON{Name: r.Name, State: string(r.State), Keys: r.Keys, Action: string(r.Action)}
			if r.Err != nil {
				j.Error = r.Err.Error()
			}
			out.Removals = append(out.Removals, j)
		}
		if err := p.PrintJSON(out); err != nil {
			return fail(err)
		}
	} else {
		printGC(p, segs, rep, o, st.AtomicDelete())
	}
	switch {
	case rep.Failed() > 0:
		return fail(fmt.Errorf("meta gc: %d of %d deletions failed: %w", rep.Failed(), len(rep.Removals), firstErr(rep)))
	case rep.Remaining() > 0:
		return &exitError{code: 1}
	}
	return nil
}

func firstErr(rep metascan.Report) error {
	for _, r := range rep.Removals {
		if r.Err != nil {
			return r.Err
		}
	}
	return nil
}

func printGC(p *printer, segs []metascan.Segment, rep metascan.Report, o metaGCOptions, atomic bool) {
	p.Table("", segmentHeader, segmentRows(segs))
	if len(rep.Removals) == 0 {
		fmt.Fprintln(p.Out, "nothing stale")
	} else {
		var rows [][]string
		for _, r := range rep.Removals {
			action := strings.ReplaceAll(string(r.Action), "_", " ")
			if r.Action == metascan.Changed {
				action = "left alone: changed since read (re-registered)"
			}
			if r.Err != nil {
				action += ": " + r.Err.Error()
			}
			rows = append(rows, []string{r.Name, string(r.State), strings.Join(r.Keys, " "), action})
		}
		fmt.Fprintln(p.Out)
		p.Table("stale", []string{"name", "state", "keys", "action"}, rows)
	}
	invalid, unknown := 0, 0
	for i := range segs {
		switch segs[i].Probe.State {
		case metascan.InvalidValue:
			invalid++
		case metascan.Unknown:
			unknown++
		}
	}
	if invalid > 0 && !o.IncludeInvalid {
		fmt.Fprintf(p.Err, "note: %d invalid value(s) kept; --include-invalid deletes them\n", invalid)
	}
	if unknown > 0 {
		fmt.Fprintf(p.Err, "note: %d segment(s) in state unknown kept: gc deletes only segments whose engine refuses connections\n", unknown)
	}
	if rep.DryRun && rep.Remaining() > 0 {
		fmt.Fprintf(p.Err, "dry run: %d stale segment(s); run again with --yes to delete them\n", rep.Remaining())
	}
	if !atomic && !rep.DryRun && len(rep.Removals) > 0 {
		fmt.Fprintln(p.Err, "note: the HTTP metadata protocol has no conditional delete: each value was compared, then deleted")
	}
}
