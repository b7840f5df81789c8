// Package glog owns the glog line format that mc writes and mc diag reads:
//
//	Lmmdd hh:mm:ss.uuuuuu TTTTT file:line] msg
//
// where L is the severity letter (I, W, E, F) and TTTTT the OS thread id,
// space-padded to five columns. Operators grep these lines and Mooncake
// writes them too, so mc's own logs must be indistinguishable in shape.
//
// The writing side is a log/slog Handler, so the rest of mc logs through the
// standard library; the reading side (ParseLine) is what pkg/diag uses.
package glog

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
)

// LevelFatal is glog's FATAL severity; slog has none.
const LevelFatal = slog.Level(12)

// Options configure a Handler.
type Options struct {
	// Level is the minimum level written; nil means slog.LevelInfo.
	Level slog.Leveler
	// Now, when set, overrides the record's time on each line. Tests fix
	// it so lines can be compared byte for byte.
	Now func() time.Time
	// ThreadID returns the id printed after the time; nil means the OS
	// thread id of the calling goroutine (what glog prints in C++).
	ThreadID func() int
}

// Handler is a slog.Handler that writes one glog line per record.
type Handler struct {
	mu    *sync.Mutex
	w     io.Writer
	opts  Options
	attrs string // preformatted " k=v" pairs from WithAttrs
	group string // dotted prefix from WithGroup
}

// NewHandler returns a Handler writing to w.
func NewHandler(w io.Writer, opts *Options) *Handler {
	h := &Handler{mu: &sync.Mutex{}, w: w}
	if opts != nil {
		h.opts = *opts
	}
	if h.opts.Level == nil {
		h.opts.Level = slog.LevelInfo
	}
	if h.opts.ThreadID == nil {
		h.opts.ThreadID = threadID
	}
	return h
}

// Enabled reports whether records at level l are written.
func (h *Handler) Enabled(_ context.Context, l slog.Level) bool {
	return l >= h.opts.Level.Level()
}

// Letter maps a slog level to glog's severity letter. Debug has no glog
// letter; it is written as I because glog's VLOG lines are INFO too.
func Letter(l slog.Level) byte {
	switch {
	case l >= LevelFatal:
		return 'F'
	case l >= slog.LevelError:
		return 'E'
	case l >= slog.LevelWarn:
		return 'W'
	default:
		return 'I'
	}
}

// Handle formats r as one line and writes it with a single Write call, so
// lines from concurrent goroutines never interleave.
func (h *Handler) Handle(_ context.Context, r slog.Record) error {
	t := r.Time
	if h.opts.Now != nil {
		t = h.opts.Now()
	} else if t.IsZero() {
		t = time.Now()
	}
	buf := make([]byte, 0, 128+len(r.Message))
	buf = AppendPrefix(buf, Letter(r.Level), t, h.opts.ThreadID(), source(r.PC))
	buf = append(buf, r.Message...)
	buf = append(buf, h.attrs...)
	r.Attrs(func(a slog.Attr) bool {
		buf = appendAttr(buf, h.group, a)
		return true
	})
	buf = append(buf, '\n')
	h.mu.Lock()
	defer h.mu.Unlock()
	_, err := h.w.Write(buf)
	return err
}

// WithAttrs returns a Handler that appends attrs to every line.
func (h *Handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	h2 := *h
	b := []byte(h.attrs)
	for _, a := range attrs {
		b = appendAttr(b, h.group, a)
	}
	h2.attrs = string(b)
	return &h2
}

// WithGroup returns a Handler that qualifies later attribute keys.
func (h *Handler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	h2 := *h
	h2.group = h.group + name + "."
	return &h2
}

// AppendPrefix appends "Lmmdd hh:mm:ss.uuuuuu TTTTT file:line] " to buf.
func AppendPrefix(buf []byte, letter byte, t time.Time, tid int, fileLine string) []byte {
	_, mo, d := t.Date()
	hh, mm, ss := t.Clock()
	buf = append(buf, letter)
	buf = append2(buf, int(mo))
	buf = append2(buf, d)
	buf = append(buf, ' ')
	buf = append2(buf, hh)
	buf = append(buf, ':')
	buf = append2(buf, mm)
	buf = append(buf, ':')
	buf = append2(buf, ss)
	buf = append(buf, '.')
	us := t.Nanosecond() / 1000
	s := strconv.Itoa(us)
	for i := len(s); i < 6; i++ {
		buf = append(buf, '0')
	}
	buf = append(buf, s...)
	buf = append(buf, ' ')
	ts := strconv.Itoa(tid)
	for i := len(ts); i < 5; i++ {
		buf = append(buf, ' ')
	}
	buf = append(buf, ts...)
	buf = append(buf, ' ')
	buf = append(buf, fileLine...)
	buf = append(buf, "] "...)
	return buf
}

func append2(buf []byte, v int) []byte {
	return append(buf, byte('0'+v/10%10), byte('0'+v%10))
}

func appendAttr(buf []byte, group string, a slog.Attr) []byte {
	a.Value = a.Value.Resolve()
	if a.Equal(slog.Attr{}) {
		return buf
	}
	if a.Value.Kind() == slog.KindGroup {
		g := group
		if a.Key != "" {
			g = group + a.Key + "."
		}
		for _, ga := range a.Value.Group() {
			buf = appendAttr(buf, g, ga)
		}
		return buf
	}
	buf = append(buf, ' ')
	buf = append(buf, group...)
	buf = append(buf, a.Key...)
	buf = append(buf, '=')
	v := a.Value.String()
	if v == "" || strings.ContainsAny(v, " \t\n\"=") {
		buf = strconv.AppendQuote(buf, v)
	} else {
		buf = append(buf, v...)
	}
	return buf
}

func source(pc uintptr) string {
	if pc == 0 {
		return "???:0"
	}
	fs := runtime.CallersFrames([]uintptr{pc})
	f, _ := fs.Next()
	if f.File == "" {
		return "???:0"
	}
	return filepath.Base(f.File) + ":" + strconv.Itoa(f.Line)
}

// ParseLevel accepts the spellings operators use for MC_LOG_LEVEL and
// --log-level: names (debug, info, warning/warn, error, fatal; any case)
// and glog's numeric minloglevel (0 INFO .. 3 FATAL).
func ParseLevel(s string) (slog.Level, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "debug", "trace", "verbose":
		return slog.LevelDebug, nil
	case "info", "0", "":
		return slog.LevelInfo, nil
	case "warning", "warn", "1":
		return slog.LevelWarn, nil
	case "error", "2":
		return slog.LevelError, nil
	case "fatal", "3":
		return LevelFatal, nil
	}
	return 0, fmt.Errorf("unknown log level %q (want debug, info, warning, error or fatal)", s)
}

// Setup installs a Handler writing to w as slog's default logger and
// returns it. Everything in mc logs through slog.Default().
func Setup(w io.Writer, level slog.Leveler) *slog.Logger {
	l := slog.New(NewHandler(w, &Options{Level: level}))
	slog.SetDefault(l)
	return l
}

// Stderr is where command-line tools send their logs.
var Stderr io.Writer = os.Stderr
