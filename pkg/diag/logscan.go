package diag

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/kvcache-ops/mc/pkg/diag/glog"
)

// LogStats counts what the scanner saw, for the report's input section and
// for the findings that depend on what the logs could show at all.
type LogStats struct {
	Files        int   `json:"files"`
	Lines        int64 `json:"lines"`
	GlogLines    int64 `json:"glog_lines"`
	OtherLines   int64 `json:"other_lines"`
	InfoLines    int64 `json:"info_lines"`
	WarningLines int64 `json:"warning_lines"`
	ErrorLines   int64 `json:"error_lines"`
	FatalLines   int64 `json:"fatal_lines"`
	Overlong     int64 `json:"overlong_lines"`
	// Unrecognised counts lines that start like a catalogue message but
	// whose fields could not be read (a format change, a truncated line).
	Unrecognised int64 `json:"unrecognised_lines"`
	Events       int64 `json:"events"`

	Evictions        int `json:"evictions"`
	QPCreateFailures int `json:"qp_create_failures"`
	QPCreateENOMEM   int `json:"qp_create_enomem"`
	ConnFailures     int `json:"connection_failures"`
	SliceFailures    int `json:"slice_failures"`
	ReadyAckTimeouts int `json:"ready_ack_timeouts"`
	Retirements      int `json:"retirements"`
	RailPauses       int `json:"rail_pauses"`
	GiveUps          int `json:"give_ups"`
	StoreLines       int `json:"endpoint_store_lines"`
	// EvictionsBeforeFirstQPFailure is how many evictions were logged
	// before the first ENOMEM (-1: no ENOMEM), the incident's tell-tale.
	EvictionsBeforeFirstQPFailure int            `json:"evictions_before_first_qp_failure"`
	StoreTypes                    map[string]int `json:"endpoint_store_types"`
	Versions                      []string       `json:"versions"`
	FirstEvent                    *time.Time     `json:"first_event"`
	LastEvent                     *time.Time     `json:"last_event"`
	Problems                      []string       `json:"problems"`
}

// PeerEvents is what the logs say about one peer NIC path.
type PeerEvents struct {
	Name             string   `json:"name"`
	Evictions        int      `json:"evictions"`
	Deletions        int      `json:"deletions"`
	ConnFailures     int      `json:"connection_failures"`
	SliceFailures    int      `json:"slice_failures"`
	ReadyAckTimeouts int      `json:"ready_ack_timeouts"`
	Retirements      int      `json:"retirements"`
	RailPauses       int      `json:"rail_pauses"`
	LocalNICs        []string `json:"local_nics"`
	evictionsNoLocal int
	deletionsNoLocal int
	local            map[string]int
}

// NICEvents is what the logs say about one local NIC.
type NICEvents struct {
	Name             string
	Evictions        int
	Deletions        int
	SliceFailures    int
	QPCreateFailures int
	Store            string
	Peers            int // distinct peer paths seen with this NIC
}

// LogSummary is the scanner's result.
type LogSummary struct {
	Stats LogStats
	Peers []*PeerEvents // by evictions+deletions, then name
	NICs  map[string]*NICEvents
	// Evictions and deletions whose local NIC no line revealed.
	UnattributedEvictions int
	UnattributedDeletions int
}

// LogScanner reads glog-format logs from Mooncake or mc and tallies the
// message catalogue of spec/rdma.md. It is not safe for concurrent use.
type LogScanner struct {
	// Year completes "mmdd" timestamps; zero means the current year.
	Year  int
	st    LogStats
	peers map[string]*PeerEvents
	nics  map[string]*NICEvents
	vers  map[string]bool
	// first and last event times; kept as values so that recording them
	// does not allocate per line.
	first, last time.Time
}

// NewLogScanner returns an empty scanner.
func NewLogScanner() *LogScanner {
	return &LogScanner{
		st:    LogStats{EvictionsBeforeFirstQPFailure: -1, StoreTypes: map[string]int{}},
		peers: make(map[string]*PeerEvents),
		nics:  make(map[string]*NICEvents),
		vers:  make(map[string]bool),
	}
}

// Scan reads r to its end. A read error stops this input only; what was
// read so far counts, and the error is returned for the caller to report.
func (s *LogScanner) Scan(r io.Reader, name string) error {
	s.st.Files++
	br, ok := r.(*bufio.Reader)
	if !ok || br.Size() < lineBufSize {
		br = bufio.NewReaderSize(r, lineBufSize)
	}
	err := eachLine(br, func(line []byte, overlong bool) {
		if overlong {
			s.st.Lines++
			s.st.Overlong++
			return
		}
		s.Line(line)
	})
	if err != nil {
		s.problem("%s: read stopped after %d lines: %v", name, s.st.Lines, err)
		return fmt.Errorf("read %s: %w", name, err)
	}
	return nil
}

func (s *LogScanner) problem(format string, a ...any) {
	if len(s.st.Problems) < maxProblems {
		s.st.Problems = append(s.st.Problems, fmt.Sprintf(format, a...))
	}
}

// Message prefixes of the catalogue (spec/rdma.md, "Log lines").
var (
	pFailedQP     = []byte("Failed to create QP")
	pUsing        = []byte("Using ")
	pStore        = []byte(" endpoint store")
	pWorker       = []byte("Worker: ")
	pConnFail     = []byte("Worker: Cannot make connection for endpoint: ")
	pSliceFail    = []byte("Worker: Process failed for slice")
	pAckTimeout   = []byte("Worker: Timed out waiting for RDMA ready ACK for endpoint: ")
	pRetiring     = []byte("Retiring endpoint")
	pEndPointLoc  = []byte("EndPoint: local ")
	pPeerSp       = []byte(", peer ")
	pRailPaused   = []byte("Rail paused")
	pGivingUp     = []byte("Giving up after")
	pEvicted      = []byte("evicted")
	pLocalNIC     = []byte("local_nic: ")
	pPeerNIC      = []byte("peer_nic: ")
	pPeerEq       = []byte("peer=")
	pENOMEM       = []byte("Cannot allocate memory")
	pFlush        = []byte("lush")
	pMooncake     = []byte("ooncake")
	attrLocalKeys = [][]byte{[]byte(" local_nic="), []byte(" nic="), []byte(" dev="), []byte(" device="), []byte(" local=")}
)

// Line processes one log line (without its newline). It is exported for
// tailing, where lines arrive one at a time.
func (s *LogScanner) Line(b []byte) {
	s.st.Lines++
	if n := len(b); n > 0 && b[n-1] == '\r' {
		b = b[:n-1]
	}
	// Cheap shape test before anything else: most lines of a big log are
	// noise, and this is the hot loop.
	if len(b) < 16 || !(b[0] == 'I' || b[0] == 'W' || b[0] == 'E' || b[0] == 'F') ||
		!((b[5] == ' ' && b[8] == ':') || (b[9] == ' ' && b[12] == ':')) {
		s.st.OtherLines++
		s.checkVersion(b)
		return
	}
	end := bytes.IndexByte(b, ']')
	if end < 0 {
		s.st.OtherLines++
		return
	}
	s.st.GlogLines++
	switch b[0] {
	case 'I':
		s.st.InfoLines++
	case 'W':
		s.st.WarningLines++
	case 'E':
		s.st.ErrorLines++
	case 'F':
		s.st.FatalLines++
	}
	msg := b[end+1:]
	if len(msg) > 0 && msg[0] == ' ' {
		msg = msg[1:]
	}
	if len(msg) == 0 {
		return
	}
	var kind int
	switch msg[0] {
	case 'F':
		if bytes.HasPrefix(msg, pFailedQP) {
			kind = evQPFail
		}
	case 'U':
		if bytes.HasPrefix(msg, pUsing) && bytes.Contains(msg, pStore) {
			kind = evStore
		}
	case 'W':
		if bytes.HasPrefix(msg, pWorker) {
			switch {
			case bytes.HasPrefix(msg, pConnFail):
				kind = evConnFail
			case bytes.HasPrefix(msg, pSliceFail):
				kind = evSliceFail
			case bytes.HasPrefix(msg, pAckTimeout):
				kind = evAckTimeout
			}
		}
	case 'R':
		if bytes.HasPrefix(msg, pRetiring) {
			kind = evRetire
		} else if bytes.HasPrefix(msg, pRailPaused) {
			kind = evRailPause
		}
	case 'G':
		if bytes.HasPrefix(msg, pGivingUp) {
			kind = evGiveUp
		}
	}
	if kind == 0 {
		// "<peer_server>@<dev> evicted": the first word holds an '@' and
		// the second is "evicted". IndexByte stops at the first space,
		// so this costs a few bytes per line, not the whole line.
		sp := bytes.IndexByte(msg, ' ')
		if sp > 0 && bytes.HasPrefix(msg[sp+1:], pEvicted) && (len(msg) == sp+8 || msg[sp+8] == ' ') {
			if bytes.IndexByte(msg[:sp], '@') > 0 {
				kind = evEvict
			}
		}
		if kind == 0 {
			if msg[0] == 'M' || msg[0] == 'm' || msg[0] == 'T' {
				s.checkVersion(msg)
			}
			return
		}
	}
	l, ok := glog.ParseLine(b)
	if !ok {
		s.st.Unrecognised++
		return
	}
	if !s.event(kind, &l) {
		s.st.Unrecognised++
		return
	}
	s.st.Events++
	t := l.Time(s.year(), time.UTC)
	if s.first.IsZero() || t.Before(s.first) {
		s.first = t
	}
	if t.After(s.last) {
		s.last = t
	}
}

func (s *LogScanner) year() int {
	if s.Year != 0 {
		return s.Year
	}
	return time.Now().Year()
}

const (
	evNone = iota
	evEvict
	evQPFail
	evStore
	evConnFail
	evSliceFail
	evAckTimeout
	evRetire
	evRailPause
	evGiveUp
)

// event records one catalogue line; false means its fields were unusable.
func (s *LogScanner) event(kind int, l *glog.Line) bool {
	msg := l.Msg
	switch kind {
	case evEvict:
		sp := bytes.IndexByte(msg, ' ')
		p := s.peer(msg[:sp])
		p.Evictions++
		s.st.Evictions++
		if nic := attrLocal(msg[sp:]); nic != nil {
			n := s.nic(nic)
			n.Evictions++
			p.pair(n.Name)
		} else {
			p.evictionsNoLocal++
		}
	case evQPFail:
		s.st.QPCreateFailures++
		if l.Errno == 12 || bytes.Contains(msg, pENOMEM) {
			s.st.QPCreateENOMEM++
			if s.st.EvictionsBeforeFirstQPFailure < 0 {
				s.st.EvictionsBeforeFirstQPFailure = s.st.Evictions
			}
		}
		if nic := attrLocal(msg); nic != nil {
			s.nic(nic).QPCreateFailures++
		}
	case evStore:
		end := bytes.Index(msg, pStore)
		if end < len(pUsing) {
			return false // "Using endpoint store": no type named
		}
		typ := bytes.TrimSpace(msg[len(pUsing):end])
		if len(typ) == 0 || len(typ) > 16 {
			return false
		}
		s.st.StoreLines++
		s.st.StoreTypes[string(typ)]++
		if nic := attrLocal(msg); nic != nil {
			s.nic(nic).Store = string(typ)
		}
	case evConnFail, evAckTimeout:
		pre := pConnFail
		if kind == evAckTimeout {
			pre = pAckTimeout
		}
		peer := token(msg[len(pre):])
		if len(peer) == 0 {
			return false
		}
		p := s.peer(peer)
		p.Deletions++
		if kind == evConnFail {
			p.ConnFailures++
			s.st.ConnFailures++
		} else {
			p.ReadyAckTimeouts++
			s.st.ReadyAckTimeouts++
		}
		if nic := attrLocal(msg); nic != nil {
			n := s.nic(nic)
			n.Deletions++
			p.pair(n.Name)
		} else {
			p.deletionsNoLocal++
		}
	case evSliceFail:
		local := field(msg, pLocalNIC)
		peer := field(msg, pPeerNIC)
		if len(local) == 0 || len(peer) == 0 {
			return false
		}
		s.st.SliceFailures++
		n := s.nic(local)
		p := s.peer(peer)
		n.SliceFailures++
		p.SliceFailures++
		p.pair(n.Name)
		// A failed completion deletes the endpoint; flushed work requests
		// are the echo of an earlier failure on the same QP, not a new
		// deletion.
		status := msg[bytes.LastIndex(msg, []byte("): "))+1:]
		if !bytes.Contains(status, pFlush) {
			n.Deletions++
			p.Deletions++
		}
	case evRetire:
		i := bytes.Index(msg, pEndPointLoc)
		if i < 0 {
			return false
		}
		rest := msg[i+len(pEndPointLoc):]
		local := token(rest)
		j := bytes.Index(rest, pPeerSp)
		if j < 0 || len(local) == 0 {
			return false
		}
		peer := token(rest[j+len(pPeerSp):])
		at := bytes.LastIndexByte(local, '@')
		if len(peer) == 0 || at < 0 || at == len(local)-1 {
			return false
		}
		s.st.Retirements++
		n := s.nic(local[at+1:])
		p := s.peer(peer)
		n.Deletions++
		p.Deletions++
		p.Retirements++
		p.pair(n.Name)
	case evRailPause:
		peer := field(msg, pPeerEq)
		if len(peer) == 0 {
			return false
		}
		s.st.RailPauses++
		s.peer(peer).RailPauses++
	case evGiveUp:
		s.st.GiveUps++
	}
	return true
}

func (s *LogScanner) peer(b []byte) *PeerEvents {
	if p := s.peers[string(b)]; p != nil {
		return p
	}
	p := &PeerEvents{Name: string(b)}
	s.peers[p.Name] = p
	return p
}

func (s *LogScanner) nic(b []byte) *NICEvents {
	if n := s.nics[string(b)]; n != nil {
		return n
	}
	n := &NICEvents{Name: string(b)}
	s.nics[n.Name] = n
	return n
}

func (p *PeerEvents) pair(nic string) {
	if p.local == nil {
		p.local = make(map[string]int, 1)
	}
	p.local[nic]++
}

// token is b's first word, ending at a space or comma.
func token(b []byte) []byte {
	for i, c := range b {
		if c == ' ' || c == ',' || c == ')' {
			return b[:i]
		}
	}
	return b
}

// field returns the token after key in msg ("local_nic: mlx5_1," -> mlx5_1).
func field(msg, key []byte) []byte {
	i := bytes.Index(msg, key)
	if i < 0 {
		return nil
	}
	return token(msg[i+len(key):])
}

// attrLocal finds the local NIC in mc's slog attributes (" nic=mlx5_1",
// " local=host@mlx5_1"); Mooncake's lines have none.
func attrLocal(msg []byte) []byte {
	for _, k := range attrLocalKeys {
		if v := field(msg, k); len(v) > 0 {
			if at := bytes.LastIndexByte(v, '@'); at >= 0 {
				v = v[at+1:]
			}
			if len(v) > 0 {
				return v
			}
		}
	}
	return nil
}

// checkVersion looks for a Mooncake version on a line that names Mooncake:
// the package banner ("Mooncake transfer engine v0.3.7.post2"), a pip
// listing ("mooncake-transfer-engine 0.3.7.post2") or a startup line
// ("Mooncake version: 0.3.11"). Mooncake's TE writes no standard version
// line, so the name and a version number on the same line is the rule.
func (s *LogScanner) checkVersion(b []byte) {
	i := bytes.Index(b, pMooncake)
	if i < 0 {
		return
	}
	if v := findVersion(b[i:]); v != "" && !s.vers[v] {
		s.vers[v] = true
		s.st.Versions = append(s.st.Versions, v)
	}
}

// findVersion returns the first "X.Y.Z[suffix]" in b, "v" prefix dropped.
func findVersion(b []byte) string {
	for i := 0; i < len(b); i++ {
		if !isDigit(b[i]) || (i > 0 && (isDigit(b[i-1]) || b[i-1] == '.')) {
			continue
		}
		j, dots := i, 0
		for j < len(b) && (isDigit(b[j]) || (b[j] == '.' && j+1 < len(b) && isDigit(b[j+1]))) {
			if b[j] == '.' {
				dots++
			}
			j++
		}
		if dots < 2 {
			i = j
			continue
		}
		// Suffixes: .post2, rc1, .dev0, a1, b2.
		k := j
		if k < len(b) && (b[k] == '.' || b[k] == '-' || b[k] == '+') {
			k++
		}
		m := k
		for m < len(b) && ((b[m] >= 'a' && b[m] <= 'z') || isDigit(b[m])) {
			m++
		}
		if m > k && !isDigit(b[k]) {
			j = m
		}
		if j-i > 32 {
			return ""
		}
		return string(b[i:j])
	}
	return ""
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// Summary finishes the scan: evictions and deletions whose line named only
// the peer go to the local NIC that the same peer was most often seen with
// (slice failures and retirements name both ends). A peer seen with no
// NIC, or with several equally, stays unattributed: guessing would make
// the per-NIC asymmetry look cleaner than the logs show.
func (s *LogScanner) Summary() *LogSummary {
	sum := &LogSummary{Stats: s.st, NICs: make(map[string]*NICEvents, len(s.nics))}
	if !s.first.IsZero() {
		f, l := s.first, s.last
		sum.Stats.FirstEvent, sum.Stats.LastEvent = &f, &l
	}
	sum.Stats.StoreTypes = make(map[string]int, len(s.st.StoreTypes))
	for k, v := range s.st.StoreTypes {
		sum.Stats.StoreTypes[k] = v
	}
	sum.Stats.Versions = append([]string{}, s.st.Versions...)
	sum.Stats.Problems = append([]string{}, s.st.Problems...)
	for k, n := range s.nics {
		c := *n
		sum.NICs[k] = &c
	}
	peersOf := make(map[string]int)
	for _, p := range s.peers {
		c := *p
		c.LocalNICs = nil
		best, bestN, tie := "", 0, false
		for nic, cnt := range p.local {
			c.LocalNICs = append(c.LocalNICs, nic)
			peersOf[nic]++
			switch {
			case cnt > bestN:
				best, bestN, tie = nic, cnt, false
			case cnt == bestN:
				tie = true
			}
		}
		sort.Strings(c.LocalNICs)
		if c.LocalNICs == nil {
			c.LocalNICs = []string{}
		}
		if best != "" && !tie {
			n := sum.NICs[best]
			n.Evictions += p.evictionsNoLocal
			n.Deletions += p.deletionsNoLocal
		} else {
			sum.UnattributedEvictions += p.evictionsNoLocal
			sum.UnattributedDeletions += p.deletionsNoLocal
		}
		sum.Peers = append(sum.Peers, &c)
	}
	for nic, k := range peersOf {
		sum.NICs[nic].Peers = k
	}
	sort.Slice(sum.Peers, func(i, j int) bool {
		a, b := sum.Peers[i], sum.Peers[j]
		if x, y := a.Evictions+a.Deletions, b.Evictions+b.Deletions; x != y {
			return x > y
		}
		return a.Name < b.Name
	})
	return sum
}
