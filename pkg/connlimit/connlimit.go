// Package connlimit bounds the inbound connections a process holds, so
// that one client opening connections and never closing them (a leak, or
// abuse) cannot take every file descriptor: past that point a server can
// no longer accept anyone, open a disk-tier file or dial a peer. Every
// listener of a process shares one Limiter: a cap on the process's inbound
// connections, below its descriptor limit so that files and outbound
// connections keep room, and a smaller cap per remote host, so that one
// host cannot take the whole budget from the others.
//
// A connection over a cap is accepted and closed at once with a reset (the
// client sees "connection reset by peer" instead of hanging in the
// backlog), counted and logged.
package connlimit

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
)

// Limiter counts a process's inbound connections. A nil *Limiter admits
// everything.
type Limiter struct {
	mu        sync.Mutex
	max       int // 0: unlimited
	perHost   int // 0: unlimited
	open      int
	hosts     map[netip.Addr]int
	listeners map[string]*listenerStats
	warned    map[warnKey]time.Time
}

type listenerStats struct {
	open        atomic.Int64
	refusedHost atomic.Uint64
	refusedProc atomic.Uint64
}

type warnKey struct {
	listener string
	host     netip.Addr
}

// warnEvery limits the refusal warning to one line per listener and host
// in this period: a leaking client retries in a tight loop.
const warnEvery = 10 * time.Second

// New returns a Limiter of at most max inbound connections in all and
// perHost from any one remote host (0: no cap).
func New(maxConns, perHost int) *Limiter {
	l := &Limiter{hosts: make(map[netip.Addr]int), listeners: make(map[string]*listenerStats), warned: make(map[warnKey]time.Time)}
	l.SetLimits(maxConns, perHost)
	return l
}

// SetLimits changes the caps; connections already held stay.
func (l *Limiter) SetLimits(maxConns, perHost int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.max, l.perHost = max(0, maxConns), max(0, perHost)
}

// Limits returns the caps (0: none).
func (l *Limiter) Limits() (maxConns, perHost int) {
	if l == nil {
		return 0, 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.max, l.perHost
}

// DefaultLimits derives the caps from a descriptor limit: the process keeps
// a fifth of its descriptors (at least 1024, or half of a small limit) for
// files, segments and outbound connections, and one host may hold a
// quarter of the rest.
func DefaultLimits(nofile uint64) (maxConns, perHost int) {
	n := int(min(nofile, 1<<30))
	reserve := max(n/5, min(n/2, 1024))
	maxConns = n - reserve
	return maxConns, PerHost(maxConns)
}

// PerHost is the default cap of one host under a process cap of maxConns:
// a quarter of it (at least 64, at most all of it).
func PerHost(maxConns int) int {
	return min(max(maxConns/4, 64), maxConns)
}

// NoFile is the process's descriptor limit (the runtime raises the soft
// limit to the hard one at start).
func NoFile() (uint64, error) {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return 0, fmt.Errorf("getrlimit(RLIMIT_NOFILE): %w", err)
	}
	return rl.Cur, nil
}

var defaultLimiter = sync.OnceValue(func() *Limiter {
	n, err := NoFile()
	if err != nil || n == unix.RLIM_INFINITY {
		return New(0, 0)
	}
	return New(DefaultLimits(n))
})

// Default is the process's Limiter, its caps from the descriptor limit
// (DefaultLimits) until SetLimits.
func Default() *Limiter { return defaultLimiter() }

// Slot is an admitted connection's place; Release gives it back (once).
type Slot struct {
	l    *Limiter
	st   *listenerStats
	host netip.Addr
	done *atomic.Bool
}

// Release gives the slot back; later calls do nothing. The zero Slot's
// Release does nothing.
func (s Slot) Release() {
	if s.l == nil || s.done.Swap(true) {
		return
	}
	s.st.open.Add(-1)
	s.l.mu.Lock()
	s.l.open--
	if n := s.l.hosts[s.host] - 1; n > 0 {
		s.l.hosts[s.host] = n
	} else {
		delete(s.l.hosts, s.host)
	}
	s.l.mu.Unlock()
}

// Admit takes a slot for a connection from remote accepted by listener,
// or refuses it (false, counted and logged) when a cap is reached.
func (l *Limiter) Admit(listener string, remote netip.Addr) (Slot, bool) {
	if l == nil {
		return Slot{}, true
	}
	remote = remote.Unmap()
	l.mu.Lock()
	st := l.statsLocked(listener)
	reason := ""
	switch {
	case l.max > 0 && l.open >= l.max:
		reason = "process"
	case l.perHost > 0 && l.hosts[remote] >= l.perHost:
		reason = "host"
	}
	if reason == "" {
		l.open++
		l.hosts[remote]++
		l.mu.Unlock()
		st.open.Add(1)
		return Slot{l: l, st: st, host: remote, done: new(atomic.Bool)}, true
	}
	held, open, maxConns, perHost := l.hosts[remote], l.open, l.max, l.perHost
	now := time.Now()
	k := warnKey{listener, remote}
	warn := now.Sub(l.warned[k]) >= warnEvery
	if warn {
		if len(l.warned) > 4096 {
			clear(l.warned)
		}
		l.warned[k] = now
	}
	l.mu.Unlock()
	if reason == "host" {
		st.refusedHost.Add(1)
	} else {
		st.refusedProc.Add(1)
	}
	if warn {
		if reason == "host" {
			slog.Warn(fmt.Sprintf("%s: refused a connection from %s: that host holds %d connections to this process, its cap (--max-connections-per-host %d); further refusals from it are counted in mc_connections_refused_total", listener, remote, held, perHost))
		} else {
			slog.Warn(fmt.Sprintf("%s: refused a connection from %s: this process holds %d inbound connections, its cap (--max-connections %d); further refusals are counted in mc_connections_refused_total", listener, remote, open, maxConns))
		}
	}
	return Slot{}, false
}

func (l *Limiter) statsLocked(name string) *listenerStats {
	st := l.listeners[name]
	if st == nil {
		st = new(listenerStats)
		l.listeners[name] = st
	}
	return st
}

// Stats is one listener's counts.
type Stats struct {
	Open           int64  `json:"open"`
	RefusedHost    uint64 `json:"refused_host"`
	RefusedProcess uint64 `json:"refused_process"`
}

// Stats returns each listener's counts, by name.
func (l *Limiter) Stats() map[string]Stats {
	out := make(map[string]Stats)
	if l == nil {
		return out
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for name, st := range l.listeners {
		out[name] = Stats{Open: st.open.Load(), RefusedHost: st.refusedHost.Load(), RefusedProcess: st.refusedProc.Load()}
	}
	return out
}

// AddrOf is the host of a connection's remote address (the zero Addr when
// it has none, as for a Unix socket: all of those count as one host).
func AddrOf(a net.Addr) netip.Addr {
	switch a := a.(type) {
	case *net.TCPAddr:
		ip, _ := netip.AddrFromSlice(a.IP)
		return ip.Unmap()
	case nil:
		return netip.Addr{}
	}
	if ap, err := netip.ParseAddrPort(a.String()); err == nil {
		return ap.Addr().Unmap()
	}
	return netip.Addr{}
}

// Refuse closes c with a reset: its peer sees the refusal at once.
func Refuse(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// RefuseFD closes an accepted socket descriptor with a reset.
func RefuseFD(fd int) {
	_ = unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
	_ = unix.Close(fd)
}

var (
	openDesc    = prometheus.NewDesc("mc_connections_open", "inbound connections this process holds, by listener", []string{"listener"}, nil)
	refusedDesc = prometheus.NewDesc("mc_connections_refused_total", "inbound connections refused (closed with a reset at accept) because a cap was reached: reason host (--max-connections-per-host) or process (--max-connections)", []string{"listener", "reason"}, nil)
	maxDesc     = prometheus.NewDesc("mc_connections_max", "the cap on this process's inbound connections (--max-connections; 0: none)", nil, nil)
	perHostDesc = prometheus.NewDesc("mc_connections_per_host_max", "the cap on one remote host's inbound connections to this process (--max-connections-per-host; 0: none)", nil, nil)
)

// Describe implements prometheus.Collector.
func (l *Limiter) Describe(ch chan<- *prometheus.Desc) {
	ch <- openDesc
	ch <- refusedDesc
	ch <- maxDesc
	ch <- perHostDesc
}

// Collect implements prometheus.Collector.
func (l *Limiter) Collect(ch chan<- prometheus.Metric) {
	stats := l.Stats()
	names := make([]string, 0, len(stats))
	for n := range stats {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		st := stats[n]
		ch <- prometheus.MustNewConstMetric(openDesc, prometheus.GaugeValue, float64(st.Open), n)
		ch <- prometheus.MustNewConstMetric(refusedDesc, prometheus.CounterValue, float64(st.RefusedHost), n, "host")
		ch <- prometheus.MustNewConstMetric(refusedDesc, prometheus.CounterValue, float64(st.RefusedProcess), n, "process")
	}
	maxConns, perHost := l.Limits()
	ch <- prometheus.MustNewConstMetric(maxDesc, prometheus.GaugeValue, float64(maxConns))
	ch <- prometheus.MustNewConstMetric(perHostDesc, prometheus.GaugeValue, float64(perHost))
}
