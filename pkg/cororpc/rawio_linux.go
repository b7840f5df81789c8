//go:build linux

package cororpc

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"syscall"
	"unsafe"
)

// rawIO reads and writes a connection's socket with read(2) and writev(2)
// made through syscall.RawSyscall, waiting for readiness on Go's poller
// (deadlines and Close work as on the net.Conn). net.Conn's Read and Write
// enter each call as a blocking syscall, and entering one wakes the
// runtime's monitor thread (sysmon) whenever it sleeps because every
// processor is idle: with one caller making one call at a time that is
// every request, and the monitor then polled every 20 µs before sleeping
// again. On the 2-core VM that was a quarter of `mc serve store`'s CPU in
// the Python client's put loop (futex and nanosleep context switches) and
// a thread competing with the handler for the cores. None of these calls
// blocks (the socket is non-blocking), so the processor is not needed by
// anyone else meanwhile.
type rawIO struct {
	rc  syscall.RawConn
	pre *bufio.Reader // bytes read ahead (a sniffed connection), drained first
}

// newRawIO returns raw I/O for nc's socket, or nil when nc is not a
// socket of its own (then nc's methods are used). A connection wrapped by
// WithReader around a bufio.Reader keeps that reader's buffered bytes; one
// with a NetConn method (connlimit's) is unwrapped.
func newRawIO(nc net.Conn) *rawIO {
	var pre *bufio.Reader
	if c, ok := nc.(*readerConn); ok {
		b, ok := c.r.(*bufio.Reader)
		if !ok {
			return nil
		}
		pre, nc = b, c.Conn
	}
	// Wrappers that only add bookkeeping (connlimit's admitted
	// connections) hand over the socket; without this, every connection
	// accepted through a connection cap lost raw I/O.
	for i := 0; i < 4; i++ {
		u, ok := nc.(interface{ NetConn() net.Conn })
		if !ok {
			break
		}
		nc = u.NetConn()
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil
	}
	switch nc.(type) {
	case *net.TCPConn, *net.UnixConn:
	default:
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return &rawIO{rc: rc, pre: pre}
}

func (r *rawIO) Read(p []byte) (int, error) {
	if r.pre != nil {
		if r.pre.Buffered() > 0 {
			return r.pre.Read(p)
		}
		r.pre = nil
	}
	if len(p) == 0 {
		return 0, nil
	}
	var n int
	var errno error
	err := r.rc.Read(func(fd uintptr) bool {
		for {
			n, errno = sysRead(int(fd), p)
			if errno != syscall.EINTR {
				return errno != syscall.EAGAIN
			}
		}
	})
	switch {
	case err != nil: // closed, or the read deadline passed
		return 0, err
	case errno != nil:
		return 0, os.NewSyscallError("read", errno)
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// writev writes bufs (at most three), whole, and returns the bytes
// written (all of them unless err is set).
func (r *rawIO) writev(bufs ...[]byte) (int, error) {
	var errno error
	total := 0
	err := r.rc.Write(func(fd uintptr) bool {
		for {
			for len(bufs) > 0 && len(bufs[0]) == 0 {
				bufs = bufs[1:]
			}
			if len(bufs) == 0 {
				return true
			}
			n, e := sysWritev(int(fd), bufs)
			switch e {
			case nil:
			case syscall.EINTR:
				continue
			case syscall.EAGAIN:
				return false
			default:
				errno = e
				return true
			}
			total += n
			for n > 0 {
				k := min(n, len(bufs[0]))
				bufs[0] = bufs[0][k:]
				n -= k
				if len(bufs[0]) == 0 {
					bufs = bufs[1:]
				}
			}
		}
	})
	if err == nil && errno != nil {
		err = os.NewSyscallError("writev", errno)
	}
	return total, err
}

func sysRead(fd int, p []byte) (int, error) {
	if raceEnabled {
		// package syscall's read orders memory for the race detector.
		return syscall.Read(fd, p)
	}
	r, _, e := syscall.RawSyscall(syscall.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	runtime.KeepAlive(p)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// sysWritev is writev(2) of up to three non-empty buffers.
func sysWritev(fd int, bufs [][]byte) (int, error) {
	if raceEnabled {
		// One write, as writev, through package syscall (race ordering).
		var all []byte
		for _, b := range bufs {
			all = append(all, b...)
		}
		return syscall.Write(fd, all)
	}
	var iov [3]syscall.Iovec
	n := 0
	for _, p := range bufs {
		if len(p) > 0 && n < len(iov) {
			iov[n].Base = &p[0]
			iov[n].SetLen(len(p))
			n++
		}
	}
	r, _, e := syscall.RawSyscall(syscall.SYS_WRITEV, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(n))
	runtime.KeepAlive(bufs)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// hungUp reports whether the peer closed (or reset) the connection, with
// one non-blocking peek at the socket: bytes waiting, or none yet, say it
// is still there. Bytes read ahead (pre) are bytes waiting.
func (r *rawIO) hungUp() bool {
	if r.pre != nil && r.pre.Buffered() > 0 {
		return false
	}
	var gone bool
	var b [1]byte
	err := r.rc.Read(func(fd uintptr) bool {
		for {
			n, _, e := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
			switch {
			case e == syscall.EINTR:
				continue
			case e == syscall.EAGAIN:
			case e != nil || n == 0:
				gone = true
			}
			return true
		}
	})
	return gone || err != nil && !errors.Is(err, os.ErrDeadlineExceeded)
}
