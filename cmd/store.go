package cmd

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/jedib0t/go-pretty/v6/progress"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"

	"github.com/kvcache-ops/mc/pkg/engine"
	"github.com/kvcache-ops/mc/pkg/engine/meta"
	"github.com/kvcache-ops/mc/pkg/engine/rdmatransport"
	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/alloc"
	"github.com/kvcache-ops/mc/pkg/store/ha"
	"github.com/kvcache-ops/mc/pkg/store/master"
	"github.com/kvcache-ops/mc/pkg/store/policy"
	"github.com/kvcache-ops/mc/pkg/store/replay"
	"github.com/kvcache-ops/mc/pkg/store/server"
)

// storeDataOptions pick the transport a store process moves bytes with.
type storeDataOptions struct {
	Protocol       string
	DeviceName     string
	LocalHostname  string
	MetadataServer string
	BindAddress    string
}

func (o *storeDataOptions) addFlags(fs *pflag.FlagSet) { o.addFlagsProtocol(fs, "tcp") }

// addFlagsProtocol is addFlags with another default --protocol (bench
// store's is auto: a benchmark client beside the node it measures
// should measure what that client would use).
func (o *storeDataOptions) addFlagsProtocol(fs *pflag.FlagSet, protocol string) {
	fs.StringVar(&o.Protocol, "protocol", protocol, "transport for the bytes: tcp, rdma, auto (shared memory with same-host nodes and clients, else tcp) or shm (shared memory only)")
	fs.StringVar(&o.DeviceName, "device-name", "", "RDMA NICs to use, comma-separated (--protocol rdma); soft* names create software NICs (bytes over TCP, shown as rdma (soft)) on a host without RDMA hardware")
	fs.StringVar(&o.LocalHostname, "local-hostname", "", "host (or host:port: the segment name with etcd/HTTP metadata, the handshake port with P2PHANDSHAKE) other processes reach this one's segment or engine at (default: the bind address, else this host's name)")
	fs.StringVar(&o.MetadataServer, "metadata-server", meta.P2PHandshake, "where transfer engines publish and find segments: P2PHANDSHAKE, http://H:P/metadata, etcd://H:P[;H:P] (Mooncake's --metadata_server)")
	fs.StringVar(&o.BindAddress, "bind-address", "", "host this process's transfer engine listens on: its handshake (RPC) port and TCP data port (Mooncake's MC_TCP_BIND_ADDRESS; default: this verb's, see README \"What listens where\")")
	envName(fs, "device-name", "MC_DEVICE_NAME")
	envName(fs, "bind-address", "MC_TCP_BIND_ADDRESS")
}

// engineConfig is the engine's configuration; it listens on
// --bind-address, else on bind (the verb's default).
func (o storeDataOptions) engineConfig(bind string) (engine.Config, error) {
	if o.BindAddress != "" {
		if err := checkHostIP("bind-address", o.BindAddress); err != nil {
			return engine.Config{}, err
		}
		bind = o.BindAddress
	}
	if o.MetadataServer != "" {
		if err := checkMetadataServer("metadata-server", o.MetadataServer); err != nil {
			return engine.Config{}, err
		}
	}
	cfg := engine.Config{Protocol: o.Protocol, BindAddress: bind, AdvertiseHost: o.LocalHostname, MetadataServer: o.MetadataServer,
		MetadataHTTPToken: metadataToken()}
	if o.MetadataServer != "" && o.MetadataServer != meta.P2PHandshake && o.LocalHostname != "" {
		// With a metadata server the local hostname is the segment's
		// name there, as with Mooncake's local_hostname; peers connect to
		// its host part.
		cfg.LocalServerName = o.LocalHostname
		cfg.AdvertiseHost = hostOf(o.LocalHostname)
	} else if h, port, err := net.SplitHostPort(o.LocalHostname); err == nil {
		// P2PHANDSHAKE names the segment host:port by its handshake
		// port: a port given is that port (the name was [host:port]:port
		// otherwise, which no peer could parse back).
		p, err := strconv.ParseUint(port, 10, 16)
		if err != nil || p == 0 {
			return cfg, usagef("--local-hostname %q: port %q is not a port (1-65535)", o.LocalHostname, port)
		}
		cfg.AdvertiseHost = h
		cfg.HandshakeAddr = net.JoinHostPort(bind, port)
	}
	switch o.Protocol {
	case "tcp", engine.ProtocolAuto, engine.ProtocolSHM:
		// auto|shm: a node's segment is mappable by same-host clients,
		// and a client maps a same-host node's segment (package shm).
		if o.DeviceName != "" {
			return cfg, usagef("--device-name needs --protocol rdma")
		}
	case "rdma":
		rc, err := rdmatransport.ConfigFromEnv()
		if err != nil {
			return cfg, err
		}
		if rc.Devices, err = rdmatransport.ParseDevices(o.DeviceName); err != nil {
			return cfg, usagef("--device-name: %w", err)
		}
		cfg.Transports = append(cfg.Transports, rdmatransport.Factory(rc))
	default:
		return cfg, usagef("--protocol %q is not supported: want tcp, rdma, auto or shm", o.Protocol)
	}
	return cfg, nil
}

// ---- mc serve store ----

type serveStoreOptions struct {
	// nodeIgnored: the master-only flags given to a node (--master).
	nodeIgnored           []string
	Data                  storeDataOptions
	Master                string
	SegmentSize           int64
	RPCPort               int
	Port                  int
	RPCAddress            string
	MetricsPort           int
	NodeAdmin             bool // --metrics-port given (a node's admin HTTP is off by default)
	LeaseTTL              time.Duration
	SoftPinTTL            time.Duration
	MaxSoftPinTTL         time.Duration
	AllowEvictSoftPinned  bool
	EvictionRatio         float64
	HighWatermark         float64
	ClientTTL             time.Duration
	ClusterID             string
	PutDiscardTimeout     time.Duration
	PutReleaseTimeout     time.Duration
	AllocationStrategy    string
	RPCThreadNum          int
	EnableMetricReporting bool
	ConfigPath            string
	RegionSize            int64
	MaxRegionsPerInstance int
	ExistKeyGrantLease    bool
	MultiTenants          bool
	TenantQuotaType       string
	TenantQuotaURI        string
	EnableHA              bool
	HABackend             string
	EtcdEndpoints         string
	HALeaseTTL            time.Duration
	HASnapshotInterval    time.Duration
	HASnapshotRecords     int
	EvictionPolicy        string
	SSDDir                string
	SSDSize               int64
	SSDStagingSize        int64
	SSDStagingTTL         time.Duration
	EnableOffload         bool
	PromoteAfter          int
	AdminAuth             adminTokenOptions
	BindAddress           string // the engine's handshake and data listeners
	MetricsAddress        string // the admin HTTP listener's host
	RequestBudget         int64
	RequestReadTimeout    time.Duration
	MaxConnections        int
	MaxConnectionsPerHost int
	KVEvents              kvEventsOptions
	ready                 func(*server.Server) // tests
}

func newServeStoreCmd(p *printer) *cobra.Command {
	var o serveStoreOptions
	cmd := &cobra.Command{
		Use:   "store",
		Short: "Run a KV-cache store: a master with a segment, a master only, or a node",
		Long: `store runs mc's KV-cache pool (Mooncake Store compatible in its flags, admin
HTTP API and metrics). The master keeps metadata only; nodes contribute memory
segments registered with the transfer engine; clients (mc store, mc bench
store, the Go package pkg/store) move bytes straight to and from segments.

Default: a master on --rpc_port plus one segment of --segment-size in this
process, ready to use. --segment-size 0: master only. --master HOST:PORT: a
node that mounts its segment on that master, pings it every second and
re-mounts by itself when the master restarts or asks. --master
mooncake://HOST:PORT: the same in a Mooncake deployment, on a real
mooncake_master (Mooncake's coro_rpc wire; mooncake_client's flag names
work: --master_server_address, --global_segment_size "4 GB", --host,
--metadata_server, --protocol, --device_names).

The master answers both mc's gRPC and Mooncake's coro_rpc on --rpc_port
(the first byte of a connection tells them apart), so Mooncake clients
(vLLM, SGLang, LMCache through MooncakeDistributedStore, mooncake_client)
can use it as their master_server_address.

Without HA, a master keeps its metadata in memory: objects stored before a
master restart are gone after it (nodes re-mount their empty segments),
except those on a node's disk tier.

--ssd-dir DIR (Mooncake: --enable_offload with $MOONCAKE_OFFLOAD_FILE_STORAGE_PATH)
gives the node's segment a disk tier of --ssd-size bytes: an object evicted
from the segment is written to that disk first (no network: the bytes are
local) and stays readable; a get of it is served through the segment, and
its --promote-after-th read brings it back into DRAM. The tier survives a
restart of the node (same --ssd-dir) or of the master; one node per
directory (a lock).

--enable_ha runs a master candidate: masters elect a leader through etcd
(--ha_backend_connstring H:P[;H:P] as mooncake_master takes it, or
etcd://H:P[;H:P]; else --etcd_endpoints) on the key
mooncake-store/<cluster_id>/master_view, held with a --ha-lease-ttl lease.
The leader commits every metadata change to an op log in etcd before it
acknowledges a put; standbys tail it and keep a warm copy; a snapshot
compacts it (--ha-snapshot-interval, --ha-snapshot-records). On failover the
new leader restores every acknowledged object and nodes re-mount on it.
Nodes and clients follow the leader with --master etcd://H:P[;H:P] and the
cluster id from MC_STORE_CLUSTER_ID (or --cluster-id for a node).

mooncake_master's flags are accepted under their own names
(--rpc_port, --default_kv_lease_ttl, --eviction_high_watermark_ratio, ...).
mooncake_master's TTL flags (--default_kv_lease_ttl, --default_kv_soft_pin_ttl,
--max_kv_soft_pin_ttl) and --kv-events-pace take milliseconds as
mooncake_master does (--default_kv_lease_ttl 10000) or a Go duration (10s);
every other duration (--client-ttl, --ha-lease-ttl, --ssd-staging-ttl, ...)
takes seconds or a Go duration.
--rpc_thread_num is accepted for compatibility: gRPC sizes its own workers.

The master bounds the memory callers can pin: --request-budget (default
512 MiB) is the request bytes it holds at once on both wires. A coro_rpc
frame of 64 KiB or more is charged its size before it is read, a gRPC
message 8 times its size (what decoding and answering a batch costs)
before it is decoded; a request that does not fit is refused (gRPC:
RESOURCE_EXHAUSTED; coro_rpc: message_too_large), its message naming the
budget, and the client may retry. A gRPC connection receives at most 4
unary messages at once. A request that started must arrive whole within
--request-read-timeout (default 30s), or its connection (coro_rpc) or call
(gRPC) is dropped with what it sent.
--config_path reads mooncake_master's config file (JSON or YAML, keys are
the flag names); flags on the command line win over it. mooncake_master's
own master.json works as it is: its settings mc has no flag for (root_fs_dir,
memory_allocator, rpc_conn_timeout_seconds, kv_events_model_name, ...) are named in
one warning and ignored; a key neither knows is refused.

The admin HTTP API on --metrics_port has the Mooncake master's paths:
/metrics, /metrics/summary, /health, /role, /ha_status, /leader,
/get_all_keys, /get_all_segments, /get_segments_detail, /query_segment,
/query_key, /batch_query_keys, /api/v1/segments/status, /api/v1/remove_all.
A node started with --metrics_port serves its own /metrics and /health.
Reads are open, as Mooncake's; with --admin-token (MC_ADMIN_TOKEN) or
--admin-token-file every other call (remove_all, drain jobs) needs
"Authorization: Bearer <token>" and is answered 401 without it. Without
a token, an admin port beyond loopback is warned about at start.

Listeners: RPC on --rpc_address (0.0.0.0), admin HTTP on --metrics-address
(default --rpc_address), the transfer engine's handshake and data ports on
--bind-address or MC_TCP_BIND_ADDRESS (default --rpc_address when it names
one host, else 0.0.0.0).

--enable_kv_events publishes KV events for cache-aware routers as
mooncake_master does: a ZMQ PUB socket on --kv-events-endpoint
(--kv_events_bind_endpoint), one message per batch of up to
--kv-events-max-batch events (empty topic, 8-byte big-endian sequence
number, msgpack [timestamp_ms, [event...], 0]); a stored event when a
put ends (medium cpu); a removed event when a key leaves the pool (cpu;
disk when a call removes a key held on disk only). An offload, a promotion or a
drain's copy sends nothing, as on mooncake_master. Under a steady stream
sends are paced (--kv-events-pace). --kv-events-backend-id is required. A full
queue (--kv-events-queue-capacity) drops its oldest event and skips a
sequence number; a subscriber that falls 10000 messages (or 640000 events)
behind loses its own. With HA only the leader publishes. The --kv-events-* settings
without --enable-kv-events, like the HA ones without --enable-ha, do
nothing, and a warning says so.

SIGINT or SIGTERM unmounts the segment gracefully and stops.`,
		Example: `  mc serve store
  mc serve store --segment-size 0 --rpc_port 50051 --metrics_port 9003
  mc serve store --master 10.0.0.1:50051 --segment-size 16G --local-hostname 10.0.0.2
  mc serve store --enable_ha --ha_backend_connstring etcd://10.0.0.9:2379 --segment-size 0 --rpc_address 10.0.0.1
  mc serve store --master 'etcd://10.0.0.9:2379' --segment-size 16G --local-hostname 10.0.0.2
  mc serve store --master 10.0.0.1:50051 --segment-size 16G --ssd-dir /nvme/mc --ssd-size 1T
  mc serve store --protocol rdma --device-name soft0,soft1
  mc serve store --master_server_address mooncake://10.0.0.1:50051 --global_segment_size "4 GB" \
      --host 10.0.0.2 --metadata_server P2PHANDSHAKE`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			if o.ConfigPath != "" {
				vals, err := readMasterConfigFile(o.ConfigPath)
				if err != nil {
					return err
				}
				ignored, err := applyMasterConfigFile(cmd.Flags(), vals)
				if err != nil {
					return err
				}
				if len(ignored) > 0 {
					slog.Warn(fmt.Sprintf("--config-path %s: mooncake_master settings that do not apply to mc, ignored: %s", o.ConfigPath, strings.Join(ignored, ", ")))
				}
			}
			// Settings of a feature left off are not refused (a
			// mooncake_master config carries them with the feature
			// off), but said to do nothing: a master given a KV events
			// endpoint without --enable-kv-events published nothing,
			// silently.
			warnInert(cmd.Flags(), o.EnableHA, "enable-ha", "this master is no HA candidate",
				"ha-backend-connstring", "etcd-endpoints", "ha-lease-ttl", "ha-snapshot-interval", "ha-snapshot-records")
			warnInert(cmd.Flags(), o.KVEvents.Enable, "enable-kv-events", "no KV events are published",
				"kv-events-endpoint", "kv-events-bind-endpoint", "kv-events-backend-id", "kv-events-queue-capacity",
				"kv-events-emit-object-key", "kv-events-emit-legacy-compat", "kv-events-pace", "kv-events-max-batch")
			warnInert(cmd.Flags(), o.MultiTenants, "enable-multi-tenants", "keys are not scoped by tenant and no quota is enforced",
				"tenant-quota-connector-type", "tenant-quota-connector-uri")
			// A node (--master) runs no master: the master's settings
			// given to it did nothing, silently.
			if o.Master != "" {
				o.nodeIgnored = givenFlags(cmd.Flags(), masterOnlyFlags...)
			}
			// Several nodes run on one host: only a master takes the
			// default admin port, a node serves one when asked to.
			o.NodeAdmin = cmd.Flags().Changed("metrics-port")
			return runServeStore(ctx, o, p)
		},
	}
	f := cmd.Flags()
	o.Data.addFlags(f)
	f.StringVar(&o.Master, "master", "", "run as a node of this master: host:port, etcd://H:P[;H:P] for HA masters, or mooncake://H:P for a mooncake_master (default: run a master here)")
	sizeVar(f, &o.SegmentSize, "segment-size", 1<<30, "memory this process contributes (0: master only)")
	f.IntVar(&o.RPCPort, "rpc-port", 50051, "master RPC port (0: use the deprecated --port)")
	f.IntVar(&o.Port, "port", 50051, "deprecated spelling of --rpc-port")
	f.StringVar(&o.RPCAddress, "rpc-address", "0.0.0.0", "address the master listens on")
	f.IntVar(&o.MetricsPort, "metrics-port", 9003, "admin HTTP port (/metrics, /health, ...); 0 disables it; a node (--master) serves one only when this is given")
	f.StringVar(&o.MetricsAddress, "metrics-address", "", "host the admin HTTP port listens on (default: --rpc-address)")
	msDurationVar(f, &o.LeaseTTL, "default-kv-lease-ttl", 10*time.Second, "read lease granted by a get")
	msDurationVar(f, &o.SoftPinTTL, "default-kv-soft-pin-ttl", 30*time.Minute, "soft pin lifetime when a put asks for none")
	msDurationVar(f, &o.MaxSoftPinTTL, "max-kv-soft-pin-ttl", 24*time.Hour, "longest soft pin a put may ask for")
	f.BoolVar(&o.AllowEvictSoftPinned, "allow-evict-soft-pinned-objects", true, "evict soft-pinned objects when nothing else is left")
	f.Float64Var(&o.EvictionRatio, "eviction-ratio", master.DefaultEvictionRatio, "fraction of capacity an eviction round frees")
	f.Float64Var(&o.HighWatermark, "eviction-high-watermark-ratio", master.DefaultHighWatermark, "used/capacity above which eviction runs")
	durationVar(f, &o.ClientTTL, "client-ttl", 10*time.Second, "time without a ping before a client is dropped and its segments unmounted")
	f.StringVar(&o.ClusterID, "cluster-id", "mooncake_cluster", "cluster id (names this store in logs and /health; the HA key prefix)")
	durationVar(f, &o.PutDiscardTimeout, "put-start-discard-timeout-sec", 30*time.Second, "time after which a put with no PutEnd is discarded")
	durationVar(f, &o.PutReleaseTimeout, "put-start-release-timeout-sec", 600*time.Second, "time after a discarded put's start before its space is reused")
	f.StringVar(&o.AllocationStrategy, "allocation-strategy", master.DefaultAllocationStrategy, "placement: random, free_ratio_first or local_first")
	f.IntVar(&o.RPCThreadNum, "rpc-thread-num", 0, "accepted for mooncake_master compatibility (gRPC sizes its own workers)")
	f.BoolVar(&o.EnableMetricReporting, "enable-metric-reporting", false, "log a summary line every 10 s")
	f.StringVar(&o.ConfigPath, "config-path", "", "mooncake_master config file (JSON or YAML; command-line flags win)")
	sizeVar(f, &o.RegionSize, "region-size", 64<<20, "piece of a segment handed to one writing client")
	f.IntVar(&o.MaxRegionsPerInstance, "max-regions-per-instance", 0, "regions one client may hold (0: unlimited)")
	f.BoolVar(&o.EnableHA, "enable-ha", false, "run as an HA master candidate: leader election and op log in etcd")
	f.StringVar(&o.HABackend, "ha-backend-connstring", "", "etcd for HA: H:P[;H:P] as mooncake_master takes it, or etcd://H:P[;H:P] (default: --etcd-endpoints)")
	f.StringVar(&o.EtcdEndpoints, "etcd-endpoints", "", "etcd endpoints for HA, H:P[;H:P] (used when --ha-backend-connstring is empty)")
	durationVar(f, &o.HALeaseTTL, "ha-lease-ttl", 5*time.Second, "the leader lease, whole seconds; a leader that cannot renew it steps down")
	durationVar(f, &o.HASnapshotInterval, "ha-snapshot-interval", 10*time.Minute, "snapshot the HA state and compact the op log this often")
	f.IntVar(&o.HASnapshotRecords, "ha-snapshot-records", 100000, "snapshot the HA state and compact the op log after this many records")
	f.BoolVar(&o.ExistKeyGrantLease, "exist-key-grant-lease", false, "ExistKey grants a read lease as Mooncake's does (off: probes never pin objects)")
	f.BoolVar(&o.MultiTenants, "enable-multi-tenants", false, "scope every key by the caller's tenant and admit writes by the tenant quota policy (needs --tenant-quota-connector-uri)")
	f.StringVar(&o.TenantQuotaType, "tenant-quota-connector-type", "file", "where the tenant quota policy lives: file")
	f.StringVar(&o.TenantQuotaURI, "tenant-quota-connector-uri", "", "the tenant quota policy file (YAML: version: 1, tenants: [{name, quota}])")
	_ = cmd.RegisterFlagCompletionFunc("tenant-quota-connector-type", cobra.FixedCompletions([]string{"file"}, cobra.ShellCompDirectiveNoFileComp))
	envName(f, "cluster-id", store.ClusterIDEnv)
	f.StringVar(&o.EvictionPolicy, "eviction-policy", master.DefaultEvictionPolicy, "eviction order: "+strings.Join(master.EvictionPolicies, ", ")+" (none: never evict; a put into a full store fails)")
	_ = cmd.RegisterFlagCompletionFunc("eviction-policy", cobra.FixedCompletions(master.EvictionPolicies, cobra.ShellCompDirectiveNoFileComp))
	sizeVar(f, &o.RequestBudget, "request-budget", master.DefaultRequestBudget, "request bytes the master holds at once, both wires together; a request over it is refused (0: unlimited)")
	durationVar(f, &o.RequestReadTimeout, "request-read-timeout", master.DefaultRequestReadTimeout, "time a started request has to arrive whole before its connection (coro_rpc) or call (gRPC) is dropped")
	f.IntVar(&o.MaxConnections, "max-connections", 0, "inbound connections this process holds at once, all listeners together; one over it is reset at accept (0: 80% of the descriptor limit, ulimit -n)")
	f.IntVar(&o.MaxConnectionsPerHost, "max-connections-per-host", 0, "inbound connections one remote host holds at once; one over it is reset at accept (0: a quarter of --max-connections)")
	addTierFlags(f, &o)
	o.KVEvents.addFlags(f)
	o.AdminAuth.addFlags(f, "bearer token the admin API asks of state-changing calls (remove_all, drain jobs); reads stay open")
	_ = f.MarkHidden("port")
	_ = cmd.RegisterFlagCompletionFunc("protocol", cobra.FixedCompletions(benchProtocols, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("allocation-strategy", cobra.FixedCompletions(master.Strategies, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

// readMasterConfigFile reads mooncake_master's --config_path file: a flat
// object of flag names to values, JSON or YAML.
func readMasterConfigFile(path string) (map[string]any, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, inputErr("--config-path", err)
	}
	var raw map[string]any
	if err := yaml.Unmarshal(b, &raw); err != nil { // YAML is a superset of JSON
		return nil, usagef("--config-path %s: %w", path, err)
	}
	return raw, nil
}

// applyMasterConfigFile sets the flags of fs the file's keys name, unless
// the command line set them. It returns the keys of mooncake_master's
// (mooncakeMasterKeys, retiredMooncakeMasterKeys) that mc has no flag
// for, to be warned about; a key neither mc nor mooncake_master knows is
// refused, with the nearest known key.
func applyMasterConfigFile(fs *pflag.FlagSet, vals map[string]any) (ignored []string, err error) {
	keys := make([]string, 0, len(vals))
	for k := range vals {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		name := strings.ReplaceAll(k, "_", "-")
		if to, ok := mooncakeMasterKeyFlags[k]; ok {
			name = to
		}
		f := fs.Lookup(name)
		if f == nil || name == "config-path" {
			if why, ok := retiredMooncakeMasterKeys[k]; ok {
				ignored = append(ignored, k+" ("+why+")")
				continue
			}
			if slices.Contains(mooncakeMasterKeys, k) {
				ignored = append(ignored, k)
				continue
			}
			return nil, usagef("--config-path: unknown setting %q%s", k, nearestMasterKey(fs, k))
		}
		var v string
		switch x := vals[k].(type) {
		case map[string]any, []any:
			return nil, usagef("--config-path: %q: want a plain value, not a list or object", k)
		case nil:
			continue
		default:
			v = fmt.Sprint(x)
		}
		if f.Changed {
			continue
		}
		if err := fs.Set(f.Name, v); err != nil {
			return nil, usagef("--config-path: %s=%q: %w", k, v, err)
		}
	}
	return ignored, nil
}

// warnInert warns once about the flags of names that were given while
// the feature flag on is off: they do nothing.
func warnInert(fs *pflag.FlagSet, enabled bool, on, effect string, names ...string) {
	if !enabled {
		warnGiven(fs, fmt.Sprintf("without --%s: ignored, %s (add --%s)", on, effect, on), names...)
	}
}

// warnGiven logs one warning naming those of names that were given,
// followed by why.
func warnGiven(fs *pflag.FlagSet, why string, names ...string) {
	if given := givenFlags(fs, names...); len(given) > 0 {
		slog.Warn(fmt.Sprintf("%s given %s", strings.Join(given, ", "), why))
	}
}

// givenFlags is those of names given on the command line, as --name.
func givenFlags(fs *pflag.FlagSet, names ...string) []string {
	var given []string
	for _, n := range names {
		if fs.Changed(n) {
			given = append(given, "--"+n)
		}
	}
	return given
}

// refuseGiven is a usage error naming the first of names given on the
// command line, followed by what it does (why): a flag of another mode
// must not look as if it had worked.
func refuseGiven(cmd *cobra.Command, what string, names ...string) error {
	for _, n := range names {
		if f := cmd.Flags().Lookup(n); f != nil && f.Changed {
			return usagef("--%s %s", n, what)
		}
	}
	return nil
}

// masterOnlyFlags are serve store's settings of the master alone (a
// node, started with --master, has no use for them).
var masterOnlyFlags = []string{
	"rpc-port", "port", "default-kv-lease-ttl", "default-kv-soft-pin-ttl", "max-kv-soft-pin-ttl",
	"allow-evict-soft-pinned-objects", "eviction-ratio", "eviction-high-watermark-ratio", "eviction-policy",
	"client-ttl", "put-start-discard-timeout-sec", "put-start-release-timeout-sec", "allocation-strategy",
	"rpc-thread-num", "enable-metric-reporting", "region-size", "max-regions-per-instance",
	"exist-key-grant-lease", "enable-multi-tenants", "tenant-quota-connector-type", "tenant-quota-connector-uri",
	"request-budget", "request-read-timeout", "promote-after", "ssd-staging-ttl", "admin-token", "admin-token-file",
}

// nearestMasterKey is " (did you mean ...?)" for the known key within
// two edits of k (a flag of fs in underscore spelling, or one of
// mooncake_master's), or "".
func nearestMasterKey(fs *pflag.FlagSet, k string) string {
	known := map[string]bool{}
	for _, m := range mooncakeMasterKeys {
		known[m] = true
	}
	fs.VisitAll(func(f *pflag.Flag) { known[strings.ReplaceAll(f.Name, "-", "_")] = true })
	best, bestD := "", 3
	for cand := range known {
		if d := editDistance(k, cand); d < bestD || (d == bestD && cand < best) {
			best, bestD = cand, d
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

func (o serveStoreOptions) serverConfig() (server.Config, error) {
	var cfg server.Config
	seg := o.SegmentSize
	switch {
	case o.RegionSize <= 0:
		return cfg, usagef("invalid --region-size %d: want more than 0 bytes", o.RegionSize)
	case !(o.EvictionRatio >= 0 && o.EvictionRatio <= 1):
		return cfg, usagef("invalid --eviction-ratio (eviction_ratio) %g: want a fraction in [0, 1]", o.EvictionRatio)
	case !(o.HighWatermark > 0 && o.HighWatermark <= 1):
		return cfg, usagef("invalid --eviction-high-watermark-ratio (eviction_high_watermark_ratio) %g: want a fraction in (0, 1]", o.HighWatermark)
	case o.MaxRegionsPerInstance < 0:
		return cfg, usagef("invalid --max-regions-per-instance %d: want 0 (unlimited) or more", o.MaxRegionsPerInstance)
	case o.LeaseTTL <= 0:
		return cfg, usagef("invalid --default-kv-lease-ttl %s: want more than 0", o.LeaseTTL)
	case o.ClientTTL <= 0:
		return cfg, usagef("invalid --client-ttl %s: want more than 0", o.ClientTTL)
	case o.PutDiscardTimeout <= 0:
		return cfg, usagef("invalid --put-start-discard-timeout-sec %s: want more than 0", o.PutDiscardTimeout)
	case o.RPCThreadNum < 0:
		return cfg, usagef("invalid --rpc-thread-num %d", o.RPCThreadNum)
	case o.MetricsPort < 0 || o.MetricsPort > 65535:
		return cfg, usagef("invalid --metrics-port %d", o.MetricsPort)
	case o.MaxConnections < 0:
		return cfg, usagef("invalid --max-connections %d: want 0 (from the descriptor limit) or more", o.MaxConnections)
	case o.MaxConnectionsPerHost < 0:
		return cfg, usagef("invalid --max-connections-per-host %d: want 0 (from --max-connections) or more", o.MaxConnectionsPerHost)
	}
	port := o.RPCPort
	if port == 0 {
		port = o.Port
	}
	if port < 0 || port > 65535 {
		return cfg, usagef("invalid --rpc-port %d", port)
	}
	if o.Master != "" {
		if err := checkMasterAddr(o.Master); err != nil {
			return cfg, err
		}
		if o.EnableHA {
			return cfg, usagef("--enable-ha runs a master candidate; --master makes this process a node: give one of them")
		}
		if seg == 0 {
			return cfg, usagef("--master with --segment-size 0 contributes nothing: give the node a segment size")
		}
	}
	bind := "0.0.0.0"
	if o.RPCAddress != "" && o.RPCAddress != "0.0.0.0" {
		bind = o.RPCAddress
	}
	ecfg, err := o.Data.engineConfig(bind)
	if err != nil {
		return cfg, err
	}
	token, err := o.AdminAuth.token()
	if err != nil {
		return cfg, err
	}
	tierCfg, err := o.tierConfig(seg)
	if err != nil {
		return cfg, err
	}
	if o.PromoteAfter < 0 {
		return cfg, usagef("invalid --promote-after %d: want the disk read that promotes (1, 2, ...) or 0 for never", o.PromoteAfter)
	}
	if o.EvictionPolicy != "" && !slices.ContainsFunc(master.EvictionPolicies, func(n string) bool { return strings.EqualFold(n, o.EvictionPolicy) }) {
		return cfg, usagef("invalid --eviction-policy %q: want one of %s", o.EvictionPolicy, strings.Join(master.EvictionPolicies, ", "))
	}
	if o.AllocationStrategy != "" && !slices.Contains(master.Strategies, o.AllocationStrategy) {
		return cfg, usagef("invalid --allocation-strategy %q: want one of %s", o.AllocationStrategy, strings.Join(master.Strategies, ", "))
	}
	if o.MultiTenants && o.Master == "" {
		// Flag mistakes, refused as such (exit 64) before anything
		// starts; the policy file's content is the master's to read.
		switch {
		case o.TenantQuotaType != "file" && o.TenantQuotaType != "":
			return cfg, usagef("invalid --tenant-quota-connector-type %q: mc supports file", o.TenantQuotaType)
		case o.TenantQuotaURI == "":
			return cfg, usagef("--enable-multi-tenants needs --tenant-quota-connector-uri (the tenant quota policy file)")
		}
	}
	if o.SSDStagingTTL < 0 {
		return cfg, usagef("invalid --ssd-staging-ttl %s: want a duration, e.g. 5s", o.SSDStagingTTL)
	}
	promote := o.PromoteAfter
	if promote == 0 {
		promote = -1 // master.Config: negative is never
	}
	if o.RequestBudget < 0 {
		return cfg, usagef("invalid --request-budget %d: want bytes, or 0 for unlimited", o.RequestBudget)
	}
	budget := o.RequestBudget
	if budget == 0 {
		budget = -1 // master.Config: negative is unlimited
	}
	allowSoft := o.AllowEvictSoftPinned
	cfg = server.Config{
		Tier:        tierCfg,
		MasterAddr:  o.Master,
		ClusterID:   o.ClusterID,
		RPCAddress:  net.JoinHostPort(o.RPCAddress, strconv.Itoa(port)),
		SegmentSize: uint64(seg),
		Engine:      ecfg,
		Master: master.Config{
			KVLeaseTTL: o.LeaseTTL, DefaultSoftPinTTL: o.SoftPinTTL, MaxSoftPinTTL: o.MaxSoftPinTTL,
			AllowEvictSoftPinned: &allowSoft, EvictionRatio: o.EvictionRatio, HighWatermark: o.HighWatermark,
			ClientTTL:          o.ClientTTL,
			PutDiscardTimeout:  o.PutDiscardTimeout,
			PutReleaseTimeout:  o.PutReleaseTimeout,
			AllocationStrategy: o.AllocationStrategy, RegionSize: uint64(o.RegionSize),
			MaxRegionsPerInstance: o.MaxRegionsPerInstance, ExistKeyGrantLease: o.ExistKeyGrantLease,
			EvictionPolicy: o.EvictionPolicy, PromoteAfter: promote, StagingTTL: o.SSDStagingTTL,
			AdminToken:    token,
			RequestBudget: budget, RequestReadTimeout: o.RequestReadTimeout,
			Tenants: master.TenantConfig{Enabled: o.MultiTenants, ConnectorType: o.TenantQuotaType, ConnectorURI: o.TenantQuotaURI},
		},
		MetricReporting:       o.EnableMetricReporting,
		MaxConnections:        o.MaxConnections,
		MaxConnectionsPerHost: o.MaxConnectionsPerHost,
	}
	if o.MetricsPort > 0 && (o.Master == "" || o.NodeAdmin) {
		host := o.RPCAddress
		if o.MetricsAddress != "" {
			if err := checkHostIP("metrics-address", o.MetricsAddress); err != nil {
				return cfg, err
			}
			host = o.MetricsAddress
		}
		if host == "" {
			host = "0.0.0.0"
		}
		cfg.AdminAddress = net.JoinHostPort(host, strconv.Itoa(o.MetricsPort))
	}
	if o.EnableHA {
		if cfg.HA, err = o.haConfig(); err != nil {
			return cfg, err
		}
	}
	if cfg.KVEvents, err = o.KVEvents.config(o.Master); err != nil {
		return cfg, err
	}
	if o.Master == "" {
		// Validate the master's settings before binding anything.
		if _, err := master.New(cfg.Master); err != nil {
			return cfg, err
		}
	}
	return cfg, nil
}

// checkMasterAddr accepts host:port, etcd://H:P[;H:P] or
// mooncake://H:P.
func checkMasterAddr(s string) error {
	if store.IsMooncakeAddress(s) {
		if _, err := store.ParseMooncakeAddress(s); err != nil {
			return usagef("invalid --master: %w", err)
		}
		return nil
	}
	if store.IsEtcdAddress(s) {
		if _, err := store.ParseEtcdAddress(s); err != nil {
			return usagef("invalid --master: %w", err)
		}
		return nil
	}
	if _, _, err := net.SplitHostPort(s); err != nil {
		return usagef("invalid --master %q: want host:port, etcd://HOST:PORT[;HOST:PORT] or mooncake://HOST:PORT", s)
	}
	return nil
}

// hostOf is the host part of host:port (or the whole string).
func hostOf(s string) string {
	if h, _, err := net.SplitHostPort(s); err == nil {
		return h
	}
	return s
}

func (o serveStoreOptions) haConfig() (*ha.Config, error) {
	var eps []string
	var err error
	switch {
	case o.HABackend != "":
		// mooncake_master takes the bare endpoints (its backend type is a
		// flag of its own, etcd by default); mc's clients' etcd:// form
		// names the same thing.
		conn := o.HABackend
		if i := strings.Index(conn, "://"); i >= 0 {
			if !store.IsEtcdAddress(conn) {
				return nil, usagef("invalid --ha-backend-connstring %q: the HA backend is etcd: want HOST:PORT[;HOST:PORT] or etcd://HOST:PORT[;HOST:PORT]", conn)
			}
			conn = conn[i+len("://"):]
		}
		if eps, err = store.ParseEndpoints(conn); err != nil {
			return nil, usagef("invalid --ha-backend-connstring: %w", err)
		}
	case o.EtcdEndpoints != "":
		if eps, err = store.ParseEndpoints(o.EtcdEndpoints); err != nil {
			return nil, usagef("invalid --etcd-endpoints: %w", err)
		}
	default:
		return nil, usagef("--enable-ha needs etcd: give --ha-backend-connstring etcd://HOST:PORT or --etcd-endpoints HOST:PORT")
	}
	switch {
	case o.HALeaseTTL < 2*time.Second || o.HALeaseTTL%time.Second != 0:
		// etcd leases count whole seconds.
		return nil, usagef("invalid --ha-lease-ttl %s: want whole seconds, at least 2", o.HALeaseTTL)
	case o.HASnapshotInterval <= 0:
		return nil, usagef("invalid --ha-snapshot-interval %s: want a positive duration", o.HASnapshotInterval)
	case o.HASnapshotRecords <= 0:
		return nil, usagef("invalid --ha-snapshot-records %d: want 1 or more", o.HASnapshotRecords)
	}
	return &ha.Config{
		Endpoints: eps, ClusterID: o.ClusterID, LeaseTTL: o.HALeaseTTL,
		SnapshotInterval: o.HASnapshotInterval, SnapshotRecords: o.HASnapshotRecords,
	}, nil
}

// serveStoreInfo is what `mc serve store` prints once it serves.
type serveStoreInfo struct {
	Role         string `json:"role"`
	ClusterID    string `json:"cluster_id"`
	Master       string `json:"master"`
	Admin        string `json:"admin"`
	Segment      string `json:"segment"`
	SegmentBytes uint64 `json:"segment_bytes"`
	Endpoint     string `json:"te_endpoint"`
	Protocol     string `json:"protocol"`
	// Provider moves the segment's rdma bytes: "soft" (the software
	// NIC, over TCP sockets) or "ibverbs"; "" for other transports.
	Provider string `json:"provider"`
}

func runServeStore(ctx context.Context, o serveStoreOptions, p *printer) error {
	cfg, err := o.serverConfig()
	if err != nil {
		return err
	}
	if len(o.nodeIgnored) > 0 {
		// After the checks: a usage error comes alone.
		slog.Warn(fmt.Sprintf("%s given with --master: this process is a node and runs no master; ignored (give them to the master)", strings.Join(o.nodeIgnored, ", ")))
	}
	srv, err := server.Start(ctx, cfg)
	if err != nil {
		return fmt.Errorf("serve store: %w", err)
	}
	info := serveStoreInfo{Role: "master", ClusterID: o.ClusterID, Master: displayAddr(srv.RPCAddr), Admin: displayAddr(srv.AdminAddr)}
	switch {
	case srv.Candidate != nil:
		info.Role = "master candidate (HA)"
		if srv.Node != nil {
			info.Role += "+node"
		}
	case srv.Master == nil:
		info.Role = "node"
	case srv.Node != nil:
		info.Role = "master+node"
	}
	if srv.Node != nil {
		if seg, ok := srv.Node.Segment(); ok {
			info.Segment, info.SegmentBytes, info.Endpoint, info.Protocol = seg.Name, seg.Size, seg.Endpoint, seg.Protocol
			info.Provider = srv.Node.Engine().Provider(seg.Protocol)
		}
	}
	if p.JSON() {
		if err := p.PrintJSON(info); err != nil {
			return err
		}
	} else {
		rows := [][]string{{"role", info.Role}, {"cluster id", info.ClusterID}, {"master RPC", info.Master}}
		if info.Admin != "" {
			rows = append(rows, []string{"admin HTTP", "http://" + info.Admin})
		}
		if info.Segment != "" {
			rows = append(rows, []string{"segment", fmt.Sprintf("%s (%s, %s at %s)", info.Segment, humanBytes(info.SegmentBytes), engine.TransportLabel(info.Protocol, info.Provider), info.Endpoint)})
		}
		p.Table("", []string{"store", "value"}, rows)
		fmt.Fprintln(p.Out, "serving; SIGINT or SIGTERM stops")
	}
	if o.ready != nil {
		o.ready(srv)
	}
	<-ctx.Done()
	cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Close(cctx); err != nil {
		return fmt.Errorf("serve store: shutdown: %w", err)
	}
	return nil
}

// ---- mc store ----

type storeClientOptions struct {
	Data      storeDataOptions
	Master    string
	Admin     string
	Checksums bool
	AdminAuth adminTokenOptions
	Tenant    string
}

func (o *storeClientOptions) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Tenant, "tenant", store.DefaultTenant, "the tenant whose keys to use on a master with --enable-multi-tenants (Mooncake's tenant_id; ignored by a master without it)")
	envName(fs, "tenant", "MC_TENANT")
	fs.StringVar(&o.Master, "master", store.DefaultMaster, "master RPC address: host:port (mc's master), etcd://H:P[;H:P] to find the HA leader (cluster id from MC_STORE_CLUSTER_ID), or mooncake://H:P for a mooncake_master")
	fs.StringVar(&o.Admin, "admin", "", "master admin HTTP API (default: with etcd://, the address the leader publishes; else http://<master host>:9003)")
	o.AdminAuth.addFlags(fs, "bearer token for the admin API's state-changing calls, when the master has one")
	// Only where values move (put, get): see addChecksumFlag.
	o.Checksums = true
}

// addChecksumFlag gives a verb that moves values the --checksums flag.
func (o *storeClientOptions) addChecksumFlag(fs *pflag.FlagSet) {
	fs.BoolVar(&o.Checksums, "checksums", true, "record a CRC32C of each value put and check it before a get returns the bytes (mc's master; --checksums=false: neither)")
}

// storeRPCTimeout bounds each call of mc store's verbs to the master, and
// the wait for an HA leader during a failover.
const storeRPCTimeout = 5 * time.Second

func (o storeClientOptions) adminURL() (string, error) {
	if o.Admin != "" {
		return o.Admin, nil
	}
	addr := o.Master
	if store.IsMooncakeAddress(o.Master) {
		a, err := store.ParseMooncakeAddress(o.Master)
		if err != nil {
			return "", usagef("invalid --master: %w", err)
		}
		addr = a
	} else if store.IsEtcdAddress(o.Master) {
		if _, err := store.ParseEtcdAddress(o.Master); err != nil {
			return "", usagef("invalid --master: %w", err)
		}
		// The address the leader publishes in etcd (its admin port
		// may not be 9003), waiting through a failover as the RPC
		// verbs do.
		return store.LeaderAdminURL(context.Background(), o.Master, "", storeRPCTimeout)
	}
	h, _, err := net.SplitHostPort(addr)
	if err != nil {
		return "", usagef("invalid --master %q: want host:port, etcd://HOST:PORT[;HOST:PORT] or mooncake://HOST:PORT", o.Master)
	}
	return "http://" + net.JoinHostPort(h, "9003"), nil
}

// checkTenant refuses a --tenant Mooncake would (store.CheckTenant).
func (o storeClientOptions) checkTenant() error {
	if err := checkTenantName(store.ResolveTenant(o.Tenant)); err != nil {
		return usagef("invalid --tenant: %w", err)
	}
	return nil
}

// checkFlags refuses a malformed --master or --admin, data flag
// (--protocol, --metadata-server, ...) or admin token whichever of them
// the verb uses: a typo in one the verb does not need passed unseen, and
// the same line then failed under the next verb.
func (o storeClientOptions) checkFlags() error {
	if o.Master != "" {
		if err := checkMasterAddr(o.Master); err != nil {
			return err
		}
	}
	if o.Admin != "" {
		if _, err := store.NewAdmin(o.Admin); err != nil {
			return usagef("invalid --admin: %w", err)
		}
	}
	// Protocol is "" only on a verb without the data flags.
	if o.Data.Protocol != "" {
		if _, err := o.Data.engineConfig("0.0.0.0"); err != nil {
			return err
		}
	}
	if _, err := o.AdminAuth.token(); err != nil {
		return err
	}
	return nil
}

func (o storeClientOptions) admin() (*store.Admin, error) {
	if err := o.checkTenant(); err != nil {
		return nil, err
	}
	if err := o.checkFlags(); err != nil {
		return nil, err
	}
	u, err := o.adminURL()
	if err != nil {
		return nil, err
	}
	tok, err := o.AdminAuth.token()
	if err != nil {
		return nil, err
	}
	a, err := store.NewAdmin(u)
	if err != nil {
		if o.Admin != "" {
			return nil, usagef("invalid --admin: %w", err)
		}
		return nil, err
	}
	a.SetToken(tok)
	a.SetTenant(o.Tenant)
	return a, nil
}

func (o storeClientOptions) client(ctx context.Context) (*store.Client, error) {
	if err := o.checkTenant(); err != nil {
		return nil, err
	}
	if err := o.checkFlags(); err != nil {
		return nil, err
	}
	if err := checkMasterAddr(o.Master); err != nil {
		return nil, err
	}
	ecfg, err := o.Data.engineConfig("0.0.0.0")
	if err != nil {
		return nil, err
	}
	ecfg.NameWithPort = true // beside a node of this host under its name
	// A one-shot client waits for nobody: fail fast when the master is
	// not there.
	c, err := store.New(ctx, store.Config{Master: o.Master, EngineConfig: ecfg, RPCTimeout: storeRPCTimeout, Logger: quietLogger(), Checksums: o.Checksums, Tenant: o.Tenant})
	if err != nil {
		return nil, httpPortHint(o.Master, err)
	}
	return c, nil
}

// httpPortHint replaces err, a failed connection to master, with what
// went wrong when master's port answers HTTP: the admin API's port
// (9003) given for the RPC port, a mistake gRPC reports as a bad frame
// ("frame too large") and coro_rpc as a bad magic byte.
func httpPortHint(master string, err error) error {
	addr := master
	if store.IsMooncakeAddress(master) {
		a, perr := store.ParseMooncakeAddress(master)
		if perr != nil {
			return err
		}
		addr = a
	} else if store.IsEtcdAddress(master) {
		return err
	}
	conn, derr := net.DialTimeout("tcp", addr, time.Second)
	if derr != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Second))
	if _, werr := io.WriteString(conn, "HEAD / HTTP/1.0\r\n\r\n"); werr != nil {
		return err
	}
	head := make([]byte, 5)
	if _, rerr := io.ReadFull(conn, head); rerr != nil || string(head) != "HTTP/" {
		return err
	}
	return fmt.Errorf("--master %s is an HTTP port (a master's admin API, --metrics_port?), not a master's RPC port: give the master's --rpc_port (default 50051)", master)
}

func newStoreCmd(p *printer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "store",
		Short: "Use a KV-cache store: put, get, exists, rm, ls, stat, query, drain, events, tenants",
		Long: `store talks to a store master: mc serve store, or mooncake_master
(--master mooncake://H:P for put, get, exists and rm). put, get, exists and
rm use the master's RPC API and move the bytes with the transfer engine;
stat, query and ls (without --regex) read only the admin HTTP API, so they
also work against a real mooncake_master's admin port.`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(newStorePutCmd(p), newStoreGetCmd(p), newStoreExistsCmd(p), newStoreRmCmd(p),
		newStoreLsCmd(p), newStoreStatCmd(p), newStoreQueryCmd(p), newStoreDrainCmd(p), newStoreEventsCmd(p))
	cmd.AddCommand(newStoreReplayCmd(p), newStoreTenantsCmd(p))
	return cmd
}

type storePutOptions struct {
	storeClientOptions
	Replicas int
	SoftPin  bool
	HardPin  bool
	In       io.Reader
}

func newStorePutCmd(p *printer) *cobra.Command {
	var o storePutOptions
	cmd := &cobra.Command{
		Use:   "put KEY [FILE|-]",
		Short: "Store a file (or standard input) under KEY",
		Example: `  mc store put prefix/0001 block.bin
  echo hello | mc store put greeting - --replicas 2`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			src := "-"
			if len(args) == 2 {
				src = args[1]
			}
			o.In = cmd.InOrStdin()
			return runStorePut(cmd.Context(), o, args[0], src, p)
		},
	}
	o.storeClientOptions.addFlags(cmd.Flags())
	o.storeClientOptions.addChecksumFlag(cmd.Flags())
	o.Data.addFlags(cmd.Flags())
	cmd.Flags().IntVar(&o.Replicas, "replicas", 1, "copies on distinct segments (best effort: the output says when fewer were placed)")
	cmd.Flags().BoolVar(&o.SoftPin, "soft-pin", false, "keep it out of eviction for the master's soft-pin TTL, unless nothing else is left")
	cmd.Flags().BoolVar(&o.HardPin, "hard-pin", false, "keep it out of eviction until removed")
	return cmd
}

func runStorePut(ctx context.Context, o storePutOptions, key, src string, p *printer) error {
	// Before reading the value: "-" would wait on standard input first.
	if err := checkKeys("put", key); err != nil {
		return err
	}
	if o.Replicas < 1 || o.Replicas > store.MaxReplicas {
		return usagef("invalid --replicas %d: want 1 to %d", o.Replicas, store.MaxReplicas)
	}
	if o.SoftPin && o.HardPin {
		return usagef("--soft-pin and --hard-pin exclude each other: a hard-pinned object is never evicted, a soft-pinned one last")
	}
	var value []byte
	var err error
	if src == "-" {
		value, err = io.ReadAll(o.In)
	} else if src == "" {
		return usagef("put %q: the value's FILE is empty: give a file name, or - for standard input", key)
	} else if value, err = os.ReadFile(src); err != nil {
		return inputErr(fmt.Sprintf("put %q: value FILE", key), err)
	}
	if err != nil {
		return fmt.Errorf("put %q: read value: %w", key, err)
	}
	c, err := o.client(ctx)
	if err != nil {
		return fmt.Errorf("put %q: %w", key, err)
	}
	defer c.Close(context.Background())
	rc := store.ReplicateConfig{ReplicaNum: o.Replicas, SoftPin: o.SoftPin, HardPin: o.HardPin}
	if err := c.Put(ctx, key, value, store.WithConfig(rc)); err != nil {
		return fmt.Errorf("put %q: %w", key, err)
	}
	// What the engine counted, not what --protocol asked for: auto
	// falls back to tcp for a node on another host.
	via := c.Engine().Stats().Transport()
	// The master's yes is not the answer: the command promises a value
	// that can be read back, so it asks once more.
	reps, err := c.Query(ctx, key)
	switch {
	case store.CodeOf(err) == store.ObjectNotFound:
		return fmt.Errorf("put %q: the master acknowledged it, but it is gone already (evicted or removed at once): nothing is stored", key)
	case err != nil:
		return fmt.Errorf("put %q: acknowledged, but reading its replicas back failed: %w", key, err)
	case len(reps) == 0:
		return fmt.Errorf("put %q: acknowledged with no replica: nothing is stored", key)
	}
	warning := ""
	if len(reps) < o.Replicas {
		// --replicas is best effort (distinct segments with room).
		warning = fmt.Sprintf("fewer than the %d asked: each replica needs a distinct segment with room that the client could reach", o.Replicas)
	}
	if p.JSON() {
		j := map[string]any{"key": key, "size": len(value), "replicas": len(reps), "replicas_requested": o.Replicas, "transport": via, "warning": nil}
		addProvider(j, c.Engine(), via)
		if warning != "" {
			j["warning"] = warning
		}
		return p.PrintJSON(j)
	}
	if warning != "" {
		warning = " (" + warning + ")"
	}
	fmt.Fprintf(p.Out, "stored %q: %d bytes, %d replica(s)%s%s\n", key, len(value), len(reps), warning, viaNote(c.Engine().TransportLabel(via)))
	return nil
}

type storeGetOptions struct {
	storeClientOptions
	Dest  string // --file: a file, "-" or "" for stdout
	Force bool   // write a binary value to a terminal all the same
	Out   io.Writer
	tty   bool // Out is a terminal
}

func newStoreGetCmd(p *printer) *cobra.Command {
	var o storeGetOptions
	cmd := &cobra.Command{
		Use:   "get KEY [--file FILE]",
		Short: "Write KEY's value to standard output or a file",
		Long: `get reads KEY's value from one of its replicas (another one when a transfer
fails) and writes it to standard output, or to FILE with --file FILE (-f).
A value that is not text is not written to a terminal: give --file, redirect
standard output, or --force. -o json prints the value base64-encoded in a
JSON object instead, or, with --file, a JSON summary of what was written.

-o is the output format here as everywhere (table or json). The old
"-o FILE" still works for now, with a warning: use --file FILE.`,
		Example: `  mc store get prefix/0001 --file block.bin
  mc store get prefix/0001 > block.bin
  mc store get greeting
  mc store get greeting -o json`,
		Annotations: map[string]string{outputMayBeFile: "true"},
		Args:        cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Out = p.Out
			o.tty = isTerminal(p.Out)
			if f := cmd.Flag("output"); f != nil && f.Changed && f.Value.String() != "table" && f.Value.String() != "json" {
				// Before -o meant the output format everywhere, it
				// named get's file. Kept for scripts, with a warning.
				if o.Dest != "" {
					return usagef("invalid --output %q: want table or json (the file is --file %s)", f.Value.String(), o.Dest)
				}
				if f.Value.String() == "" {
					return usagef("invalid --output \"\": want table or json (a file is --file FILE)")
				}
				o.Dest = f.Value.String()
				fmt.Fprintf(p.Err, "mc: store get: warning: -o %s names a file: -o is the output format (table or json); use --file %s\n", o.Dest, o.Dest)
			}
			return runStoreGet(cmd.Context(), o, args[0], p)
		},
	}
	o.storeClientOptions.addFlags(cmd.Flags())
	o.storeClientOptions.addChecksumFlag(cmd.Flags())
	o.Data.addFlags(cmd.Flags())
	cmd.Flags().StringVarP(&o.Dest, "file", "f", "", "write the value to FILE (- or none: standard output)")
	cmd.Flags().BoolVar(&o.Force, "force", false, "write a binary value to a terminal all the same")
	_ = cmd.MarkFlagFilename("file")
	return cmd
}

// checkKeys refuses a key the master would refuse (store.CheckKey: empty,
// over store.MaxKeyLength bytes, a NUL byte) before anything connects or
// reads a value, with one message for every verb:
// store <verb>: invalid key "<key>": <why>.
func checkKeys(verb string, keys ...string) error {
	for i, k := range keys {
		err := store.CheckKey(k)
		if err == nil {
			continue
		}
		var se *store.Error
		why := err.Error()
		if errors.As(err, &se) {
			why = se.Msg
		}
		shown := strconv.Quote(k)
		if len(k) > 64 {
			// The whole of a 5000-byte key would bury the message.
			shown = strconv.Quote(k[:64]) + "..."
		}
		if len(keys) > 1 {
			shown += fmt.Sprintf(" (argument %d)", i+1)
		}
		return usagef("store %s: invalid key %s: %s", verb, shown, why)
	}
	return nil
}

// outputMayBeFile marks a command whose -o takes a file name besides the
// table|json formats (mc store get KEY -o FILE).
const outputMayBeFile = "mc_output_may_be_file"

func runStoreGet(ctx context.Context, o storeGetOptions, key string, p *printer) error {
	if err := checkKeys("get", key); err != nil {
		return err
	}
	c, err := o.client(ctx)
	if err != nil {
		return fmt.Errorf("get %q: %w", key, err)
	}
	defer c.Close(context.Background())
	v, err := c.Get(ctx, key)
	if err != nil {
		return fmt.Errorf("get %q: %w", key, err)
	}
	via := c.Engine().Stats().Transport()
	toStdout := o.Dest == "" || o.Dest == "-"
	switch {
	case p.JSON() && toStdout:
		j := map[string]any{"key": key, "size": len(v), "value_base64": base64.StdEncoding.EncodeToString(v), "file": nil, "transport": via}
		addProvider(j, c.Engine(), via)
		return p.PrintJSON(j)
	case toStdout:
		if o.tty && !o.Force && isBinary(v) {
			return usagef("get %q: the value is %d bytes of binary data, not written to a terminal: use --file FILE or redirect standard output, or --force", key, len(v))
		}
		_, err = o.Out.Write(v)
		return err
	}
	// Through a temporary file renamed into place, so an interrupted get
	// never leaves a partial value under the asked name.
	if err := writeFileWith(o.Dest, func(f *os.File) error { _, err := f.Write(v); return err }); err != nil {
		return fmt.Errorf("get %q: write %s: %w", key, o.Dest, err)
	}
	if p.JSON() {
		j := map[string]any{"key": key, "size": len(v), "value_base64": nil, "file": o.Dest, "transport": via}
		addProvider(j, c.Engine(), via)
		return p.PrintJSON(j)
	}
	fmt.Fprintf(p.Err, "wrote %d bytes to %s%s\n", len(v), o.Dest, viaNote(c.Engine().TransportLabel(via)))
	return nil
}

// addProvider adds "provider" to a JSON result: "soft" says the
// software NIC moved the rdma bytes, over TCP sockets; "" when rdma
// moved none.
func addProvider(j map[string]any, e *engine.Engine, via string) {
	j["provider"] = ""
	if slices.Contains(strings.Split(via, "+"), meta.ProtocolRDMA) {
		j["provider"] = e.Provider(meta.ProtocolRDMA)
	}
}

// isBinary reports whether a value would garble a terminal, as curl
// decides before refusing to print one: it has a NUL byte, or is not
// UTF-8 text.
func isBinary(v []byte) bool {
	return bytes.IndexByte(v, 0) >= 0 || !utf8.Valid(v)
}

// viaNote names the transports that moved a value's bytes ("" when none
// did: an empty value).
func viaNote(via string) string {
	if via == "" {
		return ""
	}
	return ", via " + via
}

func newStoreExistsCmd(p *printer) *cobra.Command {
	var o storeClientOptions
	cmd := &cobra.Command{
		Use:   "exists KEY",
		Short: "Exit 0 when KEY is stored, 1 when it is not (2 on error, 64 on a usage error)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkKeys("exists", args[0]); err != nil {
				return &exitError{code: 2, err: err}
			}
			c, err := o.client(cmd.Context())
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("exists %q: %w", args[0], err)}
			}
			defer c.Close(context.Background())
			ok, err := c.Exist(cmd.Context(), args[0])
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("exists %q: %w", args[0], err)}
			}
			if p.JSON() {
				if err := p.PrintJSON(map[string]any{"key": args[0], "exists": ok}); err != nil {
					return err
				}
			} else {
				fmt.Fprintf(p.Out, "%s: %s\n", args[0], map[bool]string{true: "exists", false: "not found"}[ok])
			}
			if !ok {
				return &exitError{code: 1}
			}
			return nil
		},
	}
	o.addFlags(cmd.Flags())
	o.Data.addFlags(cmd.Flags())
	return cmd
}

func newStoreRmCmd(p *printer) *cobra.Command {
	var o storeClientOptions
	var force, dryRun, all bool
	var pattern string
	cmd := &cobra.Command{
		Use:   "rm {KEY... | --regex RE | --all}",
		Short: "Remove keys, or the keys a pattern finds (refused while being read unless --force)",
		Long: `rm removes the keys given, or with --regex RE every stored key the pattern
finds anywhere in it (RE2 syntax, Go's regexp: ^model:llama@ for the keys
that start so, add $ to anchor the end), in one call to the master
(Mooncake's RemoveByRegex). A key being read holds a lease and is kept
unless --force. --dry-run lists what would go and what would be kept,
and removes nothing. The counts cover every match; the master lists at
most 16384 keys of each. --all removes every stored key not being read
(Mooncake's RemoveAll, in one call); a master with an admin token asks
for it (--admin-token, MC_ADMIN_TOKEN or --admin-token-file).

Exit status: 0 when every key went (or with --dry-run), 64 on a usage
error, 1 otherwise.`,
		Example: `  mc store rm prefix/0001 prefix/0002
  mc store rm --regex '^model:llama-70b@' --dry-run
  mc store rm --regex '^model:llama-70b@' --force
  MC_ADMIN_TOKEN=... mc store rm --all`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if all {
				switch {
				case len(args) > 0 || cmd.Flags().Changed("regex"):
					return usagef("store rm: --all removes every key: give no keys and no --regex with it")
				case force || dryRun:
					return usagef("store rm: --all takes neither --force nor --dry-run (it keeps the keys being read; --regex . --dry-run lists what it would find)")
				}
				return runStoreRmAll(cmd.Context(), o, p)
			}
			if cmd.Flags().Changed("regex") {
				if len(args) > 0 {
					return usagef("store rm: give keys or --regex, not both")
				}
				return runStoreRmRegex(cmd.Context(), o, pattern, force, dryRun, p)
			}
			switch {
			case len(args) == 0:
				return usagef("store rm: give the keys to remove, or --regex RE: usage: %s", cmd.UseLine())
			case dryRun:
				return usagef("store rm: --dry-run goes with --regex (the keys given are what would go)")
			}
			if err := checkKeys("rm", args...); err != nil {
				return err
			}
			c, err := o.client(cmd.Context())
			if err != nil {
				return fmt.Errorf("rm: %w", err)
			}
			defer c.Close(context.Background())
			errs := c.BatchRemove(cmd.Context(), args, force)
			var failed []error
			// One row per key given, under "removed" (its name since
			// the first release): Removed says whether this one went.
			type row struct {
				Key     string `json:"key"`
				Removed bool   `json:"removed"`
				Error   string `json:"error"`
			}
			rows := make([]row, len(args))
			for i, err := range errs {
				rows[i].Key, rows[i].Removed = args[i], err == nil
				if err != nil {
					rows[i].Error = err.Error()
					failed = append(failed, fmt.Errorf("rm %q: %w", args[i], err))
				}
			}
			if p.JSON() {
				if err := p.PrintJSON(map[string]any{"removed": rows}); err != nil {
					return err
				}
			} else {
				for _, r := range rows {
					if r.Error == "" {
						fmt.Fprintf(p.Out, "removed %q\n", r.Key)
					}
				}
			}
			return errors.Join(failed...)
		},
	}
	o.addFlags(cmd.Flags())
	o.Data.addFlags(cmd.Flags())
	cmd.Flags().BoolVar(&force, "force", false, "remove even while a read holds a lease")
	cmd.Flags().StringVar(&pattern, "regex", "", "remove every key this RE2 pattern finds (Go's regexp syntax, unanchored)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "with --regex: list what would be removed and kept, remove nothing")
	cmd.Flags().BoolVar(&all, "all", false, "remove every stored key not being read (needs the admin token when the master has one)")
	return cmd
}

// runStoreRmAll is `mc store rm --all`: the master's RemoveAll, with the
// admin token (gRPC metadata) when one is given.
func runStoreRmAll(ctx context.Context, o storeClientOptions, p *printer) error {
	tok, err := o.AdminAuth.token()
	if err != nil {
		return err
	}
	c, err := o.client(ctx)
	if err != nil {
		return fmt.Errorf("rm --all: %w", err)
	}
	defer c.Close(context.Background())
	n, err := c.RemoveAll(store.WithAdminToken(ctx, tok))
	if err != nil {
		return fmt.Errorf("rm --all: %w", err)
	}
	if p.JSON() {
		return p.PrintJSON(map[string]any{"removed_count": n})
	}
	fmt.Fprintf(p.Out, "removed %d key(s) (keys being read are kept)\n", n)
	return nil
}

// storeRmRegexJSON is `mc store rm --regex RE -o json`.
type storeRmRegexJSON struct {
	Pattern      string         `json:"pattern"`
	DryRun       bool           `json:"dry_run"`
	Removed      []string       `json:"removed"`
	RemovedCount uint64         `json:"removed_count"`
	Refused      []storeRefused `json:"refused"`
	RefusedCount uint64         `json:"refused_count"`
}

type storeRefused struct {
	Key   string `json:"key"`
	Error string `json:"error"`
}

func runStoreRmRegex(ctx context.Context, o storeClientOptions, pattern string, force, dryRun bool, p *printer) error {
	if pattern == "" {
		return usagef("store rm: --regex needs a pattern ('.' finds every key)")
	}
	c, err := o.client(ctx)
	if err != nil {
		return fmt.Errorf("rm --regex: %w", err)
	}
	defer c.Close(context.Background())
	rm, err := c.RemoveByRegex(ctx, pattern, force, dryRun)
	if err != nil {
		return regexErr("rm", pattern, err)
	}
	out := storeRmRegexJSON{Pattern: pattern, DryRun: dryRun, Removed: rm.Removed, RemovedCount: rm.RemovedCount,
		Refused: make([]storeRefused, len(rm.Refused)), RefusedCount: rm.RefusedCount}
	if out.Removed == nil {
		out.Removed = []string{}
	}
	for i, k := range rm.Refused {
		out.Refused[i] = storeRefused{k, rm.RefusedErrs[i].Error()}
	}
	verb, kept := "removed", "kept"
	if dryRun {
		verb, kept = "would remove", "would keep"
	}
	if p.JSON() {
		if err := p.PrintJSON(out); err != nil {
			return err
		}
	} else {
		for _, k := range out.Removed {
			fmt.Fprintf(p.Out, "%s %q\n", verb, k)
		}
		for _, r := range out.Refused {
			fmt.Fprintf(p.Out, "%s %q: %s\n", kept, r.Key, r.Error)
		}
		if more := out.RemovedCount + out.RefusedCount - uint64(len(out.Removed)+len(out.Refused)); more > 0 {
			fmt.Fprintf(p.Out, "(%d more not listed)\n", more)
		}
		fmt.Fprintf(p.Out, "%s %d key(s), %s %d, matching %q\n", verb, out.RemovedCount, kept, out.RefusedCount, pattern)
	}
	if !dryRun && out.RefusedCount > 0 {
		hint := ""
		if !force {
			hint = " (--force removes keys being read)"
		}
		return fmt.Errorf("rm --regex %q: kept %d of %d matching key(s)%s", pattern, out.RefusedCount, out.RemovedCount+out.RefusedCount, hint)
	}
	return nil
}

func newStoreLsCmd(p *printer) *cobra.Command {
	var o storeClientOptions
	var prefix, pattern string
	var allTenants bool
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List stored keys (admin API), or the keys a pattern finds (master RPC)",
		Long: `ls lists the stored keys, sorted, from the admin API (so it works against
mooncake_master too), those starting with --prefix if given. --regex RE
asks the master's RPC (--master) instead, for the keys the RE2 pattern
(Go's regexp syntax) finds anywhere in them, as Mooncake's
GetReplicaListByRegex, and says how many matched on standard error (in the
JSON output: matched); the master lists at most 16384 of them. Keys print
one to a line, Go-quoted when one breaks mc's key rule (a mooncake_master
stores any bytes) or starts with a quote.`,
		Example: `  mc store ls --prefix model:llama-70b@
  mc store ls --regex '^model:llama-70b@rank[0-3]/'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cmd.Flags().Changed("regex") {
				if prefix != "" {
					return usagef("store ls: give --prefix or --regex, not both")
				}
				if allTenants {
					// It listed plain keys of one tenant, with no word.
					return usagef("store ls: --all-tenants lists through the admin API, --regex through the master's RPC within one --tenant: give one of them")
				}
				return runStoreLsRegex(cmd.Context(), o, pattern, p)
			}
			// No engine runs without --regex: its data-path settings did
			// nothing, silently.
			if err := refuseGiven(cmd, "sets up the data path; ls reads the admin API and moves no bytes (it applies with --regex only if the master's RPC needs it)", "protocol", "device-name", "metadata-server", "bind-address", "local-hostname"); err != nil {
				return err
			}
			a, err := o.admin()
			if err != nil {
				return fmt.Errorf("ls: %w", err)
			}
			if allTenants {
				if cmd.Flags().Changed("tenant") {
					return usagef("store ls: give --tenant or --all-tenants, not both")
				}
				tks, err := a.KeysAllTenants(cmd.Context(), prefix)
				if err != nil {
					return fmt.Errorf("ls --all-tenants: %w", err)
				}
				if p.JSON() {
					if tks == nil {
						tks = []store.TenantKey{}
					}
					return p.PrintJSON(map[string]any{"keys": tks})
				}
				for _, tk := range tks {
					fmt.Fprintf(p.Out, "%s\t%s\n", tk.Tenant, listedKey(tk.Key))
				}
				return nil
			}
			keys, err := a.Keys(cmd.Context(), prefix)
			if err != nil {
				return fmt.Errorf("ls: %w", err)
			}
			if p.JSON() {
				if keys == nil {
					keys = []string{}
				}
				return p.PrintJSON(map[string]any{"keys": keys})
			}
			for _, k := range keys {
				fmt.Fprintln(p.Out, listedKey(k))
			}
			return nil
		},
	}
	o.addFlags(cmd.Flags())
	o.Data.addFlags(cmd.Flags())
	cmd.Flags().StringVar(&prefix, "prefix", "", "only keys starting with this")
	cmd.Flags().StringVar(&pattern, "regex", "", "only keys this RE2 pattern finds (Go's regexp syntax, unanchored), through the master's RPC")
	cmd.Flags().BoolVar(&allTenants, "all-tenants", false, "every tenant's keys, one \"TENANT<TAB>KEY\" a line (an mc master with --enable-multi-tenants)")
	return cmd
}

// listedKey is a key as mc store ls prints it, one to a line: as it is
// when mc's key rule (store.CheckKey) allows it, Go-quoted when not (a
// mooncake_master stores any bytes) or when it starts with a quote, so
// that no line reads as two keys or as another key.
func listedKey(k string) string {
	if store.CheckKey(k) != nil || strings.HasPrefix(k, `"`) {
		return strconv.Quote(k)
	}
	return k
}

// regexErr is a failed regex call: a pattern the master refused
// (INVALID_PARAMS: it does not compile, or is too long) is the caller's
// mistake, a usage error, whichever master's dialect judged it.
func regexErr(verb, pattern string, err error) error {
	if store.CodeOf(err) == store.InvalidParams {
		return usagef("%s: invalid --regex %q: %w", verb, pattern, err)
	}
	return fmt.Errorf("%s --regex %q: %w", verb, pattern, err)
}

func runStoreLsRegex(ctx context.Context, o storeClientOptions, pattern string, p *printer) error {
	if pattern == "" {
		return usagef("store ls: --regex needs a pattern ('.' finds every key)")
	}
	c, err := o.client(ctx)
	if err != nil {
		return fmt.Errorf("ls --regex: %w", err)
	}
	defer c.Close(context.Background())
	m, err := c.GetReplicaListByRegex(ctx, pattern)
	if err != nil {
		return regexErr("ls", pattern, err)
	}
	if p.JSON() {
		keys := m.Keys
		if keys == nil {
			keys = []string{}
		}
		return p.PrintJSON(map[string]any{"pattern": pattern, "keys": keys, "matched": m.Matched})
	}
	for _, k := range m.Keys {
		fmt.Fprintln(p.Out, listedKey(k))
	}
	// On standard error, so that the listing pipes as plain ls does.
	if m.Matched > uint64(len(m.Keys)) {
		fmt.Fprintf(p.Err, "%d key(s) match %q; the master listed the first %d\n", m.Matched, pattern, len(m.Keys))
	} else {
		fmt.Fprintf(p.Err, "%d key(s) match %q\n", m.Matched, pattern)
	}
	return nil
}

// storeStat is `mc store stat -o json`.
type storeStat struct {
	Segments      []store.SegmentDetail `json:"segments"`
	Keys          int64                 `json:"keys"`
	UsedBytes     uint64                `json:"used_bytes"`
	CapacityBytes uint64                `json:"capacity_bytes"`
	EvictedKeys   int64                 `json:"evicted_keys"`
	EvictedBytes  int64                 `json:"evicted_bytes"`
	Evictions     int64                 `json:"evictions"`
	// EvictionAttempts counts eviction rounds (master_attempted_evictions_total);
	// EvictionPhases splits the evicted keys by phase: watermark (the
	// background loop), own_regions, other_regions and policy (inside
	// puts), offload (written to a node's disk tier first, by any of
	// them), stage (room for a disk read on its node), tenant_quota (a
	// tenant's own objects, for its put over quota).
	EvictionAttempts int64            `json:"eviction_attempts"`
	EvictionPhases   map[string]int64 `json:"evicted_keys_by_phase"`
	Clients          int64            `json:"active_clients"`
	// Role: leader or standby (HA masters), standalone (a master
	// without HA), unknown (no /role).
	Role   string           `json:"role"`
	Leader store.LeaderInfo `json:"leader"`
	// DiskTiers are the nodes' disk tiers (mc masters; empty without
	// any), DiskTier the master's counters for them.
	DiskTiers []store.AdminTier      `json:"disk_tiers"`
	DiskTier  *store.AdminTierTotals `json:"disk_tier"`
	// Tenants: each tenant's objects, charged bytes and quota, on a
	// master with --enable-multi-tenants (empty otherwise).
	Tenants []store.TenantQuota `json:"tenants"`
}

// phaseSummary is stat's line of evicted keys per phase: every phase
// the master names, zeros too, so a column is always where it was.
func phaseSummary(ph map[string]int64) string {
	names := map[string]string{"own_regions": "own regions", "other_regions": "other regions",
		"offload": "offloaded to disk", "stage": "disk-read staging", "tenant_quota": "tenant quota"}
	parts := make([]string, 0, len(master.Phases))
	for _, p := range master.Phases {
		name := names[p]
		if name == "" {
			name = p
		}
		parts = append(parts, fmt.Sprintf("%s %d", name, ph[p]))
	}
	return strings.Join(parts, ", ")
}

func newStoreStatCmd(p *printer) *cobra.Command {
	var o storeClientOptions
	cmd := &cobra.Command{
		Use:   "stat",
		Short: "Segments with used/capacity, keys, evictions and the leader (admin API)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// stat is of the whole pool: a --tenant did nothing.
			if err := refuseGiven(cmd, "picks the keys a verb uses; stat reports the whole pool (every tenant)", "tenant"); err != nil {
				return err
			}
			a, err := o.admin()
			if err != nil {
				return fmt.Errorf("stat: %w", err)
			}
			return runStoreStat(cmd.Context(), a, p)
		},
	}
	o.addFlags(cmd.Flags())
	return cmd
}

func runStoreStat(ctx context.Context, a *store.Admin, p *printer) error {
	segs, err := a.Segments(ctx)
	if err != nil {
		return fmt.Errorf("stat: %w", err)
	}
	m, err := a.Metrics(ctx)
	if err != nil {
		return fmt.Errorf("stat: %w", err)
	}
	s := storeStat{Segments: segs}
	if s.Segments == nil {
		s.Segments = []store.SegmentDetail{}
	}
	s.Keys = int64(m["master_key_count"])
	s.EvictedKeys = int64(m["master_evicted_key_count"])
	s.EvictedBytes = int64(m["master_evicted_size_bytes"])
	s.Evictions = int64(m["master_successful_evictions_total"])
	s.EvictionAttempts = int64(m["master_attempted_evictions_total"])
	s.EvictionPhases = map[string]int64{}
	for _, phase := range master.Phases {
		if v, ok := m[`master_eviction_keys_total{phase="`+phase+`"}`]; ok {
			s.EvictionPhases[phase] = int64(v)
		}
	}
	s.Clients = int64(m["master_active_clients"])
	for _, g := range segs {
		s.UsedBytes += g.Used
		s.CapacityBytes += g.Capacity
	}
	// Mooncake masters without HA may lack these; they are optional.
	s.Role, _ = a.Role(ctx)
	s.Leader, _ = a.Leader(ctx)
	s.Role = statRole(s.Role, s.Leader)
	s.DiskTiers = []store.AdminTier{}
	if tiers, totals, ok, err := a.Tiers(ctx); err != nil {
		return fmt.Errorf("stat: %w", err)
	} else if ok {
		s.DiskTiers, s.DiskTier = tiers, &totals
	}
	// A master without multi-tenant mode answers 409 (404: older ones).
	s.Tenants, _ = a.TenantQuotas(ctx)
	if s.Tenants == nil {
		s.Tenants = []store.TenantQuota{}
	}
	if p.JSON() {
		return p.PrintJSON(s)
	}
	rows := make([][]string, 0, len(segs))
	for _, g := range segs {
		rows = append(rows, []string{g.Name, g.Endpoint, g.Protocol, g.Status,
			humanBytes(g.Used), humanBytes(g.Capacity), fmt.Sprintf("%.1f%%", g.UsagePercent)})
	}
	p.Table("segments", []string{"segment", "endpoint", "protocol", "status", "used", "capacity", "use"}, rows)
	leader := "none (no HA view)"
	if s.Role == roleStandalone {
		leader = "none (not an HA master: it serves alone)"
	}
	if s.Leader.Present && s.Leader.Address != nil {
		leader = *s.Leader.Address
		if s.Leader.ViewVersion != nil {
			leader += fmt.Sprintf(" (view %d)", *s.Leader.ViewVersion)
		}
	}
	p.Table("", []string{"store", "value"}, [][]string{
		{"keys", strconv.FormatInt(s.Keys, 10)},
		{"used / capacity", humanBytes(s.UsedBytes) + " / " + humanBytes(s.CapacityBytes)},
		{"evicted keys", strconv.FormatInt(s.EvictedKeys, 10)},
		{"evicted bytes", humanBytes(uint64(s.EvictedBytes))},
		{"eviction rounds (attempted / evicting)", fmt.Sprintf("%d / %d", s.EvictionAttempts, s.Evictions)},
		{"evicted keys by phase", phaseSummary(s.EvictionPhases)},
		{"clients", strconv.FormatInt(s.Clients, 10)},
		{"role", s.Role},
		{"leader", leader},
	})
	printDiskTiers(p, s)
	if len(s.Tenants) > 0 {
		rows := make([][]string, 0, len(s.Tenants))
		for _, q := range s.Tenants {
			rows = append(rows, []string{q.TenantID, strconv.FormatUint(q.Objects, 10), humanBytes(q.ChargedBytes),
				humanBytes(q.EffectiveQuotaBytes), strconv.FormatBool(q.OverQuota)})
		}
		p.Table("tenants", []string{"tenant", "objects", "bytes", "quota", "over_quota"}, rows)
	}
	return nil
}

// roleStandalone is the role `mc store stat` shows for a master without
// HA: its /role says "leader" (as mooncake_master's does), but no election
// made it one and no view names it.
const roleStandalone = "standalone"

// statRole is the role stat reports: the master's /role, except that a
// "leader" with no HA view is a master without HA (an HA leader always
// has the view it wrote), and an unanswered /role is "unknown".
func statRole(role string, l store.LeaderInfo) string {
	switch {
	case role == "":
		return "unknown"
	case role == "leader" && !l.Present:
		return roleStandalone
	}
	return role
}

func newStoreQueryCmd(p *printer) *cobra.Command {
	var o storeClientOptions
	cmd := &cobra.Command{
		Use:   "query KEY...",
		Short: "Show keys' replicas without taking a lease (admin API)",
		Long: `query reads a key's replicas from the admin API (/query_key), several keys'
in one request (/batch_query_keys, which cannot carry a key with a comma).
Keys go as they are but for what a query must escape (&, #, %, +, space,
control and non-ASCII bytes), so keys with /, : and @ are found on
mooncake_master, whose /query_key does not decode its value.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkKeys("query", args...); err != nil {
				return err
			}
			a, err := o.admin()
			if err != nil {
				return fmt.Errorf("query: %w", err)
			}
			return runStoreQuery(cmd.Context(), a, args, p)
		},
	}
	o.addFlags(cmd.Flags())
	return cmd
}

// storeQueryReplica is a replica in `mc store query -o json`.
type storeQueryReplica struct {
	Endpoint string `json:"endpoint"`
	Protocol string `json:"protocol"`
	Address  string `json:"address"`
	Size     uint64 `json:"size"`
}

// storeQueryResult is one key of `mc store query K1 K2 -o json`.
type storeQueryResult struct {
	Key      string              `json:"key"`
	Replicas []storeQueryReplica `json:"replicas"`
	Error    string              `json:"error"`
}

func queryReplicas(reps []store.AdminReplica) ([]storeQueryReplica, [][]string) {
	out := make([]storeQueryReplica, len(reps))
	rows := make([][]string, len(reps))
	for i, r := range reps {
		out[i] = storeQueryReplica{r.Endpoint, r.Protocol, fmt.Sprintf("0x%x", r.Addr), r.Size}
		rows[i] = []string{r.Endpoint, r.Protocol, out[i].Address, strconv.FormatUint(r.Size, 10)}
	}
	return out, rows
}

func runStoreQuery(ctx context.Context, a *store.Admin, keys []string, p *printer) error {
	header := []string{"endpoint", "protocol", "address", "bytes"}
	if len(keys) == 1 {
		reps, disk, err := a.QueryKeyReplicas(ctx, keys[0])
		if err != nil {
			return fmt.Errorf("query %q: %w", keys[0], err)
		}
		out, rows := queryReplicas(reps)
		// A replica on a node's disk tier: read through that node's
		// segment when a get needs it.
		for _, d := range disk {
			where := fmt.Sprintf("disk tier %s, version %d", d.TierID, d.Version)
			if !d.Connected {
				where += " (node away)"
			}
			rows = append(rows, []string{d.Endpoint, "local_disk", where, strconv.FormatUint(d.Size, 10)})
		}
		if p.JSON() {
			if disk == nil {
				disk = []store.AdminDiskReplica{}
			}
			return p.PrintJSON(map[string]any{"key": keys[0], "replicas": out, "disk_replicas": disk})
		}
		p.Table(keys[0], header, rows)
		return nil
	}
	res, err := a.BatchQuery(ctx, keys)
	if err != nil {
		return fmt.Errorf("query: %w", err)
	}
	results := make([]storeQueryResult, len(keys))
	var failed []error
	for i, k := range keys {
		r, ok := res[k]
		switch {
		case !ok:
			r.Error = "no answer for this key"
		case !r.OK && r.Error == "":
			r.Error = "not found"
		}
		out, rows := queryReplicas(r.Replicas)
		results[i] = storeQueryResult{Key: k, Replicas: out, Error: r.Error}
		if r.Error != "" {
			failed = append(failed, fmt.Errorf("query %q: %s", k, r.Error))
			continue
		}
		if !p.JSON() {
			p.Table(k, header, rows)
		}
	}
	if p.JSON() {
		if err := p.PrintJSON(map[string]any{"results": results}); err != nil {
			return err
		}
	}
	return errors.Join(failed...)
}

// quietLogger drops the info lines a short-lived client would print
// (engine start, pings) unless --log-level debug asked for them.
func quietLogger() *slog.Logger {
	h := slog.Default().Handler()
	if h.Enabled(context.Background(), slog.LevelDebug) {
		return slog.Default()
	}
	return slog.New(minLevel{h, slog.LevelWarn})
}

type minLevel struct {
	slog.Handler
	min slog.Level
}

func (h minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && h.Handler.Enabled(ctx, l)
}

// humanBytes prints a byte count in binary units with one decimal
// (3000000 -> 2.9 MiB), exact below 1 KiB.
func humanBytes(n uint64) string {
	if n < 1024 {
		return strconv.FormatUint(n, 10) + " B"
	}
	v, unit := float64(n), 0
	for v >= 1024 && unit < 5 {
		v /= 1024
		unit++
	}
	return strconv.FormatFloat(v, 'f', 1, 64) + " " + []string{"", "KiB", "MiB", "GiB", "TiB", "PiB"}[unit]
}

// displayAddr shows a wildcard listener as 0.0.0.0:port, which reads as
// "every interface" to operators, not Go's [::]:port.
func displayAddr(a string) string {
	h, port, err := net.SplitHostPort(a)
	if err != nil || (h != "::" && h != "") {
		return a
	}
	return net.JoinHostPort("0.0.0.0", port)
}

// ---- mc store replay ----

type storeReplayOptions struct {
	storeClientOptions
	Trace      string
	Policies   []string
	Capacities []string
	Online     bool
	BlockBytes int64
	// The disk tier under the cache (two-tier replay).
	SSDCapacities []string
	PromoteAfter  int
	// AllowEvict runs an online replay that would make the store evict
	// keys that are not the run's.
	AllowEvict bool
	// HighWatermark is the store's eviction watermark (replayFits).
	HighWatermark float64
}

// replayProgress follows an online replay of n requests: a go-pretty bar
// on a terminal, else a line on stderr at every tenth of the trace (none
// with -o json). stop ends the bar.
func replayProgress(p *printer, n int) (func(requests, blocks, hits int), func()) {
	ratio := func(blocks, hits int) float64 {
		if blocks == 0 {
			return 0
		}
		return float64(hits) / float64(blocks)
	}
	switch {
	case p.JSON():
		return nil, func() {}
	case isTerminal(p.Out):
		pw := startProgress(p.Out, 40)
		pw.Style().Visibility.Percentage = true
		tr := &progress.Tracker{Total: int64(n), Units: progress.UnitsDefault, Message: fmt.Sprintf("online replay, %d requests", n)}
		pw.AppendTracker(tr)
		return func(requests, blocks, hits int) {
			tr.UpdateMessage(fmt.Sprintf("block hit ratio %.3f", ratio(blocks, hits)))
			tr.SetValue(int64(requests))
		}, func() { stopProgress(pw, tr) }
	}
	step := max(n/10, 1)
	return func(requests, blocks, hits int) {
		if requests%step == 0 || requests == n {
			fmt.Fprintf(p.Err, "replay: %d/%d requests, block hit ratio %.3f\n", requests, n, ratio(blocks, hits))
		}
	}, func() {}
}

// storeReplayJSON is `mc store replay -o json`; online is set with
// --online.
type storeReplayJSON struct {
	Results []replay.Result      `json:"results"`
	Online  *replay.OnlineResult `json:"online"`
	// Interrupted: the online run was stopped (SIGINT/SIGTERM); its
	// figures cover the requests made until then.
	Interrupted bool `json:"interrupted"`
}

func newStoreReplayCmd(p *printer) *cobra.Command {
	var o storeReplayOptions
	cmd := &cobra.Command{
		Use:   "replay --trace FILE",
		Short: "Replay a request trace through eviction policies (offline) or against a store (--online)",
		Long: `replay runs a KV-cache request trace (Mooncake FAST'25 format: one JSON
object per line with timestamp, input_length, output_length, hash_ids)
through the eviction policies the store's master uses, and prints the block
hit ratio and the prefix hit ratio (each request's leading run of hits) per
policy and capacity. Requests go in timestamp order; a block hits when it
is cached when its request arrives; then the request's blocks are touched in
order, inserted when absent, evicting per the policy when full.

--online drives a running store instead (--master): per request it checks
every block's key, reads the hits and writes the misses (--block-bytes
each), and reports hit ratios, bytes moved and GB/s. Size the store to C
blocks and give --capacity-blocks C to print the offline figures at C next
to it. Each run writes under a prefix of its own (replay/<run id>/), so no
earlier run's keys count as hits, and removes its keys when it ends (on
SIGINT too: the rows are printed, the online one marked partial, and the
run exits 130). A replay past the store's eviction watermark
makes the store evict keys of its choosing: on a store that holds other
keys, one whose trace's distinct blocks do not fit below the watermark is
refused unless --allow-evict. Progress: a bar on a terminal, else a line
on stderr at every tenth of the trace.

--ssd-capacity-blocks S puts a disk tier of S blocks under the cache (every
C with every S): the tiers are exclusive, a block evicted from DRAM moves
to the disk (which drops its least recent block when full), and a block
found on disk is a hit that moves back to DRAM on its --promote-after-th
disk read. Rows then split the hit ratio into DRAM and disk hits. Under lru
with --promote-after 1 the two tiers behave as one LRU of C+S blocks. With
--online the split comes from the master's mem_cache_hit_nums_ and
file_cache_hit_nums_ (its admin API: --admin, or port 9003 of --master).`,
		Example: `  mc store replay --trace testdata/traces/conversation_trace.jsonl --policy lru,lfu,length-aware --capacity-blocks inf,30000,10000
  mc store replay --trace testdata/traces/conversation_trace.jsonl --online --master 127.0.0.1:50051 --block-bytes 64K --capacity-blocks 10000
  mc store replay --trace testdata/traces/conversation_trace.jsonl --capacity-blocks 10000,30000 --ssd-capacity-blocks 0,50000 --promote-after 2`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !o.Online {
				// Flags that concern a store, given to an offline
				// replay, were ignored without a word.
				if err := refuseGiven(cmd, "concerns a running store: give --online with it (without it the replay runs the policies offline)",
					"master", "admin", "block-bytes", "tenant", "protocol", "allow-evict", "eviction-high-watermark-ratio",
					"device-name", "metadata-server", "bind-address", "local-hostname", "admin-token", "admin-token-file"); err != nil {
					return err
				}
			}
			if o.HighWatermark <= 0 || o.HighWatermark > 1 {
				return usagef("invalid --eviction-high-watermark-ratio %g: want a fraction in (0, 1]", o.HighWatermark)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return runStoreReplay(ctx, o, p)
		},
	}
	f := cmd.Flags()
	o.addFlags(f)
	o.Data.addFlags(f)
	f.StringVar(&o.Trace, "trace", "", "trace file, one JSON request per line (- for stdin)")
	f.StringSliceVar(&o.Policies, "policy", []string{"lru"}, "eviction policies to compare: "+strings.Join(policy.Names, ", "))
	f.StringSliceVar(&o.Capacities, "capacity-blocks", []string{"inf"}, "cache sizes in blocks (inf: unbounded)")
	f.BoolVar(&o.Online, "online", false, "drive the store at --master with the trace")
	sizeVar(f, &o.BlockBytes, "block-bytes", 64<<10, "--online: bytes of one block's value")
	f.StringSliceVar(&o.SSDCapacities, "ssd-capacity-blocks", []string{"0"}, "disk tier sizes in blocks under the cache (0: none)")
	f.IntVar(&o.PromoteAfter, "promote-after", master.DefaultPromoteAfter, "the disk read that moves a block back to DRAM (0: never), as the store's --promote-after")
	f.BoolVar(&o.AllowEvict, "allow-evict", false, "--online: run even when the trace does not fit below the store's eviction watermark and the store holds other keys (it evicts them)")
	f.Float64Var(&o.HighWatermark, "eviction-high-watermark-ratio", master.DefaultHighWatermark, "--online: the store's eviction watermark (its master's --eviction_high_watermark_ratio; mooncake_master's default is 0.95), which the replay must stay below unless --allow-evict")
	_ = cmd.MarkFlagFilename("trace", "jsonl")
	_ = cmd.RegisterFlagCompletionFunc("policy", cobra.FixedCompletions(policy.Names, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

// replayFits refuses an online replay that would make a store holding
// other keys evict them: a replay fills the store with the trace's
// blocks, and past the store's eviction watermark the store evicts
// whatever its policy picks, the run's keys or anyone's. A store that
// holds nothing (one of the run's own), or room enough for every
// distinct block, is fine.
func (o storeReplayOptions) replayFits(ctx context.Context, t *replay.Trace, block int64) error {
	a, err := o.admin()
	if err != nil {
		return err
	}
	segs, err := a.Segments(ctx)
	if err != nil {
		return fmt.Errorf("store replay --online: read the store's capacity and use from its admin API, to make sure the replay does not evict other keys (give --admin, or --allow-evict to run anyway): %w", err)
	}
	var capacity, used uint64
	for _, sg := range segs {
		capacity += sg.Capacity
		used += sg.Used
	}
	per := (uint64(block) + alloc.Align - 1) / alloc.Align * alloc.Align
	need := uint64(t.Distinct) * per
	below := uint64(o.HighWatermark * float64(capacity))
	if used == 0 || used+need <= below {
		return nil
	}
	return fmt.Errorf("store replay --online: the trace's %d distinct blocks of %s take %s, more than the room below the store's eviction watermark (%g of %s), and the store holds %s of other keys, which the replay would make it evict: run it on a store of its own, or give --allow-evict",
		t.Distinct, humanBytes(uint64(block)), humanBytes(need), o.HighWatermark, humanBytes(capacity), humanBytes(used))
}

func parseCapacities(list []string) ([]int, error) {
	out := make([]int, 0, len(list))
	for _, s := range list {
		s = strings.TrimSpace(s)
		if strings.EqualFold(s, "inf") {
			out = append(out, 0)
			continue
		}
		n, err := strconv.Atoi(s)
		if errors.Is(err, strconv.ErrRange) && !strings.HasPrefix(s, "-") {
			return nil, usagef("invalid --capacity-blocks %q: too large (at most %d blocks, or inf)", s, math.MaxInt)
		}
		if err != nil || n <= 0 {
			return nil, usagef("invalid --capacity-blocks %q: want a positive number of blocks or inf", s)
		}
		out = append(out, n)
	}
	return out, nil
}

func readTrace(path string) (*replay.Trace, error) {
	if path == "-" {
		t, err := replay.Read(os.Stdin)
		if err != nil {
			return nil, fmt.Errorf("trace on stdin: %w", err)
		}
		return t, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, inputErr("--trace", err)
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.IsDir() {
		return nil, usagef("--trace %s: is a directory, want a file", path)
	}
	t, err := replay.Read(f)
	if err != nil {
		return nil, fmt.Errorf("trace %s: %w", path, err)
	}
	return t, nil
}

func runStoreReplay(ctx context.Context, o storeReplayOptions, p *printer) error {
	if o.Trace == "" {
		return usagef("store replay: --trace is required (a FAST'25 trace, e.g. testdata/traces/conversation_trace.jsonl in mc's repository after 'make traces')")
	}
	caps, err := parseCapacities(o.Capacities)
	if err != nil {
		return err
	}
	ssds, err := parseSSDCapacities(o.SSDCapacities)
	if err != nil {
		return err
	}
	if o.PromoteAfter < 0 {
		return usagef("invalid --promote-after %d: want the disk read that promotes (1, 2, ...) or 0 for never", o.PromoteAfter)
	}
	for _, name := range o.Policies {
		if _, err := policy.New[int](name); err != nil {
			return usagef("invalid --policy: %w", err)
		}
	}
	var block int64
	if o.Online {
		if block = o.BlockBytes; block <= 0 {
			return usagef("invalid --block-bytes %d: want more than 0 bytes", block)
		}
		if len(caps) > 1 {
			return usagef("--online replays one store: give at most one --capacity-blocks (its size in blocks)")
		}
		if len(o.Policies) > 1 {
			return usagef("--online uses the store's own policy: give at most one --policy (to label it and for the offline figures)")
		}
		if len(ssds) > 1 {
			return usagef("--online replays one store: give at most one --ssd-capacity-blocks (its nodes' disk tiers in blocks)")
		}
	}
	t, err := readTrace(o.Trace)
	if err != nil {
		return err
	}
	out := storeReplayJSON{Results: []replay.Result{}}
	if !o.Online || caps[0] > 0 {
		for _, name := range o.Policies {
			for _, c := range caps {
				for _, s := range ssds {
					r, err := replay.RunTiered(t, name, c, s, o.PromoteAfter)
					if err != nil {
						return err
					}
					out.Results = append(out.Results, r)
				}
			}
		}
	}
	if o.Online {
		interrupted := func(err error) error {
			if ctx.Err() != nil {
				return &exitError{code: exitInterrupted, err: fmt.Errorf("store replay: interrupted before the online replay started (nothing written)")}
			}
			return err
		}
		if !o.AllowEvict {
			if err := o.replayFits(ctx, t, block); err != nil {
				return interrupted(err)
			}
		}
		c, err := o.client(ctx)
		if err != nil {
			return interrupted(err)
		}
		defer c.Close(context.Background())
		ocfg := replay.OnlineConfig{BlockBytes: int(block), Label: o.Policies[0], CapacityBlocks: caps[0], SSDCapacityBlocks: ssds[0], PromoteAfter: o.PromoteAfter}
		if ssds[0] > 0 {
			if ocfg.TierHits, err = o.tierHits(); err != nil {
				return err
			}
		}
		var stop func()
		ocfg.Progress, stop = replayProgress(p, len(t.Blocks))
		r, err := replay.Online(ctx, c, t, ocfg)
		stop()
		if ctx.Err() != nil {
			// The rows so far first, as the bench verbs do.
			out.Online, out.Interrupted = &r, true
			if perr := printReplay(p, out, ssds); perr != nil {
				return perr
			}
			return &exitError{code: exitInterrupted, err: fmt.Errorf("store replay: interrupted after %d of %d requests (the online row covers those); removed the run's %d keys under %q",
				r.Requests, len(t.Blocks), r.KeysRemoved, r.KeyPrefix)}
		}
		if err != nil {
			return fmt.Errorf("online replay: %w (removed the run's %d keys under %q)", err, r.KeysRemoved, r.KeyPrefix)
		}
		out.Online = &r
	}
	return printReplay(p, out, ssds)
}

// printReplay prints store replay's rows: JSON, or the offline and online
// rows and the online run's figures.
func printReplay(p *printer, out storeReplayJSON, ssds []int) error {
	if p.JSON() {
		return p.PrintJSON(out)
	}
	capName := func(c int) string {
		if c == 0 {
			return "inf"
		}
		return strconv.Itoa(c)
	}
	tiered := slices.ContainsFunc(ssds, func(s int) bool { return s > 0 })
	row := func(mode string, r replay.Result) []string {
		cells := []string{mode, r.Policy, capName(r.CapacityBlocks), strconv.Itoa(r.Requests), strconv.Itoa(r.Blocks),
			strconv.Itoa(r.HitBlocks), strconv.FormatFloat(r.HitRatio, 'f', 3, 64), strconv.FormatFloat(r.PrefixHitRatio, 'f', 3, 64)}
		if tiered {
			cells = slices.Insert(cells, 3, strconv.Itoa(r.SSDCapacityBlocks))
			cells = append(cells, strconv.FormatFloat(r.DRAMHitRatio, 'f', 3, 64), strconv.FormatFloat(r.DiskHitRatio, 'f', 3, 64))
		}
		return cells
	}
	var rows [][]string
	for _, r := range out.Results {
		rows = append(rows, row("offline", r))
	}
	if out.Online != nil {
		mode := "online"
		if out.Interrupted {
			mode = "online (partial)"
		}
		rows = append(rows, row(mode, out.Online.Result))
	}
	head := []string{"mode", "policy", "capacity (blocks)", "requests", "blocks", "hit blocks", "hit ratio", "prefix hit ratio"}
	if tiered {
		head = slices.Insert(head, 3, "ssd (blocks)")
		head = append(head, "DRAM hit ratio", "disk hit ratio")
	}
	p.Table("", head, rows)
	if r := out.Online; r != nil {
		p.Table("online", []string{"bytes read", "bytes written", "seconds", "GB/s", "put failures", "get failures"}, [][]string{{
			humanBytes(r.BytesRead), humanBytes(r.BytesWritten), strconv.FormatFloat(r.Seconds, 'f', 2, 64),
			strconv.FormatFloat(r.GBPerSec, 'f', 3, 64), strconv.Itoa(r.PutFailures), strconv.Itoa(r.GetFailures)}})
		if !out.Interrupted {
			fmt.Fprintf(p.Out, "online replay: wrote under %q; removed the %d of its keys the store still held at the end\n", r.KeyPrefix, r.KeysRemoved)
		}
	}
	return nil
}
