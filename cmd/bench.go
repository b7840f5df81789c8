package cmd

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jedib0t/go-pretty/v6/progress"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"

	"github.com/kvcache-ops/mc/pkg/engine"
	"github.com/kvcache-ops/mc/pkg/engine/bench"
	"github.com/kvcache-ops/mc/pkg/engine/handshake"
	"github.com/kvcache-ops/mc/pkg/engine/meta"
	"github.com/kvcache-ops/mc/pkg/engine/rdmatransport"
	"github.com/kvcache-ops/mc/pkg/engine/tcp"
	"github.com/kvcache-ops/mc/pkg/topo"
	"github.com/kvcache-ops/mc/pkg/units"
	"github.com/prometheus/client_golang/prometheus"
)

// benchEngineOptions are the flags target and initiator share: how the
// local engine is started and found.
type benchEngineOptions struct {
	Protocol        string
	Backend         string
	MetadataServer  string
	LocalServerName string
	BindAddress     string
	MinRPCPort      int
	MaxRPCPort      int
	ClusterID       string
	StatusTimeout   time.Duration
	TCPLanes        int
	TCPEventLoops   int
	HandshakeMax    int64
	// RDMA (--protocol rdma).
	DeviceName        string
	NICPriorityMatrix string
	AutoDiscovery     bool
}

type benchTargetOptions struct {
	benchEngineOptions
	BufferSize    int64
	MetricsListen string
	// Ready, when set, is called with the running target (tests).
	Ready func(*bench.Target)
}

type benchInitiatorOptions struct {
	benchEngineOptions
	SegmentID       string
	Operation       string
	BatchSize       int
	BlockSize       []int64
	BufferSize      int64
	Duration        time.Duration
	Threads         int
	ReportUnit      string
	ReportPrecision int
	Verify          bool
	Plot            string
	MetricsListen   string
	// Progress forces (true) or suppresses (false) the live progress;
	// nil means "when stdout is a terminal".
	Progress *bool
}

func newBenchCmd(p *printer) *cobra.Command {
	c := &cobra.Command{
		Use:   "bench",
		Short: "Benchmarks: transfer engine over TCP and RDMA (transfer_engine_bench), collectives, KV-cache store",
		Long: `mc bench measures the transfer engine between a target (which registers
memory and serves it) and an initiator (which reads or writes it in batches),
with transfer_engine_bench's flags and its "Test completed" line, plus IOPS,
batch latency percentiles, failed tasks and optional byte verification.

Without --segment-id, mc bench initiator starts a target in the same process
and benchmarks it over real loopback TCP, or with --protocol rdma over
RDMA NICs. On a host without RDMA hardware, soft* names in --device-name
(or MC_RDMA_PROVIDER=soft) create software NICs, the target getting its
own set; they move bytes over TCP sockets, so banners and rows say
"rdma (soft)" and -o json "provider": "soft". Any other name must be a
device in /sys/class/infiniband. With
--protocol auto or shm, a target registers memfd-backed buffers that an
initiator of the same user on the same host maps and copies with memcpy
(shm); auto uses tcp for any other target, shm refuses it. Slicing,
retries and queue pairs follow Mooncake's MC_* variables (MC_SLICE_SIZE,
MC_RETRY_CNT, MC_NUM_QP_PER_EP, ...); MC_RDMA_PROVIDER picks soft, ibverbs
or auto.

Scripts written for transfer_engine_bench run with their flags as they
are: --mode=target or --mode=initiator picks the verb, gflags spellings
are accepted on the verbs (-block_size=4096, --noauto_discovery), and
where Mooncake warns and carries on (a --buffer-size too small, an
unknown --report-unit) so does mc. Three defaults differ, so a script
that leaves them out gets mc's: --protocol tcp (Mooncake's rdma),
every NIC (Mooncake's --device_name mlx5_2) and P2PHANDSHAKE
(Mooncake's --metadata_server 192.168.3.77:2379). GPU flags of
Mooncake's CUDA builds (--use_vram, --gpu_id) are refused.`,
	}
	c.AddCommand(newBenchCollCmd(p))
	c.AddCommand(newBenchTargetCmd(p), newBenchInitiatorCmd(p))
	c.AddCommand(newBenchStoreCmd(p))
	return c
}

// benchProtocols are --protocol's values: Mooncake's two, and the
// same-host transport (auto: for peers on this host; shm: only).
var benchProtocols = []string{"tcp", "rdma", engine.ProtocolAuto, engine.ProtocolSHM}

func completeBenchProtocol(c *cobra.Command) {
	_ = c.RegisterFlagCompletionFunc("protocol", cobra.FixedCompletions(benchProtocols, cobra.ShellCompDirectiveNoFileComp))
}

func addBenchEngineFlags(fs *pflag.FlagSet, o *benchEngineOptions) {
	fs.StringVar(&o.Protocol, "protocol", "tcp", "transport protocol: tcp, rdma, auto (shared memory with same-host peers, else tcp) or shm (shared memory only)")
	fs.StringVar(&o.Backend, "backend", "classic", "transfer engine backend: classic (Mooncake's default, and the only one mc has)")
	fs.StringVar(&o.DeviceName, "device-name", "", "rdma: comma list of NICs to use (default all); soft* names create software NICs (bytes over TCP) on a host without RDMA hardware")
	fs.StringVar(&o.NICPriorityMatrix, "nic-priority-matrix", "", "rdma: NIC priority matrix file (Mooncake's JSON)")
	fs.BoolVar(&o.AutoDiscovery, "auto-discovery", false, "rdma: build the NIC priority matrix from this host's topology (and use its NICs when --device-name is empty)")
	fs.StringVar(&o.MetadataServer, "metadata-server", "P2PHANDSHAKE", "metadata server: P2PHANDSHAKE, etcd host:port[,host:port], etcd://h:p;h:p or http://host:port/path")
	fs.StringVar(&o.LocalServerName, "local-server-name", "", "this engine's server name (default the hostname)")
	fs.StringVar(&o.BindAddress, "bind-address", "", "address the handshake and data listeners bind to (default 0.0.0.0)")
	fs.IntVar(&o.MinRPCPort, "min-rpc-port", engine.DefaultMinRPCPort, "lowest handshake (RPC) port")
	fs.IntVar(&o.MaxRPCPort, "max-rpc-port", engine.DefaultMaxRPCPort, "highest handshake (RPC) port")
	fs.StringVar(&o.ClusterID, "metadata-cluster-id", "", "metadata key prefix mooncake/<id>/ (also --cluster-id)")
	durationVar(fs, &o.StatusTimeout, "tcp-status-timeout-sec", 30*time.Second, "wait this long for a TCP status or reply before failing the tasks")
	fs.IntVar(&o.TCPLanes, "tcp-lanes", engine.DefaultTCPLanes, "persistent TCP connections per peer; 0 opens a connection per request, as Mooncake's client without MC_TCP_ENABLE_CONNECTION_POOL=1")
	sizeVar(fs, &o.HandshakeMax, "handshake-max-length", handshake.DefaultMaxLength, "largest handshake frame, sent or accepted (at most 128M)")
	envName(fs, "bind-address", "MC_TCP_BIND_ADDRESS")
	envName(fs, "min-rpc-port", "MC_MIN_RPC_PORT")
	envName(fs, "max-rpc-port", "MC_MAX_RPC_PORT")
	envName(fs, "metadata-cluster-id", "MC_METADATA_CLUSTER_ID")
	fs.IntVar(&o.TCPEventLoops, "tcp-event-loops", 0, "event loops serving the TCP data port on Linux (connection-per-request clients are served there); 0: one per two processors, at most 4")
	envName(fs, "tcp-status-timeout-sec", "MC_TCP_STATUS_TIMEOUT_SEC")
	envName(fs, "tcp-event-loops", "MC_TCP_EVENT_LOOPS")
	envName(fs, "handshake-max-length", "MC_HANDSHAKE_MAX_LENGTH")
}

func (o benchEngineOptions) config() (engine.Config, error) {
	if !slices.Contains(benchProtocols, o.Protocol) {
		return engine.Config{}, usagef("--protocol %q is not supported: want one of: %s", o.Protocol, strings.Join(benchProtocols, ", "))
	}
	// "" is options built in code.
	if o.Backend != "" && o.Backend != "classic" {
		return engine.Config{}, usagef("--backend %q is not supported: mc implements Mooncake's classic transfer engine only", o.Backend)
	}
	// 0 (options built in code) means the handshake default.
	if o.HandshakeMax < 0 || o.HandshakeMax > handshake.MaxMaxLength {
		return engine.Config{}, usagef("--handshake-max-length %s: want 1 to %s bytes", units.FormatSize(o.HandshakeMax), units.FormatSize(handshake.MaxMaxLength))
	}
	if o.Protocol != "rdma" && (o.DeviceName != "" || o.NICPriorityMatrix != "" || o.AutoDiscovery) {
		return engine.Config{}, usagef("--device-name, --nic-priority-matrix and --auto-discovery need --protocol rdma")
	}
	if o.StatusTimeout <= 0 {
		return engine.Config{}, usagef("--tcp-status-timeout-sec %s must be positive", o.StatusTimeout)
	}
	if o.TCPLanes < 0 {
		return engine.Config{}, usagef("--tcp-lanes %d: want 0 (a connection per request) or more", o.TCPLanes)
	}
	if o.TCPEventLoops < 0 || o.TCPEventLoops > tcp.MaxEventLoops {
		return engine.Config{}, usagef("--tcp-event-loops %d: want 0 (the default) to %d", o.TCPEventLoops, tcp.MaxEventLoops)
	}
	if o.MetadataServer != "" { // "" is options built in code
		if err := checkMetadataServer("metadata-server", o.MetadataServer); err != nil {
			return engine.Config{}, err
		}
	}
	if o.BindAddress != "" {
		if err := checkHostIP("bind-address", o.BindAddress); err != nil {
			return engine.Config{}, err
		}
	}
	handshakeAddr := ""
	if strings.Contains(o.LocalServerName, ":") && (o.MetadataServer == "" || o.MetadataServer == meta.P2PHandshake) {
		// With P2PHANDSHAKE a segment is named host:port by its
		// handshake port, so a port given is that port (before, it was
		// dropped without a word and another one advertised).
		_, port, err := net.SplitHostPort(o.LocalServerName)
		n, perr := strconv.ParseUint(port, 10, 16)
		if err != nil || perr != nil || n == 0 {
			return engine.Config{}, usagef("invalid --local-server-name %q: want host or host:port (a port of 1-65535)", o.LocalServerName)
		}
		handshakeAddr = net.JoinHostPort(o.BindAddress, port)
	}
	if o.MinRPCPort != 0 || o.MaxRPCPort != 0 {
		if err := checkPortRange("min-rpc-port", "max-rpc-port", o.MinRPCPort, o.MaxRPCPort); err != nil {
			return engine.Config{}, err
		}
	}
	var transports []engine.TransportFactory
	if o.Protocol == "rdma" {
		rc, err := o.rdmaConfig()
		if err != nil {
			return engine.Config{}, err
		}
		transports = append(transports, rdmatransport.Factory(rc))
	}
	return engine.Config{
		Protocol:           o.Protocol,
		Transports:         transports,
		LocalServerName:    o.LocalServerName,
		HandshakeAddr:      handshakeAddr,
		MetadataServer:     o.MetadataServer,
		ClusterID:          o.ClusterID,
		MetadataHTTPToken:  metadataToken(),
		BindAddress:        o.BindAddress,
		MinRPCPort:         o.MinRPCPort,
		MaxRPCPort:         o.MaxRPCPort,
		TCPLanes:           o.TCPLanes,
		TCPEventLoops:      o.TCPEventLoops,
		TCPPerRequest:      o.TCPLanes == 0,
		HandshakeMaxLength: int(o.HandshakeMax),
		TCPStatusTimeout:   o.StatusTimeout,
	}, nil
}

// rdmaConfig is the rdma transport's configuration: Mooncake's MC_*
// variables, the devices and the priority matrix. Every engine built from
// it opens its own provider (its own soft NICs with the soft provider).
func (o benchEngineOptions) rdmaConfig() (rdmatransport.Config, error) {
	rc, err := rdmatransport.ConfigFromEnv()
	if err != nil {
		return rc, err
	}
	if rc.Devices, err = rdmatransport.ParseDevices(o.DeviceName); err != nil {
		return rc, usagef("--device-name: %w", err)
	}
	switch {
	case o.NICPriorityMatrix != "" && o.AutoDiscovery:
		return rc, usagef("--nic-priority-matrix and --auto-discovery exclude each other")
	case o.NICPriorityMatrix != "":
		if rc.Matrix, err = topo.ReadMatrixFile(o.NICPriorityMatrix); err != nil {
			return rc, usagef("--nic-priority-matrix: %w", err)
		}
	case o.AutoDiscovery:
		// As Mooncake: with auto discovery, MC_CUSTOM_TOPO_JSON names a
		// priority matrix file that replaces discovery; when it cannot be
		// read, warn and discover.
		if path := os.Getenv("MC_CUSTOM_TOPO_JSON"); path != "" {
			m, err := topo.ReadMatrixFile(path)
			if err == nil {
				rc.Matrix = m
				if len(rc.Devices) == 0 {
					rc.Devices = m.NICs()
				}
				return rc, nil
			}
			slog.Warn("MC_CUSTOM_TOPO_JSON cannot be used: discovering the topology instead", "path", path, "err", err)
		}
		fs, err := topo.NewFS("/")
		if err != nil {
			return rc, fmt.Errorf("--auto-discovery: %w", err)
		}
		t, err := topo.Discover(fs, topo.Options{})
		if err != nil {
			return rc, fmt.Errorf("--auto-discovery: %w", err)
		}
		// A host without RDMA NICs (the soft provider) has an empty
		// matrix: the transport's NUMA-based default applies.
		if m := t.Matrix(); len(m) > 0 {
			rc.Matrix = m
			if len(rc.Devices) == 0 {
				rc.Devices = m.NICs()
			}
		}
	}
	return rc, nil
}

func newBenchTargetCmd(p *printer) *cobra.Command {
	var o benchTargetOptions
	c := &cobra.Command{
		Use:   "target",
		Short: "Register buffers and serve them until SIGINT/SIGTERM",
		Long: `mc bench target registers --buffer-size bytes per NUMA node (as cpu:<n>),
filled with the pattern mc bench initiator --verify checks, prints the
name to pass as --segment-id, and serves until SIGINT or SIGTERM.`,
		Example: `  mc bench target --buffer-size 1G
  mc bench target --metadata-server 10.0.0.1:2379 --local-server-name node1
  mc bench target --protocol rdma --device_name soft0,soft1 --nic_priority_matrix matrix.json
  mc bench target --protocol auto     # same-host initiators map the buffers (--protocol auto|shm)`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Settings of the side that starts transfers did nothing on
			// a target, silently.
			if err := refuseGiven(cmd, "sets how an initiator's transfers go; a target starts none (give it to mc bench initiator)", "tcp-lanes", "tcp-status-timeout-sec"); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return runBenchTarget(ctx, o, p)
		},
	}
	fs := c.Flags()
	addBenchEngineFlags(fs, &o.benchEngineOptions)
	sizeVar(fs, &o.BufferSize, "buffer-size", 1<<30, "bytes registered per NUMA node")
	fs.StringVar(&o.MetricsListen, "metrics-listen", "", "serve Prometheus /metrics (per-NIC endpoints, waiting list, QPs with --protocol rdma) on this address, e.g. 127.0.0.1:9464")
	completeBenchProtocol(c)
	return c
}

func runBenchTarget(ctx context.Context, o benchTargetOptions, p *printer) error {
	cfg, err := o.config()
	if err != nil {
		return err
	}
	if o.MetricsListen != "" {
		if err := checkListen("metrics-listen", o.MetricsListen); err != nil {
			return err
		}
	}
	size := o.BufferSize
	if size <= 0 {
		return usagef("--buffer-size %d: want more than 0 bytes", size)
	}
	nodes := numaNodes()
	e, err := engine.New(ctx, cfg)
	if err != nil {
		return err
	}
	defer e.Close()
	t, err := bench.StartTarget(ctx, e, bench.TargetConfig{BufferSize: size, Nodes: nodes})
	if err != nil {
		return fmt.Errorf("register target memory: %w", err)
	}
	defer t.Close()
	type buf struct {
		Location string `json:"location"`
		Addr     uint64 `json:"addr"`
		Length   int    `json:"length"`
	}
	metricsAddr := ""
	if o.MetricsListen != "" {
		var cs []prometheus.Collector
		if rt, ok := e.Transport("rdma").(*rdmatransport.Transport); ok {
			cs = append(cs, rt.Collector())
		}
		if metricsAddr, err = serveMetrics(ctx, o.MetricsListen, cs...); err != nil {
			return err
		}
	}
	var bufs []buf
	var locs []string
	for _, m := range t.Buffers {
		bufs = append(bufs, buf{m.Location(), m.Addr(), m.Len()})
		locs = append(locs, m.Location())
	}
	if p.JSON() {
		j := map[string]any{
			"segment_id":      e.SegmentName(),
			"protocol":        o.Protocol,
			"metadata_server": cfg.MetadataServer,
			"buffers":         bufs,
			"metrics_addr":    metricsAddr,
			// The RDMA provider that moves the bytes ("" for tcp).
			"provider": e.Provider(o.Protocol),
		}
		if err := p.PrintJSON(j); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(p.Out, "segment_id %s (protocol %s, metadata %s, %d x %s: %s)\n",
			e.SegmentName(), e.TransportLabel(o.Protocol), cfg.MetadataServer, len(t.Buffers), bench.FormatSize(size), strings.Join(locs, ","))
		hint := ""
		switch o.Protocol {
		case "rdma":
			hint = " --protocol rdma"
			if o.DeviceName != "" {
				hint += " --device_name " + o.DeviceName
			}
		case engine.ProtocolAuto, engine.ProtocolSHM:
			// Same-host initiators map the buffers; others use tcp.
			hint = " --protocol auto"
		}
		fmt.Fprintf(p.Out, "run: mc bench initiator --segment_id %s --metadata_server %s%s\n", e.SegmentName(), cfg.MetadataServer, hint)
		if metricsAddr != "" {
			fmt.Fprintf(p.Out, "metrics http://%s/metrics\n", metricsAddr)
		}
	}
	if o.Ready != nil {
		o.Ready(t)
	}
	<-ctx.Done()
	if !p.JSON() {
		fmt.Fprintln(p.Out, "stopping target")
	}
	// The engine withdraws the segment once and unmaps the buffers.
	// Unregistering them one by one first would republish the descriptor
	// per buffer: one metadata timeout each when the server is gone.
	if err := e.Close(); err != nil {
		return fmt.Errorf("stop target: %w", err)
	}
	return nil
}

// numaNodes lists the host's NUMA nodes, or nil (node 0) when unknown.
func numaNodes() []int {
	fs, err := topo.NewFS("/")
	if err != nil {
		return nil
	}
	t, err := topo.Discover(fs, topo.Options{})
	if err != nil || t == nil {
		return nil
	}
	var out []int
	for _, n := range t.NUMANodes {
		if n >= 0 {
			out = append(out, n)
		}
	}
	return out
}

func newBenchInitiatorCmd(p *printer) *cobra.Command {
	var o benchInitiatorOptions
	c := &cobra.Command{
		Use:   "initiator",
		Short: "Run Mooncake's transfer loop against a target and report",
		Long: `mc bench initiator runs transfer_engine_bench's loop: each of --threads
threads submits --batch-size requests of --block-size bytes, waits for all
of them and repeats for --duration. It prints Mooncake's "Test completed"
line, then throughput, IOPS, batch latency percentiles and failed tasks.
A comma list of block sizes runs a sweep, one row per size. Without
--segment-id it benchmarks an in-process target over loopback TCP (or
over its own soft RDMA NICs with --protocol rdma).

Exit status: 0 when every task completed (and verified), 130 when
interrupted (SIGINT/SIGTERM; the partial results are printed first), 64
on a usage error, 1 otherwise.`,
		Example: `  mc bench initiator                                   # embedded loopback target
  mc bench initiator --segment_id 10.0.0.2:15123 --operation write --threads 1
  mc bench initiator --block_size 4K,64K,1M --batch_size 128 --threads 1 --verify
  mc bench initiator --threads 1 --block_size 4K,16K,64K,256K,1M --plot sweep.svg
  mc bench initiator --protocol rdma --device_name soft0,soft1 --threads 1 --verify
  mc bench initiator --protocol shm --threads 1 --block_size 1M   # shared memory, embedded target`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Without --segment_id the run measures a target in this
			// process over loopback, whatever metadata server is named:
			// one given was a target forgotten, not a choice.
			if o.SegmentID == "" && cmd.Flags().Changed("metadata-server") && o.MetadataServer != meta.P2PHandshake {
				return usagef("--metadata-server %s finds a target by its --segment_id: give --segment_id too (without it the initiator benchmarks a target in this process over loopback)", o.MetadataServer)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return runBenchInitiator(ctx, o, p)
		},
	}
	fs := c.Flags()
	addBenchEngineFlags(fs, &o.benchEngineOptions)
	fs.StringVar(&o.SegmentID, "segment-id", "", "target segment name (empty: start an in-process loopback target)")
	fs.StringVar(&o.Operation, "operation", "read", "read or write")
	fs.IntVar(&o.BatchSize, "batch-size", 128, "requests per batch")
	sizeListVar(fs, &o.BlockSize, "block-size", []int64{65536}, "bytes per request; a comma list (4K,64K,1M) runs a sweep")
	sizeVar(fs, &o.BufferSize, "buffer-size", 1<<30, "local buffer: raised, with a warning, to batch-size x block-size x threads when smaller")
	durationVar(fs, &o.Duration, "duration", 10*time.Second, "time per run")
	fs.IntVar(&o.Threads, "threads", 12, "submitting threads")
	fs.StringVar(&o.ReportUnit, "report-unit", "GB", "throughput unit: "+strings.Join(bench.UnitNames(), ", ")+" (another value: GB, with a warning)")
	fs.IntVar(&o.ReportPrecision, "report-precision", 2, "digits after the decimal point")
	fs.BoolVar(&o.Verify, "verify", false, "check every byte: reads read back a pattern written first, writes are read back")
	fs.StringVar(&o.Plot, "plot", "", "write the sweep as an SVG: throughput and p99 latency against block size")
	fs.StringVar(&o.MetricsListen, "metrics-listen", "", "serve Prometheus /metrics while running (the engine's tasks and bytes; per-NIC endpoints, waiting list, QPs with --protocol rdma) on this address, e.g. 127.0.0.1:9465")
	completeBenchProtocol(c)
	return c
}

func runBenchInitiator(ctx context.Context, o benchInitiatorOptions, p *printer) error {
	cfg, err := o.config()
	if err != nil {
		return err
	}
	if o.MetricsListen != "" {
		if err := checkListen("metrics-listen", o.MetricsListen); err != nil {
			return err
		}
	}
	var op engine.Opcode
	switch o.Operation {
	case "read":
		op = engine.Read
	case "write":
		op = engine.Write
	default:
		return usagef("--operation %q: want read or write", o.Operation)
	}
	if o.BatchSize <= 0 {
		return usagef("--batch-size %d must be positive", o.BatchSize)
	}
	if o.Threads <= 0 {
		return usagef("--threads %d must be positive", o.Threads)
	}
	if o.ReportPrecision < 0 || o.ReportPrecision > 12 {
		return usagef("--report-precision %d: want 0-12", o.ReportPrecision)
	}
	sizes, bufSize, dur := o.BlockSize, o.BufferSize, o.Duration
	if len(sizes) == 0 {
		return usagef("--block-size: give at least one size")
	}
	for _, s := range sizes {
		if s <= 0 {
			return usagef("--block-size %s: want sizes of more than 0 bytes", units.FormatSizes(sizes))
		}
	}
	if bufSize <= 0 {
		return usagef("--buffer-size %d: want more than 0 bytes", bufSize)
	}
	if dur <= 0 {
		return usagef("--duration %s: want more than 0", dur)
	}
	// Before the run, not after minutes of it.
	if err := checkOutput("--plot", o.Plot); err != nil {
		return err
	}
	unit, err := bench.ParseUnit(o.ReportUnit)
	if err != nil {
		// transfer_engine_bench warns and reports in GB; scripts written
		// for it rely on that.
		unit, _ = bench.ParseUnit("GB")
		slog.Warn("unknown --report-unit: reporting in GB", "report_unit", o.ReportUnit, "want", strings.Join(bench.UnitNames(), ","))
	}
	var maxBlock int64
	for _, s := range sizes {
		maxBlock = max(maxBlock, s)
	}
	if need := maxBlock * int64(o.BatchSize) * int64(o.Threads); need/int64(o.Threads)/int64(o.BatchSize) != maxBlock {
		return usagef("batch_size %d x block_size %d x threads %d overflows", o.BatchSize, maxBlock, o.Threads)
	} else if need > bufSize {
		// As transfer_engine_bench: warn and raise the buffer to fit.
		slog.Warn("--buffer-size too small for batch_size x block_size x threads: raised to fit",
			"buffer_size", bufSize, "batch_size", o.BatchSize, "block_size", maxBlock, "threads", o.Threads, "raised_to", need)
		bufSize = need
	}

	segment := o.SegmentID
	if segment == "" {
		// The embedded target holds exactly what the run touches.
		need := maxBlock * int64(o.BatchSize) * int64(o.Threads)
		tcfg := cfg
		tcfg.LocalServerName = ""
		t, err := bench.StartLoopbackTarget(ctx, tcfg, need)
		if err != nil {
			return err
		}
		defer t.Close()
		segment = t.Engine.SegmentName()
		cfg.BindAddress = "127.0.0.1"
		cfg.MetadataServer = "P2PHANDSHAKE"
		if !p.JSON() {
			how := "loopback " + t.Engine.TransportLabel(o.Protocol)
			if o.Protocol == engine.ProtocolAuto || o.Protocol == engine.ProtocolSHM {
				how = "same process, memfd-backed"
			}
			fmt.Fprintf(p.Out, "embedded target %s (%s, %s)\n", segment, how, bench.FormatSize(need))
		}
	}
	e, err := engine.New(ctx, cfg)
	if err != nil {
		return err
	}
	defer e.Close()
	if o.MetricsListen != "" {
		cs := []prometheus.Collector{newEngineCollector(e)}
		if rt, ok := e.Transport("rdma").(*rdmatransport.Transport); ok {
			cs = append(cs, rt.Collector())
		}
		mctx, stop := context.WithCancel(context.WithoutCancel(ctx))
		defer stop()
		addr, err := serveMetrics(mctx, o.MetricsListen, cs...)
		if err != nil {
			return err
		}
		if !p.JSON() {
			fmt.Fprintf(p.Out, "metrics http://%s/metrics\n", addr)
		}
	}

	bc := bench.InitiatorConfig{
		Engine: e, Segment: segment, Op: op, BatchSize: o.BatchSize, BlockSizes: sizes,
		BufferSize: bufSize, Duration: dur, Threads: o.Threads, Verify: o.Verify, Nodes: numaNodes(),
	}
	showProgress := !p.JSON() && isTerminal(p.Out)
	if o.Progress != nil {
		showProgress = *o.Progress && !p.JSON()
	}
	var stopProgress func()
	if showProgress {
		bc.Progress, stopProgress = liveProgress(p.Out, unit, o.ReportPrecision)
	}
	results, runErr := bench.Run(ctx, bc)
	if stopProgress != nil {
		stopProgress()
	}
	if len(results) == 0 && runErr != nil {
		return runErr
	}
	if err := printBenchResults(p, segment, unit, o.ReportPrecision, results); err != nil {
		return err
	}
	if o.Plot != "" && len(results) > 0 {
		if err := writePlot(o.Plot, results, unit); err != nil {
			return err
		}
	}
	if runErr != nil {
		return sweepError(results, sizes, runErr)
	}
	if ctx.Err() != nil {
		// SIGINT/SIGTERM: the figures cover a shortened run, and a
		// script must not take them for a complete one (130 = 128+SIGINT,
		// the shell's convention).
		return &exitError{code: exitInterrupted, err: fmt.Errorf("bench initiator: interrupted; the results above cover only the time run")}
	}
	return nil
}

func writePlot(path string, rs []bench.Result, unit bench.Unit) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--plot: %w", err)
	}
	if err := bench.PlotSweep(f, rs, unit); err != nil {
		f.Close()
		return fmt.Errorf("--plot %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("--plot: %w", err)
	}
	return nil
}

// sweepError names the row of a sweep that failed and the sizes that did
// not run, so the rows printed above it read as what they are.
func sweepError(results []bench.Result, sizes []int64, err error) error {
	if len(sizes) < 2 || len(results) == 0 {
		return err
	}
	failed := results[len(results)-1].BlockSize
	var notRun []string
	for _, s := range sizes[len(results):] {
		notRun = append(notRun, bench.FormatSize(s))
	}
	rest := ""
	if len(notRun) > 0 {
		rest = "; not run: " + strings.Join(notRun, ",")
	}
	return fmt.Errorf("sweep stopped at block size %s (%d of %d sizes done%s): %w",
		bench.FormatSize(failed), len(results)-1, len(sizes), rest, err)
}

type benchJSONResult struct {
	Operation     string  `json:"operation"`
	BlockSize     int64   `json:"block_size"`
	BatchSize     int     `json:"batch_size"`
	Threads       int     `json:"threads"`
	DurationSec   float64 `json:"duration_sec"`
	BatchCount    uint64  `json:"batch_count"`
	Bytes         uint64  `json:"bytes"`
	Throughput    float64 `json:"throughput"`
	ReportUnit    string  `json:"report_unit"`
	BytesPerSec   float64 `json:"bytes_per_sec"`
	IOPS          float64 `json:"iops"`
	LatencyP50Us  float64 `json:"latency_p50_us"`
	LatencyP99Us  float64 `json:"latency_p99_us"`
	LatencyP999Us float64 `json:"latency_p999_us"`
	FailedTasks   uint64  `json:"failed_tasks"`
	Verified      bool    `json:"verified"`
	Transport     string  `json:"transport"`
	Provider      string  `json:"provider"`
	Error         string  `json:"error"`
}

func printBenchResults(p *printer, segment string, unit bench.Unit, prec int, rs []bench.Result) error {
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	if p.JSON() {
		out := make([]benchJSONResult, 0, len(rs))
		for _, r := range rs {
			j := benchJSONResult{
				Operation: r.Operation, BlockSize: r.BlockSize, BatchSize: r.BatchSize, Threads: r.Threads,
				DurationSec: r.Duration.Seconds(), BatchCount: r.BatchCount, Bytes: r.Bytes,
				Throughput: unit.Per(r.BytesPerSec), ReportUnit: unit.Name, BytesPerSec: r.BytesPerSec, IOPS: r.IOPS,
				LatencyP50Us: us(r.LatencyP50), LatencyP99Us: us(r.LatencyP99), LatencyP999Us: us(r.LatencyP999),
				FailedTasks: r.FailedTasks, Verified: r.Verified && r.Err == nil, Transport: r.Transport, Provider: r.Provider,
			}
			if r.Err != nil {
				j.Error = r.Err.Error()
			}
			out = append(out, j)
		}
		return p.PrintJSON(map[string]any{"segment_id": segment, "results": out})
	}
	var p50s, p99s, p999s []time.Duration
	for _, r := range rs {
		p50s, p99s, p999s = append(p50s, r.LatencyP50), append(p99s, r.LatencyP99), append(p999s, r.LatencyP999)
	}
	u50, u99, u999 := latencyUnitFor(p50s), latencyUnitFor(p99s), latencyUnitFor(p999s)
	var rows [][]string
	for _, r := range rs {
		// Mooncake's line, for scripts that parse it.
		fmt.Fprintf(p.Out, "Test completed: duration %.2f, batch count %d, throughput %.*f %s/s\n",
			r.Duration.Seconds(), r.BatchCount, prec, unit.Per(r.BytesPerSec), unit.Name)
		verified := "no"
		if r.Verified {
			verified = "yes"
			if r.Err != nil {
				verified = "FAILED"
			}
		}
		rows = append(rows, []string{
			bench.FormatSize(r.BlockSize), r.Operation, strconv.Itoa(r.Threads), strconv.Itoa(r.BatchSize),
			fmt.Sprintf("%.*f", prec, unit.Per(r.BytesPerSec)), fmt.Sprintf("%.0f", r.IOPS),
			u50.format(r.LatencyP50), u99.format(r.LatencyP99), u999.format(r.LatencyP999),
			strconv.FormatUint(r.FailedTasks, 10), verified, r.TransportLabel(),
		})
	}
	p.Table("", []string{"block", "op", "threads", "batch", unit.Name + "/s", "IOPS", u50.header("p50"), u99.header("p99"), u999.header("p99.9"), "failed", "verified", "transport"}, rows)
	return nil
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// liveProgress renders elapsed time and current throughput with go-pretty,
// one tracker per block size.
func liveProgress(w io.Writer, unit bench.Unit, prec int) (func(bench.Progress), func()) {
	pw := startProgress(w, 32)
	pw.Style().Visibility.Percentage = true
	var cur *progress.Tracker
	var curBlock int64
	var last bench.Progress
	var lastAt time.Time
	update := func(pr bench.Progress) {
		if cur == nil || pr.BlockSize != curBlock {
			if cur != nil {
				cur.MarkAsDone()
			}
			cur = &progress.Tracker{Total: pr.Duration.Milliseconds(), Units: progress.UnitsDefault,
				Message: bench.FormatSize(pr.BlockSize)}
			curBlock = pr.BlockSize
			pw.AppendTracker(cur)
			last, lastAt = bench.Progress{}, time.Time{}
		}
		now := time.Now()
		rate := float64(pr.Bytes) / pr.Elapsed.Seconds()
		if !lastAt.IsZero() && now.Sub(lastAt) > 0 {
			rate = float64(pr.Bytes-last.Bytes) / now.Sub(lastAt).Seconds()
		}
		last, lastAt = pr, now
		cur.UpdateMessage(fmt.Sprintf("%s %.*f %s/s", bench.FormatSize(pr.BlockSize), prec, unit.Per(rate), unit.Name))
		cur.SetValue(min(pr.Elapsed.Milliseconds(), cur.Total))
	}
	stop := func() { stopProgress(pw, cur) }
	return update, stop
}

// gflagsArgs rewrites a transfer_engine_bench command line for cobra, so
// that scripts written for Mooncake's bench run with `mc bench` in its
// place. Mooncake parses flags with gflags, which accepts what pflag does
// not: single-dash long flags (-block_size=4096), --noflag for a false
// boolean, and the role as a flag (--mode=target) rather than a verb.
// pflag reads "-block_size" as a cluster of one-letter flags and has no
// --no prefix, and cobra dispatches on the verb before any flag is
// parsed, so the rewrite has to happen before cobra sees the arguments.
// It only touches the bench verbs, and only spellings that name one of
// their flags; everything else passes through unchanged.
func gflagsArgs(root *cobra.Command, args []string) ([]string, error) {
	i := benchIndex(root, args)
	if i < 0 {
		return args, nil
	}
	out := append([]string(nil), args[:i+1]...)
	rest := args[i+1:]
	// --mode / -mode, with = or a separate value, anywhere after "bench".
	var mode string
	var kept []string
	for j := 0; j < len(rest); j++ {
		a := rest[j]
		if a == "--" {
			kept = append(kept, rest[j:]...)
			break
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || name != "mode" {
			kept = append(kept, a)
			continue
		}
		if !hasVal {
			if j+1 >= len(rest) {
				return nil, usagef("bench: --mode needs a value: target or initiator")
			}
			j++
			val = rest[j]
		}
		if val != "target" && val != "initiator" {
			return nil, usagef("bench: --mode %q: want target or initiator", val)
		}
		if mode != "" && mode != val {
			return nil, usagef("bench: --mode %s and --mode %s: give one", mode, val)
		}
		mode = val
	}
	verb := ""
	if len(kept) > 0 && (kept[0] == "target" || kept[0] == "initiator") {
		verb = kept[0]
		kept = kept[1:]
	}
	switch {
	case verb == "" && mode == "":
		return args, nil
	case verb == "":
		verb = mode
	case mode != "" && mode != verb:
		return nil, usagef("bench %s: --mode %s contradicts the verb", verb, mode)
	}
	c, _, err := root.Find([]string{"bench", verb})
	if err != nil || c.Name() != verb {
		return args, nil
	}
	lookup := func(name string) *pflag.Flag {
		n := string(normalizeFlag(nil, name))
		if f := c.Flags().Lookup(n); f != nil {
			return f
		}
		return c.InheritedFlags().Lookup(n)
	}
	out = append(out, verb)
	for j := 0; j < len(kept); j++ {
		a := kept[j]
		if a == "--" {
			out = append(out, kept[j:]...)
			break
		}
		if !strings.HasPrefix(a, "-") || len(a) < 3 {
			out = append(out, a)
			continue
		}
		name, _, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		long := strings.HasPrefix(a, "--")
		f := lookup(name)
		switch {
		case f != nil && (long || len(name) > 1):
			a = "--" + strings.TrimLeft(a, "-")
		case f == nil && !hasVal && strings.HasPrefix(name, "no") && (long || len(name) > 1):
			// gflags' --noflag: false for a boolean flag.
			if g := lookup(name[2:]); g != nil && g.Value.Type() == "bool" {
				a, f = "--"+name[2:]+"=false", g
				hasVal = true
			}
		}
		out = append(out, a)
		// A flag's separate value is passed as is, even when it starts
		// with a dash.
		if f != nil && !hasVal && f.Value.Type() != "bool" && f.NoOptDefVal == "" && j+1 < len(kept) {
			j++
			out = append(out, kept[j])
		}
	}
	return out, nil
}

// benchIndex is the index of the "bench" verb in args (after global
// flags), or -1 when the command is not mc bench.
func benchIndex(root *cobra.Command, args []string) int {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			if a == "bench" {
				return i
			}
			return -1
		}
		if a == "--" {
			return -1
		}
		name, _, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		var f *pflag.Flag
		if strings.HasPrefix(a, "--") {
			f = root.PersistentFlags().Lookup(string(normalizeFlag(nil, name)))
		} else if len(name) == 1 {
			f = root.PersistentFlags().ShorthandLookup(name)
		}
		if f != nil && !hasVal && f.Value.Type() != "bool" {
			i++ // the global flag's value
		}
	}
	return -1
}

// startProgress starts a go-pretty progress writer on w (a terminal) with
// mc's style: elapsed time, no value or ETA columns.
func startProgress(w io.Writer, msgLen int) progress.Writer {
	pw := progress.NewWriter()
	pw.SetOutputWriter(w)
	pw.SetAutoStop(false)
	pw.SetUpdateFrequency(200 * time.Millisecond)
	pw.SetMessageLength(msgLen)
	pw.Style().Visibility.Value = false
	pw.Style().Visibility.ETA = false
	go pw.Render()
	return pw
}

// stopProgress marks cur done, lets the final frame render and stops pw.
func stopProgress(pw progress.Writer, cur *progress.Tracker) {
	if cur != nil {
		cur.MarkAsDone()
	}
	time.Sleep(250 * time.Millisecond)
	pw.Stop()
	for pw.IsRenderInProgress() {
		time.Sleep(10 * time.Millisecond)
	}
}
