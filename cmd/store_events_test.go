package cmd

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/store/kvevents"
)

func TestStoreEventsUsage(t *testing.T) {
	isolateEnv(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "--endpoint"},
		{[]string{"--endpoint", "127.0.0.1:5557"}, "invalid --endpoint"},
		{[]string{"--endpoint", "tcp://127.0.0.1"}, "invalid --endpoint"},
		{[]string{"--endpoint", "tcp://127.0.0.1:5557", "--type", "added"}, "invalid --type"},
	} {
		out, errs, code := execMC(t, append([]string{"store", "events"}, c.args...)...)
		if code != exitUsage || !strings.HasPrefix(errs, "mc: ") || !strings.Contains(errs, c.want) || out != "" {
			t.Errorf("store events %q: exit %d, stderr %q, stdout %q; want exit %d naming %s", c.args, code, errs, out, exitUsage, c.want)
		}
	}
}

// waitText polls b until it contains s.
func waitText(t *testing.T, b *syncBuffer, s string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(b.String(), s) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q in:\n%s", s, b.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// `mc store events` started before the publisher says once that it
// waits, then prints each event (filtered by --type and --prefix) as a
// JSON line or an aligned line, and exits 0 with a count when
// interrupted.
func TestStoreEventsFollowsPublisher(t *testing.T) {
	isolateEnv(t)
	for _, asJSON := range []bool{false, true} {
		ep := "tcp://127.0.0.1:" + strconv.Itoa(freePort(t))
		args := []string{"store", "events", "--endpoint", ep, "--type", "stored", "--prefix", "0x"}
		if asJSON {
			args = append(args, "-o", "json")
		}
		var out, errs syncBuffer
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan int, 1)
		go func() { done <- Execute(ctx, args, &out, &errs) }()
		waitText(t, &errs, "waiting for the publisher at "+ep)
		time.Sleep(300 * time.Millisecond) // a few more attempts: still one line
		if n := strings.Count(errs.String(), "waiting"); n != 1 {
			t.Fatalf("waiting said %d times:\n%s", n, errs.String())
		}
		p, err := kvevents.New(kvevents.Config{Endpoint: ep, BackendID: "pool-a"})
		if err != nil {
			t.Fatal(err)
		}
		waitText(t, &errs, "connected to "+ep)
		for p.Stats().Subscribers == 0 {
			time.Sleep(5 * time.Millisecond)
		}
		p.Stored("0x1f2e", kvevents.MediumCPU)
		p.Stored("1234567", kvevents.MediumCPU)  // not 0x: filtered out
		p.Removed("0x1f2e", kvevents.MediumDisk) // removed: filtered out
		p.Stored("0xabc", kvevents.MediumDisk)
		if asJSON {
			waitText(t, &out, `"key":"0xabc"`)
		} else {
			waitText(t, &out, "0xabc")
		}
		cancel()
		if code := <-done; code != 0 {
			t.Fatalf("exit %d after the interrupt; stderr:\n%s", code, errs.String())
		}
		p.Close()
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		if asJSON {
			if len(lines) != 2 {
				t.Fatalf("json: %d lines, want 2:\n%s", len(lines), out.String())
			}
			var e eventLine
			if err := json.Unmarshal([]byte(lines[0]), &e); err != nil {
				t.Fatal(err)
			}
			if e.Type != "stored" || e.Key != "0x1f2e" || e.Medium != "cpu" || e.TenantID != "default" || e.BackendID != "pool-a" ||
				e.Seq != 1 || len(e.SeqHashes) != 1 || e.SeqHashes[0] != 0x1f2e || e.TimestampMS == 0 {
				t.Fatalf("json line %s decoded as %+v", lines[0], e)
			}
			var raw map[string]any
			json.Unmarshal([]byte(lines[1]), &raw)
			for _, f := range []string{"time", "timestamp_ms", "seq", "event_id", "type", "key", "medium", "tenant_id", "backend_id", "seq_hashes"} {
				if _, ok := raw[f]; !ok {
					t.Errorf("json line %s has no %s", lines[1], f)
				}
			}
		} else {
			if len(lines) != 3 || !strings.HasPrefix(lines[0], "TIME") {
				t.Fatalf("table: %d lines, want a header and 2:\n%s", len(lines), out.String())
			}
			for i, want := range [][]string{{"TIME", "TYPE", "KEY", "MEDIUM", "TENANT"}, {"stored", "0x1f2e", "cpu", "default"}, {"stored", "0xabc", "disk", "default"}} {
				f := strings.Fields(lines[i])
				if i > 0 {
					f = f[2:] // date and time
				}
				if strings.Join(f, " ") != strings.Join(want, " ") {
					t.Errorf("line %q: fields %q, want %q", lines[i], f, want)
				}
			}
			if col := strings.Index(lines[0], "MEDIUM"); strings.Index(lines[1], "cpu") != col || strings.Index(lines[2], "disk") != col {
				t.Errorf("columns not aligned:\n%s", out.String())
			}
		}
		if !strings.Contains(errs.String(), "4 events received, 2 shown, 0 lost") {
			t.Fatalf("no count line:\n%s", errs.String())
		}
	}
}

// Events dropped by a full queue at the master are reported as lost, as
// many as the master dropped.
func TestStoreEventsReportsLoss(t *testing.T) {
	isolateEnv(t)
	p, err := kvevents.New(kvevents.Config{Endpoint: "tcp://127.0.0.1:0", BackendID: "b", QueueCapacity: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var out, errs syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- runStoreEvents(ctx, storeEventsOptions{Endpoint: p.Endpoint(), JSON: true}, &out, &errs)
	}()
	for p.Stats().Subscribers == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	p.Stored("1", kvevents.MediumCPU)
	waitText(t, &out, `"key":"1"`)
	const n = 20000
	for i := range n {
		p.Stored(strconv.Itoa(i+2), kvevents.MediumCPU)
	}
	waitText(t, &out, fmt.Sprintf(`"key":"%d"`, n+1)) // the last always goes
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	dropped := p.Stats().DroppedEvents
	if dropped > 0 && !strings.Contains(errs.String(), "lost ") {
		t.Fatalf("%d dropped, nothing said:\n%s", dropped, errs.String())
	}
	want := fmt.Sprintf("%d events received, %d shown, %d lost", n+1-dropped, n+1-dropped, dropped)
	if !strings.Contains(errs.String(), want) {
		t.Fatalf("want %q in:\n%s", want, errs.String())
	}
	t.Logf("%d of %d events dropped", dropped, n)
}

// Interrupted before it ever reached the publisher, events followed
// nothing: exit 1 naming the endpoint (it exited 0, "0 events
// received"), with -o json a JSON error object.
func TestStoreEventsNeverConnectedFails(t *testing.T) {
	isolateEnv(t)
	ep := "tcp://127.0.0.1:" + strconv.Itoa(freePort(t))
	for _, asJSON := range []bool{false, true} {
		args := []string{"store", "events", "--endpoint", ep}
		if asJSON {
			args = append(args, "-o", "json")
		}
		var out, errs syncBuffer
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan int, 1)
		go func() { done <- Execute(ctx, args, &out, &errs) }()
		waitText(t, &errs, "waiting for the publisher at "+ep)
		cancel()
		code := <-done
		if code != exitFailure || !strings.Contains(errs.String(), "0 events received") ||
			!strings.Contains(errs.String(), "mc: store events: never reached the publisher at "+ep) {
			t.Fatalf("json %v: exit %d, stderr:\n%s", asJSON, code, errs.String())
		}
		if asJSON {
			var v map[string]any
			if err := json.Unmarshal([]byte(out.String()), &v); err != nil || v["exit_code"] != float64(exitFailure) {
				t.Fatalf("-o json: stdout %q is no JSON error (%v)", out.String(), err)
			}
		}
	}
}
