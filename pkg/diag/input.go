package diag

import (
	"bufio"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"
)

// lineBufSize bounds one line. glog truncates its own lines well below
// this; anything longer is garbage (a binary blob, a missing newline) and
// is counted and skipped rather than buffered.
const lineBufSize = 1 << 20

// Stdin is what the path "-" reads; tests replace it.
var Stdin io.Reader = os.Stdin

// Open opens path for reading ("-" is standard input) and decompresses it
// when it starts with the gzip magic, whatever its name: rotated logs are
// often compressed and renamed by tools that do not keep ".gz".
func Open(path string) (io.ReadCloser, error) {
	var f io.ReadCloser
	if path == "-" {
		f = io.NopCloser(Stdin)
	} else {
		of, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		// A directory opens fine on Linux and fails only at the first
		// read, with a less helpful message.
		if st, err := of.Stat(); err == nil && st.IsDir() {
			of.Close()
			return nil, &fs.PathError{Op: "open", Path: path, Err: syscall.EISDIR}
		}
		f = of
	}
	br := bufio.NewReaderSize(f, 256<<10)
	magic, _ := br.Peek(2)
	if len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("gzip %s: %w", path, err)
		}
		return &readCloser{Reader: zr, close: func() error { zr.Close(); return f.Close() }}, nil
	}
	return &readCloser{Reader: br, close: f.Close}, nil
}

type readCloser struct {
	io.Reader
	close func() error
}

func (r *readCloser) Close() error { return r.close() }

// eachLine calls fn for every line of br (without its newline). A line
// longer than lineBufSize is reported once with overlong set and its bytes
// skipped, so one bad line never stops a scan. The slice passed to fn is
// only valid during the call.
func eachLine(br *bufio.Reader, fn func(line []byte, overlong bool)) error {
	if br.Size() < lineBufSize {
		br = bufio.NewReaderSize(br, lineBufSize)
	}
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			fn(line[:0], true)
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = br.ReadSlice('\n')
			}
			if err == nil {
				continue
			}
			line = nil
		}
		if len(line) > 0 {
			if line[len(line)-1] == '\n' {
				line = line[:len(line)-1]
			}
			fn(line, false)
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}
