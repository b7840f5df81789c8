package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
	"unicode"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/kvcache-ops/mc/pkg/cororpc"
	pb "github.com/kvcache-ops/mc/pkg/store/storepb"
)

// mc's master serves its data path's Session calls on its coro_rpc side
// too (the port's other protocol, Mooncake's wire): one function per
// call kind, named outside Mooncake's service, whose body is a
// SessionRequest and whose answer a SessionResponse. A call there is a
// frame each way on a plain TCP connection, where a Session message
// passes through gRPC's reader and writer goroutines on both sides.
const (
	coroSessionPrefix = "mc::Session::"
	// CoroSessionHello answers any body with an empty one: a client asks
	// it once per master address to learn that the master serves the
	// calls (an older mc master or mooncake_master answers
	// function-not-registered; a gRPC-only listener drops the
	// connection).
	CoroSessionHello = coroSessionPrefix + "Hello"
)

// The functions are named after the fields of SessionRequest's call
// oneof (put_start: mc::Session::PutStart), so a call kind added to the
// proto is served and sent on the coro_rpc side with no list to keep in
// step: a kind the master did not register would be answered
// function-not-registered and send the client's every call to that
// master over gRPC.
var (
	sessionCallOneof = (&pb.SessionRequest{}).ProtoReflect().Descriptor().Oneofs().ByName("call")
	coroSessionNames = func() map[protoreflect.FieldNumber]string {
		fs := sessionCallOneof.Fields()
		out := make(map[protoreflect.FieldNumber]string, fs.Len())
		for i := range fs.Len() {
			out[fs.Get(i).Number()] = coroSessionPrefix + camelCase(string(fs.Get(i).Name()))
		}
		return out
	}()
)

// camelCase turns a proto field name (get_replica_list) into a function
// name's part (GetReplicaList).
func camelCase(name string) string {
	var b strings.Builder
	up := true
	for _, r := range name {
		switch {
		case r == '_':
			up = true
		case up:
			b.WriteRune(unicode.ToUpper(r))
			up = false
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// CoroSessionCalls are the qualified names of the functions carrying
// Session calls on the master's coro_rpc port, in the proto's order.
func CoroSessionCalls() []string {
	fs := sessionCallOneof.Fields()
	out := make([]string, fs.Len())
	for i := range fs.Len() {
		out[i] = coroSessionNames[fs.Get(i).Number()]
	}
	return out
}

// CoroSessionCall is the function that carries req on the coro_rpc port,
// "" when req names no call.
func CoroSessionCall(req *pb.SessionRequest) string {
	fd := req.ProtoReflect().WhichOneof(sessionCallOneof)
	if fd == nil {
		return ""
	}
	return coroSessionNames[fd.Number()]
}

// coroDownFor is how long calls to a master address whose coro_rpc side
// could not be reached go over gRPC before it is dialled again.
const coroDownFor = time.Second

// coroRecheck is how long calls to a master address whose master did not
// serve them go over gRPC before it is asked again (it may have been
// upgraded in place, or the hello may have met a restart).
var coroRecheck = time.Minute

// coroSessions carries Session calls over pooled coro_rpc connections to
// the master's current address, one call at a time per connection, and
// says when a call should go over gRPC instead (a master that does not
// serve them, or a connection that could not be opened).
type coroSessions struct {
	addr func() string // the master's address now (the HA leader's)
	log  *slog.Logger

	mu       sync.Mutex
	closed   bool
	idle     []*coroConn
	known    map[string]bool      // addresses that answered the hello
	grpcOnly map[string]bool      // addresses whose master did not serve the calls (logged once)
	down     map[string]time.Time // addresses not to dial before then
}

type coroConn struct {
	addr string
	cl   *cororpc.Client
}

func newCoroSessions(addr func() string, log *slog.Logger) *coroSessions {
	return &coroSessions{addr: addr, log: log, known: map[string]bool{}, grpcOnly: map[string]bool{}, down: map[string]time.Time{}}
}

// errNotHere says the call was not sent over coro_rpc (surely: nothing
// of it left), so it goes over gRPC.
var errNotHere = errors.New("not sent over coro_rpc")

// get returns an open pooled connection to addr or a new client for it
// (fresh), or errNotHere when calls to addr go over gRPC now.
func (p *coroSessions) get(addr string) (c *coroConn, fresh bool, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || time.Now().Before(p.down[addr]) {
		return nil, false, errNotHere
	}
	for len(p.idle) > 0 {
		n := len(p.idle)
		c := p.idle[n-1]
		p.idle = p.idle[:n-1]
		if c.addr == addr && c.cl.Connected() {
			return c, false, nil
		}
		// The master restarted, or the leader moved: this one's
		// connection is of no more use.
		go c.cl.Close()
	}
	cl := cororpc.NewClient(addr, &cororpc.Options{
		MaxMessageLen: uint32(MaxMsgSize),
		CallTimeout:   -1, // the caller's deadline only, as a gRPC call
		DialTimeout:   coroDownFor,
		Logger:        p.log,
	})
	return &coroConn{addr: addr, cl: cl}, true, nil
}

func (p *coroSessions) put(c *coroConn) {
	p.mu.Lock()
	if !p.closed && len(p.idle) < maxIdleSessions {
		p.idle = append(p.idle, c)
		c = nil
	}
	p.mu.Unlock()
	if c != nil {
		c.cl.Close()
	}
}

// mark runs f, which records what an address's master was found to be,
// under the pool's lock.
func (p *coroSessions) mark(addr string, f func()) {
	p.mu.Lock()
	f()
	p.mu.Unlock()
}

func (p *coroSessions) closeAll() {
	p.mu.Lock()
	idle := p.idle
	p.idle, p.closed = nil, true
	p.mu.Unlock()
	for _, c := range idle {
		c.cl.Close()
	}
}

// hello learns whether addr's master serves the calls, on c's (new)
// connection. errNotHere: it does not, or could not be reached; the
// caller's context error: the caller gave up.
func (p *coroSessions) hello(ctx context.Context, c *coroConn) error {
	_, err := c.cl.Call(ctx, cororpc.FunctionID(CoroSessionHello), []byte("mc hello"))
	var re *cororpc.RPCError
	switch {
	case err == nil:
		p.mark(c.addr, func() { p.known[c.addr] = true })
		return nil
	case ctx.Err() != nil:
		return ctxStatus(ctx)
	case errors.As(err, &re) && re.Code == cororpc.ErrcFunctionNotRegistered,
		errors.Is(err, cororpc.ErrConnectionLost):
		// An mc master from before these calls, mooncake_master, or a
		// listener that speaks gRPC only (it drops the connection).
		logged := false
		p.mark(c.addr, func() {
			logged, p.grpcOnly[c.addr] = p.grpcOnly[c.addr], true
			p.down[c.addr] = time.Now().Add(coroRecheck)
		})
		if !logged {
			p.log.Info(fmt.Sprintf("master %s does not serve mc's calls on coro_rpc (%v); its data path calls go on gRPC Session streams (asked again every %v)", c.addr, err, coroRecheck))
		}
	default:
		p.mark(c.addr, func() { p.down[c.addr] = time.Now().Add(coroDownFor) })
	}
	return errNotHere
}

// do sends req and waits for its answer, as sessions.do over gRPC does
// (the same status errors). errNotHere: nothing of req was sent, and it
// is to go over gRPC.
func (p *coroSessions) do(ctx context.Context, req *pb.SessionRequest) (*pb.SessionResponse, error) {
	fn := CoroSessionCall(req)
	if fn == "" {
		return nil, errNotHere
	}
	body, err := proto.Marshal(req)
	if err != nil {
		return nil, status.Error(codes.Internal, fmt.Sprintf("session request: encode: %v", err))
	}
	c, fresh, err := p.get(p.addr())
	if err != nil {
		return nil, err
	}
	if fresh {
		p.mu.Lock()
		known := p.known[c.addr]
		p.mu.Unlock()
		if !known {
			if err := p.hello(ctx, c); err != nil {
				c.cl.Close()
				return nil, err
			}
		}
	}
	out, err := c.cl.Call(ctx, cororpc.FunctionID(fn), body)
	if err != nil {
		return nil, p.failed(ctx, c, err)
	}
	p.put(c)
	resp := &pb.SessionResponse{}
	if err := proto.Unmarshal(out, resp); err != nil {
		return nil, status.Error(codes.Internal, fmt.Sprintf("session answer from %s (%d bytes): %v", c.addr, len(out), err))
	}
	if resp.StatusCode != uint32(codes.OK) {
		return nil, status.Error(codes.Code(resp.StatusCode), resp.StatusMessage)
	}
	return resp, nil
}

// failed turns a failed call into the status a Session call would have
// ended with, or errNotHere when nothing of it was sent.
func (p *coroSessions) failed(ctx context.Context, c *coroConn, err error) error {
	var re *cororpc.RPCError
	switch {
	case ctx.Err() != nil:
		// The caller gave up: its call is abandoned on the connection,
		// which is not reused; closing it ends the call's context on
		// the master (a put start gives its grants back).
		c.cl.Close()
		return ctxStatus(ctx)
	case errors.As(err, &re):
		if re.Code == cororpc.ErrcFunctionNotRegistered {
			// Another master answers at this address now.
			c.cl.Close()
			p.mark(c.addr, func() {
				delete(p.known, c.addr)
				p.down[c.addr] = time.Now().Add(coroRecheck)
			})
			return errNotHere
		}
		// The framing is intact: the connection serves the next call.
		p.put(c)
		switch re.Code {
		case cororpc.ErrcMessageTooLarge:
			return status.Error(codes.ResourceExhausted, re.Message)
		case cororpc.ErrcOperationCanceled:
			return status.Error(codes.Unavailable, "session: "+re.Message)
		}
		return status.Error(codes.Internal, fmt.Sprintf("session call on %s: %v", c.addr, err))
	case errors.Is(err, cororpc.ErrConnectionLost):
		// Sent, maybe applied: the caller's to judge, as after a
		// unary call.
		c.cl.Close()
		return status.Error(codes.Unavailable, fmt.Sprintf("session connection ended: %v", err))
	}
	// The connection could not be opened, or nothing of the request
	// was written: it goes over gRPC, which fails or waits for the
	// master as it always did.
	c.cl.Close()
	p.mark(c.addr, func() { p.down[c.addr] = time.Now().Add(coroDownFor) })
	return errNotHere
}
