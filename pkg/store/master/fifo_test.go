package master

import "testing"

// The queue keeps order across chunk boundaries while items are pushed
// and taken in interleaved runs, and takeWhile stops at the first item it
// must keep.
func TestFifoOrder(t *testing.T) {
	var q fifo[int]
	next, want := 0, 0
	for round := range 50 {
		for range round * 97 % 3001 {
			q.push(next)
			next++
		}
		limit := want + round*61%2500
		got := q.takeWhile(func(v int) bool { return v < limit })
		for _, v := range got {
			if v != want {
				t.Fatalf("round %d: took %d, want %d", round, v, want)
			}
			want++
		}
		if q.len() != next-want {
			t.Fatalf("round %d: len %d, want %d", round, q.len(), next-want)
		}
		if v, ok := q.front(); ok && (v != want || v < limit && v < next) {
			t.Fatalf("round %d: front %d, want %d (limit %d)", round, v, want, limit)
		}
	}
	for q.len() > 0 {
		if v := q.pop(); v != want {
			t.Fatalf("pop %d, want %d", v, want)
		}
		want++
	}
	if _, ok := q.front(); ok || want != next || len(q.chunks) != 0 {
		t.Fatalf("drained: front ok %v, popped %d of %d, %d chunks left", ok, want, next, len(q.chunks))
	}
}

// Popped slots are cleared: the queue keeps no object alive.
func TestFifoClearsPopped(t *testing.T) {
	var q fifo[*Object]
	for range fifoChunk + 10 {
		q.push(&Object{})
	}
	first := q.chunks[0]
	for range 5 {
		q.pop()
	}
	for i := range 5 {
		if first[i] != nil {
			t.Fatalf("slot %d still points at a popped object", i)
		}
	}
}
