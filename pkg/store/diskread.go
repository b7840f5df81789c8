package store

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine"
	pb "github.com/kvcache-ops/mc/pkg/store/storepb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// Reads of disk objects, one hop fewer (Mooncake's BatchGetOffloadObject):
// the master answers a get of an object whose only copy is on a node's
// disk with where the record is (Replica.Disk); the client asks that node
// for a staged read, one call per node for a batch, reads the ranges the
// node answers through its engine as any replica, and hands the batch
// back to the node once its transfers are done.

// DiskRecord is where an object's record is on a node's disk: the node's
// TierRead endpoint, its tier id and the object version.
type DiskRecord struct {
	Service string
	Tier    string
	Version uint64
	// Key is the record's key on the node (the stored key, scoped by
	// tenant); "" means the key asked.
	Key string
}

// tierConns are the client's connections to nodes' TierRead services,
// and per node the staged batches whose transfers are over, to be handed
// back with the next BatchGetStaged to that node or, when none comes
// within releaseDelay, in a call of their own (timers).
type tierConns struct {
	mu      sync.Mutex
	conns   map[string]*grpc.ClientConn
	pending map[string][]uint64
	timers  map[string]*time.Timer
	// wire is the staged reads' own connections (tierwire.go).
	wire tierWireConns
}

// releaseDelay is how long a finished staged read waits for the reader's
// next read from its node to carry it back before it goes alone: a
// reader reading on saves a call per read (CPU on both sides), and a
// range stays held at most this much longer. A variable for tests.
var releaseDelay = 2 * time.Millisecond

// takeRelease takes the batches queued for svc; stopped says it stopped
// the queue's timer (whose goroutine count the caller then ends).
func (t *tierConns) takeRelease(svc string) (ids []uint64, stopped bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ids = t.pending[svc]
	delete(t.pending, svc)
	if tm := t.timers[svc]; tm != nil && tm.Stop() {
		delete(t.timers, svc)
		stopped = true
	}
	return ids, stopped
}

func (t *tierConns) get(addr string) (pb.TierReadClient, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if cc := t.conns[addr]; cc != nil {
		return pb.NewTierReadClient(cc), nil
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMsgSize), grpc.MaxCallSendMsgSize(MaxMsgSize)))
	if err != nil {
		return nil, fmt.Errorf("disk tier read service %s: %w", addr, err)
	}
	if t.conns == nil {
		t.conns = make(map[string]*grpc.ClientConn)
	}
	t.conns[addr] = cc
	return pb.NewTierReadClient(cc), nil
}

func (t *tierConns) close() {
	t.wire.close()
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, cc := range t.conns {
		_ = cc.Close()
		delete(t.conns, k)
	}
}

// stageDisk turns the disk replicas among reps into staged reads: per
// node, one BatchGetStaged for its keys, all nodes at once. A key the
// node no longer has at that version (re-put, removed or dropped since
// the master answered) is asked of the master once more; other failures
// are the key's error. The staged replicas carry the node's hold on
// their ranges as their lease (its TTL from before the node was asked,
// plus the time from asked, when the master was, to then: the read's
// LEASE_EXPIRED check counts from asked) and the batch to hand back.
//
// With dst (the keys' places in the reader's memory), a node's batch with
// a record of more than one read chunk goes as BatchGetStagedStream: its
// bytes are moved into dst while the node reads, and such replicas come
// back marked moved.
func (c *Client) stageDisk(ctx context.Context, asked time.Time, keys []string, reps [][]Replica, dst []local, errs []error) {
	var first map[int]error
	for attempt := 0; ; attempt++ {
		retry := c.stageDiskOnce(ctx, asked, keys, reps, dst, errs)
		if len(retry) == 0 || attempt > 0 {
			for _, i := range retry {
				reps[i] = nil
			}
			// A key still not found: the node's first answer says why
			// better than the master's (a record that failed its
			// checksum is gone from both by now).
			for i, err := range first {
				if CodeOf(errs[i]) == ObjectNotFound {
					errs[i] = err
				}
			}
			return
		}
		first = make(map[int]error, len(retry))
		for _, i := range retry {
			first[i] = errs[i]
		}
		ask := make([]string, len(retry))
		for j, i := range retry {
			ask[j] = keys[i]
		}
		sub := make([]error, len(ask))
		again, _ := c.replicaLists(ctx, ask, sub)
		for j, i := range retry {
			reps[i], errs[i] = again[j], sub[j]
		}
	}
}

// stageDiskOnce stages reps' disk replicas and returns the keys a node
// did not have (their errs set, to be asked again).
func (c *Client) stageDiskOnce(ctx context.Context, asked time.Time, keys []string, reps [][]Replica, dst []local, errs []error) []int {
	// No map for a get without disk objects: this runs on every get.
	var byNode map[string][]int
	for i, rs := range reps {
		if errs[i] == nil && len(rs) == 1 && rs[0].Disk != nil {
			if byNode == nil {
				byNode = make(map[string][]int)
			}
			byNode[rs[0].Disk.Service] = append(byNode[rs[0].Disk.Service], i)
		}
	}
	if len(byNode) == 0 {
		return nil
	}
	if len(byNode) == 1 {
		// One node (a lone get): asked from this goroutine.
		for svc, idx := range byNode {
			return c.stageOn(ctx, asked, svc, keys, reps, dst, errs, idx)
		}
	}
	var mu sync.Mutex
	var retry []int
	var wg sync.WaitGroup
	for svc, idx := range byNode {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if r := c.stageOn(ctx, asked, svc, keys, reps, dst, errs, idx); len(r) > 0 {
				mu.Lock()
				retry = append(retry, r...)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return retry
}

// stageOn asks the node at svc for staged reads of keys idx.
func (c *Client) stageOn(ctx context.Context, asked time.Time, svc string, keys []string, reps [][]Replica, dst []local, errs []error, idx []int) (retry []int) {
	fail := func(err error) []int {
		for _, i := range idx {
			errs[i] = err
		}
		return nil
	}
	cl, err := c.tiers.get(svc)
	if err != nil {
		return fail(Errorf(RPCFail, "%v", err))
	}
	req := &pb.BatchGetStagedRequest{TierId: reps[idx[0]][0].Disk.Tier}
	for _, i := range idx {
		d := reps[i][0].Disk
		k := keys[i]
		if d.Key != "" {
			k = d.Key
		}
		req.Keys = append(req.Keys, k)
		req.Versions = append(req.Versions, d.Version)
		req.Sizes = append(req.Sizes, reps[i][0].Len)
	}
	// Earlier reads from this node whose transfers are over go back
	// with this one (lost with it if the call fails: the TTL frees them).
	var stopped bool
	if req.Release, stopped = c.tiers.takeRelease(svc); stopped {
		c.wg.Done()
	}
	cctx, cancel := context.WithTimeout(ctx, c.cfg.RPCTimeout)
	defer cancel()
	sent := time.Now()
	var resp *pb.BatchGetStagedResponse
	var moved []bool
	// Only a staged read alone streams: with others of this client under
	// way, the node's reads and the transfers overlap across reads
	// already, and the stream's messages and per-chunk transfers would
	// only take CPU from them.
	alone := c.stagedReads.Add(1) == 1
	defer c.stagedReads.Add(-1)
	if alone && dst != nil && slices.ContainsFunc(req.Sizes, func(n uint64) bool { return n > streamMin }) {
		resp, moved, err = c.stageStream(cctx, cl, svc, req, idx, reps, dst)
		if status.Code(err) == codes.Unimplemented {
			// A node of a build before the stream: read whole, as it can.
			moved = nil
			resp, err = c.tiers.batchGetStaged(cctx, svc, cl, req)
		}
	} else {
		resp, err = c.tiers.batchGetStaged(cctx, svc, cl, req)
	}
	if err != nil {
		code := RPCFail
		if st, ok := status.FromError(err); ok && st.Code().String() == "InvalidArgument" {
			code = InvalidParams
		}
		return fail(Errorf(code, "staged read of %d disk objects from node %s: %v", len(idx), svc, err))
	}
	if len(resp.Addrs) != len(idx) || len(resp.Codes) != len(idx) || len(resp.Messages) != len(idx) {
		return fail(Errorf(RPCFail, "staged read from node %s: %d/%d/%d answers for %d keys", svc, len(resp.Addrs), len(resp.Codes), len(resp.Messages), len(idx)))
	}
	// The node holds the ranges ttl from after it read them, so at
	// least ttl from sent.
	lease := sent.Sub(asked) + time.Duration(resp.GcTtlMs)*time.Millisecond
	for j, i := range idx {
		if code := resp.Codes[j]; code != 0 {
			errs[i] = resultErr(code, resp.Messages[j])
			switch Code(code) {
			case ObjectNotFound:
				retry = append(retry, i)
			case InvalidReplica:
				// Its only copy could not be read and is dropped: the
				// object is gone, as the master's own load would say.
				errs[i] = Errorf(ObjectNotFound, "%s", errs[i].(*Error).Msg)
			}
			continue
		}
		r := reps[i][0]
		r.Disk, r.Addr, r.Staged, r.StagedAt = nil, resp.Addrs[j], resp.BatchId, svc
		if resp.TeEndpoint != "" && resp.TeEndpoint != r.Endpoint {
			r.Endpoint, r.Segment = resp.TeEndpoint, resp.TeEndpoint
		}
		// The node's hold on the range is the lease that matters.
		r.Lease = lease
		r.moved = moved != nil && moved[j]
		reps[i] = []Replica{r}
	}
	return retry
}

// releaseDirect hands each node's staged batches among reps back: with
// the reader's next read from that node if one comes within
// releaseDelay, else in a call of their own (in the background; a lost
// one is freed by the node's TTL).
func (c *Client) releaseDirect(ctx context.Context, reps [][]Replica) {
	type batch struct {
		svc string
		id  uint64
	}
	var seen map[batch]bool
	for _, rs := range reps {
		for _, r := range rs {
			if r.StagedAt != "" && r.Staged != 0 {
				if seen == nil {
					seen = make(map[batch]bool)
				}
				seen[batch{r.StagedAt, r.Staged}] = true
			}
		}
	}
	if len(seen) == 0 {
		return
	}
	t := &c.tiers
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.pending == nil {
		t.pending, t.timers = make(map[string][]uint64), make(map[string]*time.Timer)
	}
	for b := range seen {
		t.pending[b.svc] = append(t.pending[b.svc], b.id)
		if t.timers[b.svc] == nil {
			c.wg.Add(1)
			t.timers[b.svc] = time.AfterFunc(releaseDelay, func() {
				defer c.wg.Done()
				t.mu.Lock()
				delete(t.timers, b.svc)
				ids := t.pending[b.svc]
				delete(t.pending, b.svc)
				t.mu.Unlock()
				c.sendReleases(context.WithoutCancel(ctx), b.svc, ids)
			})
		}
	}
}

// flushReleases hands back every batch still queued at once (Close).
func (c *Client) flushReleases(ctx context.Context) {
	t := &c.tiers
	t.mu.Lock()
	pending := t.pending
	t.pending = nil
	for svc, tm := range t.timers {
		if tm.Stop() {
			c.wg.Done()
		}
		delete(t.timers, svc)
	}
	t.mu.Unlock()
	for svc, ids := range pending {
		c.sendReleases(ctx, svc, ids)
	}
}

// sendReleases hands batches ids back to node svc.
func (c *Client) sendReleases(ctx context.Context, svc string, ids []uint64) {
	if len(ids) == 0 {
		return
	}
	cl, err := c.tiers.get(svc)
	if err == nil {
		cctx, cancel := context.WithTimeout(ctx, c.cfg.RPCTimeout)
		_, err = cl.ReleaseStaged(cctx, &pb.ReleaseStagedBatch{BatchId: ids[0], More: ids[1:]})
		cancel()
	}
	if err != nil {
		c.log.Debug(fmt.Sprintf("hand back %d staged batches to node %s: %v (its TTL frees them)", len(ids), svc, err))
	}
}

// streamMin is the size above which a record is read with
// BatchGetStagedStream: more than one of the node's read chunks (2 MiB),
// so there is a chunk to move while the next is read.
var streamMin uint64 = 2 << 20

// stageStream is a node's staged read as BatchGetStagedStream: as the
// node tells how much of each key's range holds its record's bytes, the
// new bytes are moved into dst (their transfers run while the next
// message is awaited); once the node's answer is in and the transfers
// are over, moved says per key (of idx) that all its bytes are in dst
// and the answer's code 0 vouches for them (checksum checked). Bytes
// moved for a key that fails are never declared read: the key's error
// stands (dst holds junk the get does not return), and a key whose
// transfers fell short is left to read's whole transfer from the range.
func (c *Client) stageStream(ctx context.Context, cl pb.TierReadClient, svc string, req *pb.BatchGetStagedRequest, idx []int, reps [][]Replica, dst []local) (*pb.BatchGetStagedResponse, []bool, error) {
	// Transfers under way read into dst: they end before this returns,
	// however it returns.
	var wg sync.WaitGroup
	defer wg.Wait()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := cl.BatchGetStagedStream(sctx, req)
	if err != nil {
		return nil, nil, err
	}
	k := len(idx)
	var start *pb.BatchGetStagedResponse
	sent := make([]uint64, k) // bytes whose transfer began, per key
	var mu sync.Mutex
	short := make([]bool, k) // a transfer failed
	move := func(j int, upTo uint64) {
		i := idx[j]
		from := sent[j]
		if upTo <= from || start.Addrs[j] == 0 {
			return
		}
		sent[j] = upTo
		r := Replica{Segment: start.TeEndpoint, Endpoint: start.TeEndpoint, Addr: start.Addrs[j] + from, Len: upTo - from}
		if start.TeEndpoint == "" {
			r.Segment, r.Endpoint = reps[i][0].Segment, reps[i][0].Endpoint
		}
		c.streamMoves.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if errs := c.transferEach(ctx, []xfer{{item: i, op: engine.Read, local: dst[i].addr + from, rep: r}}); errs[0] != nil {
				mu.Lock()
				short[j] = true
				mu.Unlock()
			}
		}()
	}
	for {
		m, err := st.Recv()
		if err != nil {
			return nil, nil, err
		}
		if d := m.GetDone(); d != nil {
			if len(d.Addrs) != k || len(d.Codes) != k {
				return d, nil, nil // stageOn reports the short answer
			}
			wg.Wait()
			moved := make([]bool, k)
			for j := range k {
				moved[j] = start != nil && d.Codes[j] == 0 && !short[j] && sent[j] == req.Sizes[j] && d.Addrs[j] == start.Addrs[j]
				if moved[j] {
					c.streamKeys.Add(1)
				}
			}
			return d, moved, nil
		}
		if s := m.GetStart(); s != nil {
			if len(s.Addrs) != k {
				return nil, nil, Errorf(RPCFail, "staged read from node %s: %d ranges for %d keys", svc, len(s.Addrs), k)
			}
			start = s
		}
		if start == nil || len(m.Ready) != k {
			return nil, nil, Errorf(RPCFail, "staged read from node %s: progress of %d keys before the ranges of %d", svc, len(m.Ready), k)
		}
		for j, n := range m.Ready {
			move(j, min(n, req.Sizes[j], dst[idx[j]].n))
		}
	}
}
