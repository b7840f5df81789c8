package store_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/kvcache-ops/mc/pkg/cororpc"
	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/master"
	pb "github.com/kvcache-ops/mc/pkg/store/storepb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
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

// BenchmarkSessionSingleCaller is one caller's replica-list call for one
// key, as mc's client makes it, on the two paths it has: a message on a
// gRPC Session stream and a frame on the master's coro_rpc side
// (mc::Session::GetReplicaList). ns/op is the round trip on loopback,
// the master's work included; compare the two in the same run.
func BenchmarkSessionSingleCaller(b *testing.B) {
	c := startMaster(b, master.Config{})
	c.client(16 << 20)
	cl := c.client(0)
	ctx := context.Background()
	if err := cl.Put(ctx, "single", value(4096, 1)); err != nil {
		b.Fatal(err)
	}
	req := &pb.SessionRequest{Call: &pb.SessionRequest_GetReplicaList{GetReplicaList: &pb.BatchKeysRequest{Keys: []string{"single"}}}}
	check := func(r *pb.SessionResponse) {
		if r.StatusCode != 0 || len(r.GetReplicaTable().GetCodes()) != 1 || r.GetReplicaTable().Codes[0] != 0 {
			b.Fatalf("answer %v", r)
		}
	}
	b.Run("stream", func(b *testing.B) {
		conn, err := grpc.NewClient(c.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithInitialWindowSize(store.RPCWindow), grpc.WithInitialConnWindowSize(store.RPCConnWindow))
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		st, err := pb.NewMasterClient(conn).Session(ctx)
		if err != nil {
			b.Fatal(err)
		}
		defer st.CloseSend()
		for b.Loop() {
			if err := st.Send(req); err != nil {
				b.Fatal(err)
			}
			r, err := st.Recv()
			if err != nil {
				b.Fatal(err)
			}
			check(r)
		}
	})
	b.Run("coro", func(b *testing.B) {
		cc, err := cororpc.Dial(ctx, c.addr, nil)
		if err != nil {
			b.Fatal(err)
		}
		defer cc.Close()
		body, err := proto.Marshal(req)
		if err != nil {
			b.Fatal(err)
		}
		fn := cororpc.FunctionID(store.CoroSessionCall(req))
		for b.Loop() {
			out, err := cc.Call(ctx, fn, body)
			if err != nil {
				b.Fatal(err)
			}
			r := &pb.SessionResponse{}
			if err := proto.Unmarshal(out, r); err != nil {
				b.Fatal(err)
			}
			check(r)
		}
	})
}
