package kvevents

import "strconv"

// ParseSeqHash reads a block hash out of an object key as Mooncake's
// ParseSeqHashFromObjectKey does (std::stoull over the whole key): a
// decimal u64, or hex after a leading 0x/0X. Like stoull it skips leading
// C-locale white space and takes a sign, a minus wrapping modulo 2^64
// ("-1" is 18446744073709551615), and refuses anything left over or out
// of range. Anything else is no hash: the event then carries the
// object_key alone.
func ParseSeqHash(key string) (uint64, bool) {
	if key == "" {
		return 0, false
	}
	if len(key) >= 2 && key[0] == '0' && (key[1] == 'x' || key[1] == 'X') {
		// strtoull(base 16) takes the 0x itself; "0x" with no digit
		// after it stops at the x, which leaves the key unconsumed.
		v, err := strconv.ParseUint(key[2:], 16, 64)
		if err != nil || !allHex(key[2:]) {
			return 0, false
		}
		return v, true
	}
	s := key
	for len(s) > 0 && isCSpace(s[0]) {
		s = s[1:]
	}
	neg := false
	if len(s) > 0 && (s[0] == '+' || s[0] == '-') {
		neg = s[0] == '-'
		s = s[1:]
	}
	if s == "" || !allDigits(s) {
		return 0, false
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, false
	}
	if neg {
		v = -v
	}
	return v, true
}

func isCSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

func allHex(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return false
		}
	}
	return true
}
