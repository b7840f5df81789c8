package topo

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The example of topology.md, as Mooncake writes and reads it.
const mooncakeExample = `{
  "cpu:0":  [["mlx5_0", "mlx5_1"], ["mlx5_2", "mlx5_3"]],
  "cpu:1":  [["mlx5_2", "mlx5_3"], ["mlx5_0", "mlx5_1"]],
  "cuda:0": [["mlx5_0"], ["mlx5_1", "mlx5_2", "mlx5_3"]]
}`

func TestParseMatrixMooncakeExample(t *testing.T) {
	m, err := ParseMatrix([]byte(mooncakeExample))
	if err != nil {
		t.Fatal(err)
	}
	want := Matrix{
		"cpu:0":  {Preferred: []string{"mlx5_0", "mlx5_1"}, Accessible: []string{"mlx5_2", "mlx5_3"}},
		"cpu:1":  {Preferred: []string{"mlx5_2", "mlx5_3"}, Accessible: []string{"mlx5_0", "mlx5_1"}},
		"cuda:0": {Preferred: []string{"mlx5_0"}, Accessible: []string{"mlx5_1", "mlx5_2", "mlx5_3"}},
	}
	if !matrixEqual(m, want) {
		t.Fatalf("parsed %v, want %v", m, want)
	}
	// Round trip through both encoders.
	file, err := m.MarshalFile()
	if err != nil {
		t.Fatal(err)
	}
	const wantFile = `{
  "cpu:0": [["mlx5_0", "mlx5_1"], ["mlx5_2", "mlx5_3"]],
  "cpu:1": [["mlx5_2", "mlx5_3"], ["mlx5_0", "mlx5_1"]],
  "cuda:0": [["mlx5_0"], ["mlx5_1", "mlx5_2", "mlx5_3"]]
}
`
	if string(file) != wantFile {
		t.Errorf("MarshalFile:\n%s\nwant:\n%s", file, wantFile)
	}
	j, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	const wantJSON = `{"cpu:0":[["mlx5_0","mlx5_1"],["mlx5_2","mlx5_3"]],"cpu:1":[["mlx5_2","mlx5_3"],["mlx5_0","mlx5_1"]],"cuda:0":[["mlx5_0"],["mlx5_1","mlx5_2","mlx5_3"]]}`
	if string(j) != wantJSON {
		t.Errorf("json.Marshal = %s", j)
	}
	for _, b := range [][]byte{file, j} {
		back, err := ParseMatrix(b)
		if err != nil || !matrixEqual(back, m) {
			t.Errorf("round trip of %s: %v, %v", b, back, err)
		}
	}
}

func TestParseMatrixRejects(t *testing.T) {
	cases := map[string]string{
		`{"cpu:0": [["mlx5_0"]]}`:                 `key "cpu:0": want exactly two lists (preferred, accessible), got 1`,
		`{"cpu:0": [[], [], []]}`:                 `key "cpu:0": want exactly two lists`,
		`{"cpu:0": [[], []], "cuda:1": "mlx5_0"}`: `key "cuda:1": want [[preferred...], [accessible...]]`,
		`{"cuda:1": {"preferred": []}}`:           `key "cuda:1"`,
		`{"cuda:1": null}`:                        `key "cuda:1"`,
		`{"cuda:1": [["mlx5_0", 3], []]}`:         `key "cuda:1": preferred list: want a list of NIC names`,
		`{"cuda:1": [[], "mlx5_0"]}`:              `key "cuda:1": accessible list`,
		`{"cuda:1": [null, []]}`:                  `key "cuda:1": preferred list`,
		`{"cuda:1": [[""], []]}`:                  `key "cuda:1": preferred list: NIC name 0 is empty`,
		`{"": [[], []]}`:                          `empty location key`,
		`[["mlx5_0"], []]`:                        `want a JSON object`,
		`null`:                                    `want a JSON object`,
		`{"cpu:0": [[], []]} {}`:                  `trailing data`,
		`{"cpu:0": [[], []]`:                      `unexpected EOF`,
		``:                                        `EOF`,
	}
	for in, want := range cases {
		_, err := ParseMatrix([]byte(in))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseMatrix(%q) err = %v, want it to contain %q", in, err, want)
		}
		if err != nil && !strings.HasPrefix(err.Error(), "parse priority matrix: ") {
			t.Errorf("ParseMatrix(%q) err = %v, want the operation named", in, err)
		}
	}
}

// A segment descriptor embeds the matrix; its errors name the key too,
// and null means no matrix.
func TestMatrixEmbedded(t *testing.T) {
	var seg struct {
		PriorityMatrix Matrix `json:"priority_matrix,omitempty"`
	}
	err := json.Unmarshal([]byte(`{"priority_matrix": {"cpu:0": [["a"]]}}`), &seg)
	if err == nil || !strings.Contains(err.Error(), `key "cpu:0"`) {
		t.Errorf("err = %v", err)
	}
	seg.PriorityMatrix = nil
	if err := json.Unmarshal([]byte(`{"priority_matrix": null}`), &seg); err != nil || seg.PriorityMatrix != nil {
		t.Errorf("null: %v %v", seg.PriorityMatrix, err)
	}
	if err := json.Unmarshal([]byte(`{"priority_matrix": `+mooncakeExample+`}`), &seg); err != nil || len(seg.PriorityMatrix) != 3 {
		t.Errorf("example: %v %v", seg.PriorityMatrix, err)
	}
	out, err := json.Marshal(struct {
		M Matrix `json:"m,omitempty"`
	}{Matrix{"cpu:0": {}}})
	if err != nil || string(out) != `{"m":{"cpu:0":[[],[]]}}` {
		t.Errorf("nil lists marshal as %s, %v; want [] (Mooncake loads arrays)", out, err)
	}
}

func TestMatrixNICsCountOnce(t *testing.T) {
	m, err := ParseMatrix([]byte(`{
		"cpu:0": [["mlx5_10", "mlx5_2"], ["mlx5_2", "mlx5_1"]],
		"cuda:0": [["mlx5_1", "mlx5_1"], ["mlx5_10"]]
	}`))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := m.NICs(), []string{"mlx5_1", "mlx5_2", "mlx5_10"}; !slices.Equal(got, want) {
		t.Errorf("NICs() = %v, want %v", got, want)
	}
	// Parsing keeps the file as written (Mooncake reads it so).
	if got := m["cuda:0"].Preferred; !slices.Equal(got, []string{"mlx5_1", "mlx5_1"}) {
		t.Errorf("preferred = %v", got)
	}
}

func TestMatrixLocationsNatural(t *testing.T) {
	m := Matrix{"cuda:10": {}, "cuda:2": {}, "cpu:1": {}, "cpu:0": {}, "hip:0": {}}
	if got, want := m.Locations(), []string{"cpu:0", "cpu:1", "cuda:2", "cuda:10", "hip:0"}; !slices.Equal(got, want) {
		t.Errorf("Locations() = %v, want %v", got, want)
	}
}

func TestMarshalFileEmpty(t *testing.T) {
	b, err := Matrix{}.MarshalFile()
	if err != nil || string(b) != "{}\n" {
		t.Errorf("empty = %q, %v", b, err)
	}
	b, _ = Matrix(nil).MarshalFile()
	if string(b) != "{}\n" {
		t.Errorf("nil = %q", b)
	}
}

func TestReadMatrixFile(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "m.json")
	if err := os.WriteFile(good, []byte(mooncakeExample), 0o644); err != nil {
		t.Fatal(err)
	}
	if m, err := ReadMatrixFile(good); err != nil || len(m) != 3 {
		t.Errorf("ReadMatrixFile = %v, %v", m, err)
	}
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"cuda:0": [[]]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadMatrixFile(bad); err == nil || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), `"cuda:0"`) {
		t.Errorf("bad file err = %v", err)
	}
	if _, err := ReadMatrixFile(filepath.Join(dir, "missing")); err == nil {
		t.Error("missing file accepted")
	}
}

func FuzzParseMatrix(f *testing.F) {
	f.Add([]byte(mooncakeExample))
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"cpu:0": [["a\",\"b"], ["c"]]}`))
	f.Add([]byte(`{"cpu:0": [[], []], "cuda:1": [["x"]]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseMatrix(data)
		if err != nil {
			return
		}
		// Whatever parses must survive both encoders unchanged.
		file, err := m.MarshalFile()
		if err != nil {
			t.Fatalf("MarshalFile: %v", err)
		}
		back, err := ParseMatrix(file)
		if err != nil {
			t.Fatalf("MarshalFile output does not parse: %v\n%s", err, file)
		}
		if !matrixEqual(back, m) {
			t.Fatalf("MarshalFile round trip: %v != %v", back, m)
		}
		j, err := json.Marshal(m)
		if err != nil {
			t.Fatalf("Marshal: %v", err)
		}
		back, err = ParseMatrix(j)
		if err != nil || !matrixEqual(back, m) {
			t.Fatalf("json round trip: %v, %v", back, err)
		}
		for _, n := range m.NICs() {
			if n == "" {
				t.Fatal("empty NIC name accepted")
			}
		}
	})
}
