package master

// fifo is a first-in first-out queue in fixed-size chunks: a push never
// copies what is queued (a slice that grows copies it all, and the puts
// queue holds every put of the discard window: millions at a high put
// rate), and taking from the front frees whole chunks instead of moving
// the rest down (which cost a copy of the whole queue per maintenance
// tick).
type fifo[T any] struct {
	chunks [][]T
	head   int // index of the front item in chunks[0]
	n      int
	spare  []T // an emptied chunk kept for the next one needed
}

const fifoChunk = 1024

func (q *fifo[T]) len() int { return q.n }

func (q *fifo[T]) push(v T) {
	last := len(q.chunks) - 1
	if last < 0 || len(q.chunks[last]) == fifoChunk {
		c := q.spare
		q.spare = nil
		if c == nil {
			c = make([]T, 0, fifoChunk)
		}
		q.chunks = append(q.chunks, c)
		last++
	}
	q.chunks[last] = append(q.chunks[last], v)
	q.n++
}

// front returns the front item; ok is false when the queue is empty.
func (q *fifo[T]) front() (v T, ok bool) {
	if q.n == 0 {
		return v, false
	}
	return q.chunks[0][q.head], true
}

// pop removes the front item (the queue must not be empty).
func (q *fifo[T]) pop() T {
	c := q.chunks[0]
	v := c[q.head]
	var zero T
	c[q.head] = zero // no pointer kept alive by the queue
	q.head++
	q.n--
	if q.head == len(c) {
		q.chunks[0] = nil
		q.chunks = q.chunks[1:]
		q.head = 0
		if cap(c) == fifoChunk {
			q.spare = c[:0]
		}
		if len(q.chunks) == 0 {
			q.chunks = nil
		}
	}
	return v
}

// takeWhile pops the front items for which keep is true, in order, and
// returns them.
func (q *fifo[T]) takeWhile(keep func(T) bool) []T {
	var out []T
	for {
		v, ok := q.front()
		if !ok || !keep(v) {
			return out
		}
		out = append(out, q.pop())
	}
}
