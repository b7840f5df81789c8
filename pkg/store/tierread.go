package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	pb "github.com/kvcache-ops/mc/pkg/store/storepb"
	"github.com/kvcache-ops/mc/pkg/store/tier"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The node's side of staged reads. The staging pool is the node's
// (stagingPool): the master's STAGE (for readers on Mooncake's wire) and
// a reader's own BatchGetStaged take their ranges from the same
// allocator, so there is one count of its use.

// stageForMaster serves the master's STAGE: the record read into a range
// of the pool, held until the master's RELEASE (or its stream's end).
func (n *TierNode) stageForMaster(ctx context.Context, cmd *pb.TierCommand, res *pb.TierResult, fail func(Code, error) *pb.TierResult) *pb.TierResult {
	wait := time.Duration(cmd.GetWaitMs()) * time.Millisecond
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	sizes := []uint64{cmd.GetSize()}
	addrs, codes, msgs, gen := n.stageRecords(wctx, []string{cmd.GetKey()}, []uint64{cmd.GetVersion()}, sizes, nil)
	if codes[0] != 0 {
		return fail(Code(codes[0]), errors.New(msgs[0]))
	}
	id := n.pool.add(gen, addrs, sizes, true)
	if id == 0 {
		return fail(ObjectNotFound, fmt.Errorf("key %q: the staging pool was renewed while it was read", cmd.GetKey()))
	}
	n.loads.Add(1)
	n.pokeStats()
	res.Addr, res.Staged = addrs[0], id
	return res
}

// stageRecords reads each key's record at its version into ranges of the
// pool taken at once (waiting for room until ctx ends): per key its
// address (0 when it failed), code and message. A failed key's range is
// freed; the others are the caller's (add or put), of generation gen.
// With w, w.taken has the ranges before any is read, and w.progress each
// key's bytes read so far (tier.ReadProgress), from the keys' reads at
// once.
func (n *TierNode) stageRecords(ctx context.Context, keys []string, versions, sizes []uint64, w *stageWatch) (addrs []uint64, codes []int32, msgs []string, gen uint64) {
	codes, msgs = make([]int32, len(keys)), make([]string, len(keys))
	failAll := func(err error) {
		for i := range keys {
			codes[i], msgs[i] = int32(CodeOf(err)), err.Error()
		}
	}
	addrs, gen, mem, err := n.pool.take(ctx, sizes)
	if err != nil {
		failAll(err)
		return make([]uint64, len(keys)), codes, msgs, 0
	}
	defer mem.Unpin()
	// While puts into the segment are under way, disk reads are
	// background work (readPacer).
	done, err := n.pacer.acquire(ctx)
	if err != nil {
		n.pool.put(gen, addrs, sizes)
		failAll(Errorf(NoAvailableHandle, "disk reads yield to DRAM puts on this node (tier %s), and none had its turn before the deadline: %v", n.t.ID(), err))
		return make([]uint64, len(keys)), codes, msgs, 0
	}
	defer done()
	if w != nil {
		w.taken(addrs)
	}
	read := func(i int, key string) {
		b := within(mem, addrs[i], sizes[i])
		var progress func(uint64)
		if w != nil {
			progress = func(k uint64) { w.progress(i, k) }
		}
		rec, err := n.t.ReadProgress(ctx, key, versions[i], b, progress)
		switch {
		case errors.Is(err, tier.ErrNotFound):
			err = Errorf(ObjectNotFound, "key %q version %d is not on the disk of this node (tier %s): %v", key, versions[i], n.t.ID(), err)
		case errors.Is(err, tier.ErrDropped):
			// The tier dropped the record: the master learns it as
			// the master path's load failure would tell it.
			n.reportUnreadable(key, versions[i], sizes[i])
			err = Errorf(InvalidReplica, "key %q: its disk copy on this node (tier %s) could not be read: %v", key, n.t.ID(), err)
		case err != nil:
			// The record is as it was (the reader's deadline passed
			// waiting for a turn, the tier closing): telling the master
			// it is gone made it forget a record still on disk, which
			// came back after a restart over a newer put of the key
			// (the soak: a node SIGSTOPped past its readers' deadlines).
			err = Errorf(RPCTimeout, "key %q: its disk copy on this node (tier %s) was not read: %v", key, n.t.ID(), err)
		case rec.Size != sizes[i]:
			err = Errorf(ObjectNotFound, "key %q version %d: the record on disk has %d bytes, not %d", key, versions[i], rec.Size, sizes[i])
		}
		if err != nil {
			n.failures.Add(1)
			codes[i], msgs[i] = int32(CodeOf(err)), err.Error()
		}
	}
	// A lone key is read in this goroutine: a goroutine of its own
	// would only add a hand-off each way to every one-key read.
	if len(keys) == 1 {
		read(0, keys[0])
	} else {
		var wg sync.WaitGroup
		for i, key := range keys {
			wg.Add(1)
			go func() {
				defer wg.Done()
				read(i, key)
			}()
		}
		wg.Wait()
	}
	var bad []uint64
	badSizes := []uint64{}
	for i := range keys {
		if codes[i] != 0 {
			bad = append(bad, addrs[i])
			badSizes = append(badSizes, sizes[i])
			addrs[i] = 0
		}
	}
	if len(bad) > 0 {
		n.pool.put(gen, bad, badSizes)
	}
	return addrs, codes, msgs, gen
}

// tierReadServer serves TierRead: staged reads a reader asks the node
// for directly, the master only having told it where the records are.
type tierReadServer struct {
	pb.UnimplementedTierReadServer
	n *TierNode
}

// BatchGetStaged reads the records into the staging pool, waiting for
// room within the caller's deadline, and answers with their ranges: held
// until ReleaseStaged, or the TTL it tells the reader from now.
func (s *tierReadServer) BatchGetStaged(ctx context.Context, r *pb.BatchGetStagedRequest) (*pb.BatchGetStagedResponse, error) {
	return s.getStaged(ctx, r, nil)
}

// noStagedStream (tests only) makes nodes answer BatchGetStagedStream
// as a build before it did.
var noStagedStream bool

// stageWatch follows a staged read under way (BatchGetStagedStream).
type stageWatch struct {
	taken    func(addrs []uint64)
	progress func(i int, n uint64)
}

// BatchGetStagedStream is BatchGetStaged telling the reader, as the
// records are read, the ranges and then how much of each holds its
// record's bytes, so that it moves them while the rest is read; the last
// message is the answer BatchGetStaged would give, the only one that
// says whether a key's bytes are its record's (checksum checked). A
// sender goroutine sends the latest state whenever it changed (the reads
// never wait for the stream), then the answer once the reads are over.
func (s *tierReadServer) BatchGetStagedStream(r *pb.BatchGetStagedRequest, st pb.TierRead_BatchGetStagedStreamServer) error {
	if noStagedStream {
		return status.Error(codes.Unimplemented, "method BatchGetStagedStream not implemented")
	}
	var mu sync.Mutex
	var addrs, ready []uint64
	kick, quit, stopped := make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
	poke := func() {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	w := &stageWatch{
		taken: func(a []uint64) {
			mu.Lock()
			addrs, ready = slices.Clone(a), make([]uint64, len(a))
			mu.Unlock()
			poke()
		},
		progress: func(i int, k uint64) {
			mu.Lock()
			ready[i] = max(ready[i], k)
			mu.Unlock()
			poke()
		},
	}
	var sendErr error
	go func() {
		defer close(stopped)
		var last []uint64
		for {
			select {
			case <-kick:
			case <-quit:
				return
			}
			mu.Lock()
			a, rd := addrs, slices.Clone(ready)
			mu.Unlock()
			var m pb.StagedReadProgress
			switch {
			case a == nil:
				continue
			case last == nil:
				m.Start = &pb.BatchGetStagedResponse{Addrs: a, TeEndpoint: s.n.c.eng.SegmentName()}
			case slices.Equal(last, rd):
				continue
			}
			m.Ready, last = rd, rd
			if sendErr = st.Send(&m); sendErr != nil {
				return
			}
		}
	}()
	resp, err := s.getStaged(st.Context(), r, w)
	close(quit)
	<-stopped
	if err != nil {
		return err
	}
	if sendErr != nil {
		// The reader is gone: its batch is freed by its TTL.
		return sendErr
	}
	return st.Send(&pb.StagedReadProgress{Done: resp})
}

func (s *tierReadServer) getStaged(ctx context.Context, r *pb.BatchGetStagedRequest, w *stageWatch) (*pb.BatchGetStagedResponse, error) {
	n := s.n
	k := len(r.GetKeys())
	if len(r.GetVersions()) != k || len(r.GetSizes()) != k {
		return nil, tierReadStatus(Errorf(InvalidParams, "staged read: %d keys, %d versions, %d sizes", k, len(r.GetVersions()), len(r.GetSizes())))
	}
	if err := checkBatchLen(k); err != nil {
		return nil, tierReadStatus(err)
	}
	resp := &pb.BatchGetStagedResponse{Codes: make([]int32, k), Messages: make([]string, k)}
	if r.GetTierId() != n.t.ID() {
		// Another tier directory behind the same address (a node
		// restarted elsewhere): none of its records are these.
		for i := range resp.Codes {
			resp.Codes[i] = int32(ObjectNotFound)
			resp.Messages[i] = fmt.Sprintf("%s: this node's disk tier is %s, not %s", ObjectNotFound, n.t.ID(), r.GetTierId())
		}
		resp.Addrs = make([]uint64, k)
		return resp, nil
	}
	for i, key := range r.GetKeys() {
		if err := CheckStoredKey(key); err != nil {
			return nil, tierReadStatus(err)
		}
		if sz := r.GetSizes()[i]; sz == 0 || sz > MaxValueSize {
			return nil, tierReadStatus(Errorf(InvalidParams, "staged read of %q: size %d", key, sz))
		}
	}
	// The reader's earlier batches it hands back with this read first:
	// their room serves this one.
	if rel := r.GetRelease(); len(rel) > 0 {
		for _, id := range rel {
			n.pool.release(id, false)
		}
	}
	arrived := time.Now()
	addrs, codes, msgs, gen := n.stageRecords(ctx, r.GetKeys(), r.GetVersions(), r.GetSizes(), w)
	resp.Addrs, resp.Codes, resp.Messages = addrs, codes, msgs
	// The node holds the batch ttl from when it is added (after the
	// reads); the reader, counting from before it asked, is told ttl
	// plus the time the reads took, which ends no later.
	ttl := n.pool.ttlNow()
	told := ttl + time.Since(arrived)
	id := n.pool.add(gen, addrs, r.GetSizes(), false)
	if id == 0 {
		for i := range resp.Codes {
			if resp.Codes[i] == 0 {
				resp.Codes[i] = int32(ObjectNotFound)
				resp.Messages[i] = "the staging pool was renewed while the record was read"
				resp.Addrs[i] = 0
			}
		}
	}
	for _, a := range resp.Addrs {
		if a != 0 {
			n.directReads.Add(1)
		}
	}
	n.pokeStats()
	resp.BatchId, resp.GcTtlMs, resp.TeEndpoint = id, uint64(told.Milliseconds()), n.c.eng.SegmentName()
	return resp, nil
}

// ReleaseStaged frees batches whose transfers are over.
func (s *tierReadServer) ReleaseStaged(_ context.Context, r *pb.ReleaseStagedBatch) (*pb.Result, error) {
	s.n.pool.release(r.GetBatchId(), false)
	for _, id := range r.GetMore() {
		s.n.pool.release(id, false)
	}
	s.n.pokeStats()
	return &pb.Result{}, nil
}

func checkBatchLen(k int) error {
	if k > MaxBatchSize {
		return Errorf(InvalidParams, "staged read of %d keys: at most %d in one call", k, MaxBatchSize)
	}
	return nil
}

// tierReadStatus is a TierRead call's error as a gRPC status: the
// message names the Mooncake code first, as the master's do.
func tierReadStatus(err error) error {
	return status.Error(codes.InvalidArgument, err.Error())
}
