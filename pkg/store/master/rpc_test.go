package master

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/kvcache-ops/mc/pkg/store"
	pb "github.com/kvcache-ops/mc/pkg/store/storepb"
)

func startRPC(t *testing.T) (*Master, pb.MasterClient, string) {
	t.Helper()
	m, _ := newTestMaster(t, Config{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := Serve(m, lis)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(2*store.MaxMsgSize), grpc.MaxCallRecvMsgSize(2*store.MaxMsgSize)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return m, pb.NewMasterClient(conn), lis.Addr().String()
}

func rpcCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// roundTrip mounts, puts and reads one key over gRPC.
func roundTrip(t *testing.T, c pb.MasterClient, key string) {
	t.Helper()
	ctx := rpcCtx(t)
	node := store.UUIDToPB(uuidOf("node"))
	if p, err := c.Ping(ctx, &pb.PingRequest{ClientId: node}); err != nil {
		t.Fatal(err)
	} else if p.ClientStatus == pb.ClientStatus_NEED_REMOUNT {
		r, err := c.MountSegment(ctx, &pb.MountSegmentRequest{ClientId: node, Segment: store.SegmentToPB(segInfo("a", "127.0.0.1", 0, 64*MiB))})
		if err != nil || r.Code != 0 {
			t.Fatalf("mount: %v %v", r, err)
		}
	}
	w := store.UUIDToPB(uuidOf("w"))
	ps, err := c.BatchPutStart(ctx, &pb.BatchPutStartRequest{ClientId: w, Items: []*pb.PutStartItem{{Key: key, Length: 100}}})
	if err != nil || ps.Results[0].Code != 0 || len(ps.Results[0].Replicas) != 1 {
		t.Fatalf("put start: %v %v", ps, err)
	}
	pe, err := c.BatchPutEnd(ctx, &pb.BatchKeysRequest{ClientId: w, Keys: []string{key}})
	if err != nil || pe.Results[0].Code != 0 {
		t.Fatalf("put end: %v %v", pe, err)
	}
	g, err := c.BatchGetReplicaList(ctx, &pb.BatchKeysRequest{ClientId: w, Keys: []string{key, "missing"}})
	if err != nil || g.Results[0].Code != 0 || g.Results[0].Replicas[0].Address != ps.Results[0].Replicas[0].Address || g.Results[0].LeaseTtlMs != 10000 {
		t.Fatalf("get: %v %v", g, err)
	}
	if g.Results[1].Code != int32(store.ObjectNotFound) || !strings.HasPrefix(g.Results[1].Message, "OBJECT_NOT_FOUND") {
		t.Fatalf("get of a missing key: %v", g.Results[1])
	}
}

func TestRPCRoundTrip(t *testing.T) {
	_, c, _ := startRPC(t)
	roundTrip(t, c, "k")
	ctx := rpcCtx(t)
	dup, err := c.BatchPutStart(ctx, &pb.BatchPutStartRequest{ClientId: store.UUIDToPB(uuidOf("w2")), Items: []*pb.PutStartItem{{Key: "k", Length: 100}}})
	if err != nil || dup.Results[0].Code != int32(store.ObjectAlreadyExists) {
		t.Fatalf("duplicate put: %v %v", dup, err)
	}
	ex, err := c.BatchExistKey(ctx, &pb.BatchKeysRequest{Keys: []string{"k", "nope"}})
	if err != nil || !ex.Exists[0] || ex.Exists[1] {
		t.Fatalf("exist: %v %v", ex, err)
	}
	rm, err := c.BatchRemove(ctx, &pb.BatchRemoveRequest{Keys: []string{"k"}})
	if err != nil || rm.Results[0].Code != int32(store.ObjectHasLease) {
		t.Fatalf("remove of a leased key: %v %v", rm, err)
	}
}

func TestRPCBatchLimit(t *testing.T) {
	_, c, _ := startRPC(t)
	keys := make([]string, store.MaxBatchSize+1)
	for i := range keys {
		keys[i] = fmt.Sprint(i)
	}
	ctx := rpcCtx(t)
	calls := map[string]func() error{
		"get": func() error {
			_, err := c.BatchGetReplicaList(ctx, &pb.BatchKeysRequest{Keys: keys})
			return err
		},
		"remove": func() error {
			_, err := c.BatchRemove(ctx, &pb.BatchRemoveRequest{Keys: keys})
			return err
		},
		"put start": func() error {
			items := make([]*pb.PutStartItem, len(keys))
			for i, k := range keys {
				items[i] = &pb.PutStartItem{Key: k, Length: 1}
			}
			_, err := c.BatchPutStart(ctx, &pb.BatchPutStartRequest{Items: items})
			return err
		},
	}
	for name, call := range calls {
		err := call()
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), fmt.Sprint(store.MaxBatchSize)) {
			t.Errorf("%s of %d items: %v, want InvalidArgument naming the limit %d", name, len(keys), err, store.MaxBatchSize)
		}
	}
	// At the limit it is served.
	r, err := c.BatchExistKey(ctx, &pb.BatchKeysRequest{Keys: keys[:store.MaxBatchSize]})
	if err != nil || len(r.Exists) != store.MaxBatchSize {
		t.Fatalf("a batch at the limit: %v", err)
	}
}

func TestRPCOversizedMessage(t *testing.T) {
	_, c, _ := startRPC(t)
	big := strings.Repeat("x", store.MaxMsgSize+1)
	_, err := c.BatchExistKey(rpcCtx(t), &pb.BatchKeysRequest{Keys: []string{big}})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a message over %d bytes: %v, want ResourceExhausted", store.MaxMsgSize, err)
	}
	roundTrip(t, c, "after")
}

func TestRPCGarbageDoesNotHurt(t *testing.T) {
	_, c, addr := startRPC(t)
	roundTrip(t, c, "before")
	junk := [][]byte{
		[]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
		{0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xfe, 0xfd},
		append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), 0xff, 0xff, 0xff, 4, 0, 0, 0, 0, 0, 1, 2, 3),
		append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), 0, 0, 0, 4, 0, 0, 0, 0, 0, // empty SETTINGS
			0, 0, 20, 1, 4, 0, 0, 0, 1, 0xde, 0xad, 0xbe, 0xef), // HEADERS with garbage HPACK
	}
	for i := range 200 {
		junk = append(junk, []byte(strings.Repeat(string(rune('a'+i%26)), i*37)))
	}
	var idle []net.Conn
	for _, b := range junk {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(2 * time.Second))
		_, _ = conn.Write(b)
		if len(idle) < 5 {
			idle = append(idle, conn) // keep a few half-spoken connections open
			continue
		}
		buf := make([]byte, 512)
		_, _ = conn.Read(buf)
		conn.Close()
	}
	roundTrip(t, c, "after")
	for _, c := range idle {
		c.Close()
	}
}
