// Package server runs what `mc serve store` starts: a master (RPC and
// admin HTTP), an HA master candidate (package ha), a node contributing a
// segment, or a master and a node in one process. It
// owns start-up order, the node's own metrics endpoint and graceful
// shutdown; the work is done by packages master and store.
package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvcache-ops/mc/pkg/connlimit"
	"github.com/kvcache-ops/mc/pkg/engine"
	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/ha"
	"github.com/kvcache-ops/mc/pkg/store/kvevents"
	"github.com/kvcache-ops/mc/pkg/store/master"
)

// Config says what to run.
type Config struct {
	// MasterAddr, when set, makes this process a node of that master
	// (host:port, or etcd://H:P[;H:P] to follow HA masters); otherwise it
	// runs a master on RPCAddress.
	MasterAddr string
	// ClusterID is the HA cluster a node given etcd:// follows (default
	// $MC_STORE_CLUSTER_ID, else mooncake_cluster).
	ClusterID string
	Master    master.Config
	// HA, when set, runs the master as an HA candidate (its Master,
	// RPCAddress and AdminAddress come from this Config).
	HA         *ha.Config
	RPCAddress string // master's gRPC listen address (host:port)
	// AdminAddress serves the admin HTTP API (master) or the node's own
	// /metrics and /health; "" disables it.
	AdminAddress string
	// SegmentSize > 0 contributes a segment of that size (with a master:
	// in the same process, reached by memcpy from local clients).
	SegmentSize uint64
	// Tier, when set, gives the node's segment a disk tier (--ssd-dir):
	// objects evicted from it are offloaded there.
	Tier   *store.TierConfig
	Engine engine.Config
	// MetricReporting logs the master's summary line every
	// ReportInterval (Mooncake's --enable_metric_reporting).
	MetricReporting bool
	// KVEvents, when set, publishes the master's KV events
	// (--enable_kv_events): the socket binds at start, before the RPC
	// listener; with HA, only a leader's master publishes.
	KVEvents       *kvevents.Config
	ReportInterval time.Duration
	PingInterval   time.Duration
	Logger         *slog.Logger
	// MaxConnections and MaxConnectionsPerHost cap the inbound
	// connections of the process, on all its listeners together, and
	// those of one remote host (--max-connections,
	// --max-connections-per-host); 0 derives each from the descriptor
	// limit (connlimit.DefaultLimits).
	MaxConnections, MaxConnectionsPerHost int
}

// Server is a running master and/or node.
type Server struct {
	Master    *master.Master  // nil for a node or an HA candidate
	Candidate *ha.Candidate   // an HA master candidate
	Node      *store.Client   // nil for a master only
	Tier      *store.TierNode // the node's disk tier, if any
	KVEvents  *kvevents.Publisher
	RPCAddr   string // the master's RPC address (this one, or the one the node uses)
	AdminAddr string
	log       *slog.Logger
	grpc      *master.GRPCServer
	admin     *http.Server
	stop      chan struct{}
	done      chan struct{}
}

// Start starts everything Config asks for and returns once it serves.
// leaderWait bounds how long a node started beside an HA candidate waits
// for a leader before mounting (which then waits its RPC timeout more).
const leaderWait = 30 * time.Second

func Start(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Master.Logger == nil {
		cfg.Master.Logger = cfg.Logger
	}
	s := &Server{log: cfg.Logger, stop: make(chan struct{}), done: make(chan struct{})}
	connCaps, err := setConnectionCaps(cfg)
	if err != nil {
		return nil, err
	}
	if cfg.Tier != nil {
		// First: a bad --ssd-dir fails before anything listens.
		if cfg.SegmentSize == 0 {
			return nil, errors.New("a disk tier needs a segment: give a segment size with the SSD directory")
		}
		tc := *cfg.Tier
		if tc.Logger == nil {
			tc.Logger = cfg.Logger
		}
		if tc.StagingSize == 0 {
			tc.StagingSize = store.DefaultStagingPool(cfg.SegmentSize)
		}
		t, err := store.OpenTier(tc)
		if err != nil {
			return nil, err
		}
		s.Tier = t
	}
	fail := func(err error) (*Server, error) {
		if s.Tier != nil {
			s.Tier.Close()
		}
		if s.KVEvents != nil {
			_ = s.KVEvents.Close()
		}
		return nil, err
	}
	if cfg.KVEvents != nil && cfg.MasterAddr == "" {
		kc := *cfg.KVEvents
		if kc.Logger == nil {
			kc.Logger = cfg.Logger
		}
		p, err := kvevents.New(kc)
		if err != nil {
			return fail(err)
		}
		s.KVEvents, cfg.Master.Events = p, p
	}
	var adminHandler http.Handler
	nodeMaster := cfg.MasterAddr
	switch {
	case cfg.MasterAddr == "" && cfg.HA != nil:
		hc := *cfg.HA
		hc.Master, hc.RPCAddress, hc.AdminAddress, hc.Logger = cfg.Master, cfg.RPCAddress, cfg.AdminAddress, cfg.Logger
		c, err := ha.Start(ctx, hc)
		if err != nil {
			return fail(err)
		}
		s.Candidate, s.RPCAddr, s.AdminAddr = c, c.RPCAddr, c.AdminAddr
		cfg.AdminAddress = "" // the candidate serves it
		nodeMaster = "etcd://" + strings.Join(hc.Endpoints, ";")
		cfg.ClusterID = hc.ClusterID
		s.log.Info(fmt.Sprintf("store master candidate on %s: campaigning for %s", c.RPCAddr, store.ViewKey(store.ClusterID(hc.ClusterID))))
		if cfg.SegmentSize > 0 && !c.WaitLeader(ctx, leaderWait) {
			s.log.Warn(fmt.Sprintf("no HA leader for %s after %s: mounting this node's segment anyway", store.ViewKey(store.ClusterID(hc.ClusterID)), leaderWait))
		}
	case cfg.MasterAddr == "":
		m, err := master.New(cfg.Master)
		if err != nil {
			return fail(err)
		}
		lis, err := net.Listen("tcp", cfg.RPCAddress)
		if err != nil {
			return fail(fmt.Errorf("master RPC listener: %w", err))
		}
		lis = connlimit.Default().Listener(lis, "master rpc")
		m.Start()
		s.Master, s.RPCAddr = m, lis.Addr().String()
		s.grpc = master.Serve(m, lis)
		adminHandler = master.NewAdminHandler(m, master.AdminOptions{})
		s.log.Info(fmt.Sprintf("store master serving RPC on %s", s.RPCAddr))
	default:
		s.RPCAddr = cfg.MasterAddr
	}
	if cfg.SegmentSize > 0 || cfg.MasterAddr != "" {
		target := store.DialAddr(s.RPCAddr)
		if store.IsEtcdAddress(nodeMaster) || store.IsMooncakeAddress(nodeMaster) {
			target = nodeMaster
		}
		node, err := store.New(ctx, store.Config{
			Master: target, ClusterID: cfg.ClusterID, EngineConfig: cfg.Engine, SegmentSize: cfg.SegmentSize,
			PingInterval: cfg.PingInterval, Logger: cfg.Logger,
		})
		if err != nil {
			s.shutdownMaster()
			return fail(fmt.Errorf("node: %w", err))
		}
		s.Node = node
		if s.Tier != nil {
			if err := s.Tier.Attach(node); err != nil {
				node.Close(ctx)
				s.shutdownMaster()
				return fail(fmt.Errorf("disk tier: %w", err))
			}
			ts := s.Tier.Stats()
			s.log.Info(fmt.Sprintf("disk tier %s under this node's segment: %d records, %d of %d bytes used, O_DIRECT %v", ts.Dir, ts.Records, ts.Used, ts.Capacity, ts.Direct))
		}
		if seg, ok := node.Segment(); ok {
			s.log.Info(fmt.Sprintf("segment %s: %d bytes at 0x%x, reached at %s over %s", seg.Name, seg.Size, seg.Base, seg.Endpoint, seg.Protocol))
		}
		if adminHandler == nil {
			adminHandler = nodeHandler(node, s.Tier, target)
		}
	}
	// report closes s.done, which Close waits for: it runs before
	// anything below can fail and Close.
	go s.report(cfg)
	if cfg.AdminAddress != "" && adminHandler != nil {
		lis, err := net.Listen("tcp", cfg.AdminAddress)
		if err != nil {
			s.Close(ctx)
			return nil, fmt.Errorf("admin HTTP listener: %w", err)
		}
		lis = connlimit.Default().Listener(lis, "admin http")
		s.AdminAddr = lis.Addr().String()
		s.admin = master.NewAdminServer(adminHandler, s.log)
		go s.admin.Serve(lis)
	}
	if (s.Master != nil || s.Candidate != nil) && s.AdminAddr != "" && cfg.Master.AdminToken == "" && !IsLoopback(s.AdminAddr) {
		s.log.Warn(fmt.Sprintf("admin HTTP API on %s is reachable beyond this host and has no token: anyone who reaches it can remove every object (POST /api/v1/remove_all) or drain segments; give --admin-token (MC_ADMIN_TOKEN) or --admin-token-file, or bind it to loopback with --metrics-address 127.0.0.1", s.AdminAddr))
	}
	connCaps()
	return s, nil
}

// setConnectionCaps applies cfg's caps to the process's connlimit.Default
// (before anything listens) and returns what to log about them once the
// server is up: what they are, and a warning when one is not below the
// descriptor limit (accepts would then fail with EMFILE before the cap
// refuses anyone).
func setConnectionCaps(cfg Config) (func(), error) {
	if cfg.MaxConnections < 0 || cfg.MaxConnectionsPerHost < 0 {
		return nil, fmt.Errorf("connection caps %d, %d: want 0 (from the descriptor limit) or more", cfg.MaxConnections, cfg.MaxConnectionsPerHost)
	}
	nofile, err := connlimit.NoFile()
	if err != nil {
		return nil, err
	}
	maxConns, perHost := connlimit.DefaultLimits(nofile)
	if cfg.MaxConnections > 0 {
		maxConns = cfg.MaxConnections
		perHost = connlimit.PerHost(maxConns)
	}
	if cfg.MaxConnectionsPerHost > 0 {
		perHost = cfg.MaxConnectionsPerHost
	}
	connlimit.Default().SetLimits(maxConns, perHost)
	return func() {
		cfg.Logger.Info(fmt.Sprintf("inbound connections capped at %d, %d from one host (descriptor limit %d)", maxConns, perHost, nofile))
		if uint64(maxConns) >= nofile {
			cfg.Logger.Warn(fmt.Sprintf("--max-connections %d is not below this process's descriptor limit (%d, ulimit -n): a flood of connections exhausts descriptors before the cap refuses any; raise the limit or lower the cap", maxConns, nofile))
		}
	}, nil
}

// IsLoopback reports whether addr (host:port or a bare host) listens on
// loopback only: 127.0.0.0/8, ::1 or localhost. 0.0.0.0, :: and an empty
// host listen on every interface.
func IsLoopback(addr string) bool {
	host := addr
	if h, _, err := net.SplitHostPort(addr); err == nil {
		host = h
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func (s *Server) report(cfg Config) {
	defer close(s.done)
	if !cfg.MetricReporting || (s.Master == nil && s.Candidate == nil) {
		<-s.stop
		return
	}
	iv := cfg.ReportInterval
	if iv <= 0 {
		iv = 10 * time.Second
	}
	t := time.NewTicker(iv)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			if s.Candidate != nil {
				s.log.Info(s.Candidate.Summary())
			} else {
				s.log.Info(s.Master.Summary())
			}
		}
	}
}

// Close shuts down in order: the node unmounts gracefully (its objects'
// reads finish), then the admin endpoint, the RPC server and the master.
func (s *Server) Close(ctx context.Context) error {
	var errs []error
	select {
	case <-s.stop:
		return nil
	default:
		close(s.stop)
	}
	if s.Tier != nil {
		// Detach first: the master stops sending offloads, and what is
		// on disk stays for the next start.
		if err := s.Tier.Close(); err != nil {
			errs = append(errs, fmt.Errorf("disk tier: %w", err))
		}
	}
	if s.Node != nil {
		if err := s.Node.Close(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if s.admin != nil {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_ = s.admin.Shutdown(sctx)
		cancel()
	}
	s.shutdownMaster()
	if s.KVEvents != nil {
		if err := s.KVEvents.Close(); err != nil {
			errs = append(errs, fmt.Errorf("kv events: %w", err))
		}
	}
	<-s.done
	return errors.Join(errs...)
}

func (s *Server) shutdownMaster() {
	if s.Candidate != nil {
		s.Candidate.Close()
	}
	if s.grpc == nil {
		return
	}
	s.grpc.Shutdown(2 * time.Second)
	s.Master.Close()
	s.grpc = nil
}

// nodeHandler serves a node's own /metrics and /health.
func nodeHandler(c *store.Client, t *store.TierNode, masterAddr string) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), connlimit.Default())
	seg, _ := c.Segment()
	gauge := func(name, help string, f func() float64) {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: prometheus.Labels{"segment": seg.Name}}, f))
	}
	gauge("mc_store_node_segment_bytes", "bytes of the segment this node contributes", func() float64 { return float64(seg.Size) })
	gauge("mc_store_node_master_up", "1 when the last ping reached the master", func() float64 {
		if c.Stats().MasterUp {
			return 1
		}
		return 0
	})
	gauge("mc_store_node_pings_total", "pings sent to the master", func() float64 { return float64(c.Stats().Pings) })
	gauge("mc_store_node_ping_failures_total", "pings that failed", func() float64 { return float64(c.Stats().PingFailures) })
	gauge("mc_store_node_remounts_total", "re-mounts after the master asked (restart, drop)", func() float64 { return float64(c.Stats().Remounts) })
	gauge("mc_store_node_segment_renewals_total", "re-mounts on a master that no longer knew the segment: its memory renewed (new address, rkeys, memfd), so every earlier grant in it reaches nothing", func() float64 { return float64(c.Stats().Renewals) })
	if t != nil {
		registerTierGauges(reg, seg.Name, t)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		st := c.Stats()
		status := "ok"
		if !st.MasterUp {
			status = "master_unreachable"
		}
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		h := map[string]any{
			"status": status, "role": "node", "master": masterAddr, "master_reachable": st.MasterUp,
			"segment": seg.Name, "segment_bytes": seg.Size, "view_version": c.ViewVersion(),
		}
		if t != nil {
			h["disk_tier"] = tierHealth(t)
		}
		_ = json.NewEncoder(w).Encode(h)
	})
	return mux
}
