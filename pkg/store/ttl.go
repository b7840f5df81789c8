package store

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ParseTTL reads a duration as mooncake_master's TTL flags take it: a bare
// number counts unit (milliseconds for --default_kv_lease_ttl), or a
// number with a suffix ms, s, m or h.
func ParseTTL(s string, unit time.Duration) (time.Duration, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, fmt.Errorf("empty duration")
	}
	num, mult := t, unit
	for _, u := range []struct {
		suffix string
		d      time.Duration
	}{{"ms", time.Millisecond}, {"s", time.Second}, {"m", time.Minute}, {"h", time.Hour}} {
		if strings.HasSuffix(t, u.suffix) {
			num, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.d
			break
		}
	}
	n, err := strconv.ParseUint(num, 10, 63)
	if err != nil {
		return 0, fmt.Errorf("duration %q: want a whole number, optionally with ms, s, m or h", s)
	}
	if n > uint64(1<<62)/uint64(mult) {
		return 0, fmt.Errorf("duration %q is too long", s)
	}
	return time.Duration(n) * mult, nil
}
