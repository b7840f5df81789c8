package store_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/master"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// mooncakeClient is c.client speaking Mooncake's coro_rpc to the master's
// shared port instead of gRPC.
func (c *cluster) mooncakeClient(segSize uint64) *store.Client {
	c.t.Helper()
	return c.client(segSize, func(cfg *store.Config) { cfg.Master = "mooncake://" + c.addr })
}

// TestPutGetOverMooncakeWire runs the store's verbs with nodes and a
// client that all speak Mooncake's master RPC to mc's master, and checks
// that gRPC clients of the same master see the same objects.
func TestPutGetOverMooncakeWire(t *testing.T) {
	c := startMaster(t, master.Config{})
	c.mooncakeClient(64 << 20)
	c.client(64 << 20) // a gRPC node beside it
	cl := c.mooncakeClient(0)
	grpcCl := c.client(0)
	ctx := context.Background()
	for _, n := range []int{1, 4096, 1 << 20, 3<<20 + 5} {
		key := fmt.Sprintf("mc/k:%d@rank0", n)
		v := value(n, byte(n))
		if err := cl.Put(ctx, key, v, store.WithReplicas(2)); err != nil {
			t.Fatalf("put %d bytes: %v", n, err)
		}
		got, err := cl.Get(ctx, key)
		if err != nil || !bytes.Equal(got, v) {
			t.Fatalf("get %q over the Mooncake wire: %d bytes, %v", key, len(got), err)
		}
		got, err = grpcCl.Get(ctx, key)
		if err != nil || !bytes.Equal(got, v) {
			t.Fatalf("get %q over gRPC: %d bytes, %v", key, len(got), err)
		}
		reps, err := cl.Query(ctx, key)
		if err != nil || len(reps) != 2 || reps[0].Endpoint == reps[1].Endpoint {
			t.Fatalf("query %q: %+v, %v; want 2 replicas on distinct segments", key, reps, err)
		}
	}
	if ok, err := cl.Exist(ctx, "mc/k:1@rank0"); !ok || err != nil {
		t.Fatalf("exist = %v, %v", ok, err)
	}
	if ok, err := cl.Exist(ctx, "nope"); ok || err != nil {
		t.Fatalf("exist nope = %v, %v", ok, err)
	}
	if _, err := cl.Get(ctx, "nope"); !errors.Is(err, store.ErrObjectNotFound) {
		t.Fatalf("get unknown key: %v, want OBJECT_NOT_FOUND", err)
	}
	if err := cl.Put(ctx, "mc/k:1@rank0", []byte("x")); !errors.Is(err, store.ErrObjectAlreadyExists) {
		t.Fatalf("duplicate put: %v, want OBJECT_ALREADY_EXISTS", err)
	}
	if err := cl.Remove(ctx, "mc/k:1@rank0", false); !errors.Is(err, store.ErrObjectHasLease) {
		t.Fatalf("remove while leased: %v, want OBJECT_HAS_LEASE", err)
	}
	if err := cl.Remove(ctx, "mc/k:1@rank0", true); err != nil {
		t.Fatal(err)
	}
	if ok, _ := grpcCl.Exist(ctx, "mc/k:1@rank0"); ok {
		t.Fatal("a key removed over the Mooncake wire still exists over gRPC")
	}

	// Batch forms, one key of which fails on its own.
	keys := []string{"b0", "b1", "b2"}
	vals := [][]byte{value(100, 1), value(70000, 2), value(5, 3)}
	if errs := cl.BatchPut(ctx, keys, vals); errors.Join(errs...) != nil {
		t.Fatalf("batch put: %v", errs)
	}
	got, errs := cl.BatchGet(ctx, append(keys, "missing"))
	for i := range keys {
		if errs[i] != nil || !bytes.Equal(got[i], vals[i]) {
			t.Fatalf("batch get %s: %v", keys[i], errs[i])
		}
	}
	if !errors.Is(errs[3], store.ErrObjectNotFound) {
		t.Fatalf("batch get of a missing key: %v", errs[3])
	}
	ex, errs := cl.BatchExist(ctx, []string{"b0", "zz"})
	if !ex[0] || ex[1] || errors.Join(errs...) != nil {
		t.Fatalf("batch exist: %v %v", ex, errs)
	}
	for i, v := range [][]byte{value(9, 4), value(20, 5)} {
		if err := cl.Upsert(ctx, "u", v); err != nil {
			t.Fatalf("upsert %d: %v", i, err)
		}
	}
	if v, err := cl.Get(ctx, "u"); err != nil || !bytes.Equal(v, value(20, 5)) {
		t.Fatalf("get after upsert: %v", err)
	}
	if errs := cl.BatchRemove(ctx, []string{"b0", "zz"}, true); errs[0] != nil || !errors.Is(errs[1], store.ErrObjectNotFound) {
		t.Fatalf("batch remove: %v", errs)
	}
	// By pattern: listed without a lease, removed (leased keys kept).
	if errs := cl.BatchPut(ctx, []string{"model:a@r0/1", "model:a@r1/2", "model:b@r0/3"}, [][]byte{value(10, 1), value(10, 2), value(10, 3)}); errors.Join(errs...) != nil {
		t.Fatal(errs)
	}
	match, err := cl.GetReplicaListByRegex(ctx, "^model:a@")
	if err != nil || match.Matched != 2 || len(match.Keys) != 2 || match.Keys[0] != "model:a@r0/1" || len(match.Replicas[1]) != 1 {
		t.Fatalf("list by regex: %+v, %v", match, err)
	}
	rm, err := cl.RemoveByRegex(ctx, "^model:a@", false, false)
	if err != nil || rm.RemovedCount != 2 {
		t.Fatalf("remove by regex: %+v, %v", rm, err)
	}
	if ex, _ := grpcCl.BatchExist(ctx, []string{"model:a@r0/1", "model:b@r0/3"}); ex[0] || !ex[1] {
		t.Fatalf("after remove by regex: %v", ex)
	}

	// RemoveAll takes what no read lease holds: two fresh keys at least.
	if errs := cl.BatchPut(ctx, []string{"f0", "f1"}, [][]byte{value(10, 1), value(10, 2)}); errors.Join(errs...) != nil {
		t.Fatal(errs)
	}
	n, err := cl.RemoveAll(ctx)
	if err != nil || n < 2 {
		t.Fatalf("remove all: %d, %v", n, err)
	}
	if ex, _ := grpcCl.BatchExist(ctx, []string{"f0", "f1"}); ex[0] || ex[1] {
		t.Fatalf("keys left after remove all: %v", ex)
	}
}

// TestMooncakeNodeRemountsAfterMasterRestart: a node on the Mooncake wire
// re-mounts on a restarted master by itself (Ping says NEED_REMOUNT).
func TestMooncakeNodeRemountsAfterMasterRestart(t *testing.T) {
	c := startMaster(t, master.Config{})
	addr := c.addr
	node := c.mooncakeClient(32 << 20)
	c.stop()
	c2 := startMasterOn(t, addr, master.Config{})
	// The node counts the re-mount once its call returns, just after the
	// master has the segment.
	waitFor(t, "the node to re-mount", 10*time.Second, func() bool {
		return len(c2.m.Segments()) == 1 && node.Stats().Remounts > 0
	})
	// Mooncake's master had forgotten the segment: the node renewed it.
	if st := node.Stats(); st.Renewals == 0 {
		t.Fatalf("the node re-mounted without renewing its segment: %+v", st)
	}
	cl := c2.mooncakeClient(0)
	if err := cl.Put(context.Background(), "after", value(1000, 9)); err != nil {
		t.Fatalf("put after re-mount: %v", err)
	}
}

// TestPlainAddressOfMooncakeMaster: --master HOST:PORT naming a master
// that only speaks Mooncake's wire is told to write mooncake://.
func TestPlainAddressOfMooncakeMaster(t *testing.T) {
	m, err := master.New(master.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := master.NewMooncakeServer(m, nil, nil)
	go srv.Serve(lis)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = store.New(ctx, store.Config{Master: lis.Addr().String(), EngineConfig: engineConfig(), RPCTimeout: 2 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "mooncake://"+lis.Addr().String()) {
		t.Fatalf("plain address of a coro_rpc master: %v; want a hint to use mooncake://", err)
	}
}

// Mooncake's master answers a node's first pings after MountSegment with
// NEED_REMOUNT (only ReMountSegment makes a client OK there): a node
// over Mooncake's wire re-mounts a segment the master still knows as it
// is, and renews only one the master forgot. Before, it renewed on every
// NEED_REMOUNT: against mooncake_master it renewed every second, leaving
// a stale mount of its name behind each time, and puts placed there
// failed TRANSFER_FAIL.
func TestMooncakeWireRemountKeepsKnownSegment(t *testing.T) {
	c := startMaster(t, master.Config{})
	node := c.mooncakeClient(8 << 20)
	ctx := context.Background()
	before, _ := node.Segment()
	if err := store.WireRemount(ctx, node); err != nil {
		t.Fatalf("re-mount of a segment the master knows: %v, want it taken back as it is", err)
	}
	if after, _ := node.Segment(); after.ID != before.ID || after.Base != before.Base {
		t.Fatalf("segment %+v became %+v: renewed though the master knew it", before, after)
	}
	if n := len(c.m.Segments()); n != 1 {
		t.Fatalf("%d segments mounted, want 1", n)
	}
	// A master that forgot it (restarted): the node renews its segment,
	// once, and stays with it.
	c.stop()
	c2 := startMasterOn(t, c.addr, master.Config{})
	waitFor(t, "the node to renew its segment on the restarted master", 5*time.Second, func() bool {
		return node.Stats().Renewals == 1 && len(c2.m.Segments()) == 1
	})
	time.Sleep(500 * time.Millisecond)
	if n := node.Stats().Renewals; n != 1 {
		t.Fatalf("%d renewals after one master restart, want 1", n)
	}
	if err := store.WireRemount(ctx, node); err != nil {
		t.Fatalf("re-mount of the renewed segment: %v", err)
	}
}

// A master that speaks both wires on one port (mc's) and fails a mount
// over gRPC is not called a mooncake_master: the hint to write
// mooncake:// is for an address where gRPC gets no answer at all (under
// load a node's mount once failed RPC_FAIL and said "speaks Mooncake's
// coro_rpc (a mooncake_master?)" of mc's own master).
func TestMountFailureOnMCMasterNotCalledMooncake(t *testing.T) {
	m, err := master.New(master.Config{})
	if err != nil {
		t.Fatal(err)
	}
	m.Start()
	defer m.Close()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gate := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if strings.HasSuffix(info.FullMethod, "/MountSegment") {
			return nil, status.Error(codes.Internal, "mount refused by the test")
		}
		return h(ctx, req)
	}
	srv := master.NewGRPCServer(m, gate)
	go srv.ServeShared(lis, master.NewMooncakeServer(m, nil, nil))
	defer srv.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = store.New(ctx, store.Config{Master: lis.Addr().String(), EngineConfig: engineConfig(), SegmentSize: 1 << 20, RPCTimeout: 2 * time.Second})
	if err == nil {
		t.Fatal("mount through a gate that refuses it succeeded")
	}
	if strings.Contains(err.Error(), "speaks Mooncake") || !strings.Contains(err.Error(), "mount refused by the test") {
		t.Fatalf("mount refused by mc's master: %v; want the master's own error, no mooncake:// hint", err)
	}
}
