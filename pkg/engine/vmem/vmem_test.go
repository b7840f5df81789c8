package vmem

import (
	"bufio"
	"fmt"
	"os"
	"strings"
	"testing"
	"unsafe"
)

// A released range stays reserved: no later Map lands on it, and the
// process's maps show it inaccessible.
func TestReleasedRangeNeverReused(t *testing.T) {
	const size = 4 << 20
	b, err := Map(-1, 0, size)
	if err != nil {
		t.Fatal(err)
	}
	b[0], b[size-1] = 1, 2
	lo := uintptr(unsafe.Pointer(&b[0]))
	if err := Release(b); err != nil {
		t.Fatal(err)
	}
	if !mapped(t, lo, "---p") {
		t.Fatalf("released range 0x%x is not reserved inaccessible", lo)
	}
	var live [][]byte
	for range 64 {
		c, err := Map(-1, 0, size)
		if err != nil {
			t.Fatal(err)
		}
		a := uintptr(unsafe.Pointer(&c[0]))
		if a < lo+size && lo < a+size {
			t.Fatalf("new mapping at 0x%x overlaps the released 0x%x", a, lo)
		}
		live = append(live, c)
	}
	for _, c := range live {
		if err := Release(c); err != nil {
			t.Fatal(err)
		}
	}
	if n, bytes := Reserved(); n < 65 || bytes < 65*size {
		t.Fatalf("Reserved() = %d ranges, %d bytes; want at least 65 and %d", n, bytes, 65*size)
	}
}

// Two mappings of the same size land at different, random addresses.
func TestMapRandomPlacement(t *testing.T) {
	seen := map[uintptr]bool{}
	for range 8 {
		b, err := Map(-1, 0, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		a := uintptr(unsafe.Pointer(&b[0]))
		if seen[a] {
			t.Fatalf("address 0x%x handed out twice", a)
		}
		seen[a] = true
		if a < windowLo || a >= windowHi {
			t.Fatalf("mapping at 0x%x outside the placement window", a)
		}
		Release(b)
	}
	if _, err := Map(-1, 0, 0); err == nil {
		t.Fatal("Map of 0 bytes: want an error")
	}
}

// mapped reports whether /proc/self/maps has a mapping starting at addr
// with the given permissions.
func mapped(t *testing.T, addr uintptr, perms string) bool {
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := fmt.Sprintf("%x-", addr)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), want) {
			return strings.Fields(sc.Text())[1] == perms
		}
	}
	return false
}
