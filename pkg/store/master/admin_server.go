package master

import (
	"log/slog"
	"net/http"
	"time"
)

// The admin HTTP server's bounds on what one connection may hold. Without
// them a client that sent one request and kept the connection open, or
// sent a request body a byte at a time, held its connection and goroutine
// for as long as it liked: enough of them use up the process's file
// descriptors, and with them the RPC port's accepts. Variables so that
// tests can shorten them.
var (
	// adminReadHeaderTimeout bounds reading a request's header.
	adminReadHeaderTimeout = 5 * time.Second
	// adminReadTimeout bounds reading a whole request, body included
	// (the largest admin body is 1 MiB of drain job JSON).
	adminReadTimeout = 30 * time.Second
	// adminWriteTimeout bounds a handler's answer, from the end of the
	// request's header: generous for /get_all_keys of millions of keys,
	// finite for a client that never reads it.
	adminWriteTimeout = 5 * time.Minute
	// adminIdleTimeout bounds a kept-alive connection between requests.
	adminIdleTimeout = 2 * time.Minute
)

// adminMaxHeaderBytes bounds a request's header (admin requests carry a
// path, a query and a token).
const adminMaxHeaderBytes = 64 << 10

// NewAdminServer returns the http.Server for an admin HTTP API (a
// master's NewAdminHandler, a node's /metrics): every request must
// arrive within a bound, every answer be taken within one, and an idle
// kept-alive connection is closed, so a client can pin neither a
// connection nor a goroutine for long. Its protocol errors go to log at
// warning level (nil: slog.Default()).
func NewAdminServer(h http.Handler, log *slog.Logger) *http.Server {
	if log == nil {
		log = slog.Default()
	}
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: adminReadHeaderTimeout,
		ReadTimeout:       adminReadTimeout,
		WriteTimeout:      adminWriteTimeout,
		IdleTimeout:       adminIdleTimeout,
		MaxHeaderBytes:    adminMaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}
