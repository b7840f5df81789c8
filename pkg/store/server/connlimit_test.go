package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvcache-ops/mc/pkg/engine"
	"github.com/kvcache-ops/mc/pkg/store"
)

// capChildEnv makes the test binary a store (master and node in one
// process) with a descriptor limit of capChildNoFile (TestMain).
const (
	capChildEnv    = "MC_CONNCAP_TEST_CHILD"
	capChildNoFile = 512
)

type capChildAddrs struct {
	RPC, Admin, Handshake string
	Data                  int
}

func capChild() int {
	rl := unix.Rlimit{Cur: capChildNoFile, Max: capChildNoFile}
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	slog.SetDefault(log)
	s, err := Start(context.Background(), Config{RPCAddress: "127.0.0.1:0", AdminAddress: "127.0.0.1:0", SegmentSize: 32 << 20,
		Engine: engine.Config{BindAddress: "127.0.0.1", HandshakeAddr: "127.0.0.1:0"}, Logger: log})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	eng := s.Node.Engine()
	json.NewEncoder(os.Stdout).Encode(capChildAddrs{RPC: s.RPCAddr, Admin: s.AdminAddr, Handshake: eng.HandshakeAddr(), Data: eng.Descriptor().TCPDataPort})
	select {}
}

// flood opens n connections from host to addr, each sending a byte and
// then nothing, and returns those the server kept (the others were reset
// at accept).
func flood(t *testing.T, host, addr string, n int) []net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(host)}, Timeout: 5 * time.Second}
	var conns []net.Conn
	for range n {
		c, err := d.Dial("tcp", addr)
		if errors.Is(err, syscall.ECONNRESET) {
			continue // refused before the dial returned
		}
		if err != nil {
			t.Fatalf("flood from %s to %s: %v", host, addr, err)
		}
		// One byte of a request, then nothing: the data port accepts
		// only once a request begins (TCP_DEFER_ACCEPT), and a server
		// waits for the rest of a request it has begun.
		c.Write([]byte{0})
		conns = append(conns, c)
	}
	time.Sleep(300 * time.Millisecond) // the refusals arrive
	var kept []net.Conn
	for _, c := range conns {
		if reset(c) {
			c.Close()
		} else {
			kept = append(kept, c)
		}
	}
	t.Cleanup(func() {
		for _, c := range kept {
			c.Close()
		}
	})
	return kept
}

// reset peeks at c without blocking: true when the server reset or
// closed it.
func reset(c net.Conn) bool {
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		return true
	}
	var n int
	var rerr error
	rc.Read(func(fd uintptr) bool {
		var b [1]byte
		n, _, rerr = unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		return true
	})
	return rerr == nil && n == 0 || rerr != nil && !errors.Is(rerr, syscall.EAGAIN)
}

// TestConnectionFloodRefusedNotFatal: a store whose descriptor limit is
// 512 (so its caps are 256 connections, 64 from one host) is flooded on
// every listener. Before the caps a client holding idle connections took
// every descriptor: accepts failed with EMFILE for everyone until it left.
// Now one host gets its 64, everyone else is still served byte-exact, the
// process never runs out of descriptors even when several hosts fill the
// process cap, and the slots come back when the flood goes.
func TestConnectionFloodRefusedNotFatal(t *testing.T) {
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), capChildEnv+"=1")
	var stderr syncBuffer
	child.Stderr = &stderr
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { child.Process.Kill(); child.Wait() })
	var addrs capChildAddrs
	if err := json.NewDecoder(bufio.NewReader(out)).Decode(&addrs); err != nil {
		t.Fatalf("child's addresses: %v; stderr:\n%s", err, stderr.String())
	}
	for start := time.Now(); !strings.Contains(stderr.String(), "inbound connections capped at 256, 64 from one host (descriptor limit 512)"); {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("no start line naming the caps:\n%s", stderr.String())
		}
		time.Sleep(5 * time.Millisecond) // the child's stderr is copied by a goroutine
	}
	dataAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(addrs.Data))

	// One host floods the data, RPC and handshake ports.
	var kept int
	for _, a := range []string{dataAddr, addrs.RPC, addrs.Handshake} {
		k := len(flood(t, "127.0.0.2", a, 300))
		t.Logf("%s kept %d", a, k)
		kept += k
	}
	if kept != 64 {
		t.Fatalf("one host kept %d connections, want its cap of 64", kept)
	}
	ctx := context.Background()
	roundTrip := func(what string) {
		t.Helper()
		cl, err := store.New(ctx, store.Config{Master: addrs.RPC, EngineConfig: engine.Config{BindAddress: "127.0.0.1", HandshakeAddr: "127.0.0.1:0"}, StagingSize: 8 << 20})
		if err != nil {
			t.Fatalf("%s: client: %v", what, err)
		}
		defer cl.Close(ctx)
		for i := range 8 {
			k := fmt.Sprintf("%s-%d", what, i)
			v := bytes.Repeat([]byte{byte(i + 1)}, 1<<20)
			if err := cl.Put(ctx, k, v); err != nil {
				t.Fatalf("%s: put %s: %v", what, k, err)
			}
			if got, err := cl.Get(ctx, k); err != nil || !bytes.Equal(got, v) {
				t.Fatalf("%s: get %s: %v", what, k, err)
			}
		}
	}
	roundTrip("beside-one-host")

	// Five more hosts: together over the process cap.
	var more [][]net.Conn
	total := kept
	for h := 3; h <= 7; h++ {
		c := flood(t, fmt.Sprintf("127.0.0.%d", h), dataAddr, 100)
		more = append(more, c)
		total += len(c)
	}
	if total > 256 {
		t.Fatalf("the hosts kept %d connections, over the process cap of 256", total)
	}
	if total < 250 {
		t.Fatalf("the hosts kept only %d connections, want the process cap of 256 (less the store's own)", total)
	}
	metrics := func() string {
		t.Helper()
		resp, err := http.Get("http://" + addrs.Admin + "/metrics")
		if err != nil {
			t.Fatalf("metrics: %v", err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	// The process is full: let the flood go, then it serves again.
	for _, cs := range more {
		for _, c := range cs {
			c.Close()
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	var m string
	for {
		m = metrics()
		if strings.Contains(m, `mc_connections_refused_total{listener="tcp data",reason="process"}`) && !strings.Contains(m, `mc_connections_refused_total{listener="tcp data",reason="process"} 0`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no refusal by the process cap in /metrics:\n%s", grepLines(m, "mc_connections"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, want := range []string{`mc_connections_max 256`, `mc_connections_per_host_max 64`, `reason="host"`} {
		if !strings.Contains(m, want) {
			t.Fatalf("/metrics lacks %s:\n%s", want, grepLines(m, "mc_connections"))
		}
	}
	roundTrip("after-the-flood")
	log := stderr.String()
	if strings.Contains(log, "accept failed") || strings.Contains(log, "too many open files") {
		t.Fatalf("the store ran out of descriptors:\n%s", log)
	}
	for _, want := range []string{"refused a connection from 127.0.0.2: that host holds 64 connections", "this process holds 256 inbound connections"} {
		if !strings.Contains(log, want) {
			t.Fatalf("the log lacks %q:\n%s", want, log)
		}
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
