package ha_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/kvcache-ops/mc/pkg/engine/meta"
	"github.com/kvcache-ops/mc/pkg/store/ha"
)

// TestEtcdStaysFlat is a soak, scaled down: puts (each removed after, so
// the store's state stays small) at a steady rate for 24 s, a snapshot
// every 300 op log records, a standby tailing. etcd keeps every revision
// until its history is compacted, so deleting the log a snapshot covers
// freed nothing: 180 s of puts grew etcd from 20 KB to 47 MB, and at the
// 2 GiB quota it refuses every write. The leader compacts etcd's history
// after each snapshot, so the database (in use, and its size) stays flat;
// at the end the standby takes over and serves.
func TestEtcdStaysFlat(t *testing.T) {
	const (
		soak   = 24 * time.Second
		rate   = 200 // puts a second, each with its remove
		sample = 2 * time.Second
	)
	h := newHarness(t)
	h.cfg = func(c *ha.Config) { c.SnapshotRecords = 300 }
	h.candidate()
	h.candidate()
	h.leader(10 * time.Second)
	h.client(32 << 20)
	cl := h.client(0)
	cli, err := clientv3.New(clientv3.Config{Endpoints: h.etcd, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx := context.Background()
	status := func() *clientv3.StatusResponse {
		st, err := cli.Status(ctx, h.etcd[0])
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	val := make([]byte, 1024)
	tick := time.NewTicker(time.Second / rate)
	defer tick.Stop()
	start := time.Now()
	next := start.Add(sample)
	var inUse, size []int64
	puts := 0
	for time.Since(start) < soak {
		<-tick.C
		k := fmt.Sprintf("soak-%07d", puts)
		if err := cl.Put(ctx, k, val); err != nil {
			t.Fatalf("put %s: %v", k, err)
		}
		if err := cl.Remove(ctx, k, true); err != nil {
			t.Fatalf("remove %s: %v", k, err)
		}
		puts++
		if time.Now().After(next) {
			next = next.Add(sample)
			st := status()
			inUse, size = append(inUse, st.DbSizeInUse), append(size, st.DbSize)
			t.Logf("%5.1f s, %6d puts: etcd database %7d B, %7d B in use, revision %d", time.Since(start).Seconds(), puts, st.DbSize, st.DbSizeInUse, st.Header.Revision)
		}
	}
	// Flat: the last third of the soak holds no more than the first
	// third did, give or take (the warm-up, the first samples, is the
	// database's high-water mark forming).
	third := len(inUse) / 3
	if third == 0 {
		t.Fatalf("only %d samples in %s", len(inUse), soak)
	}
	peak := func(v []int64) int64 {
		m := v[0]
		for _, x := range v {
			m = max(m, x)
		}
		return m
	}
	early, late := peak(inUse[:third]), peak(inUse[len(inUse)-third:])
	earlySize, lateSize := peak(size[:third]), peak(size[len(size)-third:])
	t.Logf("%d puts in %s: in use %d B early, %d B late; size %d B early, %d B late", puts, time.Since(start).Round(time.Second), early, late, earlySize, lateSize)
	if late > early+early/2 {
		t.Errorf("etcd's database in use grew from %d B to %d B over the soak: its history is not compacted", early, late)
	}
	if lateSize > earlySize+earlySize/2 {
		t.Errorf("etcd's database grew from %d B to %d B over the soak", earlySize, lateSize)
	}
	// The standby kept up through the compactions: it takes over.
	old := h.leader(time.Second)
	h.forget(old)
	old.Kill()
	h.leader(testLease + 5*time.Second)
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := cl.Put(ctx, "after-failover", val)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no put after the failover: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// logSink is a log buffer the candidates' goroutines may write at once.
type logSink struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *logSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *logSink) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestNoSpaceIsLoudOnTheMasters: when etcd's database reaches its quota
// (NOSPACE) it refuses every write, so the leader's next commit fails and
// no candidate can lead again: every put fails. The masters say so at
// error level, with what to do on etcd, not only a commit error among
// warnings.
func TestNoSpaceIsLoudOnTheMasters(t *testing.T) {
	e, err := meta.StartEtcd(context.Background(), meta.EtcdConfig{Listen: "127.0.0.1:0", NoFsync: true, QuotaBackendBytes: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	eps := e.Endpoints()
	h := &harness{t: t, etcd: eps, direct: "etcd://" + strings.Join(eps, ";"), cluster: t.Name(), ee: e}
	var logs logSink
	h.cfg = func(c *ha.Config) { c.Logger = slog.New(slog.NewTextHandler(&logs, nil)) }
	h.candidate()
	h.candidate()
	h.leader(10 * time.Second)
	h.client(32 << 20)
	cl := h.client(0)
	ctx := context.Background()
	if err := cl.Put(ctx, "before", []byte("v")); err != nil {
		t.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	junk := strings.Repeat("x", 512<<10)
	for i := 0; ; i++ {
		if _, err := cli.Put(ctx, "junk", junk); errors.Is(err, rpctypes.ErrNoSpace) {
			break
		} else if err != nil {
			t.Fatal(err)
		} else if i > 100 {
			t.Fatal("100 puts of 512 KiB did not fill a 16 MiB quota")
		}
	}
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	err = cl.Put(pctx, "after", []byte("v"))
	cancel()
	if err == nil {
		t.Fatal("a put succeeded with etcd out of space")
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "etcdctl alarm disarm") {
		if time.Now().After(deadline) {
			t.Fatalf("no master said etcd is out of space, and what to do; their log:\n%s", logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "NOSPACE") {
			t.Log(l)
		}
	}
}
