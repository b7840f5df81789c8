package diag

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/kvcache-ops/mc/pkg/diag/glog"
)

// Inputs name what a qp-leak run reads.
type Inputs struct {
	// RDMA files are snapshots; At, when not empty, stamps each of them
	// (same length), else a file's modification time does.
	RDMA []string
	At   []time.Time
	Logs []string
	// Sampler is used when RDMA is empty.
	Sampler Sampler
	// Year completes "mmdd" log timestamps; zero takes the log file's
	// modification year.
	Year int
}

// ErrUnreadable wraps every failure that leaves the verdict unknown.
var ErrUnreadable = errors.New("input unreadable")

// unreadable marks err as ErrUnreadable without adding words to its
// message, which already names the input and the reason.
type unreadable struct{ err error }

func (e unreadable) Error() string   { return e.err.Error() }
func (e unreadable) Unwrap() []error { return []error{ErrUnreadable, e.err} }

// Load reads the snapshots (or takes one live sample) and scans the logs.
func Load(ctx context.Context, in Inputs) ([]*Snapshot, *LogSummary, error) {
	if len(in.At) > 0 && len(in.At) != len(in.RDMA) {
		return nil, nil, fmt.Errorf("%d --at stamps for %d --rdma files: give one per file, in the same order", len(in.At), len(in.RDMA))
	}
	var snaps []*Snapshot
	for i, p := range in.RDMA {
		s, err := readSnapshotFile(p)
		if err != nil {
			return nil, nil, unreadable{err}
		}
		if len(in.At) > 0 {
			s.At, s.AtModTime = in.At[i], false
		}
		snaps = append(snaps, s)
	}
	if len(in.RDMA) == 0 {
		s, err := in.Sampler.Sample(ctx)
		if err != nil {
			return nil, nil, unreadable{err}
		}
		snaps = append(snaps, s)
	}
	var logs *LogSummary
	if len(in.Logs) > 0 {
		sc := NewLogScanner()
		sc.Year = in.Year
		if err := ScanFiles(sc, in.Logs); err != nil {
			return nil, nil, unreadable{err}
		}
		logs = sc.Summary()
	}
	return snaps, logs, nil
}

func readSnapshotFile(p string) (*Snapshot, error) {
	rc, err := Open(p)
	if err != nil {
		return nil, fmt.Errorf("open rdma snapshot: %w", err)
	}
	defer rc.Close()
	s, err := ReadSnapshot(rc, p)
	if err != nil {
		return nil, err
	}
	s.At = time.Now()
	if p != "-" {
		if st, err := os.Stat(p); err == nil {
			s.At, s.AtModTime = st.ModTime(), true
		}
	}
	return s, nil
}

// Kind of an input file, for positional arguments: a shell glob does not
// say which flag its files belong to, their content does.
const (
	KindRDMA = "rdma"
	KindLog  = "log"
)

// Classify sniffs the first lines of path: rdma output (text device or
// "link" lines, or JSON) or a log (anything else with a glog line).
func Classify(path string) (string, error) {
	rc, err := Open(path)
	if err != nil {
		return "", err
	}
	defer rc.Close()
	br := bufio.NewReaderSize(rc, 64<<10)
	if c, _ := firstNonSpace(br); c == '[' || c == '{' {
		return KindRDMA, nil
	}
	for i := 0; i < 50; i++ {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			if _, ok := glog.ParseLine(line); ok {
				return KindLog, nil
			}
			if _, ok := ParseResourceLine(line); ok {
				return KindRDMA, nil
			}
			if _, ok := ParseQPLine(line); ok {
				return KindRDMA, nil
			}
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			break
		}
	}
	return "", fmt.Errorf("%s: neither rdma output nor a glog log in its first lines", path)
}
