package engine

import "sync/atomic"

// Stats counts the tasks this engine initiated since it started, by
// operation: what an operator graphs as the engine's throughput and its
// failed tasks (mc bench initiator --metrics-listen exports them).
type Stats struct {
	Completed [2]uint64 // tasks completed, indexed by Opcode (Read, Write)
	Failed    [2]uint64 // tasks failed, by Opcode
	Bytes     [2]uint64 // bytes moved, by Opcode (a failed task's partial bytes too)
}

// taskCounters are Stats while they change. One add per finished task:
// nothing next to the per-byte work of a transfer.
type taskCounters struct {
	completed, failed, bytes [2]atomic.Uint64
}

func (c *taskCounters) finish(op Opcode, ok bool, moved uint64) {
	if int(op) >= len(c.bytes) {
		return
	}
	if ok {
		c.completed[op].Add(1)
	} else {
		c.failed[op].Add(1)
	}
	c.bytes[op].Add(moved)
}

// Stats returns the engine's task counts.
func (e *Engine) Stats() Stats {
	var s Stats
	for op := range s.Bytes {
		s.Completed[op] = e.tasks.completed[op].Load()
		s.Failed[op] = e.tasks.failed[op].Load()
		s.Bytes[op] = e.tasks.bytes[op].Load()
	}
	return s
}
