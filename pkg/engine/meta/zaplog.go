package meta

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"sync/atomic"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// zapToSlog is a zap core that writes etcd's own errors through mc's
// logger (glog lines on stderr, with fields). etcd reports a failed disk
// write (a full disk) with zap's Fatal and exits: with a silent logger
// `mc serve metadata` exited 1 and printed nothing. (Its warnings, "apply
// request took too long" under any load among them, stay out.)
type zapToSlog struct {
	log    *slog.Logger
	level  zapcore.Level
	fields []zapcore.Field
	// closing drops what etcd reports of its own Close (its listeners'
	// "server closed" errors), fatal errors excepted.
	closing *atomic.Bool
}

// zapLogger is etcd's logger: errors and worse go to log.
func zapLogger(log *slog.Logger, closing *atomic.Bool) *zap.Logger {
	return zap.New(&zapToSlog{log: log, level: zapcore.ErrorLevel, closing: closing})
}

func (z *zapToSlog) Enabled(l zapcore.Level) bool {
	return l >= z.level && (l >= zapcore.DPanicLevel || !z.closing.Load())
}

func (z *zapToSlog) With(fields []zapcore.Field) zapcore.Core {
	c := *z
	c.fields = append(append([]zapcore.Field(nil), z.fields...), fields...)
	return &c
}

func (z *zapToSlog) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if z.Enabled(e.Level) {
		return ce.AddCore(e, z)
	}
	return ce
}

func (z *zapToSlog) Write(e zapcore.Entry, fields []zapcore.Field) error {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range z.fields {
		f.AddTo(enc)
	}
	for _, f := range fields {
		f.AddTo(enc)
	}
	keys := make([]string, 0, len(enc.Fields))
	for k := range enc.Fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	args := make([]any, 0, 2*len(keys))
	for _, k := range keys {
		args = append(args, k, fmt.Sprint(enc.Fields[k]))
	}
	level, msg := slog.LevelWarn, "etcd: "+e.Message
	switch {
	case e.Level >= zapcore.DPanicLevel:
		level, msg = slog.LevelError, "etcd (fatal, exiting): "+e.Message
	case e.Level >= zapcore.ErrorLevel:
		level = slog.LevelError
	}
	z.log.Log(context.Background(), level, msg, args...)
	return nil
}

func (z *zapToSlog) Sync() error { return nil }
