package metascan

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine"
	"github.com/kvcache-ops/mc/pkg/engine/meta"
)

// A test binary started with childEnv set runs one engine registered in the
// metadata server it names, prints READY and serves until stdin closes or
// it is killed: a real separate process for SIGKILL tests.
const (
	childEnv        = "MC_METASCAN_CHILD_SERVER"
	childNameEnv    = "MC_METASCAN_CHILD_NAME"
	childClusterEnv = "MC_METASCAN_CHILD_CLUSTER"
)

func TestMain(m *testing.M) {
	if server := os.Getenv(childEnv); server != "" {
		os.Exit(runChildEngine(server, os.Getenv(childNameEnv), os.Getenv(childClusterEnv)))
	}
	os.Exit(m.Run())
}

func runChildEngine(server, name, cluster string) int {
	ctx := context.Background()
	e, err := engine.New(ctx, engine.Config{LocalServerName: name, MetadataServer: server, ClusterID: cluster,
		BindAddress: "127.0.0.1", HandshakeAddr: "127.0.0.1:0"})
	if err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	if _, err := e.RegisterMemory(ctx, 1<<20, "cpu:0", true); err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	fmt.Println("READY", e.HandshakeAddr())
	io.Copy(io.Discard, os.Stdin)
	e.Close()
	return 0
}

// childEngine is an engine in another process.
type childEngine struct {
	cmd  *exec.Cmd
	addr string        // its handshake address
	done chan struct{} // closed when the process has been reaped
}

func startChild(t *testing.T, server, name, cluster string) *childEngine {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+server, childNameEnv+"="+name, childClusterEnv+"="+cluster)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		stdin.Close()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "READY ") {
		t.Fatalf("child engine %s: %q %v", name, line, err)
	}
	return &childEngine{cmd: cmd, addr: strings.TrimSpace(strings.TrimPrefix(line, "READY ")), done: done}
}

// kill SIGKILLs the child: nothing withdraws its descriptor.
func (c *childEngine) kill(t *testing.T) {
	t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Once reaped, the kernel has closed its sockets.
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("child engine at %s not reaped 10 s after SIGKILL", c.addr)
	}
}

func startEtcd(t testing.TB) string {
	t.Helper()
	ee, err := meta.StartEtcd(context.Background(), meta.EtcdConfig{Listen: "127.0.0.1:0", NoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ee.Close() })
	return ee.Endpoints()[0]
}

func startHTTP(t testing.TB) string {
	t.Helper()
	srv := httptest.NewServer(meta.NewHTTPHandler())
	t.Cleanup(srv.Close)
	return srv.URL + "/metadata"
}

func open(t testing.TB, server, cluster string) (meta.Backend, meta.Store) {
	t.Helper()
	b, err := meta.Open(context.Background(), server, meta.Options{ClusterID: cluster})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	st, err := meta.StoreOf(b)
	if err != nil {
		t.Fatal(err)
	}
	return b, st
}

// liveEngine runs an engine in this process.
func liveEngine(t *testing.T, server, name, cluster string) *engine.Engine {
	t.Helper()
	cfg := engine.Config{LocalServerName: name, MetadataServer: server, ClusterID: cluster,
		BindAddress: "127.0.0.1", HandshakeAddr: "127.0.0.1:0"}
	e, err := engine.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	if _, err := e.RegisterMemory(context.Background(), 1<<20, "cpu:0", true); err != nil {
		t.Fatal(err)
	}
	return e
}

// silentPeer accepts connections and never answers.
type silentPeer struct {
	ln net.Listener
}

func newSilentPeer(t testing.TB) *silentPeer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &silentPeer{ln: ln}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				io.Copy(io.Discard, c) // until the prober gives up
				c.Close()
			}()
		}
	}()
	return p
}

// closedPort is a loopback port nothing listens on.
func closedPort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	return port
}

func tcpDesc(name string, dataPort int) *meta.SegmentDesc {
	return &meta.SegmentDesc{Name: name, Protocol: meta.ProtocolTCP, TCPDataPort: dataPort, TCPProtoVersion: 2,
		Buffers: []meta.BufferDesc{{Name: name, Addr: 0x7f0000000000, Length: 1 << 20}}}
}

func byName(t *testing.T, segs []Segment) map[string]*Segment {
	t.Helper()
	m := map[string]*Segment{}
	for i := range segs {
		m[segs[i].Name] = &segs[i]
	}
	return m
}
