package bench

import (
	"fmt"
	"strings"

	// Aliased: units below is the list of report units.
	sizeunits "github.com/kvcache-ops/mc/pkg/units"
)

// ParseSize parses a positive byte count in the forms every mc flag takes
// (pkg/units: 4096, 4K, 4KiB, "4 GB"; K = 1024).
func ParseSize(s string) (int64, error) {
	n, err := sizeunits.ParseSize(s)
	if err != nil {
		return 0, fmt.Errorf("size %q: %w", s, err)
	}
	if n == 0 {
		return 0, fmt.Errorf("size %q: want more than 0 bytes", s)
	}
	return n, nil
}

// ParseSizeList parses a comma-separated list of positive sizes ("4K,64K,1M").
func ParseSizeList(s string) ([]int64, error) {
	out, err := sizeunits.ParseSizeList(s)
	if err != nil {
		return nil, fmt.Errorf("size list %q: %w", s, err)
	}
	for _, n := range out {
		if n == 0 {
			return nil, fmt.Errorf("size list %q: want sizes of more than 0 bytes", s)
		}
	}
	return out, nil
}

// FormatSize renders a byte count with the largest binary suffix that
// divides it (65536 -> "64K").
func FormatSize(n int64) string { return sizeunits.FormatSize(n) }

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
