package engine

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/kvcache-ops/mc/pkg/engine/tcp"
)

// Opcode says which way a request moves bytes.
type Opcode uint8

const (
	// Read copies from the segment into local memory.
	Read Opcode = iota
	// Write copies local memory into the segment.
	Write
)

func (o Opcode) String() string {
	if o == Write {
		return "WRITE"
	}
	return "READ"
}

// Request is one transfer, as Mooncake's TransferRequest: Length bytes
// between the local address Source (inside registered memory) and the
// target offset Target, which for a memory segment is the peer's virtual
// address.
type Request struct {
	Op      Opcode
	Source  uint64
	Segment *Segment
	Target  uint64
	Length  uint64
}

// Status is a task's state.
type Status uint32

const (
	// Waiting: submitted, not finished.
	Waiting Status = iota
	// Completed: every byte moved.
	Completed
	// Failed: see TaskStatus.Err.
	Failed
)

func (s Status) String() string {
	switch s {
	case Waiting:
		return "WAITING"
	case Completed:
		return "COMPLETED"
	case Failed:
		return "FAILED"
	}
	return fmt.Sprintf("Status(%d)", uint32(s))
}

// TaskStatus is what GetTaskStatus reports.
type TaskStatus struct {
	Status      Status
	Transferred uint64 // bytes moved (Length once Completed; what did move when Failed)
	Err         error  // the reason, when Failed
}

// Sentinel errors callers branch on.
var (
	ErrBatchFull      = errors.New("batch full")
	ErrBatchPending   = errors.New("batch has tasks still waiting")
	ErrBatchFreed     = errors.New("batch already freed")
	ErrSegmentClosed  = errors.New("segment closed")
	ErrEngineClosed   = errors.New("engine closed")
	ErrInvalidRequest = errors.New("invalid request")
)

// Task is one submitted request. Transports complete it; everyone else
// reads its status through the Batch.
type Task struct {
	op     tcp.Op
	req    Request
	local  *Memory // pinned source/destination
	batch  *Batch
	status atomic.Uint32
	err    error // written before status becomes Failed
	moved  atomic.Uint64
}

// AddTransferred records n more bytes moved: transports that cut a task
// into pieces (RDMA slices) call it per piece, so a task that fails part
// way reports what it did move, as Mooncake's transferred_bytes.
func (t *Task) AddTransferred(n uint64) { t.moved.Add(n) }

// Request returns what was submitted.
func (t *Task) Request() Request { return t.req }

// LocalBytes is the task's local memory (source of a WRITE, destination of
// a READ).
func (t *Task) LocalBytes() []byte { return t.op.Buf }

// Complete ends the task: nil err means every byte moved. Transports call
// it exactly once.
func (t *Task) Complete(err error) {
	if t.local != nil {
		t.local.Release()
		t.local = nil
	}
	b := t.batch
	via := int8(-1)
	if s := t.req.Segment; s != nil {
		via = s.viaIdx
	}
	if err != nil {
		b.e.tasks.finish(t.req.Op, false, t.moved.Load(), via)
		t.err = err
		t.status.Store(uint32(Failed))
	} else {
		b.e.tasks.finish(t.req.Op, true, t.req.Length, via)
		t.status.Store(uint32(Completed))
	}
	if b.pending.Add(-1) == 0 {
		select {
		case b.idle <- struct{}{}:
		default:
		}
	}
}

// OpDone implements tcp.Completer.
func (t *Task) OpDone(err error) { t.Complete(err) }

// Batch is a set of up to capacity tasks, as Mooncake's BatchID: allocate,
// submit, poll (or Wait), free.
type Batch struct {
	tasks   []Task
	n       int
	pending atomic.Int64
	idle    chan struct{} // signalled when pending drops to 0
	freed   bool
	e       *Engine

	scratch [][]*Task // per-transport grouping reused by Submit
}

// AllocateBatch returns a batch with room for capacity tasks.
func (e *Engine) AllocateBatch(capacity int) (*Batch, error) {
	if capacity <= 0 {
		return nil, fmt.Errorf("allocate batch of %d: capacity must be positive", capacity)
	}
	if e.closed.Load() {
		return nil, ErrEngineClosed
	}
	return &Batch{tasks: make([]Task, capacity), idle: make(chan struct{}, 1), e: e}, nil
}

// Len is the number of submitted tasks.
func (b *Batch) Len() int { return b.n }

// Cap is the batch's capacity.
func (b *Batch) Cap() int { return len(b.tasks) }

// Submit adds reqs as tasks and starts them. It returns the index of the
// first new task. A request that is wrong in itself (local range outside
// registered memory, closed segment, target range outside the segment's
// buffers) becomes a FAILED task with the reason; Submit itself fails only
// when the batch has no room (nothing is submitted then).
func (b *Batch) Submit(reqs ...Request) (int, error) {
	if b.freed {
		return 0, ErrBatchFreed
	}
	if b.n+len(reqs) > len(b.tasks) {
		return 0, fmt.Errorf("submit %d requests to a batch holding %d of %d: %w", len(reqs), b.n, len(b.tasks), ErrBatchFull)
	}
	first := b.n
	b.pending.Add(int64(len(reqs)))
	// Group by segment so each transport gets one slice per call.
	var cur *Segment
	var group []*Task
	flush := func() {
		if len(group) > 0 {
			cur.submit(group)
		}
	}
	if b.scratch == nil {
		b.scratch = make([][]*Task, 1)
	}
	group = b.scratch[0][:0]
	for i := range reqs {
		t := &b.tasks[b.n]
		b.n++
		*t = Task{req: reqs[i], batch: b}
		if err := b.e.prepare(t); err != nil {
			t.Complete(err)
			continue
		}
		if t.req.Segment != cur {
			flush()
			group = group[:0]
			cur = t.req.Segment
		}
		group = append(group, t)
	}
	flush()
	clear(group)
	b.scratch[0] = group[:0]
	return first, nil
}

// TaskStatus reports task i.
func (b *Batch) TaskStatus(i int) (TaskStatus, error) {
	if i < 0 || i >= b.n {
		return TaskStatus{}, fmt.Errorf("task %d of a batch with %d submitted: %w", i, b.n, ErrInvalidRequest)
	}
	t := &b.tasks[i]
	switch s := Status(t.status.Load()); s {
	case Completed:
		return TaskStatus{Status: s, Transferred: t.req.Length}, nil
	case Failed:
		return TaskStatus{Status: s, Transferred: t.moved.Load(), Err: t.err}, nil
	default:
		return TaskStatus{Status: s}, nil
	}
}

// Pending is the number of tasks still WAITING.
func (b *Batch) Pending() int { return int(b.pending.Load()) }

// Wait blocks until no task is WAITING or ctx ends (returning ctx's error;
// the tasks keep running and the batch cannot be freed until they end).
// It returns the first failed task's error, wrapped with its index.
func (b *Batch) Wait(ctx context.Context) error {
	for b.pending.Load() > 0 {
		select {
		case <-b.idle:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for i := 0; i < b.n; i++ {
		t := &b.tasks[i]
		if Status(t.status.Load()) == Failed {
			return fmt.Errorf("task %d (%s %d bytes at 0x%x of segment %q): %w", i, t.req.Op, t.req.Length, t.req.Target, t.req.Segment.Name(), t.err)
		}
	}
	return nil
}

// Free releases the batch. It is refused (ErrBatchPending) while a task is
// WAITING, because the transport still writes into the task.
func (b *Batch) Free() error {
	if b.freed {
		return ErrBatchFreed
	}
	if n := b.pending.Load(); n > 0 {
		return fmt.Errorf("free batch: %d tasks: %w", n, ErrBatchPending)
	}
	b.freed = true
	return nil
}

// Reset empties a batch whose tasks have all ended so it can be reused
// without a new allocation (the bench loop does this).
func (b *Batch) Reset() error {
	if n := b.pending.Load(); n > 0 {
		return fmt.Errorf("reset batch: %d tasks: %w", n, ErrBatchPending)
	}
	clear(b.tasks[:b.n])
	b.n = 0
	b.freed = false
	select {
	case <-b.idle:
	default:
	}
	return nil
}

// Transfer submits reqs in a new batch and waits for all of them; ctx
// cancels the wait (the transfers still in flight end on their own
// deadlines).
func (e *Engine) Transfer(ctx context.Context, reqs ...Request) error {
	b, err := e.AllocateBatch(max(len(reqs), 1))
	if err != nil {
		return err
	}
	if _, err := b.Submit(reqs...); err != nil {
		return err
	}
	if err := b.Wait(ctx); err != nil {
		return err
	}
	return b.Free()
}
