// Package kvevents publishes the store's KV events for cache-aware
// routers (Dynamo's KV router, llm-d's indexer, SGLang's and vLLM's
// routers), wire-compatible with mooncake_master's publisher (RFC #1527,
// --enable_kv_events): a ZMQ PUB socket sending one multipart message per
// batch (empty topic, 8-byte big-endian sequence number, msgpack
// [timestamp_ms, [event...], dp_rank]), each event a map with Mooncake's
// field names.
//
// ZMTP is spoken here (zmtp.go) rather than through a ZMQ library: a cgo
// binding to libzmq would end mc being one static binary, and the pure-Go
// go-zeromq/zmq4 PUB writes to its subscribers one after another from one
// goroutine with no deadline, so a subscriber that stops reading stalls
// every other, and its high-water mark drops silently. Here every
// subscriber has its own bounded queue (Mooncake's ZMQ_SNDHWM, 10000
// messages) and writer: one that stops reading loses its own messages,
// counted, and nobody else's.
//
// Main types: Publisher (the master's side), Subscriber (mc store events),
// Event and Batch.
package kvevents

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvcache-ops/mc/pkg/connlimit"
)

// Defaults, as Mooncake's publisher.
const (
	DefaultQueueCapacity = 65536
	DefaultTenantID      = "default"
	// DefaultSendHWM is the messages queued for one subscriber before
	// further ones are dropped for it (Mooncake's kZmqSendHwm).
	DefaultSendHWM = 10000
	// MooncakeMaxBatch is the most events one of mooncake_master's
	// messages carries (its kMaxBatchSize).
	MooncakeMaxBatch = 64
	// DefaultMaxBatch is the most events one message carries by default
	// (Config.MaxBatch), and MaxMaxBatch the most it may be set to.
	DefaultMaxBatch = 1024
	MaxMaxBatch     = 4096
	// DefaultPaceInterval and DefaultPaceBurst pace the publisher's
	// sends under a steady stream of events (Config.PaceInterval). An
	// event then waits at most 20 ms, about one scheduler step of the
	// engines whose events routers already take (vLLM hands its
	// publisher a step's events at a time); against 5 ms and 256 events
	// a message the python3-zmq subscriber spent 0.27-0.30 us per event
	// against 0.30-0.61 us (scripts/bench-kv-events.sh, README).
	DefaultPaceInterval = 20 * time.Millisecond
	DefaultPaceBurst    = 16
)

// Media of an event (Mooncake's master: cpu or disk).
const (
	MediumCPU  = "cpu"
	MediumDisk = "disk"
)

// Config configures a Publisher.
type Config struct {
	// Endpoint is the PUB socket's bind address: tcp://HOST:PORT or
	// ipc://PATH.
	Endpoint string
	// BackendID names the cache owner on every event (required).
	BackendID string
	// QueueCapacity bounds the events waiting to be sent; when it is
	// full the oldest goes. Default DefaultQueueCapacity; negative:
	// unbounded (Mooncake's 0).
	QueueCapacity int
	// NoLegacyFields leaves out the vLLM/SGLang aliases (type,
	// block_hashes, parent_block_hash): Mooncake's
	// kv_events_emit_legacy_compat=false.
	NoLegacyFields bool
	// NoObjectKey leaves out object_key, and with it every event whose
	// key is no hash (Mooncake's kv_events_emit_object_key=false).
	NoObjectKey bool
	// SendHWM bounds each subscriber's queue (default DefaultSendHWM):
	// at most SendHWM messages, and at most SendHWM*MooncakeMaxBatch
	// events (the most mooncake_master's would keep) unless one message
	// alone is more.
	SendHWM int
	// MaxBatch is the most events one message carries (default
	// DefaultMaxBatch, at most MaxMaxBatch; MooncakeMaxBatch sends
	// mooncake_master's messages). Consumers decode batches of any
	// size; what a message costs them, and the publisher, is mostly per
	// message (a wake-up, a receive, a write), so under a steady stream
	// four times Mooncake's batch takes a quarter of the messages.
	MaxBatch int
	// PaceInterval and PaceBurst bound how often the publisher sends:
	// PaceBurst sends go out as soon as their events are queued, and
	// after those one per PaceInterval (a token bucket), each send
	// taking every event queued by then, MaxBatch to a message, in one write
	// to each subscriber. Events that come now and then (fewer than one
	// send per interval) go out at once, as mooncake_master's do; under
	// a steady stream (a store's batched puts end hundreds of times a
	// second) an event waits at most the interval, and the publisher and
	// every subscriber wake once per interval rather than once per put,
	// which on the store's own cores costs more than the events do.
	// Messages, sequence numbers and event ids are what they would be
	// with the events queued that way. Defaults DefaultPaceInterval and
	// DefaultPaceBurst; a negative PaceInterval sends every time events
	// are queued (mooncake_master's publisher).
	PaceInterval time.Duration
	PaceBurst    int
	Logger       *slog.Logger
	// now is the clock (tests).
	now func() time.Time
}

// Stats are a publisher's counters (Mooncake's /kv_events/status fields,
// and the messages dropped for subscribers that fell behind).
type Stats struct {
	Enabled             bool   `json:"enabled"`
	PublishedBatches    uint64 `json:"published_batches"`
	PublishedEvents     uint64 `json:"published_events"`
	DroppedEvents       uint64 `json:"dropped_events"`
	SkippedUnparsedKeys uint64 `json:"skipped_unparsed_keys"`
	SubscriberDrops     uint64 `json:"subscriber_dropped_messages"`
	Subscribers         int    `json:"subscribers"`
	QueueLength         int    `json:"queue_length"`
}

// The queue's ring: its size to begin with (and after a burst), and the
// most it keeps once emptied. Batched puts queue tens of events at a
// time: a ring that shrank to a message's worth whenever the publisher
// caught up grew again under the next puts.
const (
	minRing     = 1024
	maxIdleRing = 16384
)

type pending struct {
	term    uint64 // the NewTerm count when queued
	removed bool
	key     string
	medium  string
}

// Publisher queues events and sends them in batches from one goroutine.
// Stored and Removed never block on the network: a full queue drops its
// oldest event, counts it and skips a sequence number so that consumers
// see the gap.
type Publisher struct {
	cfg   Config
	log   *slog.Logger
	sock  *pubSocket
	coder *eventCoder // run goroutine
	items []encoded   // publish's, run goroutine

	mu      sync.Mutex
	term    uint64    // NewTerm calls so far (mu)
	sent    uint64    // the term of the last message sent (run goroutine)
	queue   []pending // ring
	head, n int
	kick    chan struct{}
	stop    chan struct{}
	done    chan struct{}
	closed  sync.Once

	nextEventID atomic.Uint64
	nextSeq     atomic.Uint64

	batches, events, dropped, skipped atomic.Uint64
	// parks counts the times the publisher waited for events with
	// none queued: the wake-ups a put's kick paid for (tests).
	parks atomic.Uint64
}

// New binds cfg.Endpoint and starts the publisher goroutine.
func New(cfg Config) (*Publisher, error) {
	p, err := open(cfg)
	if err != nil {
		return nil, err
	}
	go p.run()
	p.log.Info(fmt.Sprintf("kv events publisher on %s (backend_id %s, queue %d, up to %d events to a message)", p.Endpoint(), p.cfg.BackendID, p.cfg.QueueCapacity, p.cfg.MaxBatch))
	return p, nil
}

// open binds and makes the publisher without starting its goroutine.
func open(cfg Config) (*Publisher, error) {
	if cfg.BackendID == "" {
		return nil, errors.New("kv events: no backend id: every event names its cache owner (kv_events_backend_id)")
	}
	network, addr, err := ParseEndpoint(cfg.Endpoint)
	if err != nil {
		return nil, fmt.Errorf("kv events: %w", err)
	}
	if cfg.QueueCapacity == 0 {
		cfg.QueueCapacity = DefaultQueueCapacity
	}
	if cfg.SendHWM <= 0 {
		cfg.SendHWM = DefaultSendHWM
	}
	switch {
	case cfg.MaxBatch == 0:
		cfg.MaxBatch = DefaultMaxBatch
	case cfg.MaxBatch < 0 || cfg.MaxBatch > MaxMaxBatch:
		return nil, fmt.Errorf("kv events: %d events to a message: want 1 to %d", cfg.MaxBatch, MaxMaxBatch)
	}
	if cfg.PaceInterval == 0 {
		cfg.PaceInterval = DefaultPaceInterval
	}
	if cfg.PaceBurst <= 0 {
		cfg.PaceBurst = DefaultPaceBurst
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.now == nil {
		cfg.now = time.Now
	}
	ln, err := net.Listen(network, addr)
	if err != nil {
		return nil, fmt.Errorf("kv events: bind %s: %w", cfg.Endpoint, err)
	}
	return newPublisher(cfg, connlimit.Default().Listener(ln, "kv events")), nil
}

// newPublisher makes a publisher on ln; its goroutine is not started.
func newPublisher(cfg Config, ln net.Listener) *Publisher {
	p := &Publisher{
		cfg: cfg, log: cfg.Logger,
		coder: newEventCoder(cfg.BackendID, !cfg.NoLegacyFields, !cfg.NoObjectKey),
		queue: make([]pending, minRing),
		items: make([]encoded, 0, cfg.MaxBatch),
		kick:  make(chan struct{}, 1),
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
	}
	p.nextEventID.Store(1)
	p.nextSeq.Store(1)
	p.sock = newPubSocket(ln, cfg.SendHWM, cfg.SendHWM*MooncakeMaxBatch, cfg.Logger)
	return p
}

// Endpoint is the bound endpoint (the port filled in for tcp://H:0).
func (p *Publisher) Endpoint() string {
	a := p.sock.ln.Addr()
	if a.Network() == "unix" {
		return "ipc://" + a.String()
	}
	return "tcp://" + a.String()
}

// Stored queues a stored event for key, now held in medium.
func (p *Publisher) Stored(key, medium string) { p.enqueue(pending{key: key, medium: medium}) }

// Removed queues a removed event for key, last held in medium.
func (p *Publisher) Removed(key, medium string) {
	p.enqueue(pending{removed: true, key: key, medium: medium})
}

// NewTerm starts a new sequence: the next message sent of an event
// queued from now on has sequence number 1 and its events ids from 1, as
// a restarted publisher's. An HA candidate calls it when it begins to
// lead: a consumer of its endpoint then sees the sequence restart
// (another leader may have changed the pool while its stream stood
// still). Events queued before are sent first, in the old sequence.
func (p *Publisher) NewTerm() {
	p.mu.Lock()
	p.term++
	p.mu.Unlock()
}

func (p *Publisher) enqueue(e pending) {
	p.mu.Lock()
	e.term = p.term
	if c := p.cfg.QueueCapacity; c > 0 && p.n >= c {
		p.queue[p.head] = pending{}
		p.head = (p.head + 1) % len(p.queue)
		p.n--
		p.dropped.Add(1)
		p.nextSeq.Add(1) // the gap tells consumers they lost events
	}
	if p.n == len(p.queue) {
		grown := make([]pending, 2*len(p.queue))
		for i := range p.n {
			grown[i] = p.queue[(p.head+i)%len(p.queue)]
		}
		p.queue, p.head = grown, 0
	}
	p.queue[(p.head+p.n)%len(p.queue)] = e
	p.n++
	p.mu.Unlock()
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// take moves up to MaxBatch queued events into buf.
func (p *Publisher) take(buf []pending) []pending {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.n > 0 && len(buf) < p.cfg.MaxBatch {
		if len(buf) > 0 && p.queue[p.head].term != buf[0].term {
			break // one message, one term's sequence
		}
		buf = append(buf, p.queue[p.head])
		p.queue[p.head] = pending{}
		p.head = (p.head + 1) % len(p.queue)
		p.n--
	}
	if p.n == 0 && len(p.queue) > maxIdleRing {
		p.queue, p.head = make([]pending, minRing), 0 // a burst's ring goes
	}
	return buf
}

func (p *Publisher) run() {
	defer close(p.done)
	batch := make([]pending, 0, p.cfg.MaxBatch)
	pace := newPacer(p.cfg.PaceInterval, p.cfg.PaceBurst, time.Now())
	var wait *time.Timer
	for {
		// The send's token first, then its events: under a steady
		// stream the token comes last, and while the publisher sleeps
		// for it the puts' kicks fill a channel nobody waits on, which
		// wakes nobody. (Waiting for the events first had every send
		// woken by a put, a futex wake-up in the put path, and then
		// sleep again for its token.) An event still waits at most
		// the interval: the token's time does not depend on the order.
		if d := pace.wait(time.Now()); d > 0 {
			if wait == nil {
				wait = time.NewTimer(d)
			} else {
				wait.Reset(d)
			}
			select {
			case <-wait.C:
			case <-p.stop:
				p.drain(batch)
				return
			}
		}
		select {
		case <-p.kick:
		default:
			p.parks.Add(1)
			select {
			case <-p.kick:
			case <-p.stop:
				p.drain(batch)
				return
			}
		}
		// A kick from here on is for events this send may not see.
		pace.spend(time.Now())
		p.send(batch)
	}
}

// send is one paced send: the queued events, MaxBatch to a message, up
// to the first message that is not full. Events queued after that kicked
// the loop and wait for a send (and a token) of their own: taking them
// here too would leave their kick to spend a token on an empty queue, and
// the next events would go at once, unpaced.
func (p *Publisher) send(batch []pending) {
	for batch = p.take(batch[:0]); len(batch) > 0; batch = p.take(batch[:0]) {
		p.publish(batch)
		if len(batch) < p.cfg.MaxBatch {
			break
		}
	}
	p.sock.flush()
}

// drain publishes every queued event, MaxBatch to a message, and hands
// the messages to the socket together (one write to each subscriber)
// once it has emptied the queue: events queued while it drains go out
// after, so that the messages' buffers come back for the next ones.
func (p *Publisher) drain(batch []pending) {
	for batch = p.take(batch[:0]); len(batch) > 0; batch = p.take(batch[:0]) {
		p.publish(batch)
		if len(batch) < p.cfg.MaxBatch {
			p.sock.flush()
		}
	}
	p.sock.flush()
}

// pacer is a token bucket of sends: burst of them at once, one per
// interval after.
type pacer struct {
	interval time.Duration
	burst    float64
	tokens   float64
	last     time.Time
}

func newPacer(interval time.Duration, burst int, now time.Time) *pacer {
	return &pacer{interval: interval, burst: float64(burst), tokens: float64(burst), last: now}
}

// wait is how long until a send's token (0: one is there now).
func (pc *pacer) wait(now time.Time) time.Duration {
	if pc.interval <= 0 {
		return 0
	}
	pc.tokens = min(pc.burst, pc.tokens+float64(now.Sub(pc.last))/float64(pc.interval))
	pc.last = now
	if pc.tokens >= 1 {
		return 0
	}
	// rounded up: a timer that fires a little early finds its token
	return time.Duration(math.Ceil((1 - pc.tokens) * float64(pc.interval)))
}

// spend takes a send's token (wait said there is one).
func (pc *pacer) spend(now time.Time) {
	if pc.interval <= 0 {
		return
	}
	pc.tokens = min(pc.burst, pc.tokens+float64(now.Sub(pc.last))/float64(pc.interval))
	pc.last = now
	pc.tokens = max(pc.tokens-1, 0)
}

// publish encodes batch into a message and hands it to the socket.
// encoded is an event of the message publish makes: its key's hash,
// event id and tenant.
type encoded struct {
	pending
	hash   uint64
	hashed bool
	id     uint64
	tenant string
}

func (p *Publisher) publish(batch []pending) {
	if t := batch[0].term; t != p.sent {
		p.sent = t
		p.nextSeq.Store(1)
		p.nextEventID.Store(1)
	}
	items := p.items[:cap(p.items)]
	n := 0
	size := 1 + 9 + 3 + 1 // [ts, [events], dp_rank]
	for _, e := range batch {
		// A multi-tenant master's stored key: tenant, NUL, user key (the
		// default tenant's keys have no scope), as Mooncake's events
		// carry each object's tenant and its user key.
		tenant := DefaultTenantID
		if i := strings.IndexByte(e.key, 0); i >= 0 {
			tenant, e.key = e.key[:i], e.key[i+1:]
		}
		h, ok := ParseSeqHash(e.key)
		if !ok {
			p.skipped.Add(1)
			if p.cfg.NoObjectKey || e.key == "" {
				continue
			}
		}
		items[n] = encoded{pending: e, hash: h, hashed: ok, id: p.nextEventID.Add(1) - 1, tenant: tenant}
		n++
		size += p.coder.maxEventSize(tenant, e.key, e.medium)
	}
	if n == 0 {
		return
	}
	ts := p.cfg.now().UnixMilli()
	m := p.sock.newMessage(size)
	b := appendArrayHeader(m.buf, 3)
	b = appendInt(b, ts)
	b = appendArrayHeader(b, n)
	p.coder.startBatch(ts)
	for i := range items[:n] {
		it := &items[i]
		b = p.coder.appendEvent(b, it.id, !it.removed, it.tenant, it.key, it.medium, it.hash, it.hashed)
		items[i] = encoded{}
	}
	m.buf = appendUint(b, 0) // batch dp_rank: a pool has no DP context
	seq := p.nextSeq.Add(1) - 1
	m.events = int64(n)
	p.sock.queue(m, seq)
	p.batches.Add(1)
	p.events.Add(uint64(n))
}

// Stats reads the counters.
func (p *Publisher) Stats() Stats {
	p.mu.Lock()
	q := p.n
	p.mu.Unlock()
	subs, drops := p.sock.stats()
	return Stats{
		Enabled: true, PublishedBatches: p.batches.Load(), PublishedEvents: p.events.Load(),
		DroppedEvents: p.dropped.Load(), SkippedUnparsedKeys: p.skipped.Load(),
		SubscriberDrops: drops, Subscribers: subs, QueueLength: q,
	}
}

// Close sends what is queued (to subscribers that keep up), then closes
// the socket and its connections.
func (p *Publisher) Close() error {
	var err error
	p.closed.Do(func() {
		close(p.stop)
		<-p.done
		err = p.sock.close()
	})
	return err
}
