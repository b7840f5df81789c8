package meta

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// EtcdConfig configures an embedded etcd.
type EtcdConfig struct {
	// Listen is the client address, host:port; port 0 picks a free one.
	// Empty means 127.0.0.1:2379.
	Listen string
	// DataDir holds etcd's data. Empty means a temporary directory removed
	// by Close.
	DataDir string
	// NoFsync skips fsync (etcd's --unsafe-no-fsync): for tests only, a
	// crash loses data.
	NoFsync bool
	// StartTimeout bounds the wait for the server to become ready; 0 means
	// 30 s.
	StartTimeout time.Duration
	// QuotaBackendBytes is etcd's database quota (--quota-backend-bytes);
	// 0 means etcd's default, 2 GiB. At the quota etcd raises a NOSPACE
	// alarm and refuses every write until the alarm is disarmed.
	QuotaBackendBytes int64
	// AutoCompaction, when positive, has etcd compact its history older
	// than this (etcd's periodic auto-compaction).
	AutoCompaction time.Duration
	// Maintenance, when positive, checks the server this often: a NOSPACE
	// alarm is logged and recovered from (history compacted, database
	// defragmented, alarm disarmed), a database of mostly free pages past
	// half the quota is defragmented, and a nearly full disk is logged.
	Maintenance time.Duration
	// Logger receives etcd's own errors (a failed disk write
	// is fatal to etcd: it is logged before the process exits) and the
	// maintenance's findings; nil means slog.Default().
	Logger *slog.Logger
}

// EmbeddedEtcd is a single-node etcd running inside the process.
type EmbeddedEtcd struct {
	e       *embed.Etcd
	tempDir string
	dataDir string

	stopMaint func()
	maintDone chan struct{}
	closing   atomic.Bool // etcd's errors about its own Close are not logged

	closeOnce sync.Once
	closeErr  error
}

// StartEtcd starts a single-node etcd and waits until it serves clients.
// etcd's own errors go to cfg.Logger.
func StartEtcd(ctx context.Context, cfg EtcdConfig) (*EmbeddedEtcd, error) {
	listen := cfg.Listen
	if listen == "" {
		listen = "127.0.0.1:2379"
	}
	if _, _, err := net.SplitHostPort(listen); err != nil {
		return nil, fmt.Errorf("etcd listen address %q is not host:port", listen)
	}
	if err := addressSpaceErr(cfg.QuotaBackendBytes, addressSpaceLimit()); err != nil {
		return nil, err
	}
	ee := &EmbeddedEtcd{dataDir: cfg.DataDir}
	if ee.dataDir == "" {
		dir, err := os.MkdirTemp("", "mc-etcd-")
		if err != nil {
			return nil, fmt.Errorf("etcd data dir: %w", err)
		}
		ee.tempDir, ee.dataDir = dir, dir
	}
	fail := func(err error) (*EmbeddedEtcd, error) {
		if ee.tempDir != "" {
			os.RemoveAll(ee.tempDir)
		}
		return nil, err
	}
	host, _, _ := net.SplitHostPort(listen)
	// The peer URL only matters to a cluster of one: a free port on the
	// same host keeps two embedded servers from colliding.
	peerPort, err := freePort(host)
	if err != nil {
		return fail(fmt.Errorf("etcd peer port on %s: %w", host, err))
	}
	curl := url.URL{Scheme: "http", Host: listen}
	purl := url.URL{Scheme: "http", Host: net.JoinHostPort(host, fmt.Sprint(peerPort))}

	ec := embed.NewConfig()
	ec.Name = "mc"
	ec.Dir = ee.dataDir
	ec.ListenClientUrls = []url.URL{curl}
	ec.AdvertiseClientUrls = []url.URL{curl}
	ec.ListenPeerUrls = []url.URL{purl}
	ec.AdvertisePeerUrls = []url.URL{purl}
	ec.InitialCluster = ec.InitialClusterFromName(ec.Name)
	ec.UnsafeNoFsync = cfg.NoFsync
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zapLogger(log, &ee.closing))
	ec.LogLevel = "error"
	ec.QuotaBackendBytes = cfg.QuotaBackendBytes
	if cfg.AutoCompaction > 0 {
		ec.AutoCompactionMode = embed.CompactorModePeriodic
		ec.AutoCompactionRetention = cfg.AutoCompaction.String()
	}

	e, err := embed.StartEtcd(ec)
	if err != nil {
		return fail(fmt.Errorf("start etcd on %s (data dir %s): %w", listen, ee.dataDir, err))
	}
	ee.e = e
	wait := cfg.StartTimeout
	if wait <= 0 {
		wait = 30 * time.Second
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-e.Server.ReadyNotify():
		if cfg.Maintenance > 0 {
			if err := ee.startMaintenance(cfg, log); err != nil {
				ee.closing.Store(true)
				e.Close()
				return fail(err)
			}
		}
		return ee, nil
	case err := <-e.Err():
		ee.closing.Store(true)
		e.Close()
		return fail(fmt.Errorf("etcd on %s: %w", listen, err))
	case <-t.C:
		ee.closing.Store(true)
		e.Close()
		return fail(fmt.Errorf("etcd on %s: not ready after %v", listen, wait))
	case <-ctx.Done():
		ee.closing.Store(true)
		e.Close()
		return fail(fmt.Errorf("start etcd on %s: %w", listen, ctx.Err()))
	}
}

func freePort(host string) (int, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// Endpoints returns the client addresses (host:port) actually listened on,
// with a port 0 request resolved.
func (ee *EmbeddedEtcd) Endpoints() []string {
	eps := make([]string, 0, len(ee.e.Clients))
	for _, l := range ee.e.Clients {
		eps = append(eps, l.Addr().String())
	}
	return eps
}

// DataDir is where etcd keeps its data.
func (ee *EmbeddedEtcd) DataDir() string { return ee.dataDir }

// Err reports a fatal server error after start (nil-safe to select on).
func (ee *EmbeddedEtcd) Err() <-chan error { return ee.e.Err() }

// Close stops the server (waiting for in-flight requests) and removes a
// temporary data dir. It is safe to call more than once.
func (ee *EmbeddedEtcd) Close() error {
	ee.closeOnce.Do(func() {
		if ee.stopMaint != nil {
			ee.stopMaint()
			<-ee.maintDone
		}
		ee.closing.Store(true)
		ee.e.Close()
		if ee.tempDir != "" {
			if err := os.RemoveAll(ee.tempDir); err != nil {
				ee.closeErr = fmt.Errorf("remove etcd data dir: %w", err)
			}
		}
	})
	return ee.closeErr
}
