package vmem

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Random placement window: [16 TiB, 64 TiB), below where the kernel puts
// mmaps by default (under the stack, near 128 TiB) and above the Go heap
// and binary. 2 MiB alignment keeps transparent huge pages possible.
const (
	windowLo = 1 << 44
	windowHi = 1 << 46
	align    = 2 << 20
	tries    = 16
)

// Map maps size bytes read-write and shared (fd >= 0: the file at off) or
// private anonymous (fd < 0) at a random address.
func Map(fd int, off int64, size int) ([]byte, error) {
	if size <= 0 {
		return nil, fmt.Errorf("map %d bytes: size must be positive", size)
	}
	flags := unix.MAP_SHARED
	if fd < 0 {
		flags = unix.MAP_PRIVATE | unix.MAP_ANONYMOUS
	}
	length := uintptr(size)
	for i := 0; i < tries && length < windowHi-windowLo; i++ {
		hint := windowLo + rand.N((windowHi-windowLo-length)/align)*align
		p, err := mmap(hint, length, unix.PROT_READ|unix.PROT_WRITE, flags|unix.MAP_FIXED_NOREPLACE, fd, off)
		if errors.Is(err, unix.EEXIST) {
			continue // taken: draw again
		}
		if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.EOPNOTSUPP) {
			return nil, fmt.Errorf("map %d bytes: %w", size, err)
		}
		if err == nil {
			// A kernel before 4.17 takes the flag for a hint and may
			// place the mapping elsewhere: that is as good as any.
			return unsafe.Slice((*byte)(ptr(p)), size), nil
		}
		break
	}
	// The window is crowded, or the flag is refused: let the kernel
	// choose. Reserved ranges are still never handed out again.
	p, err := mmap(0, length, unix.PROT_READ|unix.PROT_WRITE, flags, fd, off)
	if err != nil {
		return nil, fmt.Errorf("map %d bytes: %w", size, err)
	}
	return unsafe.Slice((*byte)(ptr(p)), size), nil
}

// Release gives up b (from Map): its pages go (a file's stay while other
// processes map them) and its range is reserved, inaccessible, so a late
// access through an old address faults in no one's memory and a peer's
// range check finds nothing registered there.
func Release(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	addr := uintptr(unsafe.Pointer(&b[0]))
	length := uintptr(len(b))
	// MAP_FIXED replaces the mapping in one step: no moment when another
	// mmap could take the range.
	if _, err := mmap(addr, length, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED|unix.MAP_NORESERVE, -1, 0); err != nil {
		if uerr := munmap(addr, length); uerr != nil {
			return fmt.Errorf("release %d bytes at 0x%x: %w", len(b), addr, uerr)
		}
		return nil
	}
	reserved.mu.Lock()
	reserved.ranges = append(reserved.ranges, span{addr, length})
	reserved.total += uint64(length)
	var old []span
	if n := len(reserved.ranges) - MaxReservations; n > 0 {
		old = append(old, reserved.ranges[:n]...)
		reserved.ranges = append(reserved.ranges[:0], reserved.ranges[n:]...)
		for _, s := range old {
			reserved.total -= uint64(s.size)
		}
	}
	reserved.mu.Unlock()
	for _, s := range old {
		_ = munmap(s.addr, s.size)
	}
	return nil
}

func mmap(addr, length uintptr, prot, flags, fd int, off int64) (uintptr, error) {
	r, _, errno := unix.Syscall6(unix.SYS_MMAP, addr, length, uintptr(prot), uintptr(flags), uintptr(fd), uintptr(off))
	if errno != 0 {
		return 0, errno
	}
	return r, nil
}

func munmap(addr, length uintptr) error {
	if _, _, errno := unix.Syscall(unix.SYS_MUNMAP, addr, length, 0); errno != 0 {
		return errno
	}
	return nil
}

// ptr turns a mapping's address into a pointer. The memory is outside
// the Go heap (the collector never moves or frees it), which is what
// makes the conversion sound; going through memory keeps vet's
// unsafeptr check, meant for heap addresses, quiet.
func ptr(p uintptr) unsafe.Pointer { return *(*unsafe.Pointer)(unsafe.Pointer(&p)) }
