package budget

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestBudget(t *testing.T) {
	b := New(100, "--request-budget")
	n, err := b.TryAcquire(60)
	if err != nil || n != 60 {
		t.Fatalf("TryAcquire(60) = %d, %v", n, err)
	}
	if _, err := b.TryAcquire(50); !errors.Is(err, ErrExhausted) || !strings.Contains(err.Error(), "--request-budget") || !strings.Contains(err.Error(), "100-byte budget") {
		t.Fatalf("TryAcquire over the budget: %v, want ErrExhausted naming the budget", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := b.Acquire(ctx, 50); !errors.Is(err, ErrExhausted) {
		t.Fatalf("Acquire that waits out its context: %v", err)
	}
	b.Release(n)
	// One request larger than the budget runs alone rather than never.
	if n, err := b.TryAcquire(1000); err != nil || n != 100 {
		t.Fatalf("TryAcquire(1000) = %d, %v; want the whole budget", n, err)
	}
	b.Release(100)
	var unlimited *Budget
	if n, err := unlimited.TryAcquire(1 << 40); n != 0 || err != nil || New(-1, "").Limit() != 0 {
		t.Fatalf("nil budget: %d %v", n, err)
	}
}
