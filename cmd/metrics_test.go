package cmd

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvcache-ops/mc/pkg/engine"
	"github.com/kvcache-ops/mc/pkg/engine/bench"
	"github.com/kvcache-ops/mc/pkg/engine/rdmatransport"
)

// An RDMA target serves its per-NIC endpoint, waiting-list and QP gauges,
// and they move when an initiator connects.
func TestBenchTargetMetrics(t *testing.T) {
	isolateEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out bytes.Buffer
	p := &printer{Out: &out, Err: &out, format: "table"}
	addrc := make(chan string, 1)
	o := benchTargetOptions{BufferSize: 16 << 20, MetricsListen: "127.0.0.1:0"}
	o.Protocol, o.DeviceName, o.MetadataServer, o.BindAddress = "rdma", "soft0,soft1", "P2PHANDSHAKE", "127.0.0.1"
	o.MinRPCPort, o.MaxRPCPort, o.StatusTimeout, o.TCPLanes = 15000, 17000, 2*time.Second, 4
	o.Ready = func(*bench.Target) {
		// Same goroutine as the writes to out: safe to read here.
		m := regexp.MustCompile(`metrics http://(\S+)/metrics`).FindStringSubmatch(out.String())
		seg := regexp.MustCompile(`segment_id (\S+)`).FindStringSubmatch(out.String())
		if m == nil || seg == nil {
			addrc <- ""
			return
		}
		addrc <- m[1] + " " + seg[1]
	}
	done := make(chan error, 1)
	go func() { done <- runBenchTarget(ctx, o, p) }()
	var addr, seg string
	select {
	case s := <-addrc:
		if s == "" {
			t.Fatalf("no metrics or segment line in target output")
		}
		addr, seg, _ = strings.Cut(s, " ")
	case err := <-done:
		t.Fatalf("target: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("target not ready")
	}
	get := func(path string) string {
		t.Helper()
		resp, err := http.Get(fmt.Sprintf("http://%s%s", addr, path))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("GET %s: %s", path, resp.Status)
		}
		return string(b)
	}
	if h := get("/health"); strings.TrimSpace(h) != "OK" {
		t.Fatalf("/health = %q", h)
	}
	before := get("/metrics")
	for _, want := range []string{`mc_rdma_endpoints{device="soft0",provider="soft"} 0`, `mc_rdma_endpoints_waiting{device="soft1",provider="soft"} 0`, `mc_rdma_qps_allocated{device="soft0",provider="soft"} 0`} {
		if !strings.Contains(before, want) {
			t.Fatalf("metrics before traffic lack %q:\n%s", want, before)
		}
	}
	if _, _, err := runCmd(t, "bench", "initiator", "--protocol", "rdma", "--device_name", "soft0,soft1", "--segment_id", seg,
		"--bind-address", "127.0.0.1", "--duration", "200ms", "--threads", "1", "--batch_size", "8", "--block_size", "128K"); err != nil {
		t.Fatal(err)
	}
	after := get("/metrics")
	if !regexp.MustCompile(`mc_rdma_qps_allocated\{device="soft[01]",provider="soft"\} [1-9]`).MatchString(after) &&
		!regexp.MustCompile(`mc_rdma_endpoints_reclaimed_total\{device="soft[01]",provider="soft"\} [1-9]`).MatchString(after) {
		t.Fatalf("no QP or reclaim activity after an initiator ran:\n%s", grepLines(after, "mc_rdma"))
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("target stop: %v", err)
	}
}

func grepLines(s, sub string) string {
	var b strings.Builder
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// The engine's exporter gives the bytes by the transport that moved them:
// an initiator under auto reading a same-host target counts them under
// shm, none under tcp.
func TestEngineCollectorByTransport(t *testing.T) {
	ctx := context.Background()
	newEng := func() *engine.Engine {
		e, err := engine.New(ctx, engine.Config{LocalServerName: "metrics", BindAddress: "127.0.0.1", HandshakeAddr: "127.0.0.1:0", Protocol: engine.ProtocolAuto})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		return e
	}
	target, init := newEng(), newEng()
	tm, err := target.RegisterMemory(ctx, 1<<20, "cpu:0", true)
	if err != nil {
		t.Fatal(err)
	}
	lm, err := init.RegisterMemory(ctx, 1<<20, "cpu:0", false)
	if err != nil {
		t.Fatal(err)
	}
	seg, err := init.OpenSegment(ctx, target.SegmentName())
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Close()
	b, _ := init.AllocateBatch(1)
	b.Submit(engine.Request{Op: engine.Read, Source: lm.Addr(), Segment: seg, Target: tm.Addr(), Length: 65536})
	if err := b.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP mc_engine_transport_bytes_total Bytes this engine's tasks moved, by the transport that moved them (local, shm, tcp, rdma; "rdma (soft)" for the software NIC, over TCP sockets).
# TYPE mc_engine_transport_bytes_total counter
mc_engine_transport_bytes_total{transport="local"} 0
mc_engine_transport_bytes_total{transport="rdma"} 0
mc_engine_transport_bytes_total{transport="shm"} 65536
mc_engine_transport_bytes_total{transport="tcp"} 0
`
	if err := testutil.CollectAndCompare(newEngineCollector(init), strings.NewReader(want), "mc_engine_transport_bytes_total"); err != nil {
		t.Fatal(err)
	}
}

// Bytes the software NIC moves are not counted as RDMA's: the label says
// "rdma (soft)" (issue 35, item 1).
func TestEngineCollectorSaysSoft(t *testing.T) {
	isolateEnv(t)
	e, err := engine.New(context.Background(), engine.Config{LocalServerName: "metrics-soft", BindAddress: "127.0.0.1",
		HandshakeAddr: "127.0.0.1:0", Protocol: "rdma", Transports: []engine.TransportFactory{rdmatransport.Factory(rdmatransport.Config{Devices: []string{"soft0"}})}})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	want := `
# HELP mc_engine_transport_bytes_total Bytes this engine's tasks moved, by the transport that moved them (local, shm, tcp, rdma; "rdma (soft)" for the software NIC, over TCP sockets).
# TYPE mc_engine_transport_bytes_total counter
mc_engine_transport_bytes_total{transport="local"} 0
mc_engine_transport_bytes_total{transport="rdma (soft)"} 0
mc_engine_transport_bytes_total{transport="shm"} 0
mc_engine_transport_bytes_total{transport="tcp"} 0
`
	if err := testutil.CollectAndCompare(newEngineCollector(e), strings.NewReader(want), "mc_engine_transport_bytes_total"); err != nil {
		t.Fatal(err)
	}
}
