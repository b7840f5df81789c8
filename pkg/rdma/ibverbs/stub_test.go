//go:build !ibverbs || !cgo

package ibverbs

import (
	"errors"
	"testing"
)

func TestNotBuilt(t *testing.T) {
	if _, err := New(Options{}); !errors.Is(err, ErrNotBuilt) {
		t.Fatalf("got %v, want ErrNotBuilt", err)
	}
}
