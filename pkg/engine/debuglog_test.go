package engine_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/kvcache-ops/mc/pkg/diag/glog"
	"github.com/kvcache-ops/mc/pkg/engine"
)

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// --log-level debug on a TCP transfer shows its metadata calls and
// connection set-up; at info the same transfer logs nothing.
func TestTCPDebugLogs(t *testing.T) {
	transfer := func(level slog.Level) string {
		buf := &lockedBuffer{}
		old := slog.Default()
		glog.Setup(buf, level)
		defer slog.SetDefault(old)
		ctx := context.Background()
		target := newEngine(t)
		tm := register(t, target, 1<<20, true)
		init := newEngine(t)
		lm := register(t, init, 1<<20, false)
		seg, err := init.OpenSegment(ctx, target.SegmentName())
		if err != nil {
			t.Fatal(err)
		}
		b, _ := init.AllocateBatch(1)
		b.Submit(engine.Request{Op: engine.Write, Source: lm.Addr(), Segment: seg, Target: tm.Addr(), Length: 4096})
		if err := b.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		init.Close()
		target.Close()
		return buf.String()
	}
	logs := transfer(slog.LevelDebug)
	for _, want := range []string{"engine started", "metadata: published segment", "metadata: get segment",
		"segment opened", "tcp lane connected", "tcp data connection accepted"} {
		if !strings.Contains(logs, "] "+want) {
			t.Errorf("debug log lacks %q:\n%s", want, logs)
		}
	}
	if logs := transfer(slog.LevelInfo); strings.Contains(logs, "tcp lane connected") {
		t.Errorf("debug lines at info:\n%s", logs)
	}
}
