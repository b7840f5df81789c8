package topotest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestUnpack(t *testing.T) {
	dir := t.TempDir()
	m := "# c\n\nd a/b\nf a/b/x 4: ACTIVE\nf a/raw \"\\x00no newline\"\nf a/empty \nl a/l ../a/b\n"
	if err := Unpack(dir, strings.NewReader(m)); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{"a/b/x": "4: ACTIVE\n", "a/raw": "\x00no newline", "a/empty": "\n", "a/l/x": "4: ACTIVE\n"} {
		b, err := os.ReadFile(filepath.Join(dir, path))
		if err != nil || string(b) != want {
			t.Errorf("%s = %q, %v; want %q", path, b, err, want)
		}
	}
	if target, err := os.Readlink(filepath.Join(dir, "a/l")); err != nil || target != "../a/b" {
		t.Errorf("link target %q, %v: want it kept relative", target, err)
	}
}

func TestUnpackRejects(t *testing.T) {
	for in, want := range map[string]string{
		"x a/b":           `unknown entry kind "x"`,
		"f /etc/passwd x": "bad path",
		"f ../up x":       "bad path",
		"l a/b":           "without a target",
		"f a \"\\q\"":     "bad quoted value",
	} {
		err := Unpack(t.TempDir(), strings.NewReader(in))
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "line 1") {
			t.Errorf("Unpack(%q) = %v, want %q at line 1", in, err, want)
		}
	}
}
