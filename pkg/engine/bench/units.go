package bench

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ParseSize parses a byte count: a decimal number with an optional binary
// suffix K, M or G (case-insensitive, optional trailing "B" or "iB"):
// 4K = 4096, 1M = 1048576, 1G = 1073741824.
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	u := strings.ToUpper(t)
	u = strings.TrimSuffix(u, "IB")
	u = strings.TrimSuffix(u, "B")
	mult := int64(1)
	if u != "" {
		switch u[len(u)-1] {
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		case 'T':
			mult = 1 << 40 // store segments of hosts with TBs of memory
		}
		if mult > 1 {
			u = u[:len(u)-1]
		}
	}
	n, err := strconv.ParseInt(u, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("size %q: want a positive number with an optional K, M, G or T suffix (binary: 4K = 4096)", s)
	}
	if n > math.MaxInt64/mult {
		return 0, fmt.Errorf("size %q: too large", s)
	}
	return n * mult, nil
}

// ParseSizeList parses a comma-separated list of sizes ("4K,64K,1M").
func ParseSizeList(s string) ([]int64, error) {
	var out []int64
	for _, f := range strings.Split(s, ",") {
		if strings.TrimSpace(f) == "" {
			continue
		}
		n, err := ParseSize(f)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("size list %q is empty", s)
	}
	return out, nil
}

// FormatSize renders a byte count with the largest binary suffix that
// divides it (65536 -> "64K").
func FormatSize(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%dG", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dM", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dK", n>>10)
	}
	return strconv.FormatInt(n, 10)
}

// Unit is a throughput report unit, as Mooncake's --report_unit.
type Unit struct {
	Name    string
	Divisor float64 // bytes per second are divided by this
}

var units = []Unit{
	{"GB", 1e9}, {"GiB", 1 << 30}, {"Gb", 1e9 / 8},
	{"MB", 1e6}, {"MiB", 1 << 20}, {"Mb", 1e6 / 8},
	{"KB", 1e3}, {"KiB", 1 << 10}, {"Kb", 1e3 / 8},
}

// UnitNames lists the accepted report units.
func UnitNames() []string {
	out := make([]string, len(units))
	for i, u := range units {
		out[i] = u.Name
	}
	return out
}

// ParseUnit returns the unit named s (exact case: Gb is bits, GB bytes).
func ParseUnit(s string) (Unit, error) {
	for _, u := range units {
		if u.Name == s {
			return u, nil
		}
	}
	return Unit{}, fmt.Errorf("report unit %q: want one of %s", s, strings.Join(UnitNames(), ", "))
}

// Per returns bytes/second expressed in u.
func (u Unit) Per(bytesPerSec float64) float64 { return bytesPerSec / u.Divisor }
