package topo

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
)

// Matrix is Mooncake's NIC priority matrix: for each memory location
// ("cpu:0", "cuda:3", "hip:1") the NICs to prefer and the NICs that are
// still usable when the preferred ones fail. It marshals to exactly the
// JSON Mooncake loads with --nic_priority_matrix (keys sorted).
type Matrix map[string]Entry

// Entry is one location's value in the matrix: two lists, preferred first.
type Entry struct {
	Preferred  []string
	Accessible []string
}

// MarshalJSON writes the entry as Mooncake's two-element array. Nil lists
// are written as [] because Mooncake's loader expects arrays, not null.
func (e Entry) MarshalJSON() ([]byte, error) {
	p, a := e.Preferred, e.Accessible
	if p == nil {
		p = []string{}
	}
	if a == nil {
		a = []string{}
	}
	return json.Marshal([2][]string{p, a})
}

// UnmarshalJSON accepts only a two-element array of lists of NIC names.
func (e *Entry) UnmarshalJSON(b []byte) error {
	var raw []json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil || raw == nil {
		return fmt.Errorf("want [[preferred...], [accessible...]], got %s", excerpt(b))
	}
	if len(raw) != 2 {
		return fmt.Errorf("want exactly two lists (preferred, accessible), got %d", len(raw))
	}
	p, err := nicList(raw[0])
	if err != nil {
		return fmt.Errorf("preferred list: %w", err)
	}
	a, err := nicList(raw[1])
	if err != nil {
		return fmt.Errorf("accessible list: %w", err)
	}
	e.Preferred, e.Accessible = p, a
	return nil
}

func nicList(b json.RawMessage) ([]string, error) {
	var l []string
	if err := json.Unmarshal(b, &l); err != nil || l == nil {
		return nil, fmt.Errorf("want a list of NIC names, got %s", excerpt(b))
	}
	for i, n := range l {
		if n == "" {
			return nil, fmt.Errorf("NIC name %d is empty", i)
		}
	}
	return l, nil
}

// excerpt quotes the start of a bad value for an error message.
func excerpt(b []byte) string {
	b = bytes.TrimSpace(b)
	if len(b) > 40 {
		return fmt.Sprintf("%q...", b[:40])
	}
	return fmt.Sprintf("%q", b)
}

// UnmarshalJSON decodes a matrix embedded in a larger document (a segment
// descriptor's priority_matrix) with the same checks as ParseMatrix, so the
// error names the bad key. null leaves the matrix unset.
func (m *Matrix) UnmarshalJSON(b []byte) error {
	if bytes.Equal(bytes.TrimSpace(b), []byte("null")) {
		return nil
	}
	d, err := decodeMatrix(b)
	if err != nil {
		return err
	}
	*m = d
	return nil
}

// ParseMatrix decodes a priority matrix file. An entry that is not two
// lists of NIC names is rejected with an error naming its key.
func ParseMatrix(data []byte) (Matrix, error) {
	m, err := decodeMatrix(data)
	if err != nil {
		return nil, fmt.Errorf("parse priority matrix: %w", err)
	}
	return m, nil
}

// ReadMatrixFile reads a --nic_priority_matrix file.
func ReadMatrixFile(path string) (Matrix, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read priority matrix: %w", err)
	}
	m, err := ParseMatrix(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return m, nil
}

var errNotObject = errors.New("want a JSON object of location: [[preferred...], [accessible...]]")

func decodeMatrix(data []byte) (Matrix, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	var raw map[string]json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		var ute *json.UnmarshalTypeError
		if errors.As(err, &ute) {
			return nil, fmt.Errorf("%w, got %s", errNotObject, ute.Value)
		}
		return nil, err
	}
	if raw == nil {
		return nil, fmt.Errorf("%w, got null", errNotObject)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("trailing data after the matrix object")
	}
	keys := make([]string, 0, len(raw))
	for k := range raw {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	m := make(Matrix, len(raw))
	for _, k := range keys {
		if k == "" {
			return nil, errors.New("empty location key")
		}
		var e Entry
		if err := e.UnmarshalJSON(raw[k]); err != nil {
			return nil, fmt.Errorf("key %q: %w", k, err)
		}
		m[k] = e
	}
	return m, nil
}

// NICs lists every NIC the matrix names, once, in natural order (mlx5_2
// before mlx5_10). A NIC named in several lists counts once.
func (m Matrix) NICs() []string {
	seen := map[string]bool{}
	var names []string
	for _, e := range m {
		for _, l := range [2][]string{e.Preferred, e.Accessible} {
			for _, n := range l {
				if !seen[n] {
					seen[n] = true
					names = append(names, n)
				}
			}
		}
	}
	slices.SortFunc(names, cmpNatural)
	return names
}

// Locations lists the keys in natural order (cuda:2 before cuda:10).
func (m Matrix) Locations() []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, cmpNatural)
	return keys
}

// MarshalFile writes the matrix as a --nic_priority_matrix file: one
// location per line, keys sorted as encoding/json and Mooncake's jsoncpp
// sort them, a trailing newline.
func (m Matrix) MarshalFile() ([]byte, error) {
	if len(m) == 0 {
		return []byte("{}\n"), nil
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b bytes.Buffer
	b.WriteString("{\n")
	for i, k := range keys {
		kb, err := json.Marshal(k)
		if err != nil {
			return nil, err
		}
		e := m[k]
		p, err := listJSON(e.Preferred)
		if err != nil {
			return nil, err
		}
		a, err := listJSON(e.Accessible)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(&b, "  %s: [%s, %s]", kb, p, a)
		if i < len(keys)-1 {
			b.WriteByte(',')
		}
		b.WriteByte('\n')
	}
	b.WriteString("}\n")
	return b.Bytes(), nil
}

// listJSON writes ["a", "b"]: the spaced style of Mooncake's examples.
func listJSON(l []string) ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('[')
	for i, n := range l {
		if i > 0 {
			b.WriteString(", ")
		}
		q, err := json.Marshal(n)
		if err != nil {
			return nil, err
		}
		b.Write(q)
	}
	b.WriteByte(']')
	return b.Bytes(), nil
}
