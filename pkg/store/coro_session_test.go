package store_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/master"
	pb "github.com/kvcache-ops/mc/pkg/store/storepb"
)

// startSharedMaster serves a master as `mc serve store` does (gRPC and
// coro_rpc on one port) with gate, optionally without mc's Session calls
// on the coro_rpc side (a master from before them), or (grpcOnly) on a
// listener that speaks gRPC alone.
func startSharedMaster(t *testing.T, cfg master.Config, gate grpc.UnaryServerInterceptor, noCoro, grpcOnly bool) (*cluster, *master.GRPCServer) {
	t.Helper()
	m, lis := listeningMaster(t, "127.0.0.1:0", cfg)
	srv := master.NewGRPCServer(m, gate)
	if noCoro {
		srv.WithoutCoroSession()
	}
	if grpcOnly {
		go srv.Serve(lis)
	} else {
		go srv.ServeShared(lis, master.NewMooncakeServer(m, nil, nil))
	}
	c := &cluster{t: t, m: m, addr: lis.Addr().String(), stop: func() { srv.Stop(); m.Close() }}
	t.Cleanup(c.stop)
	return c, srv
}

// outcome is what a client call returned, as the tests compare it.
func outcome(v any, err error) string {
	if err != nil {
		return fmt.Sprintf("error %v", store.CodeOf(err))
	}
	if b, ok := v.([]byte); ok {
		return fmt.Sprintf("%d bytes %x", len(b), b[:min(len(b), 8)])
	}
	return fmt.Sprint(v)
}

// script runs puts, gets, exists and removes (their errors included) for
// two tenants and returns what each returned.
func script(t *testing.T, c *cluster) []string {
	t.Helper()
	c.client(32 << 20)
	a := c.client(0, withTenant("a", false, c.addr))
	b := c.client(0, withTenant("b", false, c.addr))
	ctx := context.Background()
	var out []string
	note := func(what string, v any, err error) { out = append(out, what+": "+outcome(v, err)) }
	note("a put k", nil, a.Put(ctx, "k", value(4096, 1)))
	note("a put k again", nil, a.Put(ctx, "k", value(4096, 2)))
	note("b put k", nil, b.Put(ctx, "k", value(3000, 3)))
	for _, cl := range []*store.Client{a, b} {
		v, err := cl.Get(ctx, "k")
		note("get k", v, err)
		v, err = cl.Get(ctx, "missing")
		note("get missing", v, err)
		ok, err := cl.Exist(ctx, "k")
		note("exist k", ok, err)
		ok, err = cl.Exist(ctx, "missing")
		note("exist missing", ok, err)
	}
	note("a upsert k", nil, a.Upsert(ctx, "k", value(5000, 4)))
	v, err := a.Get(ctx, "k")
	note("a get k after upsert", v, err)
	note("b remove missing", nil, b.Remove(ctx, "missing", false))
	note("b remove k", nil, b.Remove(ctx, "k", false))
	v, err = b.Get(ctx, "k")
	note("b get k after remove", v, err)
	v, err = a.Get(ctx, "k")
	note("a get k after b's remove", v, err)
	for i, cl := range []*store.Client{a, b} {
		coro, stream := store.SessionCalls(cl)
		out = append(out, fmt.Sprintf("client %d: coro %v, stream %v", i, coro > 0, stream > 0))
	}
	return out
}

// The data path's calls answer the same over the master's coro_rpc side
// as over gRPC Session streams (a master without the coro_rpc calls,
// whose clients fall back to streams): results, error codes, tenants.
func TestCoroSessionMatchesStreams(t *testing.T) {
	viaCoro, _ := startSharedMaster(t, multiTenant(t), nil, false, false)
	viaStream, _ := startSharedMaster(t, multiTenant(t), nil, true, false)
	got, want := script(t, viaCoro), script(t, viaStream)
	if len(got) != len(want) {
		t.Fatalf("%d outcomes over coro_rpc, %d over streams", len(got), len(want))
	}
	n := len(got)
	for i := range n - 2 {
		if got[i] != want[i] {
			t.Errorf("over coro_rpc %q, over streams %q", got[i], want[i])
		}
	}
	for i := n - 2; i < n; i++ {
		if got[i] != fmt.Sprintf("client %d: coro true, stream false", i-(n-2)) {
			t.Errorf("master with the coro_rpc calls: %s", got[i])
		}
		if want[i] != fmt.Sprintf("client %d: coro false, stream true", i-(n-2)) {
			t.Errorf("master without them: %s", want[i])
		}
	}
	for _, o := range []string{"a put k again: error OBJECT_ALREADY_EXISTS", "get missing: error OBJECT_NOT_FOUND", "b remove missing: error OBJECT_NOT_FOUND", "b remove k: error OBJECT_HAS_LEASE"} {
		found := false
		for _, g := range got {
			found = found || g == o
		}
		if !found {
			t.Errorf("no outcome %q in %q", o, got)
		}
	}
}

// A listener that speaks gRPC alone (no coro_rpc side) drops the hello:
// the client carries its calls on streams, and remembers.
func TestCoroSessionFallsBackOnGRPCOnlyMaster(t *testing.T) {
	c, _ := startSharedMaster(t, master.Config{}, nil, false, true)
	c.client(16 << 20)
	cl := c.client(0)
	ctx := context.Background()
	v := value(3000, 5)
	for i := range 3 {
		if err := cl.Put(ctx, fmt.Sprint("k", i), v); err != nil {
			t.Fatal(err)
		}
		if got, err := cl.Get(ctx, fmt.Sprint("k", i)); err != nil || !bytes.Equal(got, v) {
			t.Fatalf("get: %v", err)
		}
	}
	if coro, stream := store.SessionCalls(cl); coro != 0 || stream != 9 {
		t.Fatalf("calls to a gRPC-only master: %d over coro_rpc, %d over streams; want 0 and 9", coro, stream)
	}
}

// A pooled connection whose master restarted is not used: the next call
// goes out on a fresh connection to the new master and is answered.
func TestCoroSessionAfterMasterRestart(t *testing.T) {
	c := startMaster(t, master.Config{})
	c.client(16 << 20)
	cl := c.client(0)
	ctx := context.Background()
	if err := cl.Put(ctx, "k", value(3000, 6)); err != nil {
		t.Fatal(err)
	}
	c.stop()
	// A master takes longer than this to come back; the client's
	// connection learns of the close meanwhile, with no call on it.
	time.Sleep(200 * time.Millisecond)
	c2 := startMasterOn(t, c.addr, master.Config{})
	if ok, err := cl.Exist(ctx, "k"); err != nil || ok {
		t.Fatalf("exist on the restarted master (which forgot k): %v, %v", ok, err)
	}
	c2.client(16 << 20)
	if err := cl.Put(ctx, "k", value(3000, 7)); err != nil {
		t.Fatalf("put on the restarted master: %v", err)
	}
	if coro, stream := store.SessionCalls(cl); stream != 0 || coro != 5 {
		t.Fatalf("%d calls over coro_rpc, %d over streams; want 5 and 0", coro, stream)
	}
}

// A caller that gives up during a put start is answered at once; the
// master sees the call's context end (as it does when a stream is
// cancelled), and the next calls are answered on other connections.
func TestCoroSessionCallerCancels(t *testing.T) {
	var hold, ended atomic.Bool
	gate := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if _, ok := req.(*pb.BatchPutStartRequest); ok {
			for hold.Load() && ctx.Err() == nil {
				time.Sleep(time.Millisecond)
			}
			if ctx.Err() != nil {
				ended.Store(true)
			}
		}
		return h(ctx, req)
	}
	c, _ := startSharedMaster(t, master.Config{}, gate, false, false)
	c.client(16 << 20)
	cl := c.client(0)
	ctx := context.Background()
	hold.Store(true)
	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(100*time.Millisecond, cancel)
	t0 := time.Now()
	if err := cl.Put(cctx, "k", value(3000, 8)); !errors.Is(err, context.Canceled) {
		t.Fatalf("put cancelled by its caller: %v, want context.Canceled", err)
	}
	if d := time.Since(t0); d > 2*time.Second {
		t.Fatalf("cancelled put returned after %s", d)
	}
	waitFor(t, "the master to see the put start's context end", 5*time.Second, ended.Load)
	hold.Store(false)
	v := value(3000, 9)
	if err := cl.Put(ctx, "k", v); err != nil {
		t.Fatalf("put after the cancelled one: %v", err)
	}
	if got, err := cl.Get(ctx, "k"); err != nil || !bytes.Equal(got, v) {
		t.Fatalf("get after the cancelled put: %v", err)
	}
	if coro, stream := store.SessionCalls(cl); stream != 0 || coro < 4 {
		t.Fatalf("%d calls over coro_rpc, %d over streams", coro, stream)
	}
}

// A put start waiting on the master for a read lease to end (run by the
// connection's read loop) stops waiting when its caller gives up: the
// wait is not counted as served once the lease ends.
func TestCoroSessionCancelEndsLeaseWait(t *testing.T) {
	const ttl = 1500 * time.Millisecond
	c := startMaster(t, master.Config{KVLeaseTTL: ttl, HighWatermark: 1})
	c.client(4 << 20)
	cl := c.client(0)
	leased := fillAndLease(t, cl, 15, ttl)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	if err := cl.Put(ctx, "new", value(300<<10, 99)); !errors.Is(err, context.Canceled) {
		t.Fatalf("put cancelled while waiting for a lease: %v, want context.Canceled", err)
	}
	time.Sleep(time.Until(leased.Add(ttl + 500*time.Millisecond)))
	if n := gauge(t, c.m, "mc_store_put_lease_waits_total"); n != 0 {
		t.Fatalf("%v lease waits served after the caller gave up (want the wait ended with it)", n)
	}
	if coro, stream := store.SessionCalls(cl); stream != 0 || coro == 0 {
		t.Fatalf("%d calls over coro_rpc, %d over streams", coro, stream)
	}
	if err := cl.Put(context.Background(), "after", value(4096, 1)); err != nil {
		t.Fatalf("put after the cancelled one: %v", err)
	}
}

// A master address found not to serve the coro_rpc calls is asked again
// later: a master upgraded in place (or a hello that met a restart) does
// not leave the client on gRPC streams for good.
func TestCoroSessionAsksAgainAfterUpgrade(t *testing.T) {
	defer store.SetCoroRecheck(store.SetCoroRecheck(50 * time.Millisecond))
	old, _ := startSharedMaster(t, master.Config{}, nil, true, false)
	old.client(16 << 20)
	cl := old.client(0)
	ctx := context.Background()
	if err := cl.Put(ctx, "k", value(3000, 8)); err != nil {
		t.Fatal(err)
	}
	if coro, _ := store.SessionCalls(cl); coro != 0 {
		t.Fatalf("%d calls over coro_rpc to a master without them", coro)
	}
	old.stop()
	time.Sleep(200 * time.Millisecond) // past the recheck; the old connections learn of the close
	upgraded := startMasterOn(t, old.addr, master.Config{})
	upgraded.client(16 << 20)
	// gRPC's connection may still be backing off from the refused dials
	// while the master was down: keep asking until a put lands.
	deadline := time.Now().Add(5 * time.Second)
	for i := 0; ; i++ {
		err := cl.Put(ctx, fmt.Sprint("k2-", i), value(3000, 9))
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("put on the upgraded master: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if coro, _ := store.SessionCalls(cl); coro == 0 {
		t.Fatal("no call over coro_rpc after the master at the same address was upgraded")
	}
}

// The function names are a wire contract between mc's clients and
// masters of other versions: each call kind keeps its name, and every
// kind of SessionRequest's call oneof has one.
func TestCoroSessionCallNames(t *testing.T) {
	want := map[string]*pb.SessionRequest{
		"mc::Session::PutStart":       {Call: &pb.SessionRequest_PutStart{PutStart: &pb.BatchPutStartRequest{}}},
		"mc::Session::PutEnd":         {Call: &pb.SessionRequest_PutEnd{PutEnd: &pb.BatchKeysRequest{}}},
		"mc::Session::PutRevoke":      {Call: &pb.SessionRequest_PutRevoke{PutRevoke: &pb.BatchKeysRequest{}}},
		"mc::Session::UpsertStart":    {Call: &pb.SessionRequest_UpsertStart{UpsertStart: &pb.BatchPutStartRequest{}}},
		"mc::Session::UpsertEnd":      {Call: &pb.SessionRequest_UpsertEnd{UpsertEnd: &pb.BatchKeysRequest{}}},
		"mc::Session::UpsertRevoke":   {Call: &pb.SessionRequest_UpsertRevoke{UpsertRevoke: &pb.BatchKeysRequest{}}},
		"mc::Session::GetReplicaList": {Call: &pb.SessionRequest_GetReplicaList{GetReplicaList: &pb.BatchKeysRequest{}}},
		"mc::Session::ExistKey":       {Call: &pb.SessionRequest_ExistKey{ExistKey: &pb.BatchKeysRequest{}}},
		"mc::Session::Remove":         {Call: &pb.SessionRequest_Remove{Remove: &pb.BatchRemoveRequest{}}},
	}
	calls := store.CoroSessionCalls()
	if len(calls) != len(want) {
		t.Errorf("CoroSessionCalls() = %v: %d functions, want %d (a new call kind needs a name here)", calls, len(calls), len(want))
	}
	listed := map[string]bool{}
	for _, c := range calls {
		listed[c] = true
	}
	for name, req := range want {
		if got := store.CoroSessionCall(req); got != name {
			t.Errorf("CoroSessionCall(%T) = %q, want %q", req.Call, got, name)
		}
		if !listed[name] {
			t.Errorf("%s missing from CoroSessionCalls() %v", name, calls)
		}
	}
	if got := store.CoroSessionCall(&pb.SessionRequest{}); got != "" {
		t.Errorf("a request without a call maps to %q, want \"\"", got)
	}
}
