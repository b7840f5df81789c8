package topo

import (
	"bytes"
	"encoding/json"
	"fmt"
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

// UnmarshalJSON accepts only a two-element array of string arrays.
func (e *Entry) UnmarshalJSON(b []byte) error {
	var raw []json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return fmt.Errorf("want [[preferred...], [accessible...]]: %w", err)
	}
	if len(raw) != 2 {
		return fmt.Errorf("want exactly two lists (preferred, accessible), got %d", len(raw))
	}
	var p, a []string
	if err := json.Unmarshal(raw[0], &p); err != nil {
		return fmt.Errorf("preferred list: %w", err)
	}
	if err := json.Unmarshal(raw[1], &a); err != nil {
		return fmt.Errorf("accessible list: %w", err)
	}
	e.Preferred, e.Accessible = p, a
	return nil
}

// ParseMatrix decodes a priority matrix file. An entry that is not two
// lists of strings is rejected with an error naming its key.
func ParseMatrix(data []byte) (Matrix, error) {
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("parse priority matrix: %w", err)
	}
	if raw == nil {
		return nil, fmt.Errorf("parse priority matrix: want a JSON object")
	}
	keys := make([]string, 0, len(raw))
	for k := range raw {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	m := make(Matrix, len(raw))
	for _, k := range keys {
		var e Entry
		if err := e.UnmarshalJSON(raw[k]); err != nil {
			return nil, fmt.Errorf("parse priority matrix: key %q: %w", k, err)
		}
		m[k] = e
	}
	return m, nil
}
