// Package trace reads the FAST'25 request traces released with the
// Mooncake paper: one JSON object per line with a timestamp (ms from
// start), input and output lengths in tokens, and hash_ids, one per
// 512-token KV-cache block, prefix-chained so equal prefixes share ids.
// Trace replay (`mc store replay`) and the conductor simulator read them.
package trace

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// BlockTokens is the tokens per block the traces' hash ids stand for.
const BlockTokens = 512

// Request is one line of a trace.
type Request struct {
	Timestamp    int64   `json:"timestamp"` // ms from the trace's start
	InputLength  int     `json:"input_length"`
	OutputLength int     `json:"output_length"`
	HashIDs      []int64 `json:"hash_ids"`
}

// MaxLine bounds one line (a prompt of 1M tokens has ~2k ids).
const MaxLine = 16 << 20

// MaxTokens bounds a request's input and output lengths, and MaxTimestamp
// its timestamp (about 35 years in ms): far beyond any model's context
// and any trace, and low enough that a simulator stepping once per output
// token, and times in nanoseconds, stay finite (an output_length of 2^63
// ran mc sim conductor forever).
const (
	MaxTokens    = 1 << 24
	MaxTimestamp = 1 << 40
)

// line is a Request as it comes off the wire: a field the line does not
// carry (or carries as null) stays nil, so Read can tell "absent" from
// zero. Without this, any JSON object (`{"garbage": 1}`, `null`) decoded
// into a zero Request and replayed as a request at time 0.
type line struct {
	Timestamp    *int64   `json:"timestamp"`
	InputLength  *int     `json:"input_length"`
	OutputLength *int     `json:"output_length"`
	HashIDs      *[]int64 `json:"hash_ids"`
}

// Read parses a trace and returns its requests in timestamp order (file
// order within a timestamp). Every line carries all four fields of
// Request; a malformed line is an error naming its number and what is
// wrong (for a missing field, the field).
func Read(r io.Reader) ([]Request, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), MaxLine)
	var out []Request
	n := 0
	for sc.Scan() {
		n++
		b := sc.Bytes()
		if len(trimSpace(b)) == 0 {
			continue
		}
		var w line
		if err := json.Unmarshal(b, &w); err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		var missing []string
		for _, f := range []struct {
			name    string
			present bool
		}{
			{"timestamp", w.Timestamp != nil},
			{"input_length", w.InputLength != nil},
			{"output_length", w.OutputLength != nil},
			{"hash_ids", w.HashIDs != nil},
		} {
			if !f.present {
				missing = append(missing, f.name)
			}
		}
		if len(missing) > 0 {
			return nil, fmt.Errorf("line %d: missing required field(s) %s", n, strings.Join(missing, ", "))
		}
		q := Request{Timestamp: *w.Timestamp, InputLength: *w.InputLength, OutputLength: *w.OutputLength, HashIDs: *w.HashIDs}
		switch {
		case q.Timestamp < 0:
			return nil, fmt.Errorf("line %d: negative timestamp %d", n, q.Timestamp)
		case q.Timestamp > MaxTimestamp:
			return nil, fmt.Errorf("line %d: timestamp %d: more than %d ms", n, q.Timestamp, int64(MaxTimestamp))
		case q.InputLength < 0 || q.OutputLength < 0:
			return nil, fmt.Errorf("line %d: negative length (input %d, output %d)", n, q.InputLength, q.OutputLength)
		case q.InputLength > MaxTokens || q.OutputLength > MaxTokens:
			return nil, fmt.Errorf("line %d: length above %d tokens (input %d, output %d)", n, MaxTokens, q.InputLength, q.OutputLength)
		case len(q.HashIDs) == 0 && q.InputLength > 0:
			return nil, fmt.Errorf("line %d: %d input tokens but no hash_ids", n, q.InputLength)
		}
		out = append(out, q)
	}
	if err := sc.Err(); err != nil {
		if err == bufio.ErrTooLong {
			return nil, fmt.Errorf("line %d: longer than %d bytes", n+1, MaxLine)
		}
		return nil, err
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Timestamp < out[j].Timestamp })
	return out, nil
}

// ReadFile reads a trace file.
func ReadFile(path string) ([]Request, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	defer f.Close()
	reqs, err := Read(f)
	if err != nil {
		return nil, fmt.Errorf("trace %s: %w", path, err)
	}
	return reqs, nil
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t' || b[0] == '\r') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}
