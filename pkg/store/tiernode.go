package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	pb "github.com/kvcache-ops/mc/pkg/store/storepb"
	"github.com/kvcache-ops/mc/pkg/store/tier"
)

// TierConfig configures a node's disk tier (StartTier).
type TierConfig struct {
	// Dir holds the tier's data files (it must exist and be writable).
	Dir string
	// Capacity bounds the bytes on disk (0: tier.DefaultCapacity).
	Capacity uint64
	// IOConcurrency bounds the disk reads in flight (tier's default 4).
	IOConcurrency int
	// Workers bounds the master's commands handled at once (32): an
	// offload waits for the disk, a load for a read turn.
	Workers int
	Logger  *slog.Logger
}

// TierNode is a node's disk tier attached to the master: it holds an
// Attach stream to the master, writes the objects the master evicts from
// this node's segment to disk (the bytes are local: no network), reads
// disk records back into the segment when the master stages them for a
// get, drops the records the master no longer wants (durably: a dropped
// record is not reported again after a restart), and reports what its
// tier evicted. After a restart it reports its records again; the master
// decides by version which come back.
type TierNode struct {
	c   *Client
	t   *tier.Tier
	log *slog.Logger
	sem chan struct{}

	mu sync.Mutex // one sender on the stream at a time
	st pb.Tier_AttachClient

	stop    chan struct{}
	stopped chan struct{}
	once    sync.Once

	attached                  atomic.Bool
	offloads, loads, failures atomic.Uint64
}

// TierStats is a node's disk tier and what it did for the master.
type TierStats struct {
	tier.Stats
	Attached bool
	// Offloads and Loads count the master's commands done; Failures
	// those that failed (full, not found, I/O).
	Offloads, Loads, Failures uint64
}

// StartTier opens the disk tier of node c (a client contributing a
// segment, talking to an mc master) and attaches it to the master in
// the background, re-attaching after a master restart or failover.
func StartTier(ctx context.Context, c *Client, cfg TierConfig) (*TierNode, error) {
	n, err := OpenTier(cfg)
	if err != nil {
		return nil, err
	}
	if err := n.Attach(c); err != nil {
		n.Close()
		return nil, err
	}
	return n, nil
}

// OpenTier opens a disk tier (locking its directory, scanning its files)
// to be attached to a node later: `mc serve store` opens it before it
// starts anything else, so a bad --ssd-dir fails at once.
func OpenTier(cfg TierConfig) (*TierNode, error) {
	if cfg.Workers <= 0 {
		cfg.Workers = 32
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Capacity == 0 {
		// A directory that cannot be measured fails in Open, naming why.
		cfg.Capacity, _ = tier.DefaultCapacity(cfg.Dir)
	}
	n := &TierNode{log: cfg.Logger, sem: make(chan struct{}, cfg.Workers), stop: make(chan struct{}), stopped: make(chan struct{})}
	t, err := tier.Open(tier.Config{Dir: cfg.Dir, Capacity: cfg.Capacity, IOConcurrency: cfg.IOConcurrency, Logger: cfg.Logger, OnEvict: n.onEvict})
	if err != nil {
		return nil, err
	}
	n.t = t
	return n, nil
}

// Attach attaches the tier to node c and keeps it attached until Close.
func (n *TierNode) Attach(c *Client) error {
	if mem, _ := c.segment(); mem == nil {
		return errors.New("a disk tier needs a segment of this node's (a segment size > 0)")
	}
	if _, ok := c.w.(*grpcWire); !ok {
		return fmt.Errorf("a disk tier needs an mc master; %s is not one", c.cfg.Master)
	}
	if n.c != nil {
		return errors.New("disk tier already attached")
	}
	n.c = c
	go n.run()
	return nil
}

// Tier is the node's disk tier.
func (n *TierNode) Tier() *tier.Tier { return n.t }

// Stats returns the tier's state and the node's command counters.
func (n *TierNode) Stats() TierStats {
	return TierStats{Stats: n.t.Stats(), Attached: n.attached.Load(),
		Offloads: n.offloads.Load(), Loads: n.loads.Load(), Failures: n.failures.Load()}
}

// Close detaches from the master and closes the tier (its records stay
// on disk for the next start).
func (n *TierNode) Close() error {
	n.once.Do(func() { close(n.stop) })
	if n.c != nil {
		<-n.stopped
	}
	return n.t.Close()
}

// run keeps the Attach stream up until Close.
func (n *TierNode) run() {
	defer close(n.stopped)
	backoff := 50 * time.Millisecond
	warned := false
	for {
		t0 := time.Now()
		err := n.session()
		select {
		case <-n.stop:
			return
		default:
		}
		if time.Since(t0) > 5*time.Second {
			backoff, warned = 50*time.Millisecond, false
		}
		if !warned {
			n.log.Warn(fmt.Sprintf("disk tier %s: stream to master %s ended: %v; re-attaching", n.t.Stats().Dir, n.c.cfg.Master, err))
			warned = true
		}
		select {
		case <-n.stop:
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// session runs one Attach stream: the hello with every record on disk,
// then the master's commands, until the stream or the node ends.
func (n *TierNode) session() error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-n.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	st, err := pb.NewTierClient(n.c.w.(*grpcWire).conn).Attach(ctx)
	if err != nil {
		return err
	}
	recs := n.t.Records()
	_, seg := n.c.segment()
	hello := &pb.TierHello{ClientId: UUIDToPB(n.c.id), SegmentId: UUIDToPB(seg.ID), TierId: n.t.ID(),
		Capacity: n.t.Capacity(), Records: make([]*pb.TierRecord, len(recs))}
	for i, r := range recs {
		hello.Records[i] = &pb.TierRecord{Key: r.Key, Size: r.Size, Version: r.Version}
	}
	if err := st.Send(&pb.TierUp{Msg: &pb.TierUp_Hello{Hello: hello}}); err != nil {
		return err
	}
	n.mu.Lock()
	n.st = st
	n.mu.Unlock()
	defer func() {
		n.attached.Store(false)
		n.mu.Lock()
		n.st = nil
		n.mu.Unlock()
	}()
	go n.reportStats(ctx, st)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		down, err := st.Recv()
		if err != nil {
			return err
		}
		n.attached.Store(true)
		// A message's drops in a row share one sync of the drop log; they
		// are done before the next command starts, as one at a time were.
		var drops []tier.Removal
		flush := func() {
			if len(drops) > 0 {
				n.t.RemoveAll(drops)
				drops = drops[:0]
			}
		}
		for _, cmd := range down.GetCommands() {
			if cmd.GetKind() == pb.TierCommand_DROP {
				drops = append(drops, tier.Removal{Key: cmd.GetKey(), Version: cmd.GetVersion()})
				continue
			}
			flush()
			select {
			case n.sem <- struct{}{}:
			case <-ctx.Done():
				return ctx.Err()
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-n.sem }()
				n.send(st, &pb.TierUp{Msg: &pb.TierUp_Result{Result: n.do(ctx, cmd)}})
			}()
		}
		flush()
	}
}

// do runs one OFFLOAD or LOAD against the segment's bytes.
func (n *TierNode) do(ctx context.Context, cmd *pb.TierCommand) *pb.TierResult {
	res := &pb.TierResult{Op: cmd.GetOp()}
	fail := func(code Code, err error) *pb.TierResult {
		n.failures.Add(1)
		res.Code, res.Message = int32(code), err.Error()
		return res
	}
	// The segment as it is now, held registered while the bytes move: a
	// command the master sent for memory since renewed falls outside it
	// (the new memory is elsewhere) and is refused.
	seg, _ := n.c.segment()
	if seg == nil || !seg.Pin() {
		return fail(InvalidParams, fmt.Errorf("range 0x%x+%d: this node's segment is being renewed", cmd.GetAddr(), cmd.GetSize()))
	}
	defer seg.Unpin()
	mem, base := seg.Bytes(), seg.Addr()
	off := cmd.GetAddr() - base
	if cmd.GetAddr() < base || off > uint64(len(mem)) || cmd.GetSize() > uint64(len(mem))-off {
		return fail(InvalidParams, fmt.Errorf("range 0x%x+%d is outside this node's segment 0x%x+%d", cmd.GetAddr(), cmd.GetSize(), base, len(mem)))
	}
	b := mem[off : off+cmd.GetSize()]
	switch cmd.GetKind() {
	case pb.TierCommand_OFFLOAD:
		err := n.t.Write(ctx, cmd.GetKey(), cmd.GetVersion(), b)
		switch {
		case errors.Is(err, tier.ErrFull):
			return fail(NoAvailableHandle, err)
		case err != nil:
			return fail(InternalError, err)
		}
		n.offloads.Add(1)
	case pb.TierCommand_LOAD:
		_, err := n.t.Read(ctx, cmd.GetKey(), cmd.GetVersion(), b)
		switch {
		case errors.Is(err, tier.ErrNotFound):
			return fail(ObjectNotFound, err)
		case err != nil:
			return fail(InternalError, err)
		}
		n.loads.Add(1)
	default:
		return fail(InvalidParams, fmt.Errorf("unknown tier command %v", cmd.GetKind()))
	}
	return res
}

func (n *TierNode) send(st pb.Tier_AttachClient, up *pb.TierUp) {
	n.mu.Lock()
	defer n.mu.Unlock()
	// A failed send ends the stream's Recv too: the session re-attaches.
	_ = st.Send(up)
}

// onEvict tells the master which records the tier evicted (on the
// tier's writer; a lost notice is repaired by the next hello).
func (n *TierNode) onEvict(recs []tier.Record) {
	n.mu.Lock()
	st := n.st
	n.mu.Unlock()
	if st == nil {
		return
	}
	ev := &pb.TierEvicted{Records: make([]*pb.TierRecord, len(recs))}
	for i, r := range recs {
		ev.Records[i] = &pb.TierRecord{Key: r.Key, Size: r.Size, Version: r.Version}
	}
	n.send(st, &pb.TierUp{Msg: &pb.TierUp_Evicted{Evicted: ev}})
}

func (n *TierNode) reportStats(ctx context.Context, st pb.Tier_AttachClient) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		s := n.t.Stats()
		n.send(st, &pb.TierUp{Msg: &pb.TierUp_Stats{Stats: &pb.TierStats{
			Capacity: s.Capacity, Used: s.Used, Records: uint64(s.Records), Files: uint64(s.Files),
			WriteBytes: s.WriteBytes, ReadBytes: s.ReadBytes, EvictedRecords: s.EvictedRecords,
			Dropped: s.Dropped, Full: s.Full, Direct: s.Direct, Dir: s.Dir,
		}}})
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
