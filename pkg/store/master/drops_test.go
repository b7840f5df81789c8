package master

import (
	"slices"
	"testing"
	"time"
)

// A ping is told the drops after the number it carries; its first ping
// none; a number from another master (a restart, an earlier leader) every
// drop still kept; a drop older than dropKeep no more.
func TestDropLogSince(t *testing.T) {
	d := newDropLog()
	now := time.Now()
	first, got := d.since(0, now)
	if got != nil {
		t.Fatalf("first ping told %v, want no drops", got)
	}
	d.add("a:1", now.Add(-2*dropKeep))
	d.add("b:1", now)
	mid, got := d.since(first, now)
	if !slices.Equal(got, []string{"b:1"}) {
		t.Fatalf("since %d: %v, want [b:1] (a:1 is older than dropKeep)", first, got)
	}
	if _, got := d.since(mid, now); got != nil {
		t.Fatalf("since the current number: %v, want none", got)
	}
	d.add("c:1", now)
	if _, got := d.since(mid, now); !slices.Equal(got, []string{"c:1"}) {
		t.Fatalf("since %d: %v, want [c:1]", mid, got)
	}
	if _, got := d.since(mid+1000, now); !slices.Equal(got, []string{"b:1", "c:1"}) {
		t.Fatalf("a number this master never gave: %v, want every kept drop", got)
	}
	for range dropCap + 10 {
		d.add("x", now)
	}
	if _, got := d.since(first-1, now); len(got) != dropCap {
		t.Fatalf("%d drops told, want the log's cap %d", len(got), dropCap)
	}
}
