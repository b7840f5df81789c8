package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvcache-ops/mc/pkg/connlimit"
	"github.com/kvcache-ops/mc/pkg/engine"
	pb "github.com/kvcache-ops/mc/pkg/store/storepb"
	"github.com/kvcache-ops/mc/pkg/store/tier"
	"google.golang.org/grpc"
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
	// StagingSize is the node's staging pool for disk reads, memory
	// registered with its engine apart from the segment (0:
	// DefaultStagingPool of the segment size). It must fit the host's
	// memory.
	StagingSize uint64
	// ReadShare is the most of the node's time its disk reads take while
	// DRAM puts into its segment are under way (the master says when):
	// then they go one at a time, each followed by a pause (0:
	// DefaultReadShare; 1: one at a time, no pause). The rest of the
	// time they run as they come.
	ReadShare float64
	// ServiceAddress is where the node serves TierRead, the staged reads
	// mc's readers ask it for directly (default: the host of its
	// engine's endpoint, any free port).
	ServiceAddress string
	Logger         *slog.Logger
}

// defaultStagingTTL holds a reader's staged read until the master says
// its --ssd-staging-ttl (master.DefaultStagingTTL).
const defaultStagingTTL = 5 * time.Second

// DefaultStagingPool is a node's staging pool for a segment of segSize
// bytes: a quarter of it, at least 16 MiB and at most Mooncake's
// default offload buffer (1280 MiB).
func DefaultStagingPool(segSize uint64) uint64 {
	return min(max(segSize/4, 16<<20), 1280<<20)
}

// meminfo is where the host's memory is read (tests point it elsewhere).
var meminfo = "/proc/meminfo"

// hostMemory is the host's MemTotal in bytes (0: unknown).
func hostMemory() uint64 {
	b, err := os.ReadFile(meminfo)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
			kb, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}

// checkStagingSize refuses a staging pool the host cannot hold.
func checkStagingSize(size uint64) error {
	if mem := hostMemory(); mem != 0 && size > mem {
		return fmt.Errorf("staging pool of %d bytes (--ssd-staging-size) is more than this host's memory (%d bytes)", size, mem)
	}
	return nil
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

	// stageSize is the staging pool's size; pool the pool (set at
	// Attach, its memory renewed for each new stream: a reader of a
	// range the previous master handed out reaches nothing).
	stageSize uint64
	pool      *stagingPool
	sessions  int
	// svc serves TierRead on svcAddr; poke asks reportStats to send the
	// stats now (the staging pool's use changed).
	svcAddr string
	// kept and keptFenced are the roster the tier's directory held at
	// the start.
	kept, keptFenced []string
	svc              *grpc.Server
	poke             chan struct{}
	svcListen        string

	mu sync.Mutex // one sender on the stream at a time
	st pb.Tier_AttachClient

	stop    chan struct{}
	stopped chan struct{}
	once    sync.Once

	attached                  atomic.Bool
	offloads, loads, failures atomic.Uint64
	directReads               atomic.Uint64
	pacer                     *readPacer
}

// TierStats is a node's disk tier and what it did for the master.
type TierStats struct {
	tier.Stats
	Attached bool
	// Offloads and Loads count the master's commands done (Loads: into
	// the segment or the staging pool); Failures those that failed
	// (full, not found, I/O).
	Offloads, Loads, Failures uint64
	// The staging pool: size, bytes held, reads that waited for room,
	// readers' staged reads freed by the TTL and handed back, and the
	// batches readers asked for directly (TierRead).
	StagingSize, StagingUsed, StagingWaits, StagingReclaimed, StagingReleased, DirectBatches uint64
	// DirectReads counts the records read for readers that asked the
	// node directly (Loads counts the master's).
	DirectReads uint64
	// YieldingToPuts says DRAM puts into the node's segment are under
	// way (the master said so within the last 100 ms): its disk reads
	// are background work now (TierConfig.ReadShare); PacedReads counts
	// the staged reads (batches) that went so.
	YieldingToPuts bool
	PacedReads     uint64
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
	if cfg.StagingSize != 0 {
		if err := checkStagingSize(cfg.StagingSize); err != nil {
			return nil, err
		}
	}
	n := &TierNode{log: cfg.Logger, sem: make(chan struct{}, cfg.Workers), stop: make(chan struct{}), stopped: make(chan struct{}), stageSize: cfg.StagingSize,
		svcListen: cfg.ServiceAddress, poke: make(chan struct{}, 1)}
	n.pacer = newReadPacer(cfg.ReadShare)
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
	mem, _ := c.segment()
	if n.stageSize == 0 {
		n.stageSize = DefaultStagingPool(uint64(mem.Len()))
	}
	if err := checkStagingSize(n.stageSize); err != nil {
		return err
	}
	if n.stageSize > uint64(maxInt) {
		return fmt.Errorf("staging pool of %d bytes does not fit this platform", n.stageSize)
	}
	st, err := c.eng.RegisterMemory(context.Background(), int(n.stageSize), "cpu:0", true)
	if err != nil {
		return fmt.Errorf("staging pool of %d bytes (--ssd-staging-size): %w", n.stageSize, err)
	}
	pool, err := newStagingPool(st, defaultStagingTTL)
	if err != nil {
		_ = c.eng.UnregisterMemory(context.Background(), st)
		return err
	}
	addr := n.svcListen
	if addr == "" {
		addr = net.JoinHostPort(hostOf(c.eng.SegmentName()), "0")
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		_ = c.eng.UnregisterMemory(context.Background(), st)
		return fmt.Errorf("disk tier's read service on %s: %w", addr, err)
	}
	lis = connlimit.Default().Listener(lis, "disk tier")
	n.pool, n.svcAddr = pool, lis.Addr().String()
	n.svc = grpc.NewServer(grpc.MaxRecvMsgSize(MaxMsgSize), grpc.MaxSendMsgSize(MaxMsgSize))
	trs := &tierReadServer{n: n}
	pb.RegisterTierReadServer(n.svc, trs)
	// The service's listener also serves the staged read's own wire
	// (tierwire.go); gRPC's Stop closes it with its connections.
	mux := newTierMux(lis, trs.serveConn)
	go func() { _ = n.svc.Serve(mux) }()
	n.c = c
	// The pool's roster outlives this process in the tier's directory:
	// a node restarted with its master (one process) names the tiers the
	// pool had to the new master in its first hello.
	n.kept, n.keptFenced = n.t.Roster()
	c.roster.seed(n.kept, n.keptFenced)
	c.roster.watch(func(ids, fenced []string) {
		if err := n.t.SetRoster(ids, fenced); err != nil {
			n.log.Warn(err.Error())
		}
	})
	go n.run()
	go n.expireLoop()
	return nil
}

// ServiceAddress is where the node serves TierRead ("" before Attach).
func (n *TierNode) ServiceAddress() string { return n.svcAddr }

// expireLoop frees the staged reads readers did not hand back within
// the TTL they were told.
func (n *TierNode) expireLoop() {
	for {
		iv := min(max(n.pool.ttlNow()/8, 10*time.Millisecond), 250*time.Millisecond)
		select {
		case <-n.stop:
			return
		case <-time.After(iv):
		}
		if k := n.pool.expire(time.Now()); k > 0 {
			n.log.Debug(fmt.Sprintf("disk tier %s: %d staged reads not handed back within %s; freed", n.t.Stats().Dir, k, n.pool.ttlNow()))
			n.pokeStats()
		}
	}
}

// pokeStats has the stats sent now rather than at the next tick.
func (n *TierNode) pokeStats() {
	select {
	case n.poke <- struct{}{}:
	default:
	}
}

// renewStaging gives the staging pool new memory at a new address (a new
// stream: the master it attaches to knows nothing of what the previous
// one handed out); the old memory goes after its last transfer, and the
// staged reads in it with it (a reader of one fails its transfer).
func (n *TierNode) renewStaging(ctx context.Context) {
	old := n.pool.memory()
	if old == nil {
		return
	}
	old.Unpin()
	m, err := n.c.eng.Renew(ctx, old)
	if err != nil {
		n.log.Warn(fmt.Sprintf("disk tier %s: renew its staging pool: %v; keeping the old one", n.t.Stats().Dir, err))
		return
	}
	if err := n.pool.reset(m); err != nil {
		n.log.Warn(fmt.Sprintf("disk tier %s: %v", n.t.Stats().Dir, err))
	}
}

// Tier is the node's disk tier.
func (n *TierNode) Tier() *tier.Tier { return n.t }

// Stats returns the tier's state and the node's command counters.
func (n *TierNode) Stats() TierStats {
	s := TierStats{Stats: n.t.Stats(), Attached: n.attached.Load(),
		Offloads: n.offloads.Load(), Loads: n.loads.Load(), Failures: n.failures.Load(), DirectReads: n.directReads.Load(),
		YieldingToPuts: n.pacer.yielding(), PacedReads: n.pacer.paced.Load()}
	if p := n.pool; p != nil {
		s.StagingSize, s.StagingUsed = p.usage()
		s.StagingWaits, s.StagingReclaimed, s.StagingReleased, s.DirectBatches = p.waits.Load(), p.reclaimed.Load(), p.released.Load(), p.direct.Load()
	}
	return s
}

// Close detaches from the master and closes the tier (its records stay
// on disk for the next start).
func (n *TierNode) Close() error {
	n.once.Do(func() { close(n.stop) })
	if n.c != nil {
		<-n.stopped
		n.svc.Stop()
		if m := n.pool.memory(); m != nil {
			m.Unpin()
			_ = n.c.eng.UnregisterMemory(context.Background(), m)
		}
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
	if n.sessions++; n.sessions > 1 {
		n.renewStaging(ctx)
	}
	recs := n.t.Records()
	_, seg := n.c.segment()
	// The staging pool is the node's (STAGE): the master is told only
	// where readers ask for staged reads themselves.
	hello := &pb.TierHello{ClientId: UUIDToPB(n.c.id), SegmentId: UUIDToPB(seg.ID), TierId: n.t.ID(),
		Capacity: n.t.Capacity(), Records: make([]*pb.TierRecord, len(recs)), StagingService: n.svcAddr,
		DropAcks: !dropAcksOff.Load()}
	hello.Roster, hello.Fenced = n.c.roster.list()
	if n.sessions == 1 {
		for _, id := range n.kept {
			if !slices.Contains(hello.Roster, id) {
				hello.Roster = append(hello.Roster, id)
			}
		}
		for _, id := range n.keptFenced {
			if !slices.Contains(hello.Fenced, id) {
				hello.Fenced = append(hello.Fenced, id)
			}
		}
	}
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
		// The master's staged reads end with its stream.
		n.pool.dropMaster()
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
		if ttl := down.GetStagingTtlMs(); ttl > 0 {
			n.pool.setTTL(time.Duration(ttl) * time.Millisecond)
		}
		// A message's drops in a row share one sync of the drop log; they
		// are done before the next command starts, as one at a time were.
		// Drops with an op id are answered once synced: the master holds
		// the put or remove that caused them until then.
		var drops []tier.Removal
		var dropOps []uint64
		flush := func() {
			if len(drops) > 0 {
				n.t.RemoveAll(drops)
				drops = drops[:0]
			}
			if len(dropOps) > 0 {
				n.send(st, &pb.TierUp{Msg: &pb.TierUp_Dropped{Dropped: &pb.TierDropped{Ops: dropOps}}})
				dropOps = nil
			}
		}
		for _, cmd := range down.GetCommands() {
			switch cmd.GetKind() {
			case pb.TierCommand_DROP:
				if h := dropHook.Load(); h != nil && (*h)(cmd.GetKey()) {
					continue // lost, as with a master that died before sending it
				}
				drops = append(drops, tier.Removal{Key: cmd.GetKey(), Version: cmd.GetVersion()})
				if cmd.GetOp() != 0 {
					dropOps = append(dropOps, cmd.GetOp())
				}
				continue
			case pb.TierCommand_RELEASE:
				n.pool.release(cmd.GetStaged(), true)
				n.pokeStats()
				continue
			case pb.TierCommand_WRITES:
				n.pacer.writes(time.Duration(cmd.GetWaitMs()) * time.Millisecond)
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

// Test hooks: dropHook, when set, is asked of each DROP and true loses
// it; dropAcksOff makes the node one that does not answer DROPs (as
// before TierHello.drop_acks); offloadHook is called before each OFFLOAD
// is written (a test holds one under way there).
var (
	dropHook    atomic.Pointer[func(key string) bool]
	dropAcksOff atomic.Bool
	offloadHook atomic.Pointer[func(key string)]
)

// do runs one OFFLOAD or LOAD against the segment's bytes.
func (n *TierNode) do(ctx context.Context, cmd *pb.TierCommand) *pb.TierResult {
	res := &pb.TierResult{Op: cmd.GetOp()}
	fail := func(code Code, err error) *pb.TierResult {
		n.failures.Add(1)
		res.Code, res.Message = int32(code), err.Error()
		return res
	}
	if cmd.GetKind() == pb.TierCommand_STAGE {
		return n.stageForMaster(ctx, cmd, res, fail)
	}
	if h := offloadHook.Load(); h != nil && cmd.GetKind() == pb.TierCommand_OFFLOAD {
		(*h)(cmd.GetKey())
	}
	// The segment as it is now, held registered while the bytes move: a
	// command the master sent for memory since renewed falls outside it
	// (the new memory is elsewhere) and is refused.
	seg, _ := n.c.segment()
	if seg == nil || !seg.Pin() {
		return fail(InvalidParams, fmt.Errorf("range 0x%x+%d: this node's segment is being renewed", cmd.GetAddr(), cmd.GetSize()))
	}
	defer seg.Unpin()
	b := within(seg, cmd.GetAddr(), cmd.GetSize())
	if b == nil {
		return fail(InvalidParams, fmt.Errorf("range 0x%x+%d is outside this node's segment 0x%x+%d", cmd.GetAddr(), cmd.GetSize(), seg.Addr(), seg.Len()))
	}
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

// within is [addr, addr+size) of m's bytes, nil when m does not hold it.
func within(m *engine.Memory, addr, size uint64) []byte {
	mem, base := m.Bytes(), m.Addr()
	off := addr - base
	if addr < base || off > uint64(len(mem)) || size > uint64(len(mem))-off {
		return nil
	}
	return mem[off : off+size]
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

// reportStats sends the tier's stats every second, and soon after the
// staging pool's use changes (at most every 10 ms), so `mc store stat`
// and the master's counts follow the pool closely.
// reportUnreadable tells the master a record is dropped because a
// reader's staged read of it failed (a lost notice is repaired by the
// next hello, which no longer lists it).
func (n *TierNode) reportUnreadable(key string, version, size uint64) {
	n.mu.Lock()
	st := n.st
	n.mu.Unlock()
	if st == nil {
		return
	}
	n.send(st, &pb.TierUp{Msg: &pb.TierUp_Evicted{Evicted: &pb.TierEvicted{Unreadable: true,
		Records: []*pb.TierRecord{{Key: key, Size: size, Version: version}}}}})
}

func (n *TierNode) reportStats(ctx context.Context, st pb.Tier_AttachClient) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		s := n.Stats()
		n.send(st, &pb.TierUp{Msg: &pb.TierUp_Stats{Stats: &pb.TierStats{
			Capacity: s.Capacity, Used: s.Used, Records: uint64(s.Records), Files: uint64(s.Files),
			WriteBytes: s.WriteBytes, ReadBytes: s.ReadBytes, EvictedRecords: s.EvictedRecords,
			Dropped: s.Dropped, Full: s.Full, Direct: s.Direct, Dir: s.Dir,
			StagingSize: s.StagingSize, StagingUsed: s.StagingUsed, StagingWaits: s.StagingWaits,
			StagingReclaimed: s.StagingReclaimed, StagingReleased: s.StagingReleased, DirectBatches: s.DirectBatches,
		}}})
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-n.poke:
			select {
			case <-ctx.Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
}
