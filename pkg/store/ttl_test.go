package store

import (
	"testing"
	"time"
)

func TestParseTTL(t *testing.T) {
	for _, c := range []struct {
		in   string
		unit time.Duration
		want time.Duration
	}{
		{"10000", time.Millisecond, 10 * time.Second},
		{"250ms", time.Millisecond, 250 * time.Millisecond},
		{"10s", time.Millisecond, 10 * time.Second},
		{"30m", time.Second, 30 * time.Minute},
		{"24h", time.Second, 24 * time.Hour},
		{"30", time.Second, 30 * time.Second},
		{" 5 s", time.Millisecond, 5 * time.Second},
	} {
		got, err := ParseTTL(c.in, c.unit)
		if err != nil || got != c.want {
			t.Errorf("ParseTTL(%q) = %v, %v; want %v", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"", "s", "-5", "1.5s", "10d", "99999999999999999999h", "ten"} {
		if d, err := ParseTTL(bad, time.Millisecond); err == nil {
			t.Errorf("ParseTTL(%q) = %v, want an error", bad, d)
		}
	}
}

func TestUUIDRoundTrip(t *testing.T) {
	u := NewUUID()
	v, err := ParseUUID(u.String())
	if err != nil || v != u {
		t.Fatalf("ParseUUID(%q) = %v, %v", u.String(), v, err)
	}
	for _, bad := range []string{"", "1", "a-b", "1-", "-1"} {
		if _, err := ParseUUID(bad); err == nil {
			t.Errorf("ParseUUID(%q): want an error", bad)
		}
	}
}

func TestCheckKey(t *testing.T) {
	if err := CheckKey("ok"); err != nil {
		t.Fatal(err)
	}
	long := make([]byte, MaxKeyLength+1)
	for i := range long {
		long[i] = 'k'
	}
	for _, bad := range []string{"", string(long), "a\x00b"} {
		if err := CheckKey(bad); CodeOf(err) != InvalidKey {
			t.Errorf("CheckKey(%.20q) = %v, want INVALID_KEY", bad, err)
		}
	}
}
