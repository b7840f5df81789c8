package master

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
	"google.golang.org/protobuf/proto"

	"github.com/kvcache-ops/mc/pkg/budget"
	"github.com/kvcache-ops/mc/pkg/store"
	pb "github.com/kvcache-ops/mc/pkg/store/storepb"
)

const (
	// DefaultRequestBudget is the request bytes the master's RPC servers
	// hold at once by default: eight maximum-size coro_rpc frames, or
	// one maximum-size gRPC message at gRPCCharge.
	DefaultRequestBudget = 512 << 20
	// DefaultRequestReadTimeout bounds reading one request by default.
	DefaultRequestReadTimeout = 30 * time.Second
	// gRPCCharge is what a gRPC request costs per byte of its encoding,
	// as measured: a 64 MiB BatchGetReplicaList of 16,384 4-KiB keys took
	// the master's RSS up by about 640 MB (the received bytes, their
	// decoded copy, one error per key quoting it, the answer, and the
	// garbage collector's headroom over all of them).
	gRPCCharge = 8
	// freeRequest is the size below which a gRPC message is not charged:
	// the calls that keep a pool going (pings, a put or get of a few
	// keys) pass while big batches wait their turn.
	freeRequest = 64 << 10
)

// Request memory on the gRPC side. gRPC reads a message before any of
// its hooks can see its size, so the budget is applied at the first point
// that knows it: the codec, before the message is decoded. A message the
// budget cannot take is not decoded (its received bytes are freed at
// once) and the call is refused with RESOURCE_EXHAUSTED by the
// interceptors, which find the refusal in a table keyed by the message
// the codec was handed. An admitted message's charge is released when its
// handler returns (unary) or when its stream sends its answer, reads the
// next message or ends (streams). Before that, what is being received is
// bounded per connection (receiveSlots unary messages at a time), and a
// unary message must arrive within Config.RequestReadTimeout of its
// receive starting, so a peer that announces a large message and stalls
// loses the call and the bytes it sent; keepalive pings drop dead peers'
// connections.

// grpcBudget ties the codec's decisions to the interceptors.
type grpcBudget struct {
	b           *budget.Budget
	readTimeout time.Duration
	proto       encoding.CodecV2
	// verdicts maps a message being received to its charge (int64) or
	// its refusal (error), from the codec to the interceptor.
	verdicts sync.Map
}

func newGRPCBudget(b *budget.Budget, readTimeout time.Duration) *grpcBudget {
	return &grpcBudget{b: b, readTimeout: readTimeout, proto: encoding.GetCodecV2("proto")}
}

// serverOptions are the gRPC server options that apply the budget, the
// read deadline and keepalive.
func (g *grpcBudget) serverOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ForceServerCodecV2(budgetCodec{g}),
		grpc.InTapHandle(g.tap),
		grpc.StatsHandler(g),
		grpc.ChainUnaryInterceptor(g.unary),
		grpc.ChainStreamInterceptor(g.stream),
		// A peer that vanished (no FIN) is found within 40 s and its
		// streams, with what they had received, are dropped.
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
	}
}

// streamMethods are the methods whose streams carry many messages over a
// long life: the read deadline of tap is for one message.
var streamMethods = map[string]bool{
	pb.Master_Session_FullMethodName: true,
	pb.Tier_Attach_FullMethodName:    true,
}

// A unary call's receive: gRPC reads a message in the handler's
// goroutine after stats.Begin, and the stream's flow-control window lets
// at most store.RPCWindow of it in before that. receiveSlots bounds the
// unary messages one connection receives at once, so that one client's
// many concurrent calls hold at most that many messages of received
// bytes; the others wait in Begin with what their window let in.
const receiveSlots = 4

type (
	connSlotsKey struct{}
	receiveKey   struct{}
)

// receive is one unary call's receive: its slot on the connection and its
// read deadline, from Begin until the message is in (InPayload) or the
// call ends.
type receive struct {
	slots  chan struct{}
	cancel context.CancelCauseFunc // the stream's context (tap)
	method string

	mu    sync.Mutex
	held  bool
	timer *time.Timer
	done  bool
}

// tap gives a unary call's stream a context the receive can cancel: the
// transport's reads watch it, so cancelling it ends a stalled read and
// drops what was received.
func (g *grpcBudget) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	if streamMethods[info.FullMethodName] {
		return ctx, nil
	}
	ctx, cancel := context.WithCancelCause(ctx)
	return context.WithValue(ctx, receiveKey{}, &receive{cancel: cancel, method: info.FullMethodName}), nil
}

// begin waits for a receive slot on the call's connection, then arms the
// read deadline.
func (g *grpcBudget) begin(ctx context.Context, r *receive) {
	slots, _ := ctx.Value(connSlotsKey{}).(chan struct{})
	if slots != nil {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done {
		if slots != nil {
			<-slots
		}
		return
	}
	r.slots, r.held = slots, slots != nil
	r.timer = time.AfterFunc(g.readTimeout, func() {
		r.cancel(fmt.Errorf("%s: request not received within %s", r.method, g.readTimeout))
		budget.ReturnMemory()
	})
}

// received ends the receive: the slot is free and the deadline off.
func (r *receive) received() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.done = true
	if r.timer != nil {
		r.timer.Stop()
	}
	if r.held {
		r.held = false
		<-r.slots
	}
}

// TagConn gives each connection its receive slots.
func (g *grpcBudget) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return context.WithValue(ctx, connSlotsKey{}, make(chan struct{}, receiveSlots))
}

func (g *grpcBudget) HandleConn(context.Context, stats.ConnStats) {}

func (g *grpcBudget) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

func (g *grpcBudget) HandleRPC(ctx context.Context, st stats.RPCStats) {
	r, ok := ctx.Value(receiveKey{}).(*receive)
	if !ok {
		return
	}
	switch st.(type) {
	case *stats.Begin:
		g.begin(ctx, r)
	case *stats.InPayload, *stats.End:
		r.received()
	}
}

// verdict takes the codec's decision on msg: the bytes charged, or the
// refusal as a RESOURCE_EXHAUSTED status.
func (g *grpcBudget) verdict(msg any) (int64, error) {
	v, ok := g.verdicts.LoadAndDelete(msg)
	if !ok {
		return 0, nil
	}
	switch v := v.(type) {
	case int64:
		return v, nil
	case error:
		if _, ok := status.FromError(v); ok {
			return 0, v // refused for what it holds (Unmarshal)
		}
		return 0, status.Error(codes.ResourceExhausted, v.Error())
	}
	return 0, nil
}

func (g *grpcBudget) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	charged, err := g.verdict(req)
	if err != nil {
		return nil, err
	}
	defer g.b.Release(charged)
	return handler(ctx, req)
}

func (g *grpcBudget) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	bs := &budgetStream{ServerStream: ss, g: g}
	defer bs.release()
	return handler(srv, bs)
}

// budgetStream holds the charge of the message its handler is working on.
type budgetStream struct {
	grpc.ServerStream
	g    *grpcBudget
	held atomic.Int64
}

func (s *budgetStream) release() { s.g.b.Release(s.held.Swap(0)) }

func (s *budgetStream) RecvMsg(m any) error {
	s.release()
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	charged, err := s.g.verdict(m)
	if err != nil {
		return err
	}
	s.held.Add(charged)
	return nil
}

// SendMsg hands the charge back before the answer goes out: the request
// is handled by then, and a caller that sees the answer must find the
// budget whole (released after, a caller could see the answer first).
func (s *budgetStream) SendMsg(m any) error {
	s.release()
	return s.ServerStream.SendMsg(m)
}

// budgetCodec is gRPC's proto codec with the budget applied before
// decoding.
type budgetCodec struct{ g *grpcBudget }

func (c budgetCodec) Name() string { return "proto" }

func (c budgetCodec) Marshal(v any) (mem.BufferSlice, error) { return c.g.proto.Marshal(v) }

func (c budgetCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if data.Len() < freeRequest {
		return c.g.proto.Unmarshal(data, v)
	}
	if m, ok := v.(proto.Message); ok && data.Len() > store.MaxRequestElements {
		// Count the repeated fields' elements before decoding makes
		// them (store.CheckElements): the charge is 8 times the bytes,
		// a message of empty keys decodes into more. A message no
		// longer than the limit cannot hold more elements (one byte
		// each at least), so it is not gathered into one buffer.
		var b []byte
		if len(data) == 1 {
			b = data[0].ReadOnlyData()
		} else {
			b = data.Materialize()
		}
		if err := store.CheckElements(b, m.ProtoReflect().Descriptor(), store.MaxRequestElements); err != nil {
			c.g.verdicts.Store(v, status.Error(codes.InvalidArgument, err.Error()))
			return nil
		}
	}
	charged, err := c.g.b.TryAcquire(gRPCCharge * int64(data.Len()))
	if err != nil {
		if errors.Is(err, budget.ErrExhausted) {
			c.g.verdicts.Store(v, err)
			return nil
		}
		return err
	}
	if err := c.g.proto.Unmarshal(data, v); err != nil {
		c.g.b.Release(charged)
		return err
	}
	if charged > 0 {
		c.g.verdicts.Store(v, charged)
	}
	return nil
}
