package master

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvcache-ops/mc/pkg/cororpc"
	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/mooncake"
	"github.com/kvcache-ops/mc/pkg/structpack"
)

// MooncakeGate runs before every Mooncake-wire call and again before its
// answer is sent, as the gRPC gate does (HA refuses calls on a master
// that is not the serving leader); a non-nil error fails the call with
// that error's code.
type MooncakeGate func(ctx context.Context, call string) error

// NewMooncakeServer returns a coro_rpc server answering Mooncake's master
// RPC (the calls a Mooncake client, mooncake_client and vLLM/SGLang/LMCache
// through them make) from m, with the same semantics as the gRPC API:
// leases, pins, regions, eviction inside a failing put, and, through
// Config.Sync, acknowledgement only after the HA op log commits.
func NewMooncakeServer(m *Master, gate MooncakeGate, log *slog.Logger) *cororpc.Server {
	if log == nil {
		log = slog.Default()
	}
	ms := &mooncakeServer{m: m, gate: gate, log: log, rpc: &rpcServer{m: m}}
	// Every answer is encoded into a pooled buffer (wrap), returned to
	// the pool once written.
	hangup := sessionIDs()
	srv := cororpc.NewServer(&cororpc.ServerOptions{
		MaxMessageLen: uint32(store.MaxMsgSize), Logger: log, Recycle: recycleBody,
		Budget: m.budget, ReadTimeout: m.cfg.RequestReadTimeout,
		Inline:         inlineRule(m),
		CancelOnHangup: func(id uint32) bool { return hangup[id] },
	})
	hs := ms.handlers()
	for name, answer := range unsupportedCalls {
		hs[name] = ms.unsupported(name, answer)
	}
	for name, h := range hs {
		if _, err := srv.Register(mooncake.Service+"::"+name, ms.wrap(name, h)); err != nil {
			// Two handler names hashing alike is a programming error the
			// tests catch.
			panic(err)
		}
	}
	return srv
}

// inlineRule says which calls a connection's read loop runs itself when
// its client makes one call at a time: Mooncake's (inlineCalls) and mc's
// own client's Session calls (sessionInline, registered by the gRPC
// server that serves the port, ServeShared).
//
// Mooncake's gets may wait for a disk load or staging room (seconds)
// once a node has a disk tier: then each gets a goroutine of its own,
// for Mooncake's client multiplexes its threads' calls on one connection,
// and a get waiting in the read loop would hold up the others' calls.
// mc's client sends one call at a time per connection, so its gets stay
// inline (as its put starts, which may wait for read leases).
func inlineRule(m *Master) func(uint32) bool {
	inline := make(map[uint32]bool)
	for name := range inlineCalls(m.cfg.Sync != nil) {
		inline[cororpc.FunctionID(mooncake.Service+"::"+name)] = true
	}
	gets := map[uint32]bool{
		cororpc.FunctionID(mooncake.Service + "::GetReplicaList"):      true,
		cororpc.FunctionID(mooncake.Service + "::BatchGetReplicaList"): true,
	}
	for id := range sessionInline(m.cfg.Sync != nil) {
		inline[id] = true
	}
	return func(id uint32) bool { return inline[id] && !(gets[id] && m.tiers.online.Load() > 0) }
}

// inlineCalls are the calls a connection's read loop may run itself when
// its client makes one call at a time (cororpc.ServerOptions.Inline): the
// hot calls of a put and a get, which only take the master's locks. With
// HA, puts and removes wait for the op log's quorum, so only reads are.
// Never: long polls (FetchTasks, PollRemoveAll), graceful unmounts (they
// wait for reads), scans (regex, RemoveAll).
func inlineCalls(ha bool) map[string]bool {
	calls := map[string]bool{
		"ServiceReady": true, "GetStorageConfig": true, "Ping": true,
		"ExistKey": true, "BatchExistKey": true, "GetReplicaList": true, "BatchGetReplicaList": true,
	}
	if !ha {
		for _, c := range []string{"PutStart", "UpsertStart", "BatchPutStart", "BatchUpsertStart",
			"PutEnd", "UpsertEnd", "BatchPutEnd", "BatchUpsertEnd",
			"PutRevoke", "UpsertRevoke", "BatchPutRevoke", "BatchUpsertRevoke", "Remove", "BatchRemove"} {
			calls[c] = true
		}
	}
	return calls
}

type mooncakeServer struct {
	m    *Master
	gate MooncakeGate
	log  *slog.Logger
	rpc  *rpcServer // durable()
	// warned remembers (client address, call) pairs already logged for a
	// request this master cannot decode, so a client of another version
	// logs once, not once per call (warnOnce); nwarned counts them.
	warned  sync.Map
	nwarned atomic.Int64
	nextID  atomic.Uint64
}

type mooncakeHandler func(ctx context.Context, req *cororpc.Request) (any, error)

// wrap decodes nothing itself: it runs the gate, the handler, and encodes
// the handler's answer.
func (s *mooncakeServer) wrap(name string, h mooncakeHandler) cororpc.Handler {
	return func(ctx context.Context, req *cororpc.Request) ([]byte, error) {
		if s.gate != nil {
			if err := s.gate(ctx, name); err != nil {
				return nil, &cororpc.RPCError{Code: cororpc.ErrcRPCThrowException, Message: err.Error()}
			}
		}
		out, err := h(ctx, req)
		if s.gate != nil {
			// Again once answered: HA's leader may have lost its lease
			// during the call (paused), and must not send what it read.
			if gerr := s.gate(ctx, name); gerr != nil {
				if b, ok := out.(preEncoded); ok {
					recycleBody(b)
				}
				return nil, &cororpc.RPCError{Code: cororpc.ErrcRPCThrowException, Message: gerr.Error()}
			}
		}
		if err != nil {
			return nil, err
		}
		if b, ok := out.(preEncoded); ok {
			return b, nil
		}
		b, err := structpack.AppendMarshal(getBody(), out)
		if err != nil {
			recycleBody(b)
			return nil, fmt.Errorf("%s: encode answer: %w", name, err)
		}
		return b, nil
	}
}

// args decodes a request's arguments; a body this master cannot decode
// (another Mooncake version's types) is answered as coro_rpc answers
// arguments it cannot deserialize, and logged once per client and call.
func (s *mooncakeServer) args(name string, req *cororpc.Request, ptrs ...any) error {
	return s.argsErr(name, req, structpack.ArgsDecoder{MaxElems: maxArgElems}.UnmarshalArgs(req.Body, ptrs...))
}

// maxArgElems bounds the elements of a request's vectors together
// before they are decoded: a batch has at most store.MaxBatchSize keys,
// each with a few slices, and without a bound a 64 MiB request of 16
// million empty keys (4 bytes each on the wire, 16 in Go) decoded into a
// GiB before the batch limit refused it.
const maxArgElems = 64 * store.MaxBatchSize

// argsBorrow is args with the strings pointing into the request's body
// (structpack.UnmarshalArgsBorrow): for a handler done with them when it
// returns.
func (s *mooncakeServer) argsBorrow(name string, req *cororpc.Request, ptrs ...any) error {
	return s.argsErr(name, req, structpack.ArgsDecoder{Borrow: true, MaxElems: maxArgElems}.UnmarshalArgs(req.Body, ptrs...))
}

func (s *mooncakeServer) argsErr(name string, req *cororpc.Request, err error) error {
	if err == nil {
		return nil
	}
	peer := ""
	if req.RemoteAddr != nil {
		peer = req.RemoteAddr.String()
	}
	msg := fmt.Sprintf("%s: cannot decode the arguments from %s", name, peer)
	var he *structpack.HashMismatchError
	if errors.As(err, &he) {
		msg = fmt.Sprintf("%s: the client at %s speaks another Mooncake version (mc speaks store %s, Mooncake %s): %v",
			name, peer, mooncake.StoreVersion, mooncake.MooncakeCommit[:7], err)
	} else {
		msg += ": " + err.Error()
	}
	if s.warnOnce(hostOf(peer) + "|" + name) {
		s.log.Warn(msg)
	}
	return &cororpc.RPCError{Code: cororpc.ErrcInvalidRPCArguments, Message: msg}
}

// maxWarned bounds the pairs warned remembers: clients from ever new
// addresses (an IPv6 prefix holds billions) would grow it for as long as
// the master runs. Past it, the memory starts over (each pair may be
// logged once more).
const maxWarned = 4096

// warnOnce reports whether key is new to warned (log it), remembering it.
func (s *mooncakeServer) warnOnce(key string) bool {
	if _, seen := s.warned.LoadOrStore(key, true); seen {
		return false
	}
	if s.nwarned.Add(1) > maxWarned {
		s.warned.Clear()
		s.nwarned.Store(0)
	}
	return true
}

// msDuration converts milliseconds from the wire, saturating.
func msDuration(ms uint64) time.Duration {
	return time.Duration(min(ms, uint64(1<<62)/uint64(time.Millisecond))) * time.Millisecond
}

func fromUUID(u mooncake.UUID) store.UUID { return store.UUID{First: u.First, Second: u.Second} }
func codeOf(err error) mooncake.ErrorCode { return mooncake.ErrorCode(store.CodeOf(err)) }
func errVoid(err error) mooncake.ExpectVoid {
	return mooncake.ExpectVoid{Error: codeOf(err), HasError: err != nil}
}

func segmentFrom(s mooncake.Segment) store.SegmentInfo {
	return store.SegmentInfo{ID: fromUUID(s.ID), Name: s.Name, Base: s.Base, Size: s.Size, Endpoint: s.TEEndpoint, Protocol: s.Protocol}
}

func configFrom(c mooncake.ReplicateConfig) store.ReplicateConfig {
	rc := store.ReplicateConfig{ReplicaNum: int(min(c.ReplicaNum, 1<<20)), PreferredSegments: c.PreferredSegments,
		PreferLocal: c.PreferAllocInSameNode, HardPin: c.WithHardPin, SoftPin: c.SoftPinAction == mooncake.SoftPinEnable}
	if c.PreferredSegment != "" {
		rc.PreferredSegments = append(rc.PreferredSegments, c.PreferredSegment)
	}
	if rc.SoftPin && c.SoftPinTTLms.Valid {
		rc.SoftPinTTL = msDuration(c.SoftPinTTLms.Value)
	}
	if rc.ReplicaNum == 0 {
		rc.ReplicaNum = 1
	}
	return rc
}

// descriptors converts mc's replicas to Mooncake's memory descriptors.
func (s *mooncakeServer) descriptors(reps []store.Replica) []mooncake.ReplicaDescriptor {
	return s.descriptorsFrom(reps, s.nextID.Add(uint64(len(reps)))-uint64(len(reps)), nil)
}

// descriptorsFrom renders reps with the ids after base, into buf's
// spare room when it has enough (a batch renders every key's replicas
// into one array).
func (s *mooncakeServer) descriptorsFrom(reps []store.Replica, base uint64, buf []mooncake.ReplicaDescriptor) []mooncake.ReplicaDescriptor {
	if cap(buf)-len(buf) < len(reps) {
		buf = make([]mooncake.ReplicaDescriptor, 0, len(reps))
	}
	n := len(buf)
	for i, r := range reps {
		st := mooncake.ReplicaProcessing
		if r.Complete {
			st = mooncake.ReplicaComplete
		}
		buf = append(buf, mooncake.ReplicaDescriptor{
			ID: base + uint64(i) + 1,
			Descriptor: mooncake.DescriptorVariant{Value: mooncake.MemoryDescriptor{Buffer: mooncake.BufferDescriptor{
				Size: r.Len, BufferAddress: r.Addr, Protocol: r.Protocol, TransportEndpoint: r.Endpoint}}},
			Status: st,
		})
	}
	return buf[n:len(buf):len(buf)]
}

func (s *mooncakeServer) list(r ReplicaResult) mooncake.ExpectList {
	if r.Err != nil {
		return mooncake.ExpectList{Error: codeOf(r.Err), HasError: true}
	}
	return mooncake.ExpectList{Value: mooncake.GetReplicaListResponse{Replicas: s.descriptors(r.Replicas), LeaseTTLms: uint64(r.LeaseTTL.Milliseconds())}}
}

// listsFrom renders a batch's results as Mooncake's values (the general
// route of BatchGetReplicaList's answer), with the ids after next (reserved
// with one atomic add per batch, not per replica) and one descriptor array.
func (s *mooncakeServer) listsFrom(rs []ReplicaResult, next uint64) ([]mooncake.ExpectList, bool) {
	total := 0
	for _, r := range rs {
		if r.Err == nil {
			total += len(r.Replicas)
		}
	}
	buf := make([]mooncake.ReplicaDescriptor, 0, total)
	out := make([]mooncake.ExpectList, len(rs))
	failed := false
	for i, r := range rs {
		if r.Err != nil {
			out[i], failed = mooncake.ExpectList{Error: codeOf(r.Err), HasError: true}, true
			continue
		}
		d := s.descriptorsFrom(r.Replicas, next, buf)
		buf = buf[:len(buf)+len(d)]
		next += uint64(len(d))
		out[i] = mooncake.ExpectList{Value: mooncake.GetReplicaListResponse{Replicas: d, LeaseTTLms: uint64(r.LeaseTTL.Milliseconds())}}
	}
	return out, failed
}

func (s *mooncakeServer) descs(r ReplicaResult) mooncake.ExpectDescs {
	if r.Err != nil {
		return mooncake.ExpectDescs{Error: codeOf(r.Err), HasError: true}
	}
	return mooncake.ExpectDescs{Value: s.descriptors(r.Replicas)}
}

func voids(errs []error) []mooncake.ExpectVoid {
	out := make([]mooncake.ExpectVoid, len(errs))
	for i, e := range errs {
		out[i] = errVoid(e)
	}
	return out
}

func batchErr(name string, n int) error {
	if n > store.MaxBatchSize {
		return &cororpc.RPCError{Code: cororpc.ErrcInvalidRPCArguments, Message: fmt.Sprintf("%s: batch of %d items exceeds the limit of %d", name, n, store.MaxBatchSize)}
	}
	return nil
}

func (s *mooncakeServer) handlers() map[string]mooncakeHandler {
	m := s.m
	one := func(err error) error { return s.rpc.durable([]error{err})[0] }
	putStart := func(name string, upsert bool) mooncakeHandler {
		return func(ctx context.Context, req *cororpc.Request) (any, error) {
			// A new HA leader holds puts until its nodes are back.
			_ = m.AwaitTakeover(ctx)
			var client mooncake.UUID
			var key, tenant string
			var n uint64
			var rc mooncake.ReplicateConfig
			if err := s.args(name, req, &client, &key, &n, &rc, &tenant); err != nil {
				return nil, err
			}
			t, err := m.WriteTenant(tenant, false, true)
			if err != nil {
				m.m.Op(opName(upsert, "batch_upsert_start", "batch_put_start"), true)
				return mooncake.ExpectDescs{Error: codeOf(err), HasError: true}, nil
			}
			key = store.ScopeKey(t, key)
			start := m.BatchPutStart
			if upsert {
				start = m.BatchUpsertStart
			}
			r := start(fromUUID(client), hostOf(addrOf(req)), []PutItem{{Key: key, Size: n}}, configFrom(rc))[0]
			m.m.Op(opName(upsert, "batch_upsert_start", "batch_put_start"), r.Err != nil)
			return s.descs(r), nil
		}
	}
	batchPutStart := func(name string, upsert bool) mooncakeHandler {
		return func(ctx context.Context, req *cororpc.Request) (any, error) {
			_ = m.AwaitTakeover(ctx)
			var client mooncake.UUID
			var keys []string
			var sizes []uint64
			var rc mooncake.ReplicateConfig
			var tenant string
			if err := s.args(name, req, &client, &keys, &sizes, &rc, &tenant); err != nil {
				return nil, err
			}
			if err := batchErr(name, len(keys)); err != nil {
				return nil, err
			}
			if len(sizes) != len(keys) {
				return nil, &cororpc.RPCError{Code: cororpc.ErrcInvalidRPCArguments, Message: fmt.Sprintf("%s: %d keys but %d sizes", name, len(keys), len(sizes))}
			}
			t, terr := m.WriteTenant(tenant, false, true)
			keys = store.ScopeKeys(t, keys)
			items := make([]PutItem, len(keys))
			for i := range keys {
				items[i] = PutItem{Key: keys[i], Size: sizes[i]}
			}
			if terr != nil {
				out := make([]mooncake.ExpectDescs, len(keys))
				for i := range out {
					out[i] = mooncake.ExpectDescs{Error: codeOf(terr), HasError: true}
				}
				m.m.Op(opName(upsert, "batch_upsert_start", "batch_put_start"), true)
				return out, nil
			}
			start := m.BatchPutStart
			if upsert {
				start = m.BatchUpsertStart
			}
			out, failed := s.putStartAnswer(start(fromUUID(client), hostOf(addrOf(req)), items, configFrom(rc)))
			m.m.Op(opName(upsert, "batch_upsert_start", "batch_put_start"), failed)
			return out, nil
		}
	}
	// end and revoke: f finishes keys; single forms take an ObjectMeta
	// (end) or a key (revoke) and a replica type, batch forms a list.
	endOne := func(name, op string, f func(store.UUID, []string) []error) mooncakeHandler {
		return func(_ context.Context, req *cororpc.Request) (any, error) {
			var client mooncake.UUID
			var meta mooncake.ObjectMeta
			var rt mooncake.ReplicaType
			var tenant string
			if err := s.args(name, req, &client, &meta, &rt, &tenant); err != nil {
				return nil, err
			}
			t, err := m.WriteTenant(tenant, false, false)
			if err == nil {
				err = one(f(fromUUID(client), []string{store.ScopeKey(t, meta.Key)})[0])
			}
			m.m.Op(op, err != nil)
			return errVoid(err), nil
		}
	}
	revokeOne := func(name, op string, f func(store.UUID, []string) []error) mooncakeHandler {
		return func(_ context.Context, req *cororpc.Request) (any, error) {
			var client mooncake.UUID
			var key, tenant string
			var rt mooncake.ReplicaType
			if err := s.args(name, req, &client, &key, &rt, &tenant); err != nil {
				return nil, err
			}
			t, err := m.WriteTenant(tenant, false, false)
			if err == nil {
				err = one(f(fromUUID(client), []string{store.ScopeKey(t, key)})[0])
			}
			m.m.Op(op, err != nil)
			return errVoid(err), nil
		}
	}
	endBatch := func(name, op string, typed bool, f func(store.UUID, []string) []error) mooncakeHandler {
		return func(_ context.Context, req *cororpc.Request) (any, error) {
			var client mooncake.UUID
			var metas []mooncake.ObjectMeta
			var rt mooncake.ReplicaType
			var tenant string
			ptrs := []any{&client, &metas, &rt, &tenant}
			if !typed {
				ptrs = []any{&client, &metas, &tenant}
			}
			// Borrowed: putEnd only looks keys up (what it keeps is the
			// object's own key).
			if err := s.argsBorrow(name, req, ptrs...); err != nil {
				return nil, err
			}
			if err := batchErr(name, len(metas)); err != nil {
				return nil, err
			}
			keys := make([]string, len(metas))
			for i, x := range metas {
				keys[i] = x.Key
			}
			t, terr := m.WriteTenant(tenant, false, false)
			if terr != nil {
				m.m.Op(op, true)
				return voids(failErrsN(len(keys), terr)), nil
			}
			errs := s.rpc.durable(f(fromUUID(client), store.ScopeKeys(t, keys)))
			m.m.Op(op, anyErr(errs))
			return voids(errs), nil
		}
	}
	revokeBatch := func(name, op string, typed bool, f func(store.UUID, []string) []error) mooncakeHandler {
		return func(_ context.Context, req *cororpc.Request) (any, error) {
			var client mooncake.UUID
			var keys []string
			var rt mooncake.ReplicaType
			var tenant string
			ptrs := []any{&client, &keys, &rt, &tenant}
			if !typed {
				ptrs = []any{&client, &keys, &tenant}
			}
			if err := s.args(name, req, ptrs...); err != nil {
				return nil, err
			}
			if err := batchErr(name, len(keys)); err != nil {
				return nil, err
			}
			t, terr := m.WriteTenant(tenant, false, false)
			if terr != nil {
				m.m.Op(op, true)
				return voids(failErrsN(len(keys), terr)), nil
			}
			errs := s.rpc.durable(f(fromUUID(client), store.ScopeKeys(t, keys)))
			m.m.Op(op, anyErr(errs))
			return voids(errs), nil
		}
	}
	return map[string]mooncakeHandler{
		"ServiceReady": func(context.Context, *cororpc.Request) (any, error) {
			return mooncake.ExpectString{Value: mooncake.StoreVersion}, nil
		},
		"GetStorageConfig": func(context.Context, *cororpc.Request) (any, error) {
			// No disk tier here: an empty fsdir tells a client to keep
			// offloading off, as mooncake_master without --root_fs_dir.
			return mooncake.ExpectConfig{Value: mooncake.GetStorageConfigResponse{EnableDiskEviction: true}}, nil
		},
		"MountSegment": func(_ context.Context, req *cororpc.Request) (any, error) {
			var seg mooncake.Segment
			var client mooncake.UUID
			if err := s.args("MountSegment", req, &seg, &client); err != nil {
				return nil, err
			}
			err := one(m.MountSegment(fromUUID(client), segmentFrom(seg)))
			m.m.Op("mount_segment", err != nil)
			return errVoid(err), nil
		},
		"ReMountSegment": func(_ context.Context, req *cororpc.Request) (any, error) {
			var segs []mooncake.Segment
			var client mooncake.UUID
			if err := s.args("ReMountSegment", req, &segs, &client); err != nil {
				return nil, err
			}
			if err := batchErr("ReMountSegment", len(segs)); err != nil {
				return nil, err
			}
			in := make([]store.SegmentInfo, len(segs))
			for i, x := range segs {
				in[i] = segmentFrom(x)
			}
			var err error
			for _, e := range s.rpc.durable(m.ReMountSegment(fromUUID(client), in)) {
				if e != nil && err == nil {
					err = e
				}
			}
			m.m.Op("remount_segment", err != nil)
			return errVoid(err), nil
		},
		"UnmountSegment": func(_ context.Context, req *cororpc.Request) (any, error) {
			var seg, client mooncake.UUID
			if err := s.args("UnmountSegment", req, &seg, &client); err != nil {
				return nil, err
			}
			err := m.UnmountSegment(fromUUID(client), fromUUID(seg))
			m.m.Op("unmount_segment", err != nil)
			return errVoid(err), nil
		},
		"GracefulUnmountSegment": func(ctx context.Context, req *cororpc.Request) (any, error) {
			var seg, client mooncake.UUID
			var graceMs uint64
			if err := s.args("GracefulUnmountSegment", req, &seg, &client, &graceMs); err != nil {
				return nil, err
			}
			if graceMs > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, msDuration(graceMs))
				defer cancel()
			}
			err := m.GracefulUnmountSegment(ctx, fromUUID(client), fromUUID(seg))
			m.m.Op("unmount_segment", err != nil)
			return errVoid(err), nil
		},
		"Ping": func(_ context.Context, req *cororpc.Request) (any, error) {
			var client mooncake.UUID
			if err := s.args("Ping", req, &client); err != nil {
				return nil, err
			}
			v, st := m.Ping(fromUUID(client))
			// Mooncake's ping carries no eviction notices: drop them so
			// they do not pile up for a client that never reads them.
			m.TakeEvictedKeys(fromUUID(client))
			m.m.Op("ping", false)
			cs := mooncake.ClientOK
			if st == store.ClientNeedRemount {
				cs = mooncake.ClientNeedRemount
			}
			return mooncake.ExpectPing{Value: mooncake.PingResponse{ViewVersion: int64(min(v, 1<<62)), ClientStatus: cs}}, nil
		},
		"FetchTasks": func(_ context.Context, req *cororpc.Request) (any, error) {
			var client mooncake.UUID
			var n uint64
			if err := s.args("FetchTasks", req, &client, &n); err != nil {
				return nil, err
			}
			// mc's master assigns no replica tasks to clients.
			return mooncake.ExpectTasks{Value: []mooncake.TaskAssignment{}}, nil
		},
		// Calls Mooncake's client makes in the background: answered so it
		// logs nothing, as against a master without those features.
		"PollRemoveAll": func(_ context.Context, req *cororpc.Request) (any, error) {
			var client mooncake.UUID
			if err := s.args("PollRemoveAll", req, &client); err != nil {
				return nil, err
			}
			return mooncake.ExpectBool{}, nil
		},
		"GetFsdir": func(context.Context, *cororpc.Request) (any, error) {
			return mooncake.ExpectString{}, nil
		},
		"QuerySegmentStatusById": func(_ context.Context, req *cororpc.Request) (any, error) {
			var id mooncake.UUID
			if err := s.args("QuerySegmentStatusById", req, &id); err != nil {
				return nil, err
			}
			for _, seg := range m.Segments() {
				if seg.Info.ID == fromUUID(id) {
					// Mooncake's SegmentStatus counts UNDEFINED first.
					return mooncake.ExpectSegmentStatus{Value: mooncake.SegmentStatus(seg.Status) + 1}, nil
				}
			}
			return mooncake.ExpectSegmentStatus{Error: mooncake.SegmentNotFound, HasError: true}, nil
		},
		"ExistKey": func(_ context.Context, req *cororpc.Request) (any, error) {
			var key, tenant string
			if err := s.args("ExistKey", req, &key, &tenant); err != nil {
				return nil, err
			}
			t, err := m.ReadTenant(tenant)
			if err != nil {
				m.m.Op("batch_exist_key", true)
				return mooncake.ExpectBool{Error: codeOf(err), HasError: true}, nil
			}
			ex, errs := m.BatchExistKey([]string{store.ScopeKey(t, key)})
			m.m.Op("batch_exist_key", errs[0] != nil)
			return mooncake.ExpectBool{Value: ex[0], Error: codeOf(errs[0]), HasError: errs[0] != nil}, nil
		},
		"BatchExistKey": func(_ context.Context, req *cororpc.Request) (any, error) {
			var keys []string
			var tenant string
			if err := s.args("BatchExistKey", req, &keys, &tenant); err != nil {
				return nil, err
			}
			if err := batchErr("BatchExistKey", len(keys)); err != nil {
				return nil, err
			}
			t, terr := m.ReadTenant(tenant)
			var ex []bool
			var errs []error
			if terr != nil {
				ex, errs = make([]bool, len(keys)), failErrsN(len(keys), terr)
			} else {
				ex, errs = m.BatchExistKey(store.ScopeKeys(t, keys))
			}
			out := make([]mooncake.ExpectBool, len(keys))
			for i := range keys {
				out[i] = mooncake.ExpectBool{Value: ex[i], Error: codeOf(errs[i]), HasError: errs[i] != nil}
			}
			m.m.Op("batch_exist_key", anyErr(errs))
			return out, nil
		},
		"GetReplicaList": func(_ context.Context, req *cororpc.Request) (any, error) {
			var key, tenant string
			if err := s.args("GetReplicaList", req, &key, &tenant); err != nil {
				return nil, err
			}
			t, err := m.ReadTenant(tenant)
			if err != nil {
				m.m.Op("batch_get_replica_list", true)
				return mooncake.ExpectList{Error: codeOf(err), HasError: true}, nil
			}
			r := m.BatchGetReplicaList([]string{store.ScopeKey(t, key)})[0]
			m.m.Op("batch_get_replica_list", r.Err != nil)
			return s.list(r), nil
		},
		"BatchGetReplicaList": func(_ context.Context, req *cororpc.Request) (any, error) {
			out, failed, err := s.batchGetAnswer(req)
			if err != nil {
				return nil, err
			}
			m.m.Op("batch_get_replica_list", failed)
			return out, nil
		},
		"GetReplicaListByRegex": func(_ context.Context, req *cororpc.Request) (any, error) {
			var pattern, tenant string
			if err := s.args("GetReplicaListByRegex", req, &pattern, &tenant); err != nil {
				return nil, err
			}
			// Mooncake answers every match in one map; the same cap as
			// the gRPC form keeps the answer within a message.
			t, err := m.ReadTenant(tenant)
			var keys []string
			var res []ReplicaResult
			if err == nil {
				keys, res, _, err = m.GetReplicaListByRegexIn(t, pattern, regexListLimit)
			}
			m.m.Op("get_replica_list_by_regex", err != nil)
			if err != nil {
				return mooncake.ExpectByRegex{Error: codeOf(err), HasError: true}, nil
			}
			out := make(map[string][]mooncake.ReplicaDescriptor, len(keys))
			for i, r := range res {
				if r.Err == nil {
					out[keys[i]] = s.descriptors(r.Replicas)
				}
			}
			return mooncake.ExpectByRegex{Value: out}, nil
		},
		"PutStart":          putStart("PutStart", false),
		"UpsertStart":       putStart("UpsertStart", true),
		"BatchPutStart":     batchPutStart("BatchPutStart", false),
		"BatchUpsertStart":  batchPutStart("BatchUpsertStart", true),
		"PutEnd":            endOne("PutEnd", "batch_put_end", m.BatchPutEnd),
		"UpsertEnd":         endOne("UpsertEnd", "batch_upsert_end", m.BatchUpsertEnd),
		"PutRevoke":         revokeOne("PutRevoke", "batch_put_revoke", m.BatchPutRevoke),
		"UpsertRevoke":      revokeOne("UpsertRevoke", "batch_upsert_revoke", m.BatchUpsertRevoke),
		"BatchPutEnd":       endBatch("BatchPutEnd", "batch_put_end", true, m.BatchPutEnd),
		"BatchUpsertEnd":    endBatch("BatchUpsertEnd", "batch_upsert_end", false, m.BatchUpsertEnd),
		"BatchPutRevoke":    revokeBatch("BatchPutRevoke", "batch_put_revoke", true, m.BatchPutRevoke),
		"BatchUpsertRevoke": revokeBatch("BatchUpsertRevoke", "batch_upsert_revoke", false, m.BatchUpsertRevoke),
		"Remove": func(_ context.Context, req *cororpc.Request) (any, error) {
			var key, tenant string
			var force bool
			if err := s.args("Remove", req, &key, &force, &tenant); err != nil {
				return nil, err
			}
			t, err := m.ReadTenant(tenant)
			if err == nil {
				err = one(m.BatchRemove([]string{store.ScopeKey(t, key)}, force)[0])
			}
			m.m.Op("batch_remove", err != nil)
			return errVoid(err), nil
		},
		"BatchRemove": func(_ context.Context, req *cororpc.Request) (any, error) {
			var keys []string
			var force bool
			var tenant string
			if err := s.args("BatchRemove", req, &keys, &force, &tenant); err != nil {
				return nil, err
			}
			if err := batchErr("BatchRemove", len(keys)); err != nil {
				return nil, err
			}
			t, terr := m.ReadTenant(tenant)
			if terr != nil {
				m.m.Op("batch_remove", true)
				return voids(failErrsN(len(keys), terr)), nil
			}
			errs := s.rpc.durable(m.BatchRemove(store.ScopeKeys(t, keys), force))
			m.m.Op("batch_remove", anyErr(errs))
			return voids(errs), nil
		},
		"RemoveAll": func(_ context.Context, req *cororpc.Request) (any, error) {
			var force bool
			var tenant string
			if err := s.args("RemoveAll", req, &force, &tenant); err != nil {
				return nil, err
			}
			if m.cfg.AdminToken != "" {
				// Mooncake's wire carries no token (admin_rpc.go).
				m.m.Op("remove_all", true)
				return nil, &cororpc.RPCError{Code: cororpc.ErrcRPCThrowException, Message: "RemoveAll is an admin operation and this master has an admin token, which Mooncake's wire cannot carry: use POST /api/v1/remove_all on the admin port with Authorization: Bearer TOKEN"}
			}
			// An empty tenant id clears every tenant, as Mooncake's; an
			// invalid one removes nothing (Mooncake's answer, a bare count).
			t := ""
			if tenant != "" {
				var err error
				if t, err = m.ReadTenant(tenant); err != nil {
					m.m.Op("remove_all", true)
					return int64(0), nil
				}
			}
			n := m.RemoveAllIn(t)
			if err := one(nil); err != nil {
				// Mooncake's RemoveAll answers a bare count: a change the
				// op log did not take is reported as nothing removed.
				m.m.Op("remove_all", true)
				return int64(0), nil
			}
			m.m.Op("remove_all", false)
			return int64(n), nil
		},
		"RemoveByRegex": func(_ context.Context, req *cororpc.Request) (any, error) {
			var pattern, tenant string
			var force bool
			if err := s.args("RemoveByRegex", req, &pattern, &force, &tenant); err != nil {
				return nil, err
			}
			t, err := m.ReadTenant(tenant)
			var rm RegexRemoval
			if err == nil {
				rm, err = m.RemoveByRegexIn(t, pattern, force, false)
			}
			if err != nil {
				m.m.Op("remove_by_regex", true)
				return mooncake.ExpectInt64{Error: codeOf(err), HasError: true}, nil
			}
			n := len(rm.Removed)
			if n > 0 && one(nil) != nil {
				// Not in the HA op log: as with gRPC, reported undone.
				n = 0
			}
			m.m.Op("remove_by_regex", n < len(rm.Removed))
			return mooncake.ExpectInt64{Value: int64(n)}, nil
		},
	}
}

// unsupportedCalls are Mooncake master calls for features mc's master does
// not have (replica copy and move tasks, disk offload and promotion): each
// is answered NOT_SUPPORTED in its own result type, so the client reads an
// error code rather than a dropped call.
var unsupportedCalls = map[string]any{
	"CopyEnd": mooncake.ExpectVoid{}, "CopyRevoke": mooncake.ExpectVoid{}, "MoveEnd": mooncake.ExpectVoid{},
	"MoveRevoke": mooncake.ExpectVoid{}, "DynamicReplicaCopyEnd": mooncake.ExpectVoid{},
	"DynamicReplicaCopyRevoke": mooncake.ExpectVoid{}, "MarkTaskToComplete": mooncake.ExpectVoid{},
	"NotifyOffloadSuccess": mooncake.ExpectVoid{}, "ReportSsdCapacity": mooncake.ExpectVoid{},
	"EvictDiskReplica": mooncake.ExpectVoid{}, "MountLocalDiskSegment": mooncake.ExpectVoid{},
	"UnmountLocalDiskSegment": mooncake.ExpectVoid{}, "NotifyPromotionSuccess": mooncake.ExpectVoid{},
	"NotifyPromotionFailure": mooncake.ExpectVoid{}, "UnmountNoFSegment": mooncake.ExpectVoid{},
	"MountNoFSegment": mooncake.ExpectVoid{}, "ReMountNoFSegment": mooncake.ExpectVoid{},
	"CreateCopyTask": mooncake.ExpectUUID{}, "CreateMoveTask": mooncake.ExpectUUID{},
	"BatchReplicaClear": mooncake.ExpectStrings{},
	// Drain jobs are served on the admin HTTP paths (mc store drain);
	// their coro_rpc forms are not.
	"CreateDrainJob": mooncake.ExpectUUID{}, "CancelDrainJob": mooncake.ExpectVoid{},
}

func (s *mooncakeServer) unsupported(name string, answer any) mooncakeHandler {
	return func(_ context.Context, req *cororpc.Request) (any, error) {
		if s.warnOnce("unsupported|" + name) {
			s.log.Warn(fmt.Sprintf("Mooncake call %s from %s: not supported by mc's master; answered NOT_SUPPORTED", name, addrOf(req)))
		}
		switch answer.(type) {
		case mooncake.ExpectVoid:
			return mooncake.ExpectVoid{Error: mooncake.NotSupported, HasError: true}, nil
		case mooncake.ExpectUUID:
			return mooncake.ExpectUUID{Error: mooncake.NotSupported, HasError: true}, nil
		case mooncake.ExpectStrings:
			return mooncake.ExpectStrings{Error: mooncake.NotSupported, HasError: true}, nil
		}
		return nil, fmt.Errorf("%s: no answer shape", name)
	}
}

func addrOf(req *cororpc.Request) string {
	if req.RemoteAddr == nil {
		return ""
	}
	return req.RemoteAddr.String()
}

func opName(cond bool, a, b string) string {
	if cond {
		return a
	}
	return b
}

func anyErr(errs []error) bool {
	for _, e := range errs {
		if e != nil {
			return true
		}
	}
	return false
}
