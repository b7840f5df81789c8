package meta

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// syncBuffer is a log sink safe for the maintenance goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestNoSpaceIsLoggedAndRecovered: an embedded etcd whose history fills
// its quota raises NOSPACE and refuses every write (HA masters then stay
// candidates and every put times out). The maintenance logs it, with
// what it does, and recovers: history compacted, database defragmented,
// alarm disarmed, writes accepted again.
func TestNoSpaceIsLoggedAndRecovered(t *testing.T) {
	var logs syncBuffer
	ee, err := StartEtcd(context.Background(), EtcdConfig{Listen: "127.0.0.1:0", NoFsync: true,
		QuotaBackendBytes: 8 << 20, Maintenance: 100 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer ee.Close()
	cli, err := clientv3.New(clientv3.Config{Endpoints: ee.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// One key rewritten: its history, not its value, fills the quota.
	val := strings.Repeat("x", 256<<10)
	full := false
	for i := 0; i < 200 && !full; i++ {
		_, err := cli.Put(ctx, "mooncake-store/test/oplog", val)
		switch {
		case errors.Is(err, rpctypes.ErrNoSpace):
			full = true
		case err != nil:
			t.Fatal(err)
		}
	}
	if !full {
		t.Fatal("200 puts of 256 KiB did not fill an 8 MiB quota")
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := cli.Put(ctx, "mooncake-store/test/after", "ok")
		if err == nil {
			break
		}
		if !errors.Is(err, rpctypes.ErrNoSpace) {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("etcd still refuses writes (NOSPACE) 30 s after its history filled the quota; log:\n%s", logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The cleared line is logged once the disarm call returns: a put
	// may land in between (CI saw it once).
	for logDeadline := time.Now().Add(5 * time.Second); !strings.Contains(logs.String(), "etcd NOSPACE alarm cleared") && time.Now().Before(logDeadline); {
		time.Sleep(10 * time.Millisecond)
	}
	out := logs.String()
	for _, want := range []string{"level=ERROR msg=\"etcd NOSPACE alarm", "etcd NOSPACE alarm cleared"} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
}

// TestEtcdErrorsAreLogged: etcd's own errors reach mc's logger, fields
// and all (a silent logger hid the fatal one a full disk causes).
func TestEtcdErrorsAreLogged(t *testing.T) {
	var logs syncBuffer
	var closing atomic.Bool
	lg := zapLogger(slog.New(slog.NewTextHandler(&logs, nil)), &closing)
	lg.Warn("apply request took too long")
	lg.With(zap.String("path", "/var/lib/etcd/member/snap/db")).Error("failed to commit tx", zap.Error(errors.New("no space left on device")))
	closing.Store(true)
	lg.Error("setting up serving from embedded etcd failed.", zap.Error(errors.New("http: Server closed")))
	out := logs.String()
	if strings.Contains(out, "Server closed") {
		t.Errorf("an error of etcd's own Close was logged:\n%s", out)
	}
	if strings.Contains(out, "took too long") {
		t.Errorf("an etcd warning was logged:\n%s", out)
	}
	if want := `level=ERROR msg="etcd: failed to commit tx" error="no space left on device" path=/var/lib/etcd/member/snap/db`; !strings.Contains(out, want) {
		t.Errorf("log lacks %q:\n%s", want, out)
	}
}
