package mooncake

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/cororpc"
	"github.com/kvcache-ops/mc/pkg/structpack"
)

// replayMaster answers each call with the body the real mooncake_master
// answered it with in the captures.
func replayMaster(t *testing.T, answers map[string][]byte, extra map[string]cororpc.Handler) string {
	t.Helper()
	srv := cororpc.NewServer(nil)
	for name, body := range answers {
		b := body
		if _, err := srv.Register(Service+"::"+name, func(context.Context, *cororpc.Request) ([]byte, error) { return b, nil }); err != nil {
			t.Fatal(err)
		}
	}
	for name, h := range extra {
		if _, err := srv.Register(Service+"::"+name, h); err != nil {
			t.Fatal(err)
		}
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	t.Cleanup(func() { srv.Close() })
	return lis.Addr().String()
}

func capturedAnswers(t *testing.T) map[string][]byte {
	out := map[string][]byte{}
	for _, c := range readCaptures(t) {
		if _, ok := out[c.Call]; !ok {
			out[c.Call] = unhex(t, c.ResponseBody)
		}
	}
	return out
}

// TestClientDecodesCapturedAnswers drives the typed client against the
// real master's captured answers.
func TestClientDecodesCapturedAnswers(t *testing.T) {
	addr := replayMaster(t, capturedAnswers(t), nil)
	c := NewClient(addr, nil)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := c.ServiceReady(ctx)
	if err != nil || v != "2.0.0" || c.MasterVersion != "2.0.0" {
		t.Fatalf("ServiceReady = %q, %v", v, err)
	}
	cfg, err := c.GetStorageConfig(ctx)
	if err != nil || cfg.FSDir != "" {
		t.Fatalf("GetStorageConfig = %+v, %v", cfg, err)
	}
	if err := c.MountSegment(ctx, Segment{Name: "n", Size: 1 << 20}, UUID{First: 1, Second: 2}); err != nil {
		t.Fatalf("MountSegment: %v", err)
	}
	p, err := c.Ping(ctx, UUID{First: 1, Second: 2})
	if err != nil || (p.ClientStatus != ClientNeedRemount && p.ClientStatus != ClientOK) {
		t.Fatalf("Ping = %+v, %v", p, err)
	}
}

// TestMasterOfAnotherVersion: a master that does not know a handler, or
// answers a type this package does not know, gives one error naming the
// call and both versions, at once.
func TestMasterOfAnotherVersion(t *testing.T) {
	// Another version's Ping answer: an extra field in PingResponse.
	type pingV2 struct {
		ViewVersion  int64
		ClientStatus ClientStatus
		Epoch        uint64
	}
	other, err := structpack.Marshal(structpack.Expected[pingV2, ErrorCode]{Value: pingV2{ClientStatus: ClientOK}})
	if err != nil {
		t.Fatal(err)
	}
	ready, _ := structpack.Marshal(ExpectString{Value: "2.1.0"})
	addr := replayMaster(t, map[string][]byte{"Ping": other, "ServiceReady": ready}, nil)
	c := NewClient(addr, nil)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.ServiceReady(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = c.Ping(ctx, UUID{})
	var ve *VersionError
	if !errors.As(err, &ve) || ve.Call != "Ping" || ve.MasterVersion != "2.1.0" {
		t.Fatalf("Ping of another version: %v", err)
	}
	for _, want := range []string{"Ping", "2.1.0", StoreVersion, MooncakeCommit[:7]} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	// A handler the master does not have: coro_rpc's not-registered.
	_, err = c.ExistKey(ctx, "k")
	if !errors.As(err, &ve) || ve.Call != "ExistKey" {
		t.Fatalf("unknown handler: %v", err)
	}
	if ctx.Err() != nil {
		t.Fatal("the calls waited out their deadline")
	}
}

// TestPerItemErrors: a batch answer's failed items come back as *Error
// with Mooncake's code, the others as values.
func TestPerItemErrors(t *testing.T) {
	body, _ := structpack.Marshal([]ExpectBool{{Value: true}, {Error: ObjectNotFound, HasError: true}})
	short, _ := structpack.Marshal([]ExpectVoid{{}})
	addr := replayMaster(t, map[string][]byte{"BatchExistKey": body, "BatchRemove": short}, nil)
	c := NewClient(addr, nil)
	defer c.Close()
	ctx := context.Background()
	ex, errs, err := c.BatchExistKey(ctx, []string{"a", "b"})
	if err != nil || !ex[0] || errs[0] != nil {
		t.Fatalf("item 0: %v %v %v", ex, errs, err)
	}
	var me *Error
	if !errors.As(errs[1], &me) || me.Code != ObjectNotFound || !strings.Contains(errs[1].Error(), "OBJECT_NOT_FOUND") {
		t.Fatalf("item 1: %v", errs[1])
	}
	// An answer with fewer items than keys is refused whole.
	if _, err := c.BatchRemove(ctx, []string{"a", "b"}, false); err == nil || !strings.Contains(err.Error(), "1 items for 2") {
		t.Fatalf("short answer: %v", err)
	}
}

// TestMasterStopsAnswering: a call to a master that accepted it and then
// went silent ends at its deadline, never later.
func TestMasterStopsAnswering(t *testing.T) {
	hang := func(ctx context.Context, _ *cororpc.Request) ([]byte, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	addr := replayMaster(t, nil, map[string]cororpc.Handler{"Ping": hang})
	c := NewClient(addr, nil)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	_, err := c.Ping(ctx, UUID{})
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(t0) > 3*time.Second {
		t.Fatalf("silent master: %v after %s", err, time.Since(t0))
	}
}
