package tcp

import (
	"io"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// directReadMin is the least data a read takes straight from the socket
// into the caller's memory rather than through a buffer. Below it, one
// buffered read(2) serves many pipelined replies and the extra copy is
// cheap; above it, the copy costs more than the syscall it would save
// (64 KiB reads through a 64 KiB buffer spent a fifth of the initiator's
// CPU in memmove).
const directReadMin = 16 << 10

// replyReader reads a lane's reply frames (status word, then a READ's
// data) in order. Small frames come out of a buffer; the data of a large
// READ lands straight in the operation's buffer, read together with its
// status word by one readv(2) where the connection allows it.
type replyReader struct {
	r    io.Reader
	raw  syscall.RawConn // nil: plain reads of r
	buf  []byte
	i, n int // buf[i:n] is buffered
	iov  [][]byte
}

func newReplyReader(r io.Reader, size int) *replyReader {
	rr := &replyReader{r: r, buf: make([]byte, size)}
	if sc, ok := r.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			rr.raw = raw
		}
	}
	return rr
}

// readFrame fills st (the status word; empty for v1) and data (a READ's
// destination; empty for a WRITE). The status word is checked as soon as
// it is complete, before any wait for data: a rejected request is
// followed by no data, only the server's close.
func (rr *replyReader) readFrame(st, data []byte) error {
	status := st
	checked := len(st) == 0
	got := 0 // bytes of this frame read so far
	for {
		// What the buffer holds first.
		if rr.i < rr.n {
			k := copy(st, rr.buf[rr.i:rr.n])
			st = st[k:]
			rr.i += k
			k2 := copy(data, rr.buf[rr.i:rr.n])
			data = data[k2:]
			rr.i += k2
			got += k + k2
		}
		if !checked && len(st) == 0 {
			checked = true
			if err := CheckStatus(status); err != nil {
				return err
			}
		}
		if len(st) == 0 && len(data) == 0 {
			return nil
		}
		// The buffer is empty here.
		var k int
		var err error
		if len(data) >= directReadMin {
			k, err = rr.readDirect(st, data)
			ks := min(k, len(st))
			st, data = st[ks:], data[k-ks:]
		} else {
			rr.i = 0
			k, err = rr.r.Read(rr.buf)
			rr.n = max(k, 0)
		}
		got += k
		if k > 0 {
			continue
		}
		if err == nil || err == io.EOF {
			if got > 0 {
				return io.ErrUnexpectedEOF
			}
			return io.EOF
		}
		return err
	}
}

// readDirect reads into st then data with one readv(2) (or a plain read
// when the connection has no file descriptor).
func (rr *replyReader) readDirect(st, data []byte) (int, error) {
	if rr.raw == nil {
		if len(st) > 0 {
			return rr.r.Read(st)
		}
		return rr.r.Read(data)
	}
	rr.iov = rr.iov[:0]
	if len(st) > 0 {
		rr.iov = append(rr.iov, st)
	}
	rr.iov = append(rr.iov, data)
	var n int
	var rerr error
	err := rr.raw.Read(func(fd uintptr) bool {
		for {
			n, rerr = unix.Readv(int(fd), rr.iov)
			if rerr != unix.EINTR {
				return rerr != unix.EAGAIN
			}
		}
	})
	clear(rr.iov)
	if err != nil {
		return 0, err
	}
	if rerr != nil {
		return 0, os.NewSyscallError("readv", rerr)
	}
	return max(n, 0), nil
}
