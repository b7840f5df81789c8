package tier

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// killChildEnv carries the directory to the child process of
// TestSIGKILLDuringWrites.
const killChildEnv = "MC_TIER_KILL_CHILD_DIR"

// TestKillChild is not a test on its own: it is the child process of
// TestSIGKILLDuringWrites, which re-executes the test binary to run only
// it. It writes records of growing sizes forever and prints each key once
// Write has returned (the record is durable).
func TestKillChild(t *testing.T) {
	dir := os.Getenv(killChildEnv)
	if dir == "" {
		t.Skip("the child process of TestSIGKILLDuringWrites")
	}
	round, _ := strconv.Atoi(os.Getenv(killChildEnv + "_ROUND"))
	tr, err := Open(Config{Dir: dir, Capacity: 1 << 30, MaxFileRecords: 7})
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(2)
	}
	fmt.Println("ready")
	for i := 0; ; i++ {
		k := fmt.Sprintf("r%d-%04d", round, i)
		n := 1000 + (i%5)*(500<<10) // up to 2 MiB: a kill lands inside a write
		if err := tr.Write(context.Background(), k, uint64(i+1), value(k, uint64(i+1), n)); err != nil {
			fmt.Println("write:", err)
			os.Exit(2)
		}
		fmt.Printf("acked %s %d %d\n", k, i+1, n)
	}
}

// A node killed (SIGKILL) while appending: after a restart every record
// acknowledged before the kill is there, byte-exact, and every record the
// scan kept reads back exactly (a torn one is dropped, never served). A
// kill cannot cut one write(2) in half, so what it leaves is a record
// written but not synced (kept: it is whole) or not written at all; a
// record torn by power loss is TestTornTail's.
func TestSIGKILLDuringWrites(t *testing.T) {
	if testing.Short() {
		t.Skip("re-executes the test binary")
	}
	dir := t.TempDir()
	type acked struct {
		version uint64
		n       int
	}
	all := map[string]acked{}
	for round := range 3 {
		cmd := exec.Command(os.Args[0], "-test.run=^TestKillChild$", "-test.v=false")
		cmd.Env = append(os.Environ(), killChildEnv+"="+dir, fmt.Sprintf("%s_ROUND=%d", killChildEnv, round))
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(out)
		got := 0
		want := 4 + 3*round // kill at a different point each round
		deadline := time.AfterFunc(60*time.Second, func() { cmd.Process.Kill() })
		for sc.Scan() {
			line := sc.Text()
			if f := strings.Fields(line); len(f) == 4 && f[0] == "acked" {
				v, _ := strconv.ParseUint(f[2], 10, 64)
				n, _ := strconv.Atoi(f[3])
				all[f[1]] = acked{v, n}
				if got++; got == want {
					// Let the next write get under way, then kill.
					time.Sleep(time.Duration(round+1) * 3 * time.Millisecond)
					cmd.Process.Signal(syscall.SIGKILL)
				}
			} else if line != "ready" {
				t.Fatalf("child: %s", line)
			}
		}
		deadline.Stop()
		err = cmd.Wait()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("child did not die of SIGKILL: %v\n%s", err, stderr.String())
		}
		if got < want {
			t.Fatalf("child acknowledged %d writes before dying, want %d\n%s", got, want, stderr.String())
		}

		log, lb := testLogger()
		tr, err := Open(Config{Dir: dir, Capacity: 1 << 30, MaxFileRecords: 7, Logger: log})
		if err != nil {
			t.Fatalf("reopen after SIGKILL: %v", err)
		}
		for k, a := range all {
			mustRead(t, tr, k, a.version, value(k, a.version, a.n))
		}
		dst := make([]byte, 8<<20)
		for _, r := range tr.Records() {
			rec, err := tr.Read(context.Background(), r.Key, r.Version, dst)
			if err != nil || !bytes.Equal(dst[:rec.Size], value(r.Key, r.Version, int(r.Size))) {
				t.Fatalf("record %q kept by the scan does not read back: %v", r.Key, err)
			}
		}
		s := tr.Stats()
		t.Logf("round %d: %d acked in all, %d records on disk, %d dropped at the scan; log:\n%s", round, len(all), s.Records, s.Dropped, lb)
		tr.Close()
	}
}
