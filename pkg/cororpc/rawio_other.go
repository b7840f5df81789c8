//go:build !linux

package cororpc

import (
	"errors"
	"net"
)

var errNoRawIO = errors.New("cororpc: raw socket I/O is Linux only")

// rawIO is Linux only: elsewhere connections use net.Conn's methods.
type rawIO struct{}

func newRawIO(net.Conn) *rawIO { return nil }

func (*rawIO) Read([]byte) (int, error) { return 0, errNoRawIO }

func (*rawIO) writev(...[]byte) (int, error) { return 0, errNoRawIO }

func (*rawIO) hungUp() bool { return false }
