// Package units reads the sizes and durations mc takes on its command line,
// from its environment and from its config files, so that every flag
// accepts the same forms and refuses a bad value with the same message.
//
// Sizes follow Mooncake (mooncake_client's --global_segment_size "4 GB"):
// a number of bytes, optionally with a unit K, M, G, T or P, with or
// without B, case-insensitive, after an optional space. Every unit is a
// power of 1024, as in Mooncake, and KiB, MiB, GiB... mean the same. A
// decimal number is accepted when it makes whole bytes ("1.5G").
//
// Durations are a bare number of a unit the flag chooses (seconds for
// most, as transfer_engine_bench's --duration; milliseconds for
// mooncake_master's TTL flags) or a Go duration ("500ms", "2m", "1h30m").
package units

import (
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
	"time"
)

// SizeForms is what a size may look like, for help text and errors.
const SizeForms = `4096, 4K, 4KB, 4KiB or "4 GB" (K, M, G, T = powers of 1024)`

// sizeUnits maps a lower-cased unit to its multiplier.
var sizeUnits = map[string]int64{
	"": 1, "b": 1,
	"k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10,
	"m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
	"g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30,
	"t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40,
	"p": 1 << 50, "pb": 1 << 50, "pib": 1 << 50,
}

// ParseSize reads a byte count (see the package doc). It refuses an empty
// value, a negative one, an unknown unit, a fraction of a byte and
// anything above math.MaxInt64.
func ParseSize(s string) (int64, error) {
	num, unit, err := splitNumber(s)
	if err != nil {
		return 0, fmt.Errorf("%v; want a size: %s", err, SizeForms)
	}
	mult, ok := sizeUnits[strings.ToLower(unit)]
	if !ok {
		return 0, fmt.Errorf("unknown unit %q; want a size: %s", unit, SizeForms)
	}
	n, ok := new(big.Rat).SetString(num)
	if !ok {
		return 0, fmt.Errorf("not a number; want a size: %s", SizeForms)
	}
	n.Mul(n, new(big.Rat).SetInt64(mult))
	if !n.IsInt() {
		return 0, fmt.Errorf("not a whole number of bytes; want a size: %s", SizeForms)
	}
	if !n.Num().IsInt64() {
		return 0, fmt.Errorf("too large: the largest size is %d bytes (8 EiB - 1)", int64(math.MaxInt64))
	}
	return n.Num().Int64(), nil
}

// ParseSizeList reads a comma-separated list of sizes ("4K,64K,1M").
func ParseSizeList(s string) ([]int64, error) {
	if strings.TrimSpace(s) == "" {
		return nil, fmt.Errorf("empty list; want sizes separated by commas, each %s", SizeForms)
	}
	var out []int64
	for i, f := range strings.Split(s, ",") {
		if strings.TrimSpace(f) == "" {
			// "4K,,8K" is a size left out more often than a stray comma:
			// refused, not run as 4K,8K.
			return nil, fmt.Errorf("item %d of %q is empty; want sizes separated by commas, each %s", i+1, s, SizeForms)
		}
		n, err := ParseSize(f)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", strings.TrimSpace(f), err)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("empty list; want sizes separated by commas, each %s", SizeForms)
	}
	return out, nil
}

// FormatSize writes n with the largest binary unit that divides it
// (65536 -> "64K"), in a form ParseSize reads back.
func FormatSize(n int64) string {
	for _, u := range []struct {
		suffix string
		shift  uint
	}{{"P", 50}, {"T", 40}, {"G", 30}, {"M", 20}, {"K", 10}} {
		if m := int64(1) << u.shift; n >= m && n%m == 0 {
			return strconv.FormatInt(n/m, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10)
}

// FormatSizes writes a list as ParseSizeList reads it.
func FormatSizes(ns []int64) string {
	parts := make([]string, len(ns))
	for i, n := range ns {
		parts[i] = FormatSize(n)
	}
	return strings.Join(parts, ",")
}

// splitNumber splits s into a plain decimal number (digits, optionally a
// point and more digits) and what follows it after optional blanks.
func splitNumber(s string) (num, rest string, err error) {
	t := strings.TrimSpace(s)
	switch {
	case t == "":
		return "", "", fmt.Errorf("empty")
	case t[0] == '-':
		return "", "", fmt.Errorf("negative")
	}
	i := digits(t, 0)
	if i == 0 {
		return "", "", fmt.Errorf("not a number")
	}
	if i < len(t) && t[i] == '.' {
		j := digits(t, i+1)
		if j == i+1 {
			return "", "", fmt.Errorf("not a number")
		}
		i = j
	}
	return t[:i], strings.TrimLeft(t[i:], " \t"), nil
}

// digits returns the index of the first non-digit of s at or after i.
func digits(s string, i int) int {
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return i
}

// DurationForms is what a duration whose bare numbers count bare may look
// like, for help text and errors.
func DurationForms(bare time.Duration) string {
	switch bare {
	case time.Second:
		return "seconds (10, 0.5) or a Go duration (500ms, 2m, 1h30m)"
	case time.Millisecond:
		return "milliseconds (10000) or a Go duration (10s, 2m, 1h30m)"
	}
	return fmt.Sprintf("a number of %s or a Go duration (500ms, 2m, 1h30m)", bare)
}

// durationUnits are Go's duration units.
var durationUnits = map[string]bool{"ns": true, "us": true, "µs": true, "μs": true, "ms": true, "s": true, "m": true, "h": true}

// ParseDuration reads a duration: a bare number counts units of bare
// ("10" is 10 s with bare = time.Second), anything else is a Go duration,
// unit letters in any case, blanks allowed between the parts ("5 s",
// "1h 30m"). It refuses an empty value, a negative one, an unknown unit and
// anything longer than time.Duration holds.
func ParseDuration(s string, bare time.Duration) (time.Duration, error) {
	forms := DurationForms(bare)
	num, rest, err := splitNumber(s)
	if err != nil {
		return 0, fmt.Errorf("%v; want %s", err, forms)
	}
	if rest == "" {
		n, _ := new(big.Rat).SetString(num)
		n.Mul(n, new(big.Rat).SetInt64(int64(bare)))
		// Whole nanoseconds: a bare 0.0000000001 s is 0.
		q := new(big.Int).Quo(n.Num(), n.Denom())
		if !q.IsInt64() {
			return 0, fmt.Errorf("too long: the longest duration is %s", time.Duration(math.MaxInt64))
		}
		return time.Duration(q.Int64()), nil
	}
	// Go's syntax, lower-cased, checked here token by token so that the
	// error says which part is wrong; then time.ParseDuration does the
	// arithmetic and only overflow is left for it to refuse.
	t := strings.Join(strings.Fields(strings.ToLower(num+rest)), "")
	for i := 0; i < len(t); {
		j := digits(t, i)
		if j < len(t) && t[j] == '.' {
			j = digits(t, j+1)
		}
		if j == i {
			return 0, fmt.Errorf("not a duration; want %s", forms)
		}
		k := j
		for k < len(t) && (t[k] < '0' || t[k] > '9') && t[k] != '.' {
			k++
		}
		if !durationUnits[t[j:k]] {
			if j == k {
				return 0, fmt.Errorf("not a duration: a unit is missing; want %s", forms)
			}
			return 0, fmt.Errorf("unknown unit %q; want %s", t[j:k], forms)
		}
		i = k
	}
	d, err := time.ParseDuration(t)
	if err != nil {
		return 0, fmt.Errorf("too long: the longest duration is %s", time.Duration(math.MaxInt64))
	}
	return d, nil
}
