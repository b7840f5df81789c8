package meta

import (
	"context"
	"net/http/httptest"
	"runtime"
	"testing"
	"time"
)

func settleGoroutines(t *testing.T, want int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > want {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("goroutines: %d, want <= %d\n%s", runtime.NumGoroutine(), want, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Backends and the embedded etcd leave nothing running after Close.
func TestNoGoroutineLeak(t *testing.T) {
	base := runtime.NumGoroutine()
	ctx := context.Background()

	ee, err := StartEtcd(ctx, EtcdConfig{Listen: "127.0.0.1:0", NoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	eb, err := Open(ctx, ee.Endpoints()[0], Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := eb.PutSegment(ctx, tcpDesc("n")); err != nil {
		t.Fatal(err)
	}
	eb.Close()
	ee.Close()

	srv := httptest.NewServer(NewHTTPHandler())
	hb, _ := Open(ctx, srv.URL, Options{})
	if err := hb.PutSegment(ctx, tcpDesc("n")); err != nil {
		t.Fatal(err)
	}
	hb.Close()
	srv.Close()

	hs := listenHS(t)
	pb, _ := Open(ctx, P2PHandshake, Options{Handshake: hs})
	if err := pb.PutSegment(ctx, tcpDesc(hs.Addr())); err != nil {
		t.Fatal(err)
	}
	reader, _ := Open(ctx, P2PHandshake, Options{})
	if _, err := reader.GetSegment(ctx, hs.Addr()); err != nil {
		t.Fatal(err)
	}
	reader.Close()
	pb.Close()
	hs.Close()

	settleGoroutines(t, base)
}
