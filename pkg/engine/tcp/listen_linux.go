package tcp

import "golang.org/x/sys/unix"

// deferAccept sets TCP_DEFER_ACCEPT (seconds to wait for data before
// accepting anyway); failure only loses the optimisation.
func deferAccept(fd uintptr) {
	_ = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_DEFER_ACCEPT, 1)
}
