package store

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/resolver"
)

// HA names shared by the masters (package ha) and the clients that follow
// them: Mooncake's key layout, so tools reading one read the other.
const (
	DefaultClusterID = "mooncake_cluster"
	// ClusterIDEnv gives clients the cluster id (Mooncake's variable).
	ClusterIDEnv = "MC_STORE_CLUSTER_ID"
	etcdScheme   = "etcd://"
	// viewReread is the safety net behind the watch.
	viewReread = 30 * time.Second
)

// ClusterID returns id, else $MC_STORE_CLUSTER_ID, else the default.
func ClusterID(id string) string {
	if id != "" {
		return id
	}
	if env := os.Getenv(ClusterIDEnv); env != "" {
		return env
	}
	return DefaultClusterID
}

// KeyPrefix is where a cluster's HA state lives in etcd. One trailing '/'
// of the cluster id is dropped, as Mooncake's masters and clients drop it
// when they build the view key: "prod/" and "prod" name one cluster, so a
// Mooncake client given either finds an mc leader started with either.
func KeyPrefix(cluster string) string {
	return "mooncake-store/" + strings.TrimSuffix(cluster, "/") + "/"
}

// ViewKey is the leader view's key: its value is the leader's
// "<rpc_address>:<rpc_port>", its create revision the view version.
func ViewKey(cluster string) string { return KeyPrefix(cluster) + "master_view" }

// AdminKey is where mc's leader publishes its admin HTTP API, beside
// the view: the value is "<host>:<port>", written in the view's own
// transaction under the view's lease, so it lives and dies with the view
// and its mod revision equals the view version. Mooncake's masters do
// not write it (their admin port is their --metrics_port, 9003 by
// default); the view's value stays Mooncake's plain "<host>:<port>".
func AdminKey(cluster string) string { return KeyPrefix(cluster) + "master_admin" }

// IsEtcdAddress reports whether a master address names etcd endpoints
// (etcd://H:P[;H:P]) rather than one master.
func IsEtcdAddress(s string) bool { return strings.HasPrefix(s, etcdScheme) }

// ParseEtcdAddress reads etcd://H:P[;H:P] (commas accepted too) into
// endpoints.
func ParseEtcdAddress(s string) ([]string, error) {
	if !IsEtcdAddress(s) {
		return nil, fmt.Errorf("%q: want etcd://HOST:PORT[;HOST:PORT]", s)
	}
	return ParseEndpoints(strings.TrimPrefix(s, etcdScheme))
}

// ParseEndpoints splits a ';'- or ','-separated list of host:port.
func ParseEndpoints(s string) ([]string, error) {
	var out []string
	for _, e := range strings.FieldsFunc(s, func(r rune) bool { return r == ';' || r == ',' }) {
		e = strings.TrimSpace(e)
		if _, _, err := net.SplitHostPort(e); err != nil {
			return nil, fmt.Errorf("etcd endpoint %q: want host:port", e)
		}
		out = append(out, e)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%q: no etcd endpoint", s)
	}
	return out, nil
}

// View is the leader view: who leads, since which etcd revision.
type View struct {
	Leader  string // "<rpc_address>:<rpc_port>"
	Version uint64
	// Admin is the leader's admin HTTP API, "<host>:<port>", when it
	// publishes one (AdminKey): "" for a Mooncake leader.
	Admin string
}

// ReadView reads the cluster's view (and the leader's admin address, in
// the same read); ok is false when there is no leader.
func ReadView(ctx context.Context, cli *clientv3.Client, cluster string) (v View, ok bool, err error) {
	resp, err := cli.Txn(ctx).Then(clientv3.OpGet(ViewKey(cluster)), clientv3.OpGet(AdminKey(cluster))).Commit()
	if err != nil {
		return View{}, false, fmt.Errorf("read master view %q: %w", ViewKey(cluster), err)
	}
	views := resp.Responses[0].GetResponseRange().GetKvs()
	if len(views) == 0 {
		return View{}, false, nil
	}
	kv := views[0]
	v = View{Leader: string(kv.Value), Version: uint64(kv.CreateRevision)}
	if admin := resp.Responses[1].GetResponseRange().GetKvs(); len(admin) > 0 && admin[0].ModRevision == kv.CreateRevision {
		// Written in the transaction that created this view, so this
		// leader's.
		v.Admin = string(admin[0].Value)
	}
	return v, true, nil
}

// DefaultAdminPort is the admin HTTP port of a leader that does not
// publish its admin address (a mooncake_master's --metrics_port default).
const DefaultAdminPort = "9003"

// AdminURL is the leader's admin HTTP API: the address it publishes, else
// its RPC host at DefaultAdminPort.
func (v View) AdminURL() string {
	if v.Admin != "" {
		return "http://" + DialAddr(v.Admin)
	}
	h, _, err := net.SplitHostPort(DialAddr(v.Leader))
	if err != nil {
		h = v.Leader
	}
	return "http://" + net.JoinHostPort(h, DefaultAdminPort)
}

// LeaderAdminURL finds the admin HTTP API of the HA leader that the etcd://
// master address master names: the address the leader publishes, so a
// client asks the leader whatever its admin port. During a failover it
// waits, up to wait, for a leader whose admin API is there and serving
// (the view names a dead leader until its lease expires, and the next
// one answers 503 while it takes over); at the end of wait it returns
// the last leader's address found, and the caller's request says what is
// wrong.
func LeaderAdminURL(ctx context.Context, master, cluster string, wait time.Duration) (string, error) {
	eps, err := ParseEtcdAddress(master)
	if err != nil {
		return "", err
	}
	cli, err := NewEtcdClient(eps)
	if err != nil {
		return "", fmt.Errorf("master %s: %w", master, err)
	}
	defer cli.Close()
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	cluster = ClusterID(cluster)
	found := ""
	for {
		v, err := WaitView(wctx, cli, cluster)
		if err != nil {
			if found != "" {
				return found, nil
			}
			return "", fmt.Errorf("master %s: no leader within %s (is etcd up, and a master elected?): %w", master, wait, err)
		}
		found = v.AdminURL()
		if adminServing(wctx, found) {
			return found, nil
		}
		select {
		case <-wctx.Done():
			return found, nil
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// adminServing reports whether the admin API at base answers as a
// serving leader: its /health does not say 503 or service_ready false (a
// master whose /health is older than that field counts as serving).
func adminServing(ctx context.Context, base string) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/health", nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusServiceUnavailable {
		return false
	}
	var h struct {
		Ready *bool `json:"service_ready"`
	}
	if json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(&h) == nil && h.Ready != nil {
		return *h.Ready
	}
	return true
}

// DialAddr turns a published address into one a client can dial: a
// wildcard host means this host.
func DialAddr(addr string) string {
	h, p, err := net.SplitHostPort(addr)
	if err == nil && (h == "" || h == "0.0.0.0" || h == "::") {
		return net.JoinHostPort("127.0.0.1", p)
	}
	return addr
}

// NewEtcdClient connects to endpoints with the timeouts the store uses.
func NewEtcdClient(endpoints []string) (*clientv3.Client, error) {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: endpoints, DialTimeout: 5 * time.Second,
		DialKeepAliveTime: 2 * time.Second, DialKeepAliveTimeout: 2 * time.Second,
		Logger: zap.NewNop(),
	})
	if err != nil {
		return nil, fmt.Errorf("etcd %v: %w", endpoints, err)
	}
	return cli, nil
}

// WaitView reads the view, waiting (watching) until there is a leader or
// ctx ends.
func WaitView(ctx context.Context, cli *clientv3.Client, cluster string) (View, error) {
	for {
		v, ok, err := ReadView(ctx, cli, cluster)
		if err == nil && ok {
			return v, nil
		}
		select {
		case <-ctx.Done():
			if err == nil {
				err = fmt.Errorf("no leader in %q", ViewKey(cluster))
			}
			return View{}, fmt.Errorf("find the store master: %w", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// leaderResolver is a gRPC resolver whose only address is the current
// leader: when the view changes, the connection re-dials the new one.
type leaderResolver struct {
	mu   sync.Mutex
	addr string
	ccs  map[*leaderConn]struct{}
}

type leaderConn struct {
	r  *leaderResolver
	cc resolver.ClientConn
}

func (r *leaderResolver) Scheme() string { return "mcstore-leader" }

func (r *leaderResolver) Build(_ resolver.Target, cc resolver.ClientConn, _ resolver.BuildOptions) (resolver.Resolver, error) {
	lc := &leaderConn{r: r, cc: cc}
	r.mu.Lock()
	r.ccs[lc] = struct{}{}
	addr := r.addr
	r.mu.Unlock()
	_ = cc.UpdateState(resolver.State{Addresses: []resolver.Address{{Addr: addr}}})
	return lc, nil
}

func (r *leaderResolver) set(addr string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if addr == r.addr {
		return false
	}
	r.addr = addr
	for lc := range r.ccs {
		_ = lc.cc.UpdateState(resolver.State{Addresses: []resolver.Address{{Addr: addr}}})
	}
	return true
}

func (r *leaderResolver) current() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.addr
}

func (lc *leaderConn) ResolveNow(resolver.ResolveNowOptions) {}

func (lc *leaderConn) Close() {
	lc.r.mu.Lock()
	delete(lc.r.ccs, lc)
	lc.r.mu.Unlock()
}

// followView keeps the resolver on the leader: it watches the view key and
// re-reads it every viewReread in case a watch event was missed.
func (w *grpcWire) followView() {
	defer w.wg.Done()
	cli, r := w.etcd, w.leaderR
	key := ViewKey(w.cfg.clusterID)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-w.stop
		cancel()
	}()
	reread := func() {
		rctx, rcancel := context.WithTimeout(ctx, w.cfg.timeout)
		defer rcancel()
		if v, ok, err := ReadView(rctx, cli, w.cfg.clusterID); err == nil && ok {
			w.onView(r, v)
		}
	}
	t := time.NewTicker(viewReread)
	defer t.Stop()
	for ctx.Err() == nil {
		wch := cli.Watch(clientv3.WithRequireLeader(ctx), key)
		reread() // nothing missed between reads and the watch
	watch:
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				reread()
			case wr, ok := <-wch:
				if !ok || wr.Err() != nil {
					break watch
				}
				for _, ev := range wr.Events {
					if ev.Type == clientv3.EventTypePut {
						w.onView(r, View{Leader: string(ev.Kv.Value), Version: uint64(ev.Kv.CreateRevision)})
					}
				}
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (w *grpcWire) onView(r *leaderResolver, v View) {
	if r.set(DialAddr(v.Leader)) {
		w.log.Info(fmt.Sprintf("store master leader is now %s (view %d)", v.Leader, v.Version))
		select {
		case w.newView <- struct{}{}:
		default:
		}
	}
}

// Leader is the master address the client currently talks to (the leader
// it follows, with an etcd:// master).
func (c *Client) Leader() string { return c.w.leader() }
