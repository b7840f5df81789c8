//go:build linux

package shm

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// childEnv makes the test binary a region owner in another process: it
// creates a region, fills it, prints what a peer needs and waits for
// stdin to close (or to be killed).
const childEnv = "MC_SHM_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	os.Exit(m.Run())
}

func runChild() int {
	tok, _ := NewToken()
	r, err := NewRegion(10007, tok, 7)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	for i := range r.Bytes() {
		r.Bytes()[i] = byte(i * 13)
	}
	fmt.Printf("%d %s %d %d\n", os.Getpid(), tok, r.FD(), uint64(addrOf(r.Bytes())))
	bufio.NewReader(os.Stdin).ReadString('\n')
	return 0
}

func addrOf(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(&b[0]))) }

func self(t *testing.T, tok Token) (Local, Identity) {
	t.Helper()
	id, err := Self("", tok)
	if err != nil {
		t.Fatal(err)
	}
	return Local{BootID: id.BootID, UID: id.UID}, id
}

func newRegion(t *testing.T, size int, id uint64) (*Region, Token) {
	t.Helper()
	tok, err := NewToken()
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewRegion(size, tok, id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r, tok
}

// open attaches to peer and maps bufs, closing everything at the end of
// the test.
func open(t *testing.T, local Local, peer Identity, bufs ...BufferRef) ([]*Mapping, *Peer, error) {
	t.Helper()
	p, err := Attach(local, peer)
	if err != nil {
		return nil, nil, err
	}
	t.Cleanup(func() { p.Close() })
	var ms []*Mapping
	for _, b := range bufs {
		m, err := p.Map(b)
		if err != nil {
			return nil, nil, err
		}
		t.Cleanup(func() { m.Close() })
		ms = append(ms, m)
	}
	return ms, p, nil
}

func ref(r *Region) BufferRef {
	return BufferRef{Addr: addrOf(r.Bytes()), Length: uint64(len(r.Bytes())), FD: r.FD(), ID: r.ID()}
}

func TestRegionMapsBothWaysAtOddSize(t *testing.T) {
	r, tok := newRegion(t, 12345, 1)
	for i := range r.Bytes() {
		r.Bytes()[i] = byte(i * 7)
	}
	local, id := self(t, tok)
	ms, p, err := open(t, local, id, ref(r))
	if err != nil {
		t.Fatal(err)
	}
	m := ms[0]
	if len(m.Bytes()) != 12345 {
		t.Fatalf("mapping of %d bytes, want 12345", len(m.Bytes()))
	}
	for i, c := range m.Bytes() {
		if c != byte(i*7) {
			t.Fatalf("byte %d: peer sees %d, owner wrote %d", i, c, byte(i*7))
		}
	}
	copy(m.Bytes()[12340:], "abcde")
	if got := string(r.Bytes()[12340:]); got != "abcde" {
		t.Fatalf("owner sees %q after the peer wrote abcde", got)
	}
	if addrOf(m.Bytes()) == addrOf(r.Bytes()) {
		t.Fatal("peer mapping shares the owner's address: not a second mapping")
	}
	if !m.Live() || p.Exited() {
		t.Fatalf("live %v exited %v, want a live region of a running process", m.Live(), p.Exited())
	}
}

func TestRegionFileIsPrivateAndSealed(t *testing.T) {
	r, _ := newRegion(t, 4096, 1)
	var st unix.Stat_t
	if err := unix.Fstat(r.FD(), &st); err != nil {
		t.Fatal(err)
	}
	if perm := st.Mode & 0o7777; perm != 0o600 {
		t.Fatalf("mode %04o, want 0600", perm)
	}
	if int(st.Uid) != os.Geteuid() {
		t.Fatalf("owned by uid %d, want %d", st.Uid, os.Geteuid())
	}
	if err := unix.Ftruncate(r.FD(), 4096); err == nil {
		t.Fatal("the region could be shrunk: a mapped peer would fault")
	}
	if fl, _ := unix.FcntlInt(uintptr(r.FD()), unix.F_GETFD, 0); fl&unix.FD_CLOEXEC == 0 {
		t.Fatal("memfd is inherited by child processes")
	}
}

func TestOpenRefusesAnotherUser(t *testing.T) {
	r, tok := newRegion(t, 4096, 1)
	local, id := self(t, tok)
	other := local.UID + 1000

	// The descriptor says so.
	_, _, err := open(t, Local{BootID: local.BootID, UID: other}, id, ref(r))
	if !errors.Is(err, ErrOtherUser) || !strings.Contains(err.Error(), fmt.Sprintf("runs as uid %d, this engine as uid %d", id.UID, other)) {
		t.Fatalf("peer of uid %d opened by uid %d: %v, want ErrOtherUser naming both", id.UID, other, err)
	}
	// The descriptor lies: the file's owner is checked.
	id.UID = other
	_, _, err = open(t, Local{BootID: local.BootID, UID: other}, id, ref(r))
	if !errors.Is(err, ErrOtherUser) || !strings.Contains(err.Error(), fmt.Sprintf("owned by uid %d, this engine runs as uid %d", local.UID, other)) {
		t.Fatalf("file of uid %d opened by uid %d: %v, want ErrOtherUser naming both", local.UID, other, err)
	}
}

func TestOpenRefusesAnotherHost(t *testing.T) {
	r, tok := newRegion(t, 4096, 1)
	local, id := self(t, tok)
	id.BootID = "00000000-0000-4000-8000-000000000000"
	_, _, err := open(t, local, id, ref(r))
	if !errors.Is(err, ErrOtherHost) {
		t.Fatalf("%v, want ErrOtherHost", err)
	}
}

func TestOpenChecksTheFileIsTheDescribedRegion(t *testing.T) {
	r, tok := newRegion(t, 8192, 5)
	local, id := self(t, tok)
	plain, err := os.CreateTemp(t.TempDir(), "plain")
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	plain.Truncate(3 * 4096)
	otherTok := id
	otherTok.Token[0] ^= 1
	cases := map[string]struct {
		id   Identity
		ref  func(BufferRef) BufferRef
		want string
	}{
		"token":       {otherTok, func(b BufferRef) BufferRef { return b }, "another engine"},
		"stale id":    {id, func(b BufferRef) BufferRef { b.ID = 4; return b }, "descriptor is stale"},
		"addr":        {id, func(b BufferRef) BufferRef { b.Addr += 4096; return b }, "want 0x"},
		"too long":    {id, func(b BufferRef) BufferRef { b.Length = 1 << 20; return b }, "too small"},
		"not a memfd": {id, func(b BufferRef) BufferRef { b.FD = int(plain.Fd()); return b }, "sealed"},
		"closed fd":   {id, func(b BufferRef) BufferRef { b.FD = 99999; return b }, "open"},
	}
	for name, c := range cases {
		_, _, err := open(t, local, c.id, c.ref(ref(r)))
		if !errors.Is(err, ErrUnmappable) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrUnmappable saying %q", name, err, c.want)
		}
	}
	if err := os.Chmod(plain.Name(), 0o644); err != nil {
		t.Fatal(err)
	}
	b := ref(r)
	b.FD = int(plain.Fd())
	if _, _, err := open(t, local, id, b); !errors.Is(err, ErrUnmappable) || !strings.Contains(err.Error(), "want 0600") {
		t.Errorf("a 0644 file: %v, want a refusal naming the mode", err)
	}
}

func TestRetiredRegionFailsAndStaysMapped(t *testing.T) {
	r, tok := newRegion(t, 3*4096+1, 2)
	copy(r.Bytes(), "kept")
	local, id := self(t, tok)
	ms, _, err := open(t, local, id, ref(r))
	if err != nil {
		t.Fatal(err)
	}
	m := ms[0]
	rf := ref(r)
	r.Retire()
	if m.Live() {
		t.Fatal("mapping still live after the owner retired the region")
	}
	if _, _, err := open(t, local, id, rf); !errors.Is(err, ErrRetired) {
		t.Fatalf("opening a retired region: %v, want ErrRetired", err)
	}
	r.Revive()
	if !m.Live() {
		t.Fatal("revived region not live")
	}
	// The owner unmaps and closes: the peer's mapping stays valid memory
	// (no SIGBUS) that nobody else will ever be given.
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if m.Live() {
		t.Fatal("closed region still live")
	}
	if got := string(m.Bytes()[:4]); got != "kept" {
		t.Fatalf("peer reads %q after the owner closed, want kept", got)
	}
	m.Bytes()[len(m.Bytes())-1] = 1
}

func TestBootIDThroughRoot(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "sys", "kernel", "random")
	os.MkdirAll(dir, 0o755)
	if _, err := BootID(root); err == nil {
		t.Fatal("missing boot_id: no error")
	}
	os.WriteFile(filepath.Join(dir, "boot_id"), []byte("3f1c2a9e-0b7d-4c55-9e7a-1d2b3c4d5e6f\n"), 0o644)
	id, err := BootID(root)
	if err != nil || id != "3f1c2a9e-0b7d-4c55-9e7a-1d2b3c4d5e6f" {
		t.Fatalf("BootID = %q, %v", id, err)
	}
	os.WriteFile(filepath.Join(dir, "boot_id"), []byte("myhost\n"), 0o644)
	if _, err := BootID(root); err == nil || !strings.Contains(err.Error(), "not a UUID") {
		t.Fatalf("boot_id myhost: %v, want not a UUID", err)
	}
}

func TestTokenRoundTrip(t *testing.T) {
	a, _ := NewToken()
	b, _ := NewToken()
	if a == b {
		t.Fatal("two tokens are equal")
	}
	got, err := ParseToken(a.String())
	if err != nil || got != a {
		t.Fatalf("ParseToken(%s) = %s, %v", a, got, err)
	}
	for _, s := range []string{"", "zz" + a.String()[2:], a.String()[1:]} {
		if _, err := ParseToken(s); err == nil {
			t.Errorf("ParseToken(%q) accepted", s)
		}
	}
}

// A region in another process: mapped, then the owner is SIGKILLed. The
// mapping stays readable and Exited says so.
func TestPeerInAnotherProcessExits(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	cmd.Stderr = os.Stderr
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { in.Close(); cmd.Process.Kill(); cmd.Wait() }()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("child: %v", err)
	}
	var pid, fd int
	var tokS string
	var addr uint64
	if _, err := fmt.Sscanf(line, "%d %s %d %d", &pid, &tokS, &fd, &addr); err != nil {
		t.Fatalf("child said %q: %v", line, err)
	}
	tok, err := ParseToken(tokS)
	if err != nil {
		t.Fatal(err)
	}
	local, id := self(t, tok)
	id.PID = pid
	ms, p, err := open(t, local, id, BufferRef{Addr: addr, Length: 10007, FD: fd, ID: 7})
	if err != nil {
		t.Fatal(err)
	}
	m := ms[0]
	for i, c := range m.Bytes() {
		if c != byte(i*13) {
			t.Fatalf("byte %d: %d, want %d", i, c, byte(i*13))
		}
	}
	if p.Exited() {
		t.Fatal("running child reported exited")
	}
	cmd.Process.Signal(syscall.SIGKILL)
	deadline := time.Now().Add(5 * time.Second)
	for !p.Exited() {
		if time.Now().After(deadline) {
			t.Fatal("child killed 5 s ago, Exited still false")
		}
		time.Sleep(time.Millisecond)
	}
	if i := 100; m.Bytes()[i] != byte(i*13) {
		t.Fatal("mapping of a dead owner changed")
	}
	m.Bytes()[0] = 1 // still writable, never a fault
}
