package cmd

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvcache-ops/mc/pkg/connlimit"
	"github.com/kvcache-ops/mc/pkg/engine/meta"
	"github.com/kvcache-ops/mc/pkg/units"
)

// newServeCmd is the group of long-running services mc can host. Each verb
// runs until SIGINT/SIGTERM and then stops cleanly.
func newServeCmd(p *printer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run mc services (metadata server, KV-cache store)",
		Long: `serve runs a long-lived service in the foreground until SIGINT or SIGTERM,
then stops it cleanly.`,
	}
	cmd.AddCommand(newServeMetadataCmd(p))
	cmd.AddCommand(newServeStoreCmd(p))
	return cmd
}

// Default listen addresses: etcd's client port and the port of Mooncake's
// example HTTP metadata server.
const (
	defaultEtcdListen = "127.0.0.1:2379"
	defaultHTTPListen = "127.0.0.1:8080"
	httpMetadataPath  = "/metadata"
)

type serveMetadataOptions struct {
	Listen  string
	DataDir string
	Backend string
	// Quota and AutoCompaction are etcd's --quota-backend-bytes and
	// (periodic) --auto-compaction-retention.
	Quota          int64
	AutoCompaction time.Duration

	// ready, when set, is called once the server accepts clients (tests
	// use it to learn a port-0 address).
	ready func(serveMetadataInfo)
}

// serveMetadataInfo is what `mc serve metadata` prints at start.
type serveMetadataInfo struct {
	Backend        string `json:"backend"`
	Listen         string `json:"listen"`
	MetadataServer string `json:"metadata_server"`
	DataDir        string `json:"data_dir"`
	Temporary      bool   `json:"temporary_data_dir"`
}

func newServeMetadataCmd(p *printer) *cobra.Command {
	var o serveMetadataOptions
	cmd := &cobra.Command{
		Use:   "metadata",
		Short: "Run a Mooncake-compatible metadata server (embedded etcd or HTTP)",
		Long: `metadata runs a metadata server that Mooncake Transfer Engine processes and
mc commands can share via --metadata-server (Mooncake: --metadata_server).

With --backend etcd (default) it runs a single-node embedded etcd; segment
descriptors live under mooncake/ram/<segment> and RPC endpoints under
mooncake/rpc_meta/<server>. Without --data-dir the data is kept in a
temporary directory removed on exit (Mooncake processes re-register at
start). With --backend http it serves Mooncake's HTTP metadata protocol
(GET/PUT/DELETE <url>?key=...) from memory at ` + httpMetadataPath + `.

etcd keeps every revision of every key until its history is compacted,
and refuses all writes (a NOSPACE alarm) once its database reaches
--quota-backend-bytes. This server compacts history older than
--auto-compaction-retention (an HA store leader also compacts its op log's
history after each snapshot), checks the server every 10 s, and logs what
it finds with what to do: on a NOSPACE alarm it compacts all history,
defragments and disarms the alarm; a database mostly of free pages past
half the quota is defragmented; a data dir with under 256 MiB free is
reported (etcd exits when a write fails, and its error is printed).

--listen defaults to ` + defaultEtcdListen + ` for etcd and ` + defaultHTTPListen + ` for http;
port 0 picks a free port. The address clients should pass is printed at start.`,
		Example: `  mc serve metadata
  mc serve metadata --listen 0.0.0.0:2379 --data-dir /var/lib/mc/etcd
  mc serve metadata --backend http --listen 127.0.0.1:8080`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Backend == "http" {
				for _, f := range []string{"quota-backend-bytes", "auto-compaction-retention"} {
					if cmd.Flags().Changed(f) {
						return usagef("--%s applies to --backend etcd only (the http backend keeps metadata in memory)", f)
					}
				}
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return runServeMetadata(ctx, o, p)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Listen, "listen", "", "address to listen on, host:port (default "+defaultEtcdListen+" for etcd, "+defaultHTTPListen+" for http)")
	f.StringVar(&o.DataDir, "data-dir", "", "etcd data directory (default: a temporary directory removed on exit)")
	f.StringVar(&o.Backend, "backend", "etcd", "metadata backend: etcd or http")
	sizeVar(f, &o.Quota, "quota-backend-bytes", meta.DefaultQuotaBackendBytes, "etcd: database size at which etcd refuses writes (NOSPACE alarm)")
	durationVar(f, &o.AutoCompaction, "auto-compaction-retention", 10*time.Minute, "etcd: compact history older than this (0: never)")
	_ = cmd.RegisterFlagCompletionFunc("backend", cobra.FixedCompletions([]string{"etcd", "http"}, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.MarkFlagDirname("data-dir")
	return cmd
}

func runServeMetadata(ctx context.Context, o serveMetadataOptions, p *printer) error {
	switch o.Backend {
	case "etcd":
		if o.Listen == "" {
			o.Listen = defaultEtcdListen
		}
	case "http":
		if o.Listen == "" {
			o.Listen = defaultHTTPListen
		}
		if o.DataDir != "" {
			return usagef("--data-dir applies to --backend etcd only (the http backend keeps metadata in memory)")
		}
	default:
		return usagef("invalid --backend %q: want etcd or http", o.Backend)
	}
	if o.Quota < 0 || o.AutoCompaction < 0 {
		return usagef("--quota-backend-bytes and --auto-compaction-retention must not be negative")
	}
	if o.Quota > maxEtcdQuota {
		// etcd maps its whole database (quota + 10%) up front; past its
		// recommended 8 GiB the map alone can exhaust a host's address
		// space (and 2^63 overflows it).
		return usagef("--quota-backend-bytes %s: at most %s (etcd's recommended maximum)", units.FormatSize(o.Quota), units.FormatSize(maxEtcdQuota))
	}
	if err := checkListen("listen", o.Listen); err != nil {
		return err
	}
	if o.Backend == "http" {
		return serveHTTPMetadata(ctx, o, p)
	}
	return serveEtcdMetadata(ctx, o, p)
}

// maxEtcdQuota is etcd's recommended largest backend quota.
const maxEtcdQuota = 8 << 30

// metadataMaintenance is how often `mc serve metadata` checks its etcd.
const metadataMaintenance = 10 * time.Second

func serveEtcdMetadata(ctx context.Context, o serveMetadataOptions, p *printer) error {
	if o.DataDir != "" {
		// etcd makes a missing directory and starts empty there: a
		// mistyped --data-dir looked like a metadata server that lost
		// everything. Say so.
		if _, err := os.Stat(filepath.Join(o.DataDir, "member")); errors.Is(err, fs.ErrNotExist) {
			slog.Warn(fmt.Sprintf("--data-dir %s holds no etcd data: starting a new, empty metadata store there (check the path if you meant to reuse one)", o.DataDir))
		}
	}
	ee, err := meta.StartEtcd(ctx, meta.EtcdConfig{Listen: o.Listen, DataDir: o.DataDir, QuotaBackendBytes: o.Quota,
		AutoCompaction: o.AutoCompaction, Maintenance: metadataMaintenance, Logger: slog.Default()})
	if err != nil {
		return fmt.Errorf("serve metadata: %w", err)
	}
	defer ee.Close()
	ep := ee.Endpoints()[0]
	info := serveMetadataInfo{Backend: "etcd", Listen: displayAddr(ep), MetadataServer: clientAddr(ep), DataDir: ee.DataDir(), Temporary: o.DataDir == ""}
	if err := announce(info, o, p); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
	case err := <-ee.Err():
		if err != nil {
			return fmt.Errorf("serve metadata: etcd on %s: %w", ep, err)
		}
	}
	slog.Info("metadata server stopping", "backend", "etcd", "listen", ep)
	if err := ee.Close(); err != nil {
		return fmt.Errorf("serve metadata: %w", err)
	}
	return nil
}

func serveHTTPMetadata(ctx context.Context, o serveMetadataOptions, p *printer) error {
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return fmt.Errorf("serve metadata: %w", err)
	}
	ln = connlimit.Default().Listener(ln, "metadata http")
	mux := http.NewServeMux()
	var h http.Handler = meta.NewHTTPHandler()
	if token := metadataToken(); token != "" {
		h = meta.RequireToken(h, token)
	}
	mux.Handle(httpMetadataPath, h)
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       60 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       120 * time.Second,
		ErrorLog:          slog.NewLogLogger(slog.Default().Handler(), slog.LevelWarn),
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	addr := ln.Addr().String()
	info := serveMetadataInfo{Backend: "http", Listen: displayAddr(addr), MetadataServer: "http://" + clientAddr(addr) + httpMetadataPath}
	if err := announce(info, o, p); err != nil {
		srv.Close()
		<-served
		return err
	}
	select {
	case <-ctx.Done():
	case err := <-served:
		return fmt.Errorf("serve metadata: http on %s: %w", addr, err)
	}
	slog.Info("metadata server stopping", "backend", "http", "listen", addr)
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = srv.Shutdown(sctx)
	if serr := <-served; serr != nil && !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("serve metadata: stop http on %s: %w", addr, err)
	}
	return nil
}

// clientAddr is listen address a as another host reaches it: a wildcard
// host ("[::]:2379" from a listener on 0.0.0.0) is no address a client
// can dial, so one of this host's is named instead (its first non-loopback
// IPv4 address, else its name).
func clientAddr(a string) string {
	h, port, err := net.SplitHostPort(a)
	if err != nil || !(h == "" || net.ParseIP(h) != nil && net.ParseIP(h).IsUnspecified()) {
		return a
	}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, ad := range addrs {
			if ipn, ok := ad.(*net.IPNet); ok && ipn.IP.To4() != nil && !ipn.IP.IsLoopback() && !ipn.IP.IsLinkLocalUnicast() {
				return net.JoinHostPort(ipn.IP.String(), port)
			}
		}
	}
	if name, err := os.Hostname(); err == nil && name != "" {
		return net.JoinHostPort(name, port)
	}
	return net.JoinHostPort("127.0.0.1", port)
}

// announce prints where the server listens and the value clients pass.
func announce(info serveMetadataInfo, o serveMetadataOptions, p *printer) error {
	if p.JSON() {
		if err := p.PrintJSON(info); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(p.Out, "metadata server (%s) listening on %s\n", info.Backend, info.Listen)
		fmt.Fprintf(p.Out, "clients: --metadata-server %s\n", info.MetadataServer)
		if info.DataDir != "" {
			note := ""
			if info.Temporary {
				note = " (temporary, removed on exit)"
			}
			fmt.Fprintf(p.Out, "data dir: %s%s\n", info.DataDir, note)
		}
	}
	if o.ready != nil {
		o.ready(info)
	}
	return nil
}
