//go:build !linux

package vmem

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Map maps size bytes (fd >= 0: shared, of the file at off; else private
// anonymous) where the kernel chooses: only Linux gets random placement.
func Map(fd int, off int64, size int) ([]byte, error) {
	if size <= 0 {
		return nil, fmt.Errorf("map %d bytes: size must be positive", size)
	}
	flags := unix.MAP_SHARED
	if fd < 0 {
		flags = unix.MAP_PRIVATE | unix.MAP_ANON
	}
	b, err := unix.Mmap(fd, off, size, unix.PROT_READ|unix.PROT_WRITE, flags)
	if err != nil {
		return nil, fmt.Errorf("map %d bytes: %w", size, err)
	}
	return b, nil
}

// Release unmaps b.
func Release(b []byte) error { return unix.Munmap(b) }
