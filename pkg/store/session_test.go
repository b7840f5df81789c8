package store_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/master"
	pb "github.com/kvcache-ops/mc/pkg/store/storepb"
)

// startGatedMaster serves a master whose calls wait while *hold is set
// (a slow master, seen from a client).
func startGatedMaster(t *testing.T, hold *atomic.Bool) (*cluster, *master.GRPCServer) {
	t.Helper()
	m, lis := listeningMaster(t, "127.0.0.1:0", master.Config{})
	gate := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		for hold.Load() && ctx.Err() == nil {
			time.Sleep(time.Millisecond)
		}
		return h(ctx, req)
	}
	srv := master.NewGRPCServer(m, gate)
	go srv.ServeShared(lis, master.NewMooncakeServer(m, nil, nil))
	c := &cluster{t: t, m: m, addr: lis.Addr().String(), stop: func() { srv.Stop(); m.Close() }}
	t.Cleanup(c.stop)
	return c, srv
}

// A caller's deadline ends its call on a Session stream as it would a
// unary one (RPC_TIMEOUT), and the stream it abandoned is not handed to
// the next call, which gets its own answer.
func TestSessionCallHonoursDeadline(t *testing.T) {
	var hold atomic.Bool
	c, _ := startGatedMaster(t, &hold)
	c.client(16 << 20)
	cl := c.client(0)
	ctx := context.Background()
	v := value(3000, 7)
	if err := cl.Put(ctx, "k", v); err != nil {
		t.Fatal(err)
	}
	hold.Store(true)
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err := cl.Get(short, "k")
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) && store.CodeOf(err) != store.RPCTimeout {
		t.Fatalf("get from a master that does not answer in time: %v, want RPC_TIMEOUT", err)
	}
	canceled, cancel := context.WithCancel(ctx)
	time.AfterFunc(50*time.Millisecond, cancel)
	if _, err := cl.Get(canceled, "k"); !errors.Is(err, context.Canceled) {
		t.Fatalf("get cancelled by its caller: %v, want context.Canceled", err)
	}
	hold.Store(false)
	for i := range 3 {
		got, err := cl.Get(ctx, "k")
		if err != nil || !bytes.Equal(got, v) {
			t.Fatalf("get %d once the master answers again: %v", i, err)
		}
	}
}

// Shutdown answers the calls under way and returns without waiting for
// clients to close their idle Session streams (which they never do);
// calls after it fail as RPC_FAIL.
func TestShutdownWithIdleSessions(t *testing.T) {
	var hold atomic.Bool
	c, srv := startGatedMaster(t, &hold)
	c.client(16 << 20)
	cl := c.client(0)
	ctx := context.Background()
	v := value(3000, 9)
	if err := cl.Put(ctx, "k", v); err != nil {
		t.Fatal(err)
	}
	// One call is under way when the shutdown starts: it is answered.
	hold.Store(true)
	type result struct {
		b   []byte
		err error
	}
	inflight := make(chan result, 1)
	go func() {
		b, err := cl.Get(ctx, "k")
		inflight <- result{b, err}
	}()
	time.Sleep(100 * time.Millisecond)
	done := make(chan struct{})
	go func() {
		srv.Shutdown(time.Hour)
		close(done)
	}()
	time.Sleep(100 * time.Millisecond)
	hold.Store(false)
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Shutdown still waiting 20 s after the last call was answered")
	}
	if r := <-inflight; r.err != nil || !bytes.Equal(r.b, v) {
		t.Fatalf("get under way at shutdown: %v", r.err)
	}
	if _, err := cl.Get(ctx, "k"); store.CodeOf(err) != store.RPCFail {
		t.Fatalf("get after shutdown: %v, want RPC_FAIL", err)
	}
}

// A Session request that names no call, or breaks a limit, is answered
// with an error and the stream serves the next call.
func TestSessionBadRequests(t *testing.T) {
	c := startMaster(t, master.Config{})
	c.client(16 << 20)
	st, err := rawClient(t, c.addr).Session(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer st.CloseSend()
	ask := func(req *pb.SessionRequest) *pb.SessionResponse {
		t.Helper()
		if err := st.Send(req); err != nil {
			t.Fatal(err)
		}
		resp, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	if r := ask(&pb.SessionRequest{}); codes.Code(r.StatusCode) != codes.InvalidArgument || !strings.Contains(r.StatusMessage, "names no call") {
		t.Fatalf("empty request: %v", r)
	}
	huge := make([]string, store.MaxBatchSize+1)
	for i := range huge {
		huge[i] = "k"
	}
	r := ask(&pb.SessionRequest{Call: &pb.SessionRequest_GetReplicaList{GetReplicaList: &pb.BatchKeysRequest{Keys: huge}}})
	if codes.Code(r.StatusCode) != codes.InvalidArgument || !strings.Contains(r.StatusMessage, "exceeds the limit") {
		t.Fatalf("oversized batch: %v", r)
	}
	r = ask(&pb.SessionRequest{Call: &pb.SessionRequest_GetReplicaList{GetReplicaList: &pb.BatchKeysRequest{Keys: []string{"nope"}}}})
	tb := r.GetReplicaTable()
	if r.StatusCode != 0 || tb == nil || len(tb.Codes) != 1 || store.Code(tb.Codes[0]) != store.ObjectNotFound {
		t.Fatalf("get of an unknown key after the bad requests: %v", r)
	}
}

// Callers that keep sending on their sessions do not hold a shutdown
// open: each stream ends after the call under way.
func TestShutdownUnderLoad(t *testing.T) {
	var hold atomic.Bool
	c, srv := startGatedMaster(t, &hold)
	c.client(16 << 20)
	cl := c.client(0)
	ctx := context.Background()
	if err := cl.Put(ctx, "k", value(3000, 9)); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var answered atomic.Int64
	var wg sync.WaitGroup
	defer wg.Wait()
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := cl.Get(ctx, "k"); err == nil {
					answered.Add(1)
				}
			}
		}()
	}
	defer close(stop)
	waitFor(t, "gets to flow", 5*time.Second, func() bool { return answered.Load() > 100 })
	done := make(chan struct{})
	go func() {
		srv.Shutdown(time.Hour)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Shutdown still waiting after 20 s of callers sending on their sessions")
	}
}
