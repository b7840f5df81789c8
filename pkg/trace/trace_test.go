package trace

import (
	"os"
	"strings"
	"testing"
)

func TestRead(t *testing.T) {
	in := `{"timestamp": 5, "input_length": 600, "output_length": 10, "hash_ids": [0, 1]}

{"timestamp": 0, "input_length": 100, "output_length": 3, "hash_ids": [0]}
{"timestamp": 5, "input_length": 10, "output_length": 1, "hash_ids": [7]}
`
	reqs, err := Read(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 3 || reqs[0].Timestamp != 0 || reqs[1].HashIDs[1] != 1 || reqs[2].HashIDs[0] != 7 {
		t.Fatalf("%+v: want timestamp order, file order within a timestamp", reqs)
	}
	for _, bad := range []struct{ in, want string }{
		{`{"timestamp": -1, "input_length": 1, "output_length": 1, "hash_ids": [1]}`, "negative timestamp"},
		{`{"timestamp": 1, "input_length": 5, "output_length": 1, "hash_ids": []}`, "no hash_ids"},
		{"{\"timestamp\": 1, \"input_length\": 0, \"output_length\": 0, \"hash_ids\": []}\n{oops", "line 2"},
		{`{"timestamp": 1, "input_length": -3, "output_length": 1, "hash_ids": [1]}`, "negative length"},
		// Lengths and times a simulator cannot step through (it ran
		// forever on an output_length of 2^63).
		{`{"timestamp": 0, "input_length": 1, "output_length": 9223372036854775807, "hash_ids": [1]}`, "line 1: length above 16777216 tokens"},
		{`{"timestamp": 0, "input_length": 16777217, "output_length": 1, "hash_ids": [1]}`, "length above 16777216 tokens"},
		{`{"timestamp": 9223372036854775807, "input_length": 1, "output_length": 1, "hash_ids": [1]}`, "timestamp 9223372036854775807: more than"},
		// A line must carry every field: a missing one is not a zero.
		{`{"garbage": 1}`, "line 1: missing required field(s) timestamp, input_length, output_length, hash_ids"},
		{"null", "line 1: missing required field(s) timestamp"},
		{"{\"timestamp\": 0, \"input_length\": 0, \"output_length\": 0, \"hash_ids\": []}\n\n{\"timestamp\": 3, \"input_length\": 0, \"hash_ids\": []}", "line 3: missing required field(s) output_length"},
		{`{"timestamp": 3, "input_length": 0, "output_length": 1, "hash_ids": null}`, "line 1: missing required field(s) hash_ids"},
	} {
		if _, err := Read(strings.NewReader(bad.in)); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("Read(%q) = %v, want an error about %q", bad.in, err, bad.want)
		}
	}
}

// The shared traces parse whole, with the counts their README gives.
func TestSharedTraces(t *testing.T) {
	for name, n := range map[string]int{"conversation_trace.jsonl": 12031, "synthetic_trace.jsonl": 3993} {
		path := "../../../shared/traces/" + name
		if _, err := os.Stat(path); err != nil {
			t.Skipf("shared traces not found at %s (they live beside the repository): %v", path, err)
		}
		reqs, err := ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if len(reqs) != n {
			t.Fatalf("%s: %d requests, want %d", name, len(reqs), n)
		}
		for i, r := range reqs {
			if want := (r.InputLength + BlockTokens - 1) / BlockTokens; len(r.HashIDs) != want {
				t.Fatalf("%s request %d: %d hash ids for %d tokens, want %d", name, i, len(r.HashIDs), r.InputLength, want)
			}
		}
	}
}

func FuzzRead(f *testing.F) {
	f.Add([]byte(`{"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [0, 1]}`))
	f.Add([]byte("{\"timestamp\": 1}\n\n{\"timestamp\": 0, \"hash_ids\": [3]}"))
	f.Add([]byte("{\"timestamp\": 1, \"input_length\": 0, \"output_length\": 0, \"hash_ids\": []}\n\n{\"timestamp\": 0, \"input_length\": 3, \"output_length\": 1, \"hash_ids\": [3]}"))
	f.Add([]byte(`{"timestamp": 9e99}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		reqs, err := Read(strings.NewReader(string(b)))
		if err != nil {
			return
		}
		for i := 1; i < len(reqs); i++ {
			if reqs[i].Timestamp < reqs[i-1].Timestamp {
				t.Fatal("not in timestamp order")
			}
		}
	})
}
