package connlimit

import "net"

// Listener wraps ln so that its Accept refuses connections over a cap
// (they never reach the caller) and a returned connection gives its slot
// back when closed. name labels the listener in logs and metrics.
func (l *Limiter) Listener(ln net.Listener, name string) net.Listener {
	if l == nil {
		return ln
	}
	return &listener{Listener: ln, l: l, name: name}
}

type listener struct {
	net.Listener
	l    *Limiter
	name string
}

func (ln *listener) Accept() (net.Conn, error) {
	for {
		c, err := ln.Listener.Accept()
		if err != nil {
			return nil, err
		}
		slot, ok := ln.l.Admit(ln.name, AddrOf(c.RemoteAddr()))
		if !ok {
			Refuse(c)
			continue
		}
		return Wrap(c, slot), nil
	}
}

// Wrap returns c, whose Close also releases slot. A TCP connection stays a
// TCP connection to interface checks (syscall.Conn, CloseWrite, ReadFrom),
// though not to a *net.TCPConn type assertion.
func Wrap(c net.Conn, slot Slot) net.Conn {
	if tc, ok := c.(*net.TCPConn); ok {
		return &TCPConn{TCPConn: tc, slot: slot}
	}
	return &conn{Conn: c, slot: slot}
}

// TCPConn is an admitted TCP connection.
type TCPConn struct {
	*net.TCPConn
	slot Slot
}

// Close closes the connection and gives its slot back.
func (c *TCPConn) Close() error {
	err := c.TCPConn.Close()
	c.slot.Release()
	return err
}

// NetConn returns the connection itself (as tls.Conn's does): code that
// reads and writes the socket directly (cororpc's raw I/O) unwraps it.
func (c *TCPConn) NetConn() net.Conn { return c.TCPConn }

type conn struct {
	net.Conn
	slot Slot
}

// NetConn returns the wrapped connection.
func (c *conn) NetConn() net.Conn { return c.Conn }

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.slot.Release()
	return err
}
