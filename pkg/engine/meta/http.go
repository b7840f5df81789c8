package meta

import (
	"bytes"
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
)

// DefaultHTTPBodyLimit bounds an HTTP metadata body (both directions) when
// Options.MaxLength is 0.
const DefaultHTTPBodyLimit = 64 << 20

// notFoundBody is what Mooncake's HTTP metadata server answers for a
// missing key, with status 404.
const notFoundBody = "metadata not found"

// httpBackend talks to Mooncake's HTTP metadata server:
// GET|PUT|DELETE <url>?key=<escaped key>.
type httpBackend struct {
	base  string
	host  string
	limit int64
	cli   *http.Client
	opts  Options
}

func newHTTP(server string, opts Options) (*httpBackend, error) {
	u, err := url.Parse(server)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("metadata server %q is not a valid http URL (want http://host:port/path)", server)
	}
	limit := int64(DefaultHTTPBodyLimit)
	if opts.MaxLength > 0 {
		limit = int64(opts.MaxLength)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil // metadata servers are on the cluster network
	return &httpBackend{
		base:  server,
		host:  u.Host,
		limit: limit,
		cli:   &http.Client{Transport: tr, Timeout: opts.timeout()},
		opts:  opts,
	}, nil
}

// keyURL builds Mooncake's request URL: the server URL as given, then
// "?key=" and the key escaped as curl_easy_escape does (everything but
// RFC 3986 unreserved characters percent-encoded, '/' included).
func (h *httpBackend) keyURL(key string) string {
	return h.base + "?key=" + EscapeKey(key)
}

// EscapeKey percent-encodes key like libcurl's curl_easy_escape, which
// Mooncake uses for the key query parameter.
func EscapeKey(key string) string {
	const hexDigits = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(key); i++ {
		c := key[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~' {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hexDigits[c>>4])
		b.WriteByte(hexDigits[c&15])
	}
	return b.String()
}

// do sends one request; found is false for a 404 "metadata not found".
func (h *httpBackend) do(ctx context.Context, method, key string, body []byte) (resp []byte, found bool, err error) {
	limit := callLimit(ctx, h.opts.timeout())
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, h.keyURL(key), rd)
	if err != nil {
		return nil, false, fmt.Errorf("%s %s: %w", method, key, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if h.opts.HTTPToken != "" {
		req.Header.Set("Authorization", "Bearer "+h.opts.HTTPToken)
	}
	r, err := h.cli.Do(req)
	if err != nil {
		var ne net.Error
		var oe *net.OpError
		if errors.As(err, &oe) || (errors.As(err, &ne) && ne.Timeout()) || errors.Is(err, context.DeadlineExceeded) {
			return nil, false, &unreachableError{what: "metadata server", addr: h.host, err: rootCause(err)}
		}
		return nil, false, fmt.Errorf("%s %s: %w", method, key, err)
	}
	defer r.Body.Close()
	data, err := io.ReadAll(io.LimitReader(r.Body, h.limit+1))
	if err != nil {
		return nil, false, fmt.Errorf("%s %s: read reply from %s: %w", method, key, h.host, err)
	}
	if int64(len(data)) > h.limit {
		return nil, false, fmt.Errorf("%s %s: reply from %s exceeds %d bytes", method, key, h.host, h.limit)
	}
	switch {
	case r.StatusCode == http.StatusOK:
		return data, true, nil
	case r.StatusCode == http.StatusNotFound:
		return nil, false, nil
	}
	if r.StatusCode == http.StatusUnauthorized {
		return nil, false, fmt.Errorf("%s %s: metadata server %s answered %s: set MC_METADATA_HTTP_TOKEN to the server's token", method, key, h.host, r.Status)
	}
	return nil, false, fmt.Errorf("%s %s: metadata server %s answered %s: %s", method, key, h.host, r.Status, snippet(data))
}

// rootCause drops url.Error's "Get \"http://...?key=...\":" prefix; the
// unreachable error already names the server.
func rootCause(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

func snippet(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	if s == "" {
		return "(empty body)"
	}
	return fmt.Sprintf("%q", s)
}

func (h *httpBackend) get(ctx context.Context, key string) ([]byte, bool, error) {
	return h.do(ctx, http.MethodGet, key, nil)
}

func (h *httpBackend) put(ctx context.Context, key string, v []byte) error {
	_, ok, err := h.do(ctx, http.MethodPut, key, v)
	if err == nil && !ok {
		err = fmt.Errorf("PUT %s: metadata server %s answered 404", key, h.host)
	}
	return err
}

// del treats a 404 as success: deleting is idempotent.
func (h *httpBackend) del(ctx context.Context, key string) error {
	_, _, err := h.do(ctx, http.MethodDelete, key, nil)
	return err
}

func (h *httpBackend) close() error {
	h.cli.CloseIdleConnections()
	return nil
}

// httpStore is the server side: Mooncake's HTTP metadata server.
type httpStore struct {
	mu    sync.RWMutex
	kv    map[string][]byte
	limit int64
}

// NewHTTPHandler returns Mooncake's HTTP metadata server protocol over an
// in-memory map: GET|PUT|DELETE ?key=<key>; 200 on success, 404 with body
// "metadata not found" for a missing key, 400 without a key, 413 for a
// body over DefaultHTTPBodyLimit, 405 for other methods.
func NewHTTPHandler() http.Handler {
	return &httpStore{kv: make(map[string][]byte), limit: DefaultHTTPBodyLimit}
}

func (s *httpStore) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.URL.Query().Get("key")
	if key == "" {
		plain(w, http.StatusBadRequest, "missing key")
		return
	}
	switch r.Method {
	case http.MethodGet:
		s.mu.RLock()
		v, ok := s.kv[key]
		s.mu.RUnlock()
		if !ok {
			plain(w, http.StatusNotFound, notFoundBody)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(v)
	case http.MethodPut:
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.limit))
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				plain(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("metadata larger than %d bytes", s.limit))
				return
			}
			plain(w, http.StatusBadRequest, "read body: "+err.Error())
			return
		}
		s.mu.Lock()
		s.kv[key] = body
		s.mu.Unlock()
		plain(w, http.StatusOK, "metadata updated")
	case http.MethodDelete:
		s.mu.Lock()
		_, ok := s.kv[key]
		delete(s.kv, key)
		s.mu.Unlock()
		if !ok {
			plain(w, http.StatusNotFound, notFoundBody)
			return
		}
		plain(w, http.StatusOK, "metadata deleted")
	default:
		w.Header().Set("Allow", "GET, PUT, DELETE")
		plain(w, http.StatusMethodNotAllowed, "method not allowed")
	}
}

// RequireToken wraps a metadata handler so that only requests carrying
// "Authorization: Bearer <token>" reach it (401 otherwise), as Mooncake's
// HTTP metadata server does when MC_METADATA_HTTP_TOKEN is set.
func RequireToken(h http.Handler, token string) http.Handler {
	want := []byte("Bearer " + token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			w.Header().Set("WWW-Authenticate", "Bearer")
			plain(w, http.StatusUnauthorized, "missing or wrong bearer token")
			return
		}
		h.ServeHTTP(w, r)
	})
}

// plain writes a text body exactly (http.Error would append a newline, and
// Mooncake's clients compare "metadata not found" verbatim).
func plain(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(code)
	_, _ = io.WriteString(w, msg)
}
