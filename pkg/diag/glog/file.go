package glog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"time"
)

// CreateLogFile creates a log file in dir named as glog names its files,
// <program>.<host>.<user>.log.INFO.<yyyymmdd-hhmmss>.<pid>, and points the
// symlink <program>.INFO at it, so operators' `tail -F mc.INFO` and
// `mc diag qp-leak --log` work as they do for Mooncake's logs.
func CreateLogFile(dir, program string, now time.Time) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("log dir %q: %w", dir, err)
	}
	host, _ := os.Hostname()
	if i := strings.IndexByte(host, '.'); i > 0 {
		host = host[:i]
	}
	if host == "" {
		host = "unknownhost"
	}
	name := "unknownuser"
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = strings.ReplaceAll(u.Username, string(filepath.Separator), "_")
	}
	base := fmt.Sprintf("%s.%s.%s.log.INFO.%s.%d", program, host, name, now.Format("20060102-150405"), os.Getpid())
	f, err := os.OpenFile(filepath.Join(dir, base), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("create log file: %w", err)
	}
	link := filepath.Join(dir, program+".INFO")
	_ = os.Remove(link) // a stale link from an earlier run; absence is fine
	if err := os.Symlink(base, link); err != nil && !errors.Is(err, os.ErrExist) {
		f.Close()
		return nil, fmt.Errorf("link %s: %w", link, err)
	}
	return f, nil
}

// Tee returns a handler that passes each record to every handler enabled
// for its level: glog's file-plus-stderr-threshold behaviour.
func Tee(hs ...slog.Handler) slog.Handler { return tee(hs) }

type tee []slog.Handler

func (t tee) Enabled(ctx context.Context, l slog.Level) bool {
	for _, h := range t {
		if h.Enabled(ctx, l) {
			return true
		}
	}
	return false
}

func (t tee) Handle(ctx context.Context, r slog.Record) error {
	var errs []error
	for _, h := range t {
		if h.Enabled(ctx, r.Level) {
			errs = append(errs, h.Handle(ctx, r.Clone()))
		}
	}
	return errors.Join(errs...)
}

func (t tee) WithAttrs(attrs []slog.Attr) slog.Handler {
	out := make(tee, len(t))
	for i, h := range t {
		out[i] = h.WithAttrs(attrs)
	}
	return out
}

func (t tee) WithGroup(name string) slog.Handler {
	out := make(tee, len(t))
	for i, h := range t {
		out[i] = h.WithGroup(name)
	}
	return out
}
