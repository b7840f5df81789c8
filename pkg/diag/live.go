package diag

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"
)

// Errors a live sample can end with; callers branch on them to explain.
var (
	// ErrNoRDMATool: the rdma binary (iproute2) is not installed.
	ErrNoRDMATool = errors.New("the rdma tool (iproute2) is not installed")
	// ErrNoRDMANetlink: the kernel has no RDMA netlink (no RDMA support,
	// or the ib_core module is not loaded).
	ErrNoRDMANetlink = errors.New("this host has no RDMA netlink (Failed to open NETLINK_RDMA socket): no RDMA devices to inspect")
)

// Sampler runs `rdma -j resource show` (or `... show qp`) on this host.
type Sampler struct {
	Bin     string        // path or name of rdma; "" means "rdma"
	Timeout time.Duration // per run; 0 means 10s
	// PerQP lists every QP instead of the per-device summary: owners and
	// states, at the cost of a longer run on hosts with many QPs.
	PerQP bool
	Now   func() time.Time
}

// Sample runs the tool once and parses its output.
func (s Sampler) Sample(ctx context.Context) (*Snapshot, error) {
	bin := s.Bin
	if bin == "" {
		bin = "rdma"
	}
	timeout := s.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	now := time.Now
	if s.Now != nil {
		now = s.Now
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	args := []string{"-j", "resource", "show"}
	if s.PerQP {
		args = append(args, "qp")
	}
	what := bin + " " + strings.Join(args, " ")
	cmd := exec.CommandContext(ctx, bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// A child that forks and leaves its own children holding the pipes
	// must not keep us waiting past the timeout.
	cmd.WaitDelay = time.Second
	at := now()
	err := cmd.Run()
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s: %w", bin, ErrNoRDMATool)
	}
	if strings.Contains(stderr.String()+stdout.String(), "NETLINK_RDMA") {
		return nil, ErrNoRDMANetlink
	}
	if ctx.Err() != nil {
		return nil, fmt.Errorf("%s: %w", what, ctx.Err())
	}
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 200 {
			msg = msg[:200]
		}
		return nil, fmt.Errorf("%s: %w: %s", what, err, msg)
	}
	snap, err := ReadSnapshot(&stdout, what)
	if err != nil {
		if errors.Is(err, ErrNoRDMAData) && len(bytes.TrimSpace(stdout.Bytes())) <= 2 {
			return nil, fmt.Errorf("%s: no RDMA devices on this host", what)
		}
		return nil, err
	}
	snap.At = at
	return snap, nil
}

// Tailer follows growing plain-text log files, feeding complete new lines
// to a LogScanner: `--watch` counts evictions as they happen. A file that
// is rotated away (renamed or deleted and created anew, or a glog
// symlink pointed at a new file) is read to its end and the new file at
// the path is then read from its start; a file truncated in place
// (logrotate's copytruncate) is read again from its start.
type Tailer struct {
	Scanner *LogScanner
	files   []*tailFile
	buf     []byte
}

type tailFile struct {
	path    string
	f       *os.File
	off     int64 // bytes of f read so far
	partial []byte
}

// NewTailer opens the files and positions at their current end: what was
// there before the watch began is read by a normal scan first.
func NewTailer(sc *LogScanner, paths []string) (*Tailer, error) {
	t := &Tailer{Scanner: sc}
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			t.Close()
			return nil, err
		}
		off, err := f.Seek(0, io.SeekEnd)
		if err != nil {
			f.Close()
			t.Close()
			return nil, fmt.Errorf("seek %s: %w", p, err)
		}
		t.files = append(t.files, &tailFile{path: p, f: f, off: off})
	}
	return t, nil
}

// Poll reads what was appended since the last call, following rotations.
// A half-written last line waits for its newline.
func (t *Tailer) Poll() error {
	if t.buf == nil {
		t.buf = make([]byte, 256<<10)
	}
	var firstErr error
	for _, tf := range t.files {
		if err := t.poll(tf); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	return firstErr
}

func (t *Tailer) poll(tf *tailFile) error {
	if st, err := tf.f.Stat(); err == nil && st.Size() < tf.off {
		// Truncated in place: what is there now was written after.
		if _, err := tf.f.Seek(0, io.SeekStart); err != nil {
			return fmt.Errorf("tail %s: %w", tf.path, err)
		}
		tf.off, tf.partial = 0, tf.partial[:0]
	}
	if err := t.drain(tf); err != nil {
		return err
	}
	// Rotated: the path names another file now. The old one was read to
	// its end above; a missing path (between rename and create) waits
	// for the next poll.
	cur, err := tf.f.Stat()
	if err != nil {
		return fmt.Errorf("tail %s: %w", tf.path, err)
	}
	now, err := os.Stat(tf.path)
	if err != nil || os.SameFile(cur, now) {
		return nil
	}
	f, err := os.Open(tf.path)
	if err != nil {
		return nil
	}
	if len(tf.partial) > 0 {
		// glog writes whole lines: the old file's last one is complete.
		t.Scanner.Line(tf.partial)
	}
	tf.f.Close()
	tf.f, tf.off, tf.partial = f, 0, tf.partial[:0]
	return t.drain(tf)
}

// drain reads tf to its current end.
func (t *Tailer) drain(tf *tailFile) error {
	for {
		n, err := tf.f.Read(t.buf)
		if n > 0 {
			tf.off += int64(n)
			data := append(tf.partial, t.buf[:n]...)
			for {
				i := bytes.IndexByte(data, '\n')
				if i < 0 {
					break
				}
				t.Scanner.Line(data[:i])
				data = data[i+1:]
			}
			if len(data) > lineBufSize {
				t.Scanner.st.Lines++
				t.Scanner.st.Overlong++
				data = nil
			}
			tf.partial = append(tf.partial[:0], data...)
		}
		if errors.Is(err, io.EOF) || n == 0 {
			return nil
		}
		if err != nil {
			return fmt.Errorf("tail %s: %w", tf.path, err)
		}
	}
}

// Close closes the files.
func (t *Tailer) Close() {
	for _, tf := range t.files {
		tf.f.Close()
	}
}

// ScanFiles scans every path ("-" is stdin) into sc. It stops at the first
// file that cannot be opened, decompressed or read to its end (a
// directory, a truncated gzip): a report built without all of an input
// the operator named would mislead, so the verdict is unknown. What was
// read before the failure stays in sc.
func ScanFiles(sc *LogScanner, paths []string) error {
	for _, p := range paths {
		rc, err := Open(p)
		if err != nil {
			return fmt.Errorf("open log %s: %w", p, err)
		}
		if st, err := os.Stat(p); err == nil && p != "-" && sc.Year == 0 {
			// "mmdd" timestamps take the year the file was last written.
			sc.Year = st.ModTime().Year()
		}
		err = sc.Scan(bufio.NewReaderSize(rc, lineBufSize), p)
		rc.Close()
		if err != nil {
			return err
		}
	}
	return nil
}
