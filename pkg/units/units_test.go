package units

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{
		"0":                   0,
		"4096":                4096,
		"4K":                  4 << 10,
		"4k":                  4 << 10,
		"4KB":                 4 << 10,
		"4kb":                 4 << 10,
		"4KiB":                4 << 10,
		"4kib":                4 << 10,
		"4 GB":                4 << 30, // mooncake_client's --global_segment_size "4 GB"
		"512 MB":              512 << 20,
		" 16G ":               16 << 30,
		"1\tT":                1 << 40,
		"2PiB":                2 << 50,
		"1.5G":                3 << 29,
		"0.5 KB":              512,
		"100B":                100,
		"100 b":               100,
		"007":                 7,
		"8191P":               8191 << 50,
		"9223372036854775807": math.MaxInt64,
	} {
		got, err := ParseSize(in)
		if err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
}

func TestParseSizeRefuses(t *testing.T) {
	for in, why := range map[string]string{
		"":                                  "empty",
		"   ":                               "empty",
		"-4K":                               "negative",
		"- 4K":                              "negative",
		"K":                                 "not a number",
		".5K":                               "not a number",
		"1.K":                               "not a number",
		"+4K":                               "not a number",
		"four":                              "not a number",
		"4 GBs":                             `unknown unit "GBs"`,
		"4X":                                `unknown unit "X"`,
		"4 G B":                             `unknown unit "G B"`,
		"1e3":                               `unknown unit "e3"`,
		"0x10":                              `unknown unit "x10"`,
		"4K,8K":                             `unknown unit "K,8K"`,
		"1.1":                               "not a whole number of bytes",
		"0.1K":                              "not a whole number of bytes",
		"8192P":                             "too large",
		"9223372036854775808":               "too large",
		"99999999999999999999999999999999T": "too large",
	} {
		got, err := ParseSize(in)
		if err == nil {
			t.Errorf("ParseSize(%q) = %d, want an error", in, got)
			continue
		}
		if !strings.HasPrefix(err.Error(), why) {
			t.Errorf("ParseSize(%q): %q, want it to start %q", in, err, why)
		}
		// Every refusal but overflow says what is accepted.
		if why != "too large" && !strings.Contains(err.Error(), SizeForms) {
			t.Errorf("ParseSize(%q): %q does not give the accepted forms", in, err)
		}
	}
}

func TestParseSizeList(t *testing.T) {
	got, err := ParseSizeList("4K, 64KiB, 1 MB")
	if err != nil || len(got) != 3 || got[0] != 4096 || got[1] != 65536 || got[2] != 1<<20 {
		t.Fatalf("ParseSizeList = %v, %v", got, err)
	}
	for _, s := range []string{"", " ", " , ", "4K,,8K", "4K,", ",4K"} {
		if got, err := ParseSizeList(s); err == nil {
			t.Errorf("ParseSizeList(%q) = %v: an empty item accepted", s, got)
		}
	}
	if _, err := ParseSizeList("4K,,8K"); err == nil || !strings.Contains(err.Error(), "item 2") {
		t.Errorf("4K,,8K: %v, want the empty item named", err)
	}
	if _, err := ParseSizeList("4K,lots"); err == nil || !strings.HasPrefix(err.Error(), `"lots": not a number`) {
		t.Errorf("bad element: %v", err)
	}
}

func TestFormatSizeReadsBack(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 1000: "1000", 4096: "4K", 3 << 29: "1536M", 1 << 30: "1G", 5 << 40: "5T", 1 << 50: "1P", math.MaxInt64: "9223372036854775807"} {
		if got := FormatSize(n); got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", n, got, want)
		}
		if back, err := ParseSize(FormatSize(n)); err != nil || back != n {
			t.Errorf("ParseSize(FormatSize(%d)) = %d, %v", n, back, err)
		}
	}
	if got := FormatSizes([]int64{4096, 1 << 20}); got != "4K,1M" {
		t.Errorf("FormatSizes = %q", got)
	}
}

func TestParseDuration(t *testing.T) {
	for _, c := range []struct {
		in   string
		bare time.Duration
		want time.Duration
	}{
		{"5", time.Second, 5 * time.Second}, // transfer_engine_bench's --duration 5
		{"0", time.Second, 0},
		{"0.5", time.Second, 500 * time.Millisecond},
		{"10000", time.Millisecond, 10 * time.Second}, // mooncake_master's --default_kv_lease_ttl
		{"500ms", time.Second, 500 * time.Millisecond},
		{"2m", time.Second, 2 * time.Minute},
		{"1h30m", time.Second, 90 * time.Minute},
		{"1h 30m", time.Second, 90 * time.Minute},
		{"5 s", time.Millisecond, 5 * time.Second},
		{"10S", time.Second, 10 * time.Second},
		{"250MS", time.Second, 250 * time.Millisecond},
		{"1.5h", time.Second, 90 * time.Minute},
		{"3µs", time.Second, 3 * time.Microsecond},
		{"3us", time.Second, 3 * time.Microsecond},
		{" 24h ", time.Millisecond, 24 * time.Hour},
		{"9223372036", time.Second, 9223372036 * time.Second},
		{"0.0000000001", time.Second, 0},
	} {
		got, err := ParseDuration(c.in, c.bare)
		if err != nil || got != c.want {
			t.Errorf("ParseDuration(%q, %v) = %v, %v; want %v", c.in, c.bare, got, err, c.want)
		}
	}
}

func TestParseDurationRefuses(t *testing.T) {
	for in, why := range map[string]string{
		"":                      "empty",
		"-5":                    "negative",
		"-5s":                   "negative",
		"s":                     "not a number",
		"soon":                  "not a number",
		"+5s":                   "not a number",
		"5x":                    `unknown unit "x"`,
		"10d":                   `unknown unit "d"`,
		"5 sec":                 `unknown unit "sec"`,
		"10 000":                "not a duration: a unit is missing",
		"1h30":                  "not a duration: a unit is missing",
		"1.5.3s":                "not a duration: a unit is missing",
		"1h-5m":                 `unknown unit "h-"`,
		"9223372037":            "too long",
		"3000000h":              "too long",
		"99999999999999999999h": "too long",
	} {
		got, err := ParseDuration(in, time.Second)
		if err == nil {
			t.Errorf("ParseDuration(%q) = %v, want an error", in, got)
			continue
		}
		if !strings.HasPrefix(err.Error(), why) {
			t.Errorf("ParseDuration(%q): %q, want it to start %q", in, err, why)
		}
		if why != "too long" && !strings.Contains(err.Error(), DurationForms(time.Second)) {
			t.Errorf("ParseDuration(%q): %q does not give the accepted forms", in, err)
		}
	}
	if _, err := ParseDuration("x", time.Millisecond); err == nil || !strings.Contains(err.Error(), "milliseconds (10000)") {
		t.Errorf("a millisecond flag's error does not say bare numbers are milliseconds: %v", err)
	}
}

// FuzzParseSize: no input panics, and whatever is accepted is a
// non-negative size that FormatSize writes back to the same value.
func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"4096", "4K", "4 GB", "1.5G", "-1", "8192P", "0.1K", "4 GBs", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseSize(s)
		if err != nil {
			return
		}
		if n < 0 {
			t.Fatalf("ParseSize(%q) = %d", s, n)
		}
		if back, err := ParseSize(FormatSize(n)); err != nil || back != n {
			t.Fatalf("ParseSize(%q) = %d, but FormatSize gives %q -> %d, %v", s, n, FormatSize(n), back, err)
		}
	})
}

// FuzzParseDuration: no input panics, and whatever is accepted is not
// negative and, written as a Go duration, reads back the same.
func FuzzParseDuration(f *testing.F) {
	for _, s := range []string{"10", "0.5", "500ms", "1h 30m", "5 s", "-5s", "10d", "9223372037", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseDuration(s, time.Second)
		if err != nil {
			return
		}
		if d < 0 {
			t.Fatalf("ParseDuration(%q) = %v", s, d)
		}
		if back, err := ParseDuration(d.String(), time.Second); err != nil || back != d {
			t.Fatalf("ParseDuration(%q) = %v, but %q reads back as %v, %v", s, d, d.String(), back, err)
		}
	})
}
