package ha

import (
	"errors"
	"log/slog"
	"net"
	"sync"
	"time"
)

// muxListener keeps the RPC port bound for the candidate's life and hands
// its connections to the current term's gRPC server. Between terms a
// connection is closed at once, so clients fail fast and look again at
// the view. (Re-binding the port per term could lose it to another
// process.)
type muxListener struct {
	base net.Listener
	mu   sync.Mutex
	cur  *termListener
	done chan struct{}
}

func newMuxListener(base net.Listener) *muxListener {
	l := &muxListener{base: base, done: make(chan struct{})}
	go l.accept()
	return l
}

func (l *muxListener) accept() {
	defer close(l.done)
	var backoff time.Duration
	for {
		conn, err := l.base.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of descriptors and the like: accept again after a
			// pause, as net/http does. Returning here left the
			// candidate's port bound and never accepting again.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			slog.Warn("master RPC listener: accept failed", "addr", l.base.Addr(), "err", err, "retry_in", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		l.mu.Lock()
		t := l.cur
		l.mu.Unlock()
		if t == nil {
			conn.Close()
			continue
		}
		select {
		case t.ch <- conn:
		case <-t.closed:
			conn.Close()
		}
	}
}

// open starts a term: the returned listener gets the connections until it
// is closed (gRPC's Stop closes it).
func (l *muxListener) open() net.Listener {
	t := &termListener{mux: l, ch: make(chan net.Conn), closed: make(chan struct{})}
	l.mu.Lock()
	if l.cur != nil {
		l.cur.close()
	}
	l.cur = t
	l.mu.Unlock()
	return t
}

// Close unbinds the port.
func (l *muxListener) Close() {
	l.base.Close()
	<-l.done
	l.mu.Lock()
	if l.cur != nil {
		l.cur.close()
		l.cur = nil
	}
	l.mu.Unlock()
}

type termListener struct {
	mux    *muxListener
	ch     chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func (t *termListener) Accept() (net.Conn, error) {
	select {
	case c := <-t.ch:
		return c, nil
	case <-t.closed:
		return nil, net.ErrClosed
	}
}

func (t *termListener) close() { t.once.Do(func() { close(t.closed) }) }

func (t *termListener) Close() error {
	t.mux.mu.Lock()
	if t.mux.cur == t {
		t.mux.cur = nil
	}
	t.mux.mu.Unlock()
	t.close()
	return nil
}

func (t *termListener) Addr() net.Addr { return t.mux.base.Addr() }
