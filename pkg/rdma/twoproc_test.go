package rdma_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/rdma"
	"github.com/kvcache-ops/mc/pkg/rdma/soft"
)

// helperMsg is one line of the parent/child protocol on stdin/stdout.
type helperMsg struct {
	Cmd   string               `json:"cmd,omitempty"` // connect, sum, exit
	Req   *rdma.ConnectionDesc `json:"req,omitempty"`
	Reply *rdma.ConnectionDesc `json:"reply,omitempty"`
	Addr  uint64               `json:"addr,omitempty"`
	RKey  uint32               `json:"rkey,omitempty"`
	Off   int                  `json:"off,omitempty"`
	Len   int                  `json:"len,omitempty"`
	Sum   string               `json:"sum,omitempty"`
	Err   string               `json:"err,omitempty"`
}

const helperBuf = 1 << 20

// TestHelperProcess is the remote side of TestTwoProcesses when run with
// MC_RDMA_HELPER=1: a process with its own soft NIC and context that
// answers connection requests and checksums its memory on request.
func TestHelperProcess(t *testing.T) {
	if os.Getenv("MC_RDMA_HELPER") != "1" {
		return
	}
	out := json.NewEncoder(os.Stdout)
	fail := func(err error) {
		out.Encode(helperMsg{Err: err.Error()})
		os.Exit(1)
	}
	p, err := soft.New(soft.Config{Devices: []soft.DeviceConfig{{Name: "soft0"}}})
	if err != nil {
		fail(err)
	}
	c, err := rdma.NewContext(p, "soft0", rdma.Config{ServerName: "child"})
	if err != nil {
		fail(err)
	}
	buf := make([]byte, helperBuf)
	fill(buf, 77)
	mr, err := c.RegisterMemory(buf)
	if err != nil {
		fail(err)
	}
	out.Encode(helperMsg{Addr: mr.Addr(), RKey: mr.RKey(), Len: helperBuf})
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var m helperMsg
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			fail(err)
		}
		switch m.Cmd {
		case "connect":
			r := c.Accept(*m.Req)
			out.Encode(helperMsg{Reply: &r})
		case "sum":
			s := sha256.Sum256(buf[m.Off : m.Off+m.Len])
			out.Encode(helperMsg{Sum: hex.EncodeToString(s[:])})
		case "exit":
			c.Close()
			p.Close()
			os.Exit(0)
		}
	}
	os.Exit(0)
}

// child drives a helper process.
type child struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *json.Decoder
	mu  sync.Mutex
}

func (c *child) call(t testing.TB, m helperMsg) (helperMsg, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := json.NewEncoder(c.in).Encode(m); err != nil {
		return helperMsg{}, err
	}
	var r helperMsg
	if err := c.out.Decode(&r); err != nil {
		return r, err
	}
	if r.Err != "" {
		return r, fmt.Errorf("helper: %s", r.Err)
	}
	return r, nil
}

// TestTwoProcesses moves bytes between soft NICs in two processes: the
// connection exchange (lid, gid, qp_num) crosses stdin/stdout as it would
// cross the handshake socket, and the data crosses the NICs' wires.
func TestTwoProcesses(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), "MC_RDMA_HELPER=1")
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	outPipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ch := &child{cmd: cmd, in: in, out: json.NewDecoder(outPipe)}
	done := make(chan error, 1)
	t.Cleanup(func() {
		in.Close()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	var remote helperMsg
	if err := ch.out.Decode(&remote); err != nil || remote.Err != "" {
		go func() { done <- cmd.Wait() }()
		t.Fatalf("helper start: %v %s; stderr:\n%s", err, remote.Err, stderr.String())
	}
	go func() { done <- cmd.Wait() }()

	p, err := soft.New(soft.Config{Devices: []soft.DeviceConfig{{Name: "soft0"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	exchange := func(_ context.Context, req rdma.ConnectionDesc) (rdma.ConnectionDesc, error) {
		r, err := ch.call(t, helperMsg{Cmd: "connect", Req: &req})
		if err != nil {
			return rdma.ConnectionDesc{}, err
		}
		return *r.Reply, nil
	}
	a, err := rdma.NewContext(p, "soft0", rdma.Config{ServerName: "parent", Exchange: exchange})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	local := register(t, a, helperBuf)
	fill(local.buf, 5)
	e, err := a.Endpoint(context.Background(), "child@soft0")
	if err != nil {
		t.Fatal(err)
	}
	// The remote region is described by what the child printed: the
	// parent has no Go object for it.
	rr := region{mr: remoteMR{addr: remote.Addr, rkey: remote.RKey}}
	var chs []<-chan rdma.WC
	for i := 0; i < 8; i++ { // WRITE the first half
		chs = append(chs, post(t, e, rdma.OpWrite, local, i<<16, rr, i<<16, 1<<16))
	}
	for i := 8; i < 16; i++ { // READ the second half
		chs = append(chs, post(t, e, rdma.OpRead, local, i<<16, rr, i<<16, 1<<16))
	}
	for _, c := range chs {
		if wc := wait(t, c); wc.Status != rdma.WCSuccess {
			t.Fatalf("completion %+v; helper stderr:\n%s", wc, stderr.String())
		}
	}
	want := make([]byte, helperBuf)
	fill(want, 77)
	if !bytes.Equal(local.buf[helperBuf/2:], want[helperBuf/2:]) {
		t.Fatal("bytes read from the other process differ")
	}
	sum := sha256.Sum256(local.buf[:helperBuf/2])
	r, err := ch.call(t, helperMsg{Cmd: "sum", Off: 0, Len: helperBuf / 2})
	if err != nil {
		t.Fatal(err)
	}
	if r.Sum != hex.EncodeToString(sum[:]) {
		t.Fatal("bytes written to the other process differ")
	}
	// The other process checks keys and bounds: a range past its region
	// fails with a remote access error and leaves its memory alone.
	bad := post(t, e, rdma.OpWrite, local, 0, rr, helperBuf-100, 4096)
	if wc := wait(t, bad); wc.Status != rdma.WCRemAccessErr {
		t.Fatalf("out-of-bounds write: %+v", wc)
	}
	if r, err := ch.call(t, helperMsg{Cmd: "sum", Off: 0, Len: helperBuf / 2}); err != nil || r.Sum != hex.EncodeToString(sum[:]) {
		t.Fatalf("remote memory changed by a rejected write (%v)", err)
	}
	ch.mu.Lock()
	json.NewEncoder(in).Encode(helperMsg{Cmd: "exit"})
	ch.mu.Unlock()
	if strings.Contains(stderr.String(), "panic") {
		t.Fatalf("helper panicked:\n%s", stderr.String())
	}
}

// remoteMR stands for a peer's region known only by address and key.
type remoteMR struct {
	addr uint64
	rkey uint32
}

func (m remoteMR) LKey() uint32      { return 0 }
func (m remoteMR) RKey() uint32      { return m.rkey }
func (m remoteMR) Addr() uint64      { return m.addr }
func (m remoteMR) Len() int          { return helperBuf }
func (m remoteMR) Deregister() error { return nil }
