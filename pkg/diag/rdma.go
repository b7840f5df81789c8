package diag

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"time"
)

// Device is one device line of `rdma resource show`: the kernel's resource
// counters for one NIC. Counters a kernel does not print are -1.
type Device struct {
	Index int    `json:"ifindex"`
	Name  string `json:"ifname"`
	PD    int64  `json:"pd"`
	CQ    int64  `json:"cq"`
	QP    int64  `json:"qp"`
	CMID  int64  `json:"cm_id"`
	MR    int64  `json:"mr"`
	CTX   int64  `json:"ctx"`
	SRQ   int64  `json:"srq"`
}

// QP is one queue pair of `rdma resource show qp`. PID is -1 for kernel
// QPs, which print `comm [name]` and no pid.
type QP struct {
	NIC   string
	Port  int
	LQPN  int64
	Type  string
	State string
	PID   int
	Comm  string
}

// Owner identifies the process that holds QPs.
type Owner struct {
	PID  int    `json:"pid"`
	Comm string `json:"comm"`
}

// Snapshot is what one `rdma resource show` (or `... show qp`) output says
// at one moment. Per-QP outputs are summarised as they stream past: a host
// can hold a million QPs and the analysis needs only the counts.
type Snapshot struct {
	Source string
	At     time.Time
	// AtModTime says At is the file's modification time, which a copy
	// without -p resets: such times are checked before giving a rate.
	AtModTime bool
	Devices   []Device
	// From per-QP output: QPs per NIC, and per owner and state.
	QPByNIC   map[string]int64
	QPByOwner map[Owner]map[string]int64
	// ErrByOwnerNIC counts ERR/RESET QPs per owner and NIC.
	ErrByOwnerNIC map[Owner]map[string]int64
	PerQP         bool
	Lines         int // lines (text) or objects (JSON) read
	Bad           int // lines or objects that could not be parsed
	Problems      []string
}

// QPCounts returns the QP count per NIC: the device counters when the
// snapshot has them, else the per-QP tally.
func (s *Snapshot) QPCounts() map[string]int64 {
	m := make(map[string]int64)
	for _, d := range s.Devices {
		m[d.Name] += d.QP
	}
	if len(m) == 0 {
		for k, v := range s.QPByNIC {
			m[k] = v
		}
	}
	return m
}

// Empty reports whether the snapshot holds no usable data.
func (s *Snapshot) Empty() bool { return len(s.Devices) == 0 && len(s.QPByNIC) == 0 }

func (s *Snapshot) addQP(q QP) {
	s.PerQP = true
	if s.QPByNIC == nil {
		s.QPByNIC = make(map[string]int64)
		s.QPByOwner = make(map[Owner]map[string]int64)
		s.ErrByOwnerNIC = make(map[Owner]map[string]int64)
	}
	s.QPByNIC[q.NIC]++
	o := Owner{PID: q.PID, Comm: q.Comm}
	st := s.QPByOwner[o]
	if st == nil {
		st = make(map[string]int64)
		s.QPByOwner[o] = st
	}
	st[q.State]++
	if q.State == "ERR" || q.State == "RESET" {
		e := s.ErrByOwnerNIC[o]
		if e == nil {
			e = make(map[string]int64)
			s.ErrByOwnerNIC[o] = e
		}
		e[q.NIC]++
	}
}

func (s *Snapshot) problem(format string, a ...any) {
	if len(s.Problems) < maxProblems {
		s.Problems = append(s.Problems, fmt.Sprintf(format, a...))
	}
}

const maxProblems = 20

// ErrNoRDMAData means an rdma input held no device or QP at all.
var ErrNoRDMAData = errors.New("no rdma device or QP found")

// ReadSnapshot reads `rdma resource show` or `rdma resource show qp`
// output, text or JSON (`-j`), detected from the content. Lines or objects
// it cannot parse are counted in Bad and skipped; the error is for input
// that yields nothing at all or that cannot be read.
func ReadSnapshot(r io.Reader, source string) (*Snapshot, error) {
	s := &Snapshot{Source: source}
	br := bufio.NewReaderSize(r, 64<<10)
	first, err := firstNonSpace(br)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("read %s: %w", source, err)
	}
	if first == '[' || first == '{' {
		err = decodeJSON(br, s)
	} else {
		err = scanText(br, s)
	}
	if err != nil {
		return s, fmt.Errorf("read %s: %w", source, err)
	}
	if s.Empty() {
		return s, fmt.Errorf("read %s: %w (%d lines, %d unparsed)", source, ErrNoRDMAData, s.Lines, s.Bad)
	}
	sort.SliceStable(s.Devices, func(i, j int) bool { return s.Devices[i].Name < s.Devices[j].Name })
	return s, nil
}

func firstNonSpace(br *bufio.Reader) (byte, error) {
	for n := 1; ; n++ {
		b, err := br.Peek(n)
		if len(b) < n {
			return 0, err
		}
		c := b[n-1]
		if c != ' ' && c != '\t' && c != '\n' && c != '\r' {
			return c, nil
		}
		if n >= br.Size() {
			return 0, nil
		}
	}
}

// scanText reads text output line by line. Device and QP lines may mix
// (someone concatenated both commands); each line is classified alone.
func scanText(br *bufio.Reader, s *Snapshot) error {
	return eachLine(br, func(line []byte, overlong bool) {
		if overlong {
			s.Lines++
			s.Bad++
			s.problem("line %d: longer than %d bytes, skipped", s.Lines, lineBufSize)
			return
		}
		line = bytes.TrimSpace(line)
		if len(line) == 0 || line[0] == '#' {
			// Blank lines and comments (a capture annotated by hand).
			return
		}
		s.Lines++
		if bytes.HasPrefix(line, []byte("link ")) {
			q, ok := ParseQPLine(line)
			if !ok {
				s.Bad++
				s.problem("line %d: unparsed qp line %.80q", s.Lines, line)
				return
			}
			s.addQP(q)
			return
		}
		d, ok := ParseResourceLine(line)
		if !ok {
			s.Bad++
			s.problem("line %d: unparsed line %.80q", s.Lines, line)
			return
		}
		s.Devices = append(s.Devices, d)
	})
}

// ParseResourceLine parses one line of `rdma resource show`:
//
//	0: mlx5_0: pd 99 cq 95 qp 130763 cm_id 130810 mr 848 ctx 98
//
// Keys may be missing (older kernels omit ctx and srq) or unknown (newer
// kernels add some); qp must be there.
func ParseResourceLine(b []byte) (Device, bool) {
	d := Device{PD: -1, CQ: -1, QP: -1, CMID: -1, MR: -1, CTX: -1, SRQ: -1}
	b = bytes.TrimSpace(b)
	colon := bytes.IndexByte(b, ':')
	if colon <= 0 {
		return d, false
	}
	idx, ok := atoi64(b[:colon])
	if !ok || idx > 1<<31 {
		return d, false
	}
	d.Index = int(idx)
	rest := bytes.TrimLeft(b[colon+1:], " ")
	colon = bytes.IndexByte(rest, ':')
	if colon <= 0 || bytes.IndexByte(rest[:colon], ' ') >= 0 {
		return d, false
	}
	d.Name = string(rest[:colon])
	f := bytes.Fields(rest[colon+1:])
	if len(f)%2 != 0 {
		return d, false
	}
	for i := 0; i < len(f); i += 2 {
		v, ok := atoi64(f[i+1])
		if !ok {
			return d, false
		}
		switch string(f[i]) {
		case "pd":
			d.PD = v
		case "cq":
			d.CQ = v
		case "qp":
			d.QP = v
		case "cm_id":
			d.CMID = v
		case "mr":
			d.MR = v
		case "ctx":
			d.CTX = v
		case "srq":
			d.SRQ = v
		}
	}
	return d, d.QP >= 0
}

// ParseQPLine parses one line of `rdma resource show qp`:
//
//	link mlx5_0/1 lqpn 30278 rqpn 39296 type RC state RTS ... pid 61655 comm kucl
//	link mlx5_0/- lqpn 1 type GSI state RTS sq-psn 0 comm [ib_core]
func ParseQPLine(b []byte) (QP, bool) {
	q := QP{PID: -1, LQPN: -1}
	f := bytes.Fields(b)
	if len(f) < 2 || string(f[0]) != "link" {
		return q, false
	}
	link := f[1]
	slash := bytes.LastIndexByte(link, '/')
	if slash <= 0 {
		return q, false
	}
	q.NIC = string(link[:slash])
	if p := link[slash+1:]; string(p) != "-" {
		v, ok := atoi64(p)
		if !ok || v > 1<<16 {
			return q, false
		}
		q.Port = int(v)
	}
	for i := 2; i+1 < len(f); i += 2 {
		k, v := f[i], f[i+1]
		switch string(k) {
		case "lqpn":
			n, ok := atoi64(v)
			if !ok {
				return q, false
			}
			q.LQPN = n
		case "type":
			q.Type = string(v)
		case "state":
			q.State = string(v)
		case "pid":
			n, ok := atoi64(v)
			if !ok || n > 1<<31 {
				return q, false
			}
			q.PID = int(n)
		case "comm":
			// comm is last and may contain spaces ("[ib_core]" does not,
			// but a thread name can): take the rest of the line.
			q.Comm = string(bytes.Join(f[i+1:], []byte(" ")))
			i = len(f)
		}
	}
	if q.LQPN < 0 || q.State == "" {
		return q, false
	}
	return q, true
}

// rdmaObject is the union of the objects `rdma -j resource show` and
// `rdma -j resource show qp` print.
type rdmaObject struct {
	Ifindex *int64 `json:"ifindex"`
	Ifname  string `json:"ifname"`
	Port    *int64 `json:"port"`
	Lqpn    *int64 `json:"lqpn"`
	Type    string `json:"type"`
	State   string `json:"state"`
	Pid     *int64 `json:"pid"`
	Comm    string `json:"comm"`
	PD      *int64 `json:"pd"`
	CQ      *int64 `json:"cq"`
	QP      *int64 `json:"qp"`
	CMID    *int64 `json:"cm_id"`
	MR      *int64 `json:"mr"`
	CTX     *int64 `json:"ctx"`
	SRQ     *int64 `json:"srq"`
}

func (o *rdmaObject) classify(s *Snapshot) bool {
	if o.Ifname == "" {
		return false
	}
	if o.Lqpn != nil {
		if *o.Lqpn < 0 || o.State == "" {
			return false
		}
		q := QP{NIC: o.Ifname, LQPN: *o.Lqpn, Type: o.Type, State: o.State, PID: -1, Comm: o.Comm}
		if o.Port != nil {
			q.Port = int(*o.Port)
		}
		if o.Pid != nil {
			if *o.Pid < 0 || *o.Pid > 1<<31 {
				return false
			}
			q.PID = int(*o.Pid)
		} else if q.Comm != "" && q.Comm[0] != '[' {
			// JSON prints kernel owners without the brackets text uses;
			// keep one spelling so text and JSON reports agree.
			q.Comm = "[" + q.Comm + "]"
		}
		s.addQP(q)
		return true
	}
	if o.QP == nil || *o.QP < 0 {
		return false
	}
	d := Device{Name: o.Ifname, QP: *o.QP}
	if o.Ifindex != nil {
		d.Index = int(*o.Ifindex)
	}
	for _, p := range []struct {
		src *int64
		dst *int64
	}{{o.PD, &d.PD}, {o.CQ, &d.CQ}, {o.CMID, &d.CMID}, {o.MR, &d.MR}, {o.CTX, &d.CTX}, {o.SRQ, &d.SRQ}} {
		*p.dst = -1
		if p.src != nil {
			*p.dst = *p.src
		}
	}
	s.Devices = append(s.Devices, d)
	return true
}

// decodeJSON streams a JSON array of objects (or a sequence of arrays or
// of bare objects) without holding the whole document. iproute2 >= 6.7
// puts newlines between the array's objects, which a decoder does not mind.
func decodeJSON(br *bufio.Reader, s *Snapshot) error {
	dec := json.NewDecoder(br)
	one := func() error {
		var o rdmaObject
		err := dec.Decode(&o)
		s.Lines++
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			// A field of the wrong type: the decoder has consumed the whole
			// object and can go on with the next one.
			s.Bad++
			s.problem("object %d: %v", s.Lines, err)
			return nil
		}
		if err != nil {
			return err
		}
		if !o.classify(s) {
			s.Bad++
			s.problem("object %d: neither a device (ifname, qp) nor a QP (ifname, lqpn, state)", s.Lines)
		}
		return nil
	}
	if c, _ := firstNonSpace(br); c == '{' {
		// Bare objects one after another (jq -c output, say).
		for {
			err := one()
			if errors.Is(err, io.EOF) {
				s.Lines--
				return nil
			}
			if err != nil {
				return jsonProblem(s, err, dec)
			}
		}
	}
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return jsonProblem(s, err, dec)
		}
		d, ok := tok.(json.Delim)
		switch {
		case ok && d == '[':
			for dec.More() {
				if err := one(); err != nil {
					return jsonProblem(s, err, dec)
				}
			}
			if _, err := dec.Token(); err != nil {
				return jsonProblem(s, err, dec)
			}
		default:
			s.Bad++
			s.problem("unexpected JSON value %v at top level", tok)
		}
	}
}

// jsonProblem records a syntax error. What was decoded before it stays:
// a truncated capture still tells the counts of the NICs it reached.
func jsonProblem(s *Snapshot, err error, dec *json.Decoder) error {
	s.Bad++
	s.problem("JSON broken at byte %d: %v", dec.InputOffset(), err)
	if s.Empty() {
		return fmt.Errorf("invalid JSON at byte %d: %w", dec.InputOffset(), err)
	}
	return nil
}

func atoi64(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 18 {
		return 0, false
	}
	var v int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int64(c-'0')
	}
	return v, true
}
