package glog

import (
	"bytes"
	"time"
)

// Line is one parsed glog line. Its byte slices alias the input: they are
// valid only as long as the caller keeps that buffer unchanged, which lets
// a scanner parse gigabytes of logs without allocating per line.
type Line struct {
	Severity byte // 'I', 'W', 'E' or 'F'
	// Year is 0 for the classic "Lmmdd" prefix; newer glog writes
	// "Lyyyymmdd" and then it is the four-digit year.
	Year                        int
	Month, Day                  int
	Hour, Minute, Second, Micro int
	TID                         int // -1 when the line has no thread id
	File                        []byte
	FileLine                    int
	Msg                         []byte // everything after "] ", PLOG suffix included
	Body                        []byte // Msg without the PLOG suffix
	Strerror                    []byte // PLOG's "<strerror>", nil when absent
	Errno                       int    // PLOG's "[<errno>]", -1 when absent
}

// Time returns the line's timestamp in loc. A prefix without a year takes
// year, which the caller picks (a file's modification year, say).
func (l *Line) Time(year int, loc *time.Location) time.Time {
	if l.Year != 0 {
		year = l.Year
	}
	return time.Date(year, time.Month(l.Month), l.Day, l.Hour, l.Minute, l.Second, l.Micro*1000, loc)
}

// ParseLine parses "Lmmdd hh:mm:ss.uuuuuu TTTTT file:line] msg" (and the
// "Lyyyymmdd" and no-thread-id variants). A trailing newline or "\r\n" is
// ignored. It reports false when b is not a glog line; it never panics and
// never allocates.
func ParseLine(b []byte) (Line, bool) {
	var l Line
	l.TID = -1
	l.Errno = -1
	b = trimEOL(b)
	if len(b) < 1 {
		return l, false
	}
	switch b[0] {
	case 'I', 'W', 'E', 'F':
		l.Severity = b[0]
	default:
		return l, false
	}
	// Date: 4 or 8 digits, then a space.
	i := 1
	for i < len(b) && isDigit(b[i]) {
		i++
	}
	nd := i - 1
	if i >= len(b) || b[i] != ' ' || (nd != 4 && nd != 8) {
		return l, false
	}
	d := b[1:i]
	if nd == 8 {
		l.Year = atoiFixed(d[:4])
		d = d[4:]
	}
	l.Month, l.Day = atoiFixed(d[:2]), atoiFixed(d[2:4])
	if l.Month < 1 || l.Month > 12 || l.Day < 1 || l.Day > daysIn[l.Month] ||
		(l.Year != 0 && l.Month == 2 && l.Day == 29 && !(l.Year%4 == 0 && (l.Year%100 != 0 || l.Year%400 == 0))) {
		return l, false
	}
	i++
	// Clock: hh:mm:ss.uuuuuu (glog always writes six fractional digits;
	// accept fewer or none for hand-edited lines).
	if len(b) < i+8 || b[i+2] != ':' || b[i+5] != ':' ||
		!allDigits(b[i:i+2]) || !allDigits(b[i+3:i+5]) || !allDigits(b[i+6:i+8]) {
		return l, false
	}
	l.Hour, l.Minute, l.Second = atoiFixed(b[i:i+2]), atoiFixed(b[i+3:i+5]), atoiFixed(b[i+6:i+8])
	if l.Hour > 23 || l.Minute > 59 || l.Second > 60 {
		return l, false
	}
	i += 8
	if i < len(b) && b[i] == '.' {
		i++
		j := i
		for i < len(b) && isDigit(b[i]) && i-j < 9 {
			i++
		}
		frac := b[j:i]
		if len(frac) == 0 {
			return l, false
		}
		us := 0
		for k := 0; k < 6; k++ {
			us *= 10
			if k < len(frac) {
				us += int(frac[k] - '0')
			}
		}
		l.Micro = us
	}
	if i >= len(b) || b[i] != ' ' {
		return l, false
	}
	for i < len(b) && b[i] == ' ' {
		i++
	}
	// Optional thread id: digits followed by a space. A file name may start
	// with a digit, so only take it as a tid when a space follows.
	j := i
	for j < len(b) && isDigit(b[j]) {
		j++
	}
	if j > i && j < len(b) && b[j] == ' ' && j-i <= 10 {
		l.TID = atoiFixed(b[i:j])
		i = j
		for i < len(b) && b[i] == ' ' {
			i++
		}
	}
	// file:line]
	end := bytes.IndexByte(b[i:], ']')
	if end < 0 {
		return l, false
	}
	fl := b[i : i+end]
	colon := bytes.LastIndexByte(fl, ':')
	if colon <= 0 || colon == len(fl)-1 || !allDigits(fl[colon+1:]) || len(fl)-colon-1 > 9 ||
		bytes.IndexByte(fl[:colon], ' ') >= 0 {
		return l, false
	}
	l.File = fl[:colon]
	l.FileLine = atoiFixed(fl[colon+1:])
	i += end + 1
	if i < len(b) && b[i] == ' ' {
		i++
	}
	l.Msg = b[i:]
	l.Body, l.Strerror, l.Errno = splitPLOG(l.Msg)
	return l, true
}

// daysIn bounds the day of each month; February allows the 29th because
// "mmdd" carries no year to tell.
var daysIn = [13]int{0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31}

// splitPLOG splits glog's PLOG suffix ": <strerror> [<errno>]" off msg.
// mc's slog lines may carry attributes after it ("... [12] local_nic=x"),
// which stay in Msg but do not hide the suffix.
func splitPLOG(msg []byte) (body, strerror []byte, errno int) {
	n := len(msg)
	if n < 4 {
		return msg, nil, -1
	}
	end := n - 1
	if msg[end] != ']' {
		j := bytes.LastIndex(msg, []byte("] "))
		if j < 0 || !isAttr(msg[j+2:]) {
			return msg, nil, -1
		}
		end = j
	}
	open := bytes.LastIndexByte(msg[:end], '[')
	if open < 2 || msg[open-1] != ' ' {
		return msg, nil, -1
	}
	digits := msg[open+1 : end]
	if len(digits) == 0 || len(digits) > 5 || !allDigits(digits) {
		return msg, nil, -1
	}
	sep := bytes.LastIndex(msg[:open-1], []byte(": "))
	if sep < 0 || sep+2 > open-1 {
		return msg, nil, -1
	}
	return msg[:sep], msg[sep+2 : open-1], atoiFixed(digits)
}

// isAttr reports whether b starts with a slog "key=value" attribute.
func isAttr(b []byte) bool {
	for i, c := range b {
		switch {
		case c == '=':
			return i > 0
		case c == ' ' || c == '"' || c == '[' || c == ']':
			return false
		}
	}
	return false
}

func trimEOL(b []byte) []byte {
	if n := len(b); n > 0 && b[n-1] == '\n' {
		b = b[:n-1]
	}
	if n := len(b); n > 0 && b[n-1] == '\r' {
		b = b[:n-1]
	}
	return b
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func allDigits(b []byte) bool {
	for _, c := range b {
		if !isDigit(c) {
			return false
		}
	}
	return len(b) > 0
}

// atoiFixed converts a short run of ASCII digits; callers bound the length,
// so it cannot overflow.
func atoiFixed(b []byte) int {
	v := 0
	for _, c := range b {
		v = v*10 + int(c-'0')
	}
	return v
}
