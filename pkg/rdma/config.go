package rdma

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// StoreType picks an endpoint store's eviction policy.
type StoreType int

// Store types. SIEVE is Mooncake's default.
const (
	SIEVE StoreType = iota
	FIFO
)

func (t StoreType) String() string {
	if t == FIFO {
		return "FIFO"
	}
	return "SIEVE"
}

// ParseStoreType accepts MC_ENDPOINT_STORE_TYPE's values (any case).
func ParseStoreType(s string) (StoreType, error) {
	switch strings.ToUpper(strings.TrimSpace(s)) {
	case "", "SIEVE":
		return SIEVE, nil
	case "FIFO":
		return FIFO, nil
	}
	return 0, fmt.Errorf("endpoint store type %q: want SIEVE or FIFO", s)
}

// Defaults (Mooncake's, compat.md §5, and rdma.md).
const (
	DefaultMaxEndpoints    = 65536 // MC_MAX_EP_PER_CTX
	DefaultQPsPerEndpoint  = 2     // MC_NUM_QP_PER_EP
	DefaultMaxWR           = 256   // MC_MAX_WR
	DefaultMaxSGE          = 4     // MC_MAX_SGE
	DefaultMaxInline       = 64    // MC_MAX_INLINE
	DefaultWorkers         = 2     // MC_WORKERS_PER_CTX
	DefaultCQDepth         = 4096  // MC_MAX_CQE_PER_CTX
	DefaultPort            = 1     // MC_IB_PORT
	DefaultMTU             = 4096  // MC_MTU
	DefaultMonitorInterval = time.Second
	DefaultReclaimGrace    = 30 * time.Second
	DefaultReenableDelay   = 5 * time.Second
)

// Config parameterises a Context. Zero fields take the defaults above.
type Config struct {
	// ServerName is the local server name; the context's NIC path is
	// "<ServerName>@<device>".
	ServerName     string
	StoreType      StoreType
	MaxEndpoints   int // clamped to max_qp / QPsPerEndpoint
	QPsPerEndpoint int
	MaxWR          int
	MaxSGE         int
	MaxInline      int
	Workers        int
	CQDepth        int
	Port           int
	MTU            int
	// MonitorInterval is the monitor's tick: async events are reaped
	// continuously, and retired endpoints are reclaimed on every tick.
	MonitorInterval time.Duration
	// ReclaimGrace is how long a retired endpoint may keep outstanding
	// work requests before it is destroyed anyway, with a warning.
	ReclaimGrace time.Duration
	// ReenableDelay is how long a context stays inactive after its port
	// came back, so a flapping port does not attract traffic at once.
	ReenableDelay time.Duration
	// Exchange carries connection requests to peers (the engine sends
	// them as Connection frames on the handshake socket). Required to
	// connect endpoints actively.
	Exchange ExchangeFunc

	// reclaimAfterInsertOnly reproduces Mooncake before v0.3.11: reclaim
	// runs only right after an insert on a cache miss, never from the
	// monitor. Only tests set it, to show the leak it causes.
	reclaimAfterInsertOnly bool
}

func (c Config) withDefaults() Config {
	set := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	set(&c.MaxEndpoints, DefaultMaxEndpoints)
	set(&c.QPsPerEndpoint, DefaultQPsPerEndpoint)
	set(&c.MaxWR, DefaultMaxWR)
	set(&c.MaxSGE, DefaultMaxSGE)
	set(&c.MaxInline, DefaultMaxInline)
	set(&c.Workers, DefaultWorkers)
	set(&c.CQDepth, DefaultCQDepth)
	set(&c.Port, DefaultPort)
	set(&c.MTU, DefaultMTU)
	if c.MonitorInterval <= 0 {
		c.MonitorInterval = DefaultMonitorInterval
	}
	if c.ReclaimGrace <= 0 {
		c.ReclaimGrace = DefaultReclaimGrace
	}
	if c.ReenableDelay <= 0 {
		c.ReenableDelay = DefaultReenableDelay
	}
	if c.ServerName == "" {
		c.ServerName, _ = os.Hostname()
	}
	return c
}

// ConfigFromEnv reads Mooncake's variables: MC_ENDPOINT_STORE_TYPE,
// MC_MAX_EP_PER_CTX, MC_NUM_QP_PER_EP, MC_MAX_WR, MC_MAX_SGE,
// MC_MAX_INLINE, MC_WORKERS_PER_CTX, MC_MAX_CQE_PER_CTX, MC_IB_PORT and
// MC_MTU. Unset variables keep their defaults; malformed ones are errors.
func ConfigFromEnv() (Config, error) {
	var c Config
	var err error
	if c.StoreType, err = ParseStoreType(os.Getenv("MC_ENDPOINT_STORE_TYPE")); err != nil {
		return c, fmt.Errorf("MC_ENDPOINT_STORE_TYPE: %w", err)
	}
	ints := []struct {
		name string
		dst  *int
	}{
		{"MC_MAX_EP_PER_CTX", &c.MaxEndpoints},
		{"MC_NUM_QP_PER_EP", &c.QPsPerEndpoint},
		{"MC_MAX_WR", &c.MaxWR},
		{"MC_MAX_SGE", &c.MaxSGE},
		{"MC_MAX_INLINE", &c.MaxInline},
		{"MC_WORKERS_PER_CTX", &c.Workers},
		{"MC_MAX_CQE_PER_CTX", &c.CQDepth},
		{"MC_IB_PORT", &c.Port},
		{"MC_MTU", &c.MTU},
	}
	for _, v := range ints {
		s := strings.TrimSpace(os.Getenv(v.name))
		if s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			return c, fmt.Errorf("%s=%q: want a positive integer", v.name, s)
		}
		*v.dst = n
	}
	return c.withDefaults(), nil
}
