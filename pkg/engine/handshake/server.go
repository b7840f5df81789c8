package handshake

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/kvcache-ops/mc/pkg/connlimit"
)

// DefaultTimeout bounds one handshake connection (request read, handler,
// reply write) when Options.Timeout is zero, and one Request when its
// context has no deadline.
const DefaultTimeout = 10 * time.Second

// HandlerFunc answers one request payload. The returned bytes are sent back
// in a frame of the request's type. An error closes the connection without
// a reply (Mooncake peers see the connection drop). ctx ends at the
// connection deadline.
type HandlerFunc func(ctx context.Context, payload []byte) ([]byte, error)

// Options configures a Server.
type Options struct {
	// MaxLength bounds a request frame's length field; 0 means
	// DefaultMaxLength, values above MaxMaxLength are clamped.
	MaxLength int
	// Timeout is the per-connection deadline; 0 means DefaultTimeout.
	Timeout time.Duration
}

// ConnectionInfo is the JSON of a Connection request and of its reply: the
// RDMA endpoint exchange. A NIC path is "<server_name>@<device>".
type ConnectionInfo struct {
	LocalNICPath string   `json:"local_nic_path"`
	LocalLID     uint16   `json:"local_lid"`
	LocalGID     string   `json:"local_gid"`
	PeerNICPath  string   `json:"peer_nic_path"`
	QPNum        []uint32 `json:"qp_num"`
	ReplyMsg     string   `json:"reply_msg"`
}

// Server is a handshake listener. It reads one frame per connection,
// dispatches it to the handler registered for its type, replies with a frame
// of the same type and half-closes, as Mooncake's handshake daemon does.
type Server struct {
	ln   net.Listener
	opts Options

	mu       sync.Mutex
	handlers map[FrameType]HandlerFunc
	idle     map[net.Conn]struct{} // connections still waiting for their request
	closed   bool

	wg   sync.WaitGroup
	done chan struct{}
}

// Listen starts a handshake server on addr ("127.0.0.1:0" picks a port) and
// serves in the background until Close.
func Listen(addr string, opts Options) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("handshake listen on %s: %w", addr, err)
	}
	return serve(ln, opts), nil
}

// ListenRange listens on a random free port in [minPort, maxPort] of host,
// as Mooncake picks its RPC port (MC_MIN_RPC_PORT, MC_MAX_RPC_PORT).
func ListenRange(host string, minPort, maxPort int, opts Options) (*Server, error) {
	if minPort < 1 || maxPort > 65535 || minPort > maxPort {
		return nil, fmt.Errorf("handshake port range [%d, %d] is invalid: want 1 <= min <= max <= 65535", minPort, maxPort)
	}
	ports := rand.Perm(maxPort - minPort + 1)
	var last error
	for _, off := range ports {
		ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(minPort+off)))
		if err == nil {
			return serve(ln, opts), nil
		}
		last = err
		if !errors.Is(err, syscall.EADDRINUSE) {
			// Not a busy port (bad host, permission): trying others won't help.
			break
		}
	}
	return nil, fmt.Errorf("handshake listen on %s ports %d-%d: no free port: %w", host, minPort, maxPort, last)
}

func serve(ln net.Listener, opts Options) *Server {
	ln = connlimit.Default().Listener(ln, "handshake")
	opts.MaxLength = effectiveMax(opts.MaxLength)
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	s := &Server{
		ln:       ln,
		opts:     opts,
		handlers: make(map[FrameType]HandlerFunc),
		idle:     make(map[net.Conn]struct{}),
		done:     make(chan struct{}),
	}
	// Mooncake peers probe liveness before use and expect this answer;
	// Handle(Probe, ...) replaces it.
	s.handlers[Probe] = func(context.Context, []byte) ([]byte, error) {
		return []byte(`{"status":"success"}`), nil
	}
	s.wg.Add(1)
	go s.acceptLoop()
	return s
}

// Handle registers h for frames of type t, replacing any previous handler.
// A nil h removes it. Frames without a handler get the connection closed.
// A new server answers Probe with {"status":"success"}, as Mooncake does.
func (s *Server) Handle(t FrameType, h HandlerFunc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h == nil {
		delete(s.handlers, t)
		return
	}
	s.handlers[t] = h
}

// Addr returns "host:port" the server listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops accepting, drops connections that have not sent a complete
// request, waits for in-flight handlers to reply, and returns when every
// goroutine of the server has exited. It is safe to call more than once.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.wg.Wait()
		return nil
	}
	s.closed = true
	close(s.done)
	err := s.ln.Close()
	for c := range s.idle {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("close handshake listener %s: %w", s.Addr(), err)
	}
	return nil
}

func (s *Server) acceptLoop() {
	defer s.wg.Done()
	var backoff time.Duration
	for {
		c, err := s.ln.Accept()
		if err != nil {
			select {
			case <-s.done:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Transient (EMFILE and the like): back off as net/http does.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			slog.Warn("handshake accept failed", "addr", s.Addr(), "err", err, "retry_in", backoff)
			select {
			case <-time.After(backoff):
			case <-s.done:
				return
			}
			continue
		}
		backoff = 0
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.idle[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serveConn(c)
	}
}

func (s *Server) serveConn(c net.Conn) {
	defer s.wg.Done()
	defer c.Close()
	deadline := time.Now().Add(s.opts.Timeout)
	_ = c.SetDeadline(deadline)
	peer := c.RemoteAddr().String()

	t, req, err := ReadFrame(c, s.opts.MaxLength)

	s.mu.Lock()
	delete(s.idle, c)
	closed := s.closed
	h := s.handlers[t]
	s.mu.Unlock()
	if err != nil {
		if !closed {
			slog.Debug("handshake request dropped", "peer", peer, "err", err)
		}
		return
	}
	if h == nil {
		slog.Warn("handshake request has no handler; closing", "peer", peer, "type", t.String())
		return
	}
	// Once a full request is in, it is served even if Close has begun: the
	// peer is waiting for the answer and Close waits for it.
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	reply, err := h(ctx, req)
	if err != nil {
		slog.Warn("handshake handler failed; closing without reply", "peer", peer, "type", t.String(), "err", err)
		return
	}
	if err := WriteFrame(c, t, reply); err != nil {
		slog.Debug("handshake reply not sent", "peer", peer, "err", err)
		return
	}
	if tc, ok := c.(interface{ CloseWrite() error }); ok {
		_ = tc.CloseWrite()
	}
}
