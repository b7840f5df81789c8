package store

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvcache-ops/mc/pkg/engine"
	pb "github.com/kvcache-ops/mc/pkg/store/storepb"
)

// A node takes part in drain jobs (mc store drain) by keeping one long
// poll open to the master: the master answers with copies to make (a
// range of this node's segment written into a range it allocated on
// another node), the node makes them with its engine as one batch and
// reports the results on its next poll. Bytes never pass through the
// master.

const (
	drainPollWait  = 2 * time.Second
	drainPollBatch = 64
)

// drainTask is one copy the master asks of this node.
type drainTask struct {
	id      uint64
	key     string
	srcAddr uint64
	size    uint64
	dst     Replica
}

// drainWire is the part of a master wire that carries drain tasks: mc's
// gRPC wire has it; Mooncake's masters run their own drain through
// their own clients.
type drainWire interface {
	drainTasks(ctx context.Context, results []*pb.DrainTaskResult, max int, wait time.Duration) ([]drainTask, error)
}

func (w *grpcWire) drainTasks(ctx context.Context, results []*pb.DrainTaskResult, max int, wait time.Duration) ([]drainTask, error) {
	req := &pb.DrainTasksRequest{ClientId: UUIDToPB(w.cfg.id), Results: results, MaxTasks: uint32(max), WaitMs: uint32(wait / time.Millisecond)}
	var resp *pb.DrainTasksResponse
	unimplemented := false
	err := w.call(ctx, "drain tasks", func(ctx context.Context) (err error) {
		resp, err = pb.NewDrainClient(w.conn).Tasks(ctx, req, failFast)
		if status.Code(err) == codes.Unimplemented {
			unimplemented = true
			return nil
		}
		return err
	})
	if unimplemented {
		return nil, errNoDrain
	}
	if err != nil {
		return nil, err
	}
	out := make([]drainTask, 0, len(resp.Tasks))
	for _, t := range resp.Tasks {
		if t.Dst == nil {
			continue
		}
		out = append(out, drainTask{id: t.Id, key: t.Key, srcAddr: t.SrcAddr, size: t.Size, dst: ReplicaFromPB(t.Dst)})
	}
	return out, nil
}

var errNoDrain = fmt.Errorf("the master has no drain service")

// drainLoop serves the master's drain tasks for this node's segment
// until the client closes.
func (c *Client) drainLoop(dw drainWire) {
	defer c.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-c.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	var results []*pb.DrainTaskResult
	wait := min(drainPollWait, c.cfg.RPCTimeout/2)
	for ctx.Err() == nil {
		tasks, err := dw.drainTasks(ctx, results, drainPollBatch, wait)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if err == errNoDrain {
				c.log.Debug("master has no drain service: this node takes no part in drains")
				return
			}
			// Results not delivered are sent again: the master
			// ignores ids it no longer waits for.
			select {
			case <-ctx.Done():
				return
			case <-time.After(200 * time.Millisecond):
			}
			continue
		}
		results = c.runDrainTasks(ctx, tasks)
	}
}

// runDrainTasks makes the copies as one engine batch.
func (c *Client) runDrainTasks(ctx context.Context, tasks []drainTask) []*pb.DrainTaskResult {
	if len(tasks) == 0 {
		return nil
	}
	out := make([]*pb.DrainTaskResult, len(tasks))
	reqs := make([]xfer, 0, len(tasks))
	_, seg := c.segment()
	base, end := seg.Base, seg.Base+seg.Size
	for i, t := range tasks {
		out[i] = &pb.DrainTaskResult{Id: t.id}
		if t.size == 0 || t.srcAddr < base || t.srcAddr+t.size > end || t.srcAddr+t.size < t.srcAddr || t.dst.Len != t.size {
			out[i].Code, out[i].Message = int32(InvalidParams), fmt.Sprintf("copy of %q: %d bytes at 0x%x is not inside this node's segment 0x%x+%d", t.key, t.size, t.srcAddr, base, seg.Size)
			continue
		}
		reqs = append(reqs, xfer{item: i, op: engine.Write, local: t.srcAddr, rep: t.dst})
	}
	failed := c.transfer(ctx, reqs, len(tasks))
	var moved uint64
	for _, x := range reqs {
		if err := failed[x.item]; err != nil {
			out[x.item].Code, out[x.item].Message = int32(CodeOf(err)), err.Error()
			continue
		}
		moved += x.rep.Len
	}
	c.mu.Lock()
	c.stats.DrainCopies += uint64(len(reqs))
	c.stats.DrainBytes += moved
	c.mu.Unlock()
	return out
}
