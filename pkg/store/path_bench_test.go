package store_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/master"
	pb "github.com/kvcache-ops/mc/pkg/store/storepb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// BenchmarkBatchGetPath splits a batched 4 KiB get into its layers, one
// caller, so the per-key cost of each shows: the master's lookup in
// process, the same call through gRPC (the unary form, then as the client
// makes it: a message on a Session stream, answered as a replica table),
// and the whole client get (lookup plus engine transfers over loopback
// TCP).
func BenchmarkBatchGetPath(b *testing.B) {
	const batch, vs = 32, 4096
	c := startMaster(b, master.Config{})
	c.client(64 << 20)
	cl := c.client(0)
	ctx := context.Background()
	keys := make([]string, batch)
	for i := range keys {
		keys[i] = fmt.Sprintf("bench/%016d", i)
		if err := cl.Put(ctx, keys[i], value(vs, byte(i))); err != nil {
			b.Fatal(err)
		}
	}
	perKey := func(b *testing.B) {
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/key")
	}
	b.Run("master", func(b *testing.B) {
		for b.Loop() {
			c.m.BatchGetReplicaList(keys)
		}
		perKey(b)
	})
	conn, err := grpc.NewClient(c.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(store.RPCWindow), grpc.WithInitialConnWindowSize(store.RPCConnWindow))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	rpc := pb.NewMasterClient(conn)
	b.Run("rpc", func(b *testing.B) {
		for b.Loop() {
			if _, err := rpc.BatchGetReplicaList(ctx, &pb.BatchKeysRequest{Keys: keys}); err != nil {
				b.Fatal(err)
			}
		}
		perKey(b)
	})
	b.Run("session", func(b *testing.B) {
		st, err := rpc.Session(ctx)
		if err != nil {
			b.Fatal(err)
		}
		defer st.CloseSend()
		req := &pb.SessionRequest{Call: &pb.SessionRequest_GetReplicaList{GetReplicaList: &pb.BatchKeysRequest{Keys: keys}}}
		for b.Loop() {
			if err := st.Send(req); err != nil {
				b.Fatal(err)
			}
			if r, err := st.Recv(); err != nil || len(r.GetReplicaTable().GetCodes()) != batch {
				b.Fatalf("%v %v", r, err)
			}
		}
		perKey(b)
	})
	buf, err := cl.RegisterBuffer(ctx, batch*vs)
	if err != nil {
		b.Fatal(err)
	}
	sl := make([]store.Slice, batch)
	for i := range sl {
		sl[i] = store.Slice{Buf: buf, Off: i * vs, Len: vs}
	}
	b.Run("get", func(b *testing.B) {
		for b.Loop() {
			if _, errs := cl.BatchGetInto(ctx, keys, sl); errs[0] != nil {
				b.Fatal(errs[0])
			}
		}
		perKey(b)
	})
}
