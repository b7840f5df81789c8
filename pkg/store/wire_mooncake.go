package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/kvcache-ops/mc/pkg/cororpc"
	"github.com/kvcache-ops/mc/pkg/store/mooncake"
)

// mooncakeWire speaks Mooncake's master RPC (coro_rpc + struct_pack) to a
// mooncake_master, as Mooncake's own client does: ServiceReady first (the
// versions must agree), MountSegment for a node's segment, Ping every
// second, ReMountSegment when a ping says NEED_REMOUNT, and the batch
// forms of the data path's calls.
type mooncakeWire struct {
	cfg wireConfig
	log *slog.Logger
	mc  *mooncake.Client

	mu    sync.Mutex
	ready bool // ServiceReady answered with our version
	// warnUnfenced: a master that cannot say whether it knows a
	// segment is warned about once.
	warnUnfenced sync.Once
}

// dialMooncake prepares a client of the Mooncake master at addr; the
// first call connects. Like dialGRPC it returns the interface, so a
// failure is a nil masterWire.
func dialMooncake(addr string, cfg wireConfig, log *slog.Logger) (masterWire, error) {
	opts := &cororpc.Options{CallTimeout: cfg.timeout, DialTimeout: cfg.timeout, Logger: log}
	mc := mooncake.NewClient(addr, opts)
	mc.Tenant = cfg.tenant
	return &mooncakeWire{cfg: cfg, log: log, mc: mc}, nil
}

// speaksMooncake reports whether addr answers Mooncake's ServiceReady: a
// plain host:port that gRPC could not talk to may be a mooncake_master.
func speaksMooncake(ctx context.Context, addr string) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	c := mooncake.NewClient(addr, &cororpc.Options{DialTimeout: time.Second, Logger: slog.New(discardHandler{})})
	defer c.Close()
	_, err := c.ServiceReady(ctx)
	var ve *mooncake.VersionError
	return err == nil || errors.As(err, &ve)
}

type discardHandler struct{}

func (discardHandler) Enabled(context.Context, slog.Level) bool  { return false }
func (discardHandler) Handle(context.Context, slog.Record) error { return nil }
func (h discardHandler) WithAttrs([]slog.Attr) slog.Handler      { return h }
func (h discardHandler) WithGroup(string) slog.Handler           { return h }

func (w *mooncakeWire) views() <-chan struct{} { return nil }
func (w *mooncakeWire) leader() string         { return w.cfg.master }
func (w *mooncakeWire) close()                 { w.mc.Close() }

// err turns a call's failure into a store error that names the master:
// Mooncake's own codes keep their code, a lost connection or a timeout is
// RPC_FAIL or RPC_TIMEOUT as with mc's master.
func (w *mooncakeWire) err(what string, ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	var me *mooncake.Error
	var ve *mooncake.VersionError
	switch {
	case errors.As(err, &me):
		return Errorf(Code(me.Code), "%s", what)
	case errors.As(err, &ve):
		return Errorf(InvalidVersion, "%s: master %s: %v", what, w.cfg.master, ve)
	case errors.Is(err, context.Canceled) && ctx.Err() != nil:
		return fmt.Errorf("%s: %w", what, context.Canceled)
	case errors.Is(err, context.DeadlineExceeded):
		return clockOf(ctx, w.cfg.timeout).timeoutErr(what, w.cfg.master)
	}
	return Errorf(RPCFail, "%s: master %s: %v", what, w.cfg.master, err)
}

func (w *mooncakeWire) itemErr(what string, err error) error {
	if err == nil {
		return nil
	}
	var me *mooncake.Error
	if errors.As(err, &me) {
		return Errorf(Code(me.Code), "%s", what)
	}
	return Errorf(RPCFail, "%s: %v", what, err)
}

func (w *mooncakeWire) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	return withClock(ctx, w.cfg.timeout)
}

func (w *mooncakeWire) id() mooncake.UUID { return toMooncakeUUID(w.cfg.id) }

func toMooncakeUUID(u UUID) mooncake.UUID { return mooncake.UUID{First: u.First, Second: u.Second} }

// hello asks ServiceReady once per connection life: a master of another
// Mooncake store version is refused here, with both versions named,
// rather than misread later.
func (w *mooncakeWire) hello(ctx context.Context) error {
	w.mu.Lock()
	ready := w.ready
	w.mu.Unlock()
	if ready {
		return nil
	}
	v, err := w.mc.ServiceReady(ctx)
	if err != nil {
		return w.err("connect", ctx, err)
	}
	if v != mooncake.StoreVersion {
		return Errorf(InvalidVersion, "connect: master %s is Mooncake store version %s; mc speaks %s (Mooncake %s)", w.cfg.master, v, mooncake.StoreVersion, mooncake.MooncakeCommit[:7])
	}
	w.mu.Lock()
	w.ready = true
	w.mu.Unlock()
	return nil
}

func toMooncakeSegment(s SegmentInfo) mooncake.Segment {
	return mooncake.Segment{ID: toMooncakeUUID(s.ID), Name: s.Name, Base: s.Base, Size: s.Size, TEEndpoint: s.Endpoint, Protocol: s.Protocol}
}

func (w *mooncakeWire) mount(ctx context.Context, seg SegmentInfo) error {
	ctx, cancel := w.bound(ctx)
	defer cancel()
	if err := w.hello(ctx); err != nil {
		return err
	}
	if err := w.mc.MountSegment(ctx, toMooncakeSegment(seg), w.id()); err != nil {
		return fmt.Errorf("mount segment %q: %w", seg.Name, w.err("mount segment", ctx, err))
	}
	return nil
}

func (w *mooncakeWire) remount(ctx context.Context, segs []SegmentInfo) error {
	ctx, cancel := w.bound(ctx)
	defer cancel()
	if err := w.hello(ctx); err != nil {
		return err
	}
	if len(segs) > 0 {
		// Mooncake's master asks every client to re-mount once after its
		// first MountSegment (only ReMountSegment makes a client OK), and
		// again after it forgot the client. It takes any segment back,
		// but one it forgot goes with what it granted in it before: a
		// writer stalled since would land on objects placed anew. So a
		// segment the master still knows is re-mounted as it is, and one
		// it does not is renewed (new memory) and mounted as new.
		for _, s := range segs {
			_, err := w.mc.QuerySegmentStatusById(ctx, toMooncakeUUID(s.ID))
			var me *mooncake.Error
			switch {
			case errors.As(err, &me) && me.Code == mooncake.SegmentNotFound:
				return Errorf(SegmentNotFound, "master %s no longer knows segment %q: it must be mounted anew", w.cfg.master, s.Name)
			case err != nil:
				var ve *mooncake.VersionError
				if !errors.As(err, &ve) {
					return w.err("re-mount", ctx, err)
				}
				// A master without the call: it cannot say whether it
				// knows the segment; re-mounting it as it is keeps the
				// pool working, unfenced (as Mooncake's own nodes).
				w.warnUnfenced.Do(func() {
					w.log.Warn(fmt.Sprintf("master %s cannot be asked whether it knows segment %q (%v): re-mounting it as it is, so a writer stalled across a restart of that master is not fenced", w.cfg.master, s.Name, err))
				})
			}
		}
		ms := make([]mooncake.Segment, len(segs))
		for i, s := range segs {
			ms[i] = toMooncakeSegment(s)
		}
		if err := w.mc.ReMountSegment(ctx, ms, w.id()); err != nil {
			return w.err("re-mount", ctx, err)
		}
		return nil
	}
	// A pure client has nothing to mount; Mooncake's master learns of it
	// from its first put or ping.
	return nil
}

// Mooncake's Ping carries no drops: a transfer to a node that went silent
// ends at the transfer timeout.
func (w *mooncakeWire) ping(ctx context.Context, _, _ uint64) (pingResult, error) {
	ctx, cancel := w.bound(ctx)
	defer cancel()
	r, err := w.mc.Ping(ctx, w.id())
	if err != nil {
		if errors.Is(err, cororpc.ErrConnectionLost) {
			// A restarted master may be another version: ask again.
			w.mu.Lock()
			w.ready = false
			w.mu.Unlock()
		}
		return pingResult{}, w.err("ping", ctx, err)
	}
	st := ClientOK
	if r.ClientStatus == mooncake.ClientNeedRemount {
		st = ClientNeedRemount
	}
	return pingResult{view: uint64(max(r.ViewVersion, 0)), status: st}, nil
}

func (w *mooncakeWire) unmount(ctx context.Context, seg UUID) error {
	ctx, cancel := w.bound(ctx)
	defer cancel()
	err := w.mc.UnmountSegment(ctx, toMooncakeUUID(seg), w.id())
	var me *mooncake.Error
	if errors.As(err, &me) && me.Code == mooncake.SegmentNotFound {
		return nil
	}
	return w.err("unmount segment", ctx, err)
}

// unregister has no Mooncake counterpart: a client that stops pinging is
// dropped after the master's client_ttl.
func (w *mooncakeWire) unregister(context.Context) error { return nil }

func toMooncakeConfig(rc ReplicateConfig) mooncake.ReplicateConfig {
	out := mooncake.ReplicateConfig{
		ReplicaNum: uint64(max(rc.ReplicaNum, 1)), PreferredSegments: rc.PreferredSegments,
		PreferAllocInSameNode: rc.PreferLocal, WithHardPin: rc.HardPin,
	}
	if rc.SoftPin {
		out.SoftPinAction = mooncake.SoftPinEnable
		if rc.SoftPinTTL > 0 {
			out.SoftPinTTLms.Value, out.SoftPinTTLms.Valid = uint64(rc.SoftPinTTL/time.Millisecond), true
		}
	}
	if out.PreferredSegments == nil {
		out.PreferredSegments = []string{}
	}
	out.PreferredNoFSegments = []string{}
	return out
}

// replicasFrom keeps the memory replicas mc can move bytes to and from;
// disk and NVMe-oF replicas are Mooncake's own business.
func replicasFrom(ds []mooncake.ReplicaDescriptor) []Replica {
	out := make([]Replica, 0, len(ds))
	for _, d := range ds {
		b, ok := d.Memory()
		if !ok {
			continue
		}
		out = append(out, Replica{Segment: b.TransportEndpoint, Endpoint: b.TransportEndpoint, Protocol: b.Protocol,
			Addr: b.BufferAddress, Len: b.Size, Complete: d.Status == mooncake.ReplicaComplete})
	}
	return out
}

func (w *mooncakeWire) putStart(ctx context.Context, items []putItem, rc ReplicateConfig, upsert bool) ([][]Replica, []error, error) {
	ctx, cancel := w.bound(ctx)
	defer cancel()
	keys := make([]string, len(items))
	sizes := make([]uint64, len(items))
	for i, it := range items {
		keys[i], sizes[i] = it.key, it.n
	}
	ds, errs, err := w.mc.BatchPutStart(ctx, w.id(), keys, sizes, toMooncakeConfig(rc), upsert)
	if err != nil {
		return nil, nil, w.err("put start", ctx, err)
	}
	out := make([][]Replica, len(items))
	for i := range items {
		if errs[i] != nil {
			errs[i] = w.itemErr(fmt.Sprintf("put %q", keys[i]), errs[i])
			continue
		}
		out[i] = replicasFrom(ds[i])
		if len(out[i]) == 0 {
			errs[i] = Errorf(InvalidReplica, "put %q: the master placed no memory replica", keys[i])
		}
	}
	return out, errs, nil
}

func (w *mooncakeWire) keysResult(what string, keys []string, errs []error, err error, ctx context.Context) []error {
	out := make([]error, len(keys))
	for i := range out {
		switch {
		case err != nil:
			out[i] = w.err(what, ctx, err)
		default:
			out[i] = w.itemErr(fmt.Sprintf("%s %q", what, keys[i]), errs[i])
		}
	}
	return out
}

// endsPartial: Mooncake's PutEnd has no field for failed replicas.
func (w *mooncakeWire) endsPartial() bool { return false }

func (w *mooncakeWire) putEnd(ctx context.Context, keys []string, _ []uint64, _ []failedReplica, upsert bool) []error {
	ctx, cancel := w.bound(ctx)
	defer cancel()
	errs, err := w.mc.BatchPutEnd(ctx, w.id(), keys, upsert)
	return w.keysResult("put end", keys, errs, err, ctx)
}

func (w *mooncakeWire) putRevoke(ctx context.Context, keys []string, upsert bool, _ []string) []error {
	ctx, cancel := w.bound(ctx)
	defer cancel()
	errs, err := w.mc.BatchPutRevoke(ctx, w.id(), keys, upsert)
	return w.keysResult("put revoke", keys, errs, err, ctx)
}

func (w *mooncakeWire) replicaLists(ctx context.Context, keys []string) ([][]Replica, []uint64, []error, error) {
	ctx, cancel := w.bound(ctx)
	defer cancel()
	ls, errs, err := w.mc.BatchGetReplicaList(ctx, keys)
	if err != nil {
		return nil, nil, nil, w.err("get", ctx, err)
	}
	out := make([][]Replica, len(keys))
	for i := range keys {
		if errs[i] != nil {
			errs[i] = w.itemErr(fmt.Sprintf("get %q", keys[i]), errs[i])
			continue
		}
		for _, r := range replicasFrom(ls[i].Replicas) {
			if r.Complete {
				r.Lease = time.Duration(ls[i].LeaseTTLms) * time.Millisecond
				out[i] = append(out[i], r)
			}
		}
	}
	// Mooncake's wire carries no checksum of mc's.
	return out, nil, errs, nil
}

func (w *mooncakeWire) exist(ctx context.Context, keys []string) ([]bool, []error) {
	ctx, cancel := w.bound(ctx)
	defer cancel()
	ex, errs, err := w.mc.BatchExistKey(ctx, keys)
	if err != nil {
		return make([]bool, len(keys)), w.keysResult("exist", keys, nil, err, ctx)
	}
	return ex, w.keysResult("exist", keys, errs, nil, ctx)
}

func (w *mooncakeWire) remove(ctx context.Context, keys []string, force bool) []error {
	ctx, cancel := w.bound(ctx)
	defer cancel()
	errs, err := w.mc.BatchRemove(ctx, keys, force)
	return w.keysResult("remove", keys, errs, err, ctx)
}

func (w *mooncakeWire) removeAll(ctx context.Context) (uint64, error) {
	ctx, cancel := w.bound(ctx)
	defer cancel()
	n, err := w.mc.RemoveAll(ctx, false)
	if err != nil {
		return 0, w.err("remove all", ctx, err)
	}
	return uint64(max(n, 0)), nil
}

// query reads one key's replicas without a lease: Mooncake registers no
// lease-free single-key read, but its by-regex read takes none, so the
// key goes as an anchored, quoted pattern.
func (w *mooncakeWire) query(ctx context.Context, key string) ([]Replica, error) {
	ctx, cancel := w.bound(ctx)
	defer cancel()
	m, err := w.mc.GetReplicaListByRegex(ctx, "^"+regexp.QuoteMeta(key)+"$")
	if err != nil {
		return nil, w.err("query", ctx, err)
	}
	ds, ok := m[key]
	if !ok {
		return nil, Errorf(ObjectNotFound, "query %q", key)
	}
	return replicasFrom(ds), nil
}

// replicaListByRegex: Mooncake's answer is a map of every match; it is
// listed in key order, at most MaxBatchSize keys, as mc's master does.
// The pattern is the master's regex dialect (std::regex ECMAScript on
// mooncake_master, RE2 on mc's).
func (w *mooncakeWire) replicaListByRegex(ctx context.Context, pattern string) (RegexMatch, error) {
	ctx, cancel := w.bound(ctx)
	defer cancel()
	m, err := w.mc.GetReplicaListByRegex(ctx, pattern)
	if err != nil {
		return RegexMatch{}, w.err("get replica list by regex", ctx, err)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := RegexMatch{Matched: uint64(len(keys))}
	out.Keys = keys[:min(len(keys), MaxBatchSize)]
	out.Replicas = make([][]Replica, len(out.Keys))
	for i, k := range out.Keys {
		out.Replicas[i] = replicasFrom(m[k])
	}
	return out, nil
}

// removeByRegex: Mooncake's RemoveByRegex answers a count only, and has
// no dry run; a dry run lists the matches (which of them a lease would
// keep, only the real removal can tell).
func (w *mooncakeWire) removeByRegex(ctx context.Context, pattern string, force, dryRun bool) (RegexRemoval, error) {
	if dryRun {
		m, err := w.replicaListByRegex(ctx, pattern)
		if err != nil {
			return RegexRemoval{}, err
		}
		return RegexRemoval{Removed: m.Keys, RemovedCount: m.Matched}, nil
	}
	ctx, cancel := w.bound(ctx)
	defer cancel()
	n, err := w.mc.RemoveByRegex(ctx, pattern, force)
	if err != nil {
		return RegexRemoval{}, w.err("remove by regex", ctx, err)
	}
	return RegexRemoval{RemovedCount: uint64(max(n, 0))}, nil
}
