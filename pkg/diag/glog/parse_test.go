package glog

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestParseLineVariants(t *testing.T) {
	cases := []struct {
		in                         string
		sev                        byte
		year, month, day           int
		hour, min, sec, micro, tid int
		file                       string
		fline                      int
		msg, body, strerror        string
		errno                      int
	}{
		{"I0307 09:05:03.000042   812 rdma_context.cpp:77] host-b@mlx5_1 evicted\n",
			'I', 0, 3, 7, 9, 5, 3, 42, 812, "rdma_context.cpp", 77, "host-b@mlx5_1 evicted", "host-b@mlx5_1 evicted", "", -1},
		{"E20260307 23:59:59.999999 1234567 rdma_endpoint.cpp:120] Failed to create QP: Cannot allocate memory [12]",
			'E', 2026, 3, 7, 23, 59, 59, 999999, 1234567, "rdma_endpoint.cpp", 120,
			"Failed to create QP: Cannot allocate memory [12]", "Failed to create QP", "Cannot allocate memory", 12},
		// Missing thread id.
		{"W1231 00:00:00.5 worker_pool.cpp:9] Rail paused: peer=b@mlx5_2 error_count=5 pause_ms=30000\r\n",
			'W', 0, 12, 31, 0, 0, 0, 500000, -1, "worker_pool.cpp", 9,
			"Rail paused: peer=b@mlx5_2 error_count=5 pause_ms=30000", "Rail paused: peer=b@mlx5_2 error_count=5 pause_ms=30000", "", -1},
		// A file name starting with digits is not mistaken for a tid.
		{"F0101 01:02:03.000004 9p.cc:1] x", 'F', 0, 1, 1, 1, 2, 3, 4, -1, "9p.cc", 1, "x", "x", "", -1},
		// Empty message.
		{"I0101 01:02:03.000004 1 a.cc:1]", 'I', 0, 1, 1, 1, 2, 3, 4, 1, "a.cc", 1, "", "", "", -1},
		// mc appends slog attributes after the PLOG suffix.
		{"E0307 09:05:03.000042   812 context.go:246] Failed to create QP: Cannot allocate memory [12] local_nic=soft0",
			'E', 0, 3, 7, 9, 5, 3, 42, 812, "context.go", 246,
			"Failed to create QP: Cannot allocate memory [12] local_nic=soft0", "Failed to create QP", "Cannot allocate memory", 12},
		// Brackets inside a message that is not a PLOG suffix.
		{"I0101 01:02:03.000004 1 a.cc:1] list [a] done [x]", 'I', 0, 1, 1, 1, 2, 3, 4, 1, "a.cc", 1,
			"list [a] done [x]", "list [a] done [x]", "", -1},
		{"I0101 01:02:03.000004 1 a.cc:1] got: x [3] then words", 'I', 0, 1, 1, 1, 2, 3, 4, 1, "a.cc", 1,
			"got: x [3] then words", "got: x [3] then words", "", -1},
	}
	for _, c := range cases {
		l, ok := ParseLine([]byte(c.in))
		if !ok {
			t.Errorf("ParseLine(%q) not ok", c.in)
			continue
		}
		got := fmt.Sprintf("%c %d %d %d %d %d %d %d %d %s %d %q %q %q %d", l.Severity, l.Year, l.Month, l.Day,
			l.Hour, l.Minute, l.Second, l.Micro, l.TID, l.File, l.FileLine, l.Msg, l.Body, l.Strerror, l.Errno)
		want := fmt.Sprintf("%c %d %d %d %d %d %d %d %d %s %d %q %q %q %d", c.sev, c.year, c.month, c.day,
			c.hour, c.min, c.sec, c.micro, c.tid, c.file, c.fline, c.msg, c.body, c.strerror, c.errno)
		if got != want {
			t.Errorf("ParseLine(%q)\n got %s\nwant %s", c.in, got, want)
		}
	}
}

func TestParseLineRejects(t *testing.T) {
	for _, in := range []string{
		"", "I", "X0307 09:05:03.000042 1 a.cc:1] m", "I037 09:05:03.000042 1 a.cc:1] m",
		"I1307 09:05:03.000042 1 a.cc:1] m", "I0300 09:05:03.000042 1 a.cc:1] m",
		"I0307 9:05:03.000042 1 a.cc:1] m", "I0307 09:05:03.000042 1 a.cc] m",
		"I0307 09:05:03.000042 1 a.cc:1 m", "I0307 25:05:03.000042 1 a.cc:1] m",
		"I0307 09:05:03. 1 a.cc:1] m", "Info: something happened",
		"I0307 09:05:03.000042 1 a b.cc:1] m", "W0230 00:00:00 0:00]0000000000", "I0431 09:05:03.000042 1 a.cc:1] m",
		"I20230229 09:05:03.000042 1 a.cc:1] m",
	} {
		if l, ok := ParseLine([]byte(in)); ok {
			t.Errorf("ParseLine(%q) accepted: %+v", in, l)
		}
	}
}

func TestLineTime(t *testing.T) {
	l, ok := ParseLine([]byte("I0307 09:05:03.000042 1 a.cc:1] m"))
	if !ok {
		t.Fatal("not parsed")
	}
	if got, want := l.Time(2025, time.UTC), time.Date(2025, 3, 7, 9, 5, 3, 42000, time.UTC); !got.Equal(want) {
		t.Errorf("Time = %v want %v", got, want)
	}
	l, _ = ParseLine([]byte("I20240307 09:05:03.000042 1 a.cc:1] m"))
	if got := l.Time(2025, time.UTC); got.Year() != 2024 {
		t.Errorf("explicit year ignored: %v", got)
	}
}

// Every line mc's own Handler writes must parse back to what was logged,
// so `mc diag` can read mc's logs as well as Mooncake's.
func TestParseLineRoundTripsHandler(t *testing.T) {
	times := []time.Time{
		time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC),
		time.Date(2026, 12, 31, 23, 59, 59, 999_999_000, time.UTC),
	}
	msgs := []struct {
		level slog.Level
		msg   string
		attrs []any
	}{
		{slog.LevelInfo, "host-b@mlx5_1 evicted", nil},
		{slog.LevelWarn, "Rail paused", []any{"peer", "host-b@mlx5_1", "pause_ms", 30000}},
		{slog.LevelError, "Failed to create QP: Cannot allocate memory [12]", nil},
		{LevelFatal, "device fatal", []any{"dev", "a b"}},
		{slog.LevelDebug, "", nil},
	}
	for _, ts := range times {
		for _, tid := range []int{1, 812, 99999, 1234567} {
			var buf bytes.Buffer
			h := NewHandler(&buf, &Options{Level: slog.LevelDebug, Now: func() time.Time { return ts }, ThreadID: func() int { return tid }})
			lg := slog.New(h)
			for _, m := range msgs {
				buf.Reset()
				lg.Log(t.Context(), m.level, m.msg, m.attrs...)
				l, ok := ParseLine(buf.Bytes())
				if !ok {
					t.Fatalf("handler line not parsed: %q", buf.String())
				}
				if l.Severity != Letter(m.level) || l.TID != tid || l.Year != 0 ||
					!l.Time(ts.Year(), time.UTC).Equal(ts.Truncate(time.Microsecond)) ||
					string(l.File) != "parse_test.go" || l.FileLine <= 0 ||
					!strings.HasPrefix(string(l.Msg), m.msg) {
					t.Errorf("round trip of %q: %+v", buf.String(), l)
				}
				if strings.HasSuffix(m.msg, "[12]") && (l.Errno != 12 || string(l.Strerror) != "Cannot allocate memory") {
					t.Errorf("PLOG suffix lost: %+v", l)
				}
			}
			// AppendPrefix with a year-less file name of odd shape.
			line := AppendPrefix(nil, 'W', ts, tid, "x.go:1")
			if _, ok := ParseLine(append(line, "m"...)); !ok {
				t.Errorf("AppendPrefix line not parsed: %q", line)
			}
		}
	}
}

func FuzzParseLine(f *testing.F) {
	// More seeds live in testdata/fuzz/FuzzParseLine.
	f.Add([]byte("I0307 09:05:03.000042   812 a.cc:77] x: y [1]"))
	f.Fuzz(func(t *testing.T, b []byte) {
		l, ok := ParseLine(b)
		if !ok {
			return
		}
		// Parsed slices must lie inside the input and fit together.
		if !bytes.Contains(b, l.Msg) || !bytes.HasPrefix(l.Msg, l.Body) || !bytes.Contains(b, l.File) {
			t.Fatalf("slices outside input: %q -> %+v", b, l)
		}
		if l.Month < 1 || l.Month > 12 || l.Day < 1 || l.Day > 31 || l.Micro < 0 || l.Micro > 999999 {
			t.Fatalf("out of range fields: %q -> %+v", b, l)
		}
		if (l.Errno >= 0) != (l.Strerror != nil) {
			t.Fatalf("errno/strerror disagree: %q -> %+v", b, l)
		}
		// Re-emitting the prefix and message must parse to the same fields.
		fl := string(l.File) + ":" + fmt.Sprint(l.FileLine)
		tid := l.TID
		re := AppendPrefix(nil, l.Severity, l.Time(2024, time.UTC), max(tid, 0), fl)
		re = append(re, l.Msg...)
		l2, ok := ParseLine(re)
		if !ok || l2.Month != l.Month || l2.Day != l.Day || l2.Micro != l.Micro || !bytes.Equal(l2.Msg, bytes.TrimRight(l.Msg, "\r\n")) {
			if l.Second == 60 || bytes.ContainsAny(l.Msg, "\r\n") {
				return // leap second / embedded EOL: time.Date normalises, trimEOL strips
			}
			t.Fatalf("re-emitted line differs: %q -> %q (%v)", b, re, ok)
		}
	})
}
