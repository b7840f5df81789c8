package store

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Without puts under way reads run as they come; while they are, one
// at a time, the next starting no earlier than the last one's time
// times (1-share)/share after it ended, and a read whose deadline
// passes while it waits its turn gives up with its context's error.
func TestReadPacer(t *testing.T) {
	ctx := context.Background()
	p := newReadPacer(0.5)
	if p.yielding() {
		t.Fatal("a new pacer yields before any put")
	}
	d1, err := p.acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	d2, err := p.acquire(ctx) // at once: no puts
	if err != nil {
		t.Fatal(err)
	}
	d1()
	d2()
	if p.paced.Load() != 0 {
		t.Fatalf("%d reads paced without puts", p.paced.Load())
	}

	p.writes(time.Hour)
	if !p.yielding() {
		t.Fatal("not yielding after WRITES")
	}
	done, err := p.acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A second read waits for the first's turn.
	short, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel()
	if _, err := p.acquire(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a second read while the first holds the turn: %v, want it to wait until its deadline", err)
	}
	const took = 40 * time.Millisecond
	time.Sleep(took)
	done()
	ended := time.Now()
	done, err = p.acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// share 0.5: a pause as long as the read (at least took).
	if gap := time.Since(ended); gap < took {
		t.Fatalf("the next paced read started %s after the last ended, want at least %s", gap, took)
	}
	done()
	if p.paced.Load() != 3 {
		t.Fatalf("%d reads paced, want 3", p.paced.Load())
	}
	// A pause longer than a read's deadline: it gives up, and hands the
	// turn back.
	p.next = time.Now().Add(time.Hour)
	short2, cancel2 := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel2()
	if _, err := p.acquire(short2); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a read whose deadline ends in the pause: %v", err)
	}
	p.next = time.Time{}
	if done, err = p.acquire(ctx); err != nil {
		t.Fatalf("after a read gave up in the pause: %v (its turn was not handed back)", err)
	}
	done()
}

// A share out of (0, 1] is the default.
func TestReadPacerShare(t *testing.T) {
	for _, s := range []float64{0, -1, 1.5} {
		if p := newReadPacer(s); p.share != DefaultReadShare {
			t.Fatalf("share %v: %v, want %v", s, p.share, DefaultReadShare)
		}
	}
	if p := newReadPacer(1); p.share != 1 {
		t.Fatalf("share 1: %v", p.share)
	}
}
