package ha

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/master"
)

// Key layout under store.KeyPrefix(cluster).
func oplogPrefix(cluster string) string { return store.KeyPrefix(cluster) + "oplog/" }
func oplogKey(cluster string, seq uint64) string {
	return fmt.Sprintf("%s%020d", oplogPrefix(cluster), seq)
}
func snapshotKey(cluster string) string { return store.KeyPrefix(cluster) + "snapshot" }
func snapshotChunks(cluster string, seq uint64) string {
	return fmt.Sprintf("%ssnapshots/%020d/", store.KeyPrefix(cluster), seq)
}

// snapshotMeta is the value of the snapshot key.
type snapshotMeta struct {
	Seq    uint64 `json:"seq"`
	Chunks int    `json:"chunks"`
}

const snapshotChunkBytes = 1 << 20

var errStopped = errors.New("leader term ended")

// committer is one leader term's op log writer: the master's OnChange
// numbers and queues records, one goroutine commits what is queued as one
// fenced batch, and Sync waits for the batch holding the caller's records.
type committer struct {
	c     *Candidate
	fence clientv3.Cmp

	mu    sync.Mutex
	cond  *sync.Cond
	queue []record
	next  uint64 // seq the next record gets
	enq   uint64 // last seq queued
	done  uint64 // last seq committed
	err   error  // sticky: once set, nothing more is committed
	known map[string]bool

	master    atomic.Pointer[master.Master]
	stopped   atomic.Bool // err is set: the gates refuse every call
	kick      chan struct{}
	failed    chan struct{} // closed when a commit fails
	exited    chan struct{}
	sinceSnap int
	lastSnap  time.Time
}

func newCommitter(c *Candidate, viewRev int64, from uint64, segments map[string]store.SegmentInfo) *committer {
	l := &committer{
		c:     c,
		fence: clientv3.Compare(clientv3.CreateRevision(store.ViewKey(c.cfg.ClusterID)), "=", viewRev),
		next:  from + 1, enq: from, done: from,
		known: make(map[string]bool, len(segments)),
		kick:  make(chan struct{}, 1), failed: make(chan struct{}), exited: make(chan struct{}),
		lastSnap: time.Now(),
	}
	l.cond = sync.NewCond(&l.mu)
	for name := range segments {
		l.known[name] = true
	}
	return l
}

// onChange is the master's OnChange: called in order, under the changed
// key's lock, so it only queues.
func (l *committer) onChange(ch master.Change) {
	var extra []record
	if ch.Op == master.OpPutEnd || ch.Op == master.OpPutStart {
		// A put can complete on a segment whose mount record is not
		// queued yet (the mount emits after the space is usable): queue
		// the mount first, so the put's replicas can be located.
		l.mu.Lock()
		var missing []string
		for _, r := range ch.Replicas {
			if !l.known[r.Segment] {
				missing = append(missing, r.Segment)
			}
		}
		l.mu.Unlock()
		if len(missing) > 0 {
			if m := l.master.Load(); m != nil {
				for _, s := range m.Segments() {
					for _, name := range missing {
						if s.Info.Name == name {
							extra = append(extra, recordOf(master.Change{Op: master.OpMount, Segment: s.Info, Client: s.Client}))
						}
					}
				}
			}
		}
	}
	l.mu.Lock()
	if l.err != nil {
		l.mu.Unlock()
		return
	}
	for _, r := range append(extra, recordOf(ch)) {
		if r.Op == "mount" {
			l.known[r.Segment.Name] = true
		}
		r.Seq = l.next
		l.next++
		l.enq = r.Seq
		l.queue = append(l.queue, r)
	}
	l.mu.Unlock()
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// sync is the master's Sync: it returns once every record queued before
// the call is committed, or the error that stopped the term. Once the log
// has stopped, every sync fails: onChange drops the changes that come
// after, so a caller cannot tell from the counters whether its own were
// ever queued, and a put acknowledged then would be missing from the log
// the next leader replays (a dying leader, still serving while its term
// winds down, acknowledged such puts).
func (l *committer) sync() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	target := l.enq
	for l.done < target && l.err == nil {
		l.cond.Wait()
	}
	return l.err
}

// stop ends the term's log: waiters get err, nothing more is committed.
func (l *committer) stop(err error) {
	l.mu.Lock()
	if l.err == nil {
		l.err = err
	}
	l.stopped.Store(true)
	l.cond.Broadcast()
	l.mu.Unlock()
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

func (l *committer) failure() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

func (l *committer) lastQueued() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.enq
}

// take removes up to maxBatchBytes of queued records, encoded.
func (l *committer) take() ([]record, []byte, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return nil, nil, l.err
	}
	buf := []byte{'['}
	n := 0
	for n < len(l.queue) {
		b, err := json.Marshal(l.queue[n])
		if err != nil {
			return nil, nil, err
		}
		if n > 0 && len(buf)+len(b) > maxBatchBytes {
			break
		}
		if n > 0 {
			buf = append(buf, ',')
		}
		buf = append(buf, b...)
		n++
	}
	buf = append(buf, ']')
	recs := append([]record(nil), l.queue[:n]...)
	l.queue = l.queue[n:]
	if len(l.queue) == 0 {
		l.queue = nil
	}
	return recs, buf, nil
}

// run commits batches until the term ends or a commit fails.
func (l *committer) run(ctx context.Context) {
	defer close(l.exited)
	c := l.c
	for {
		recs, val, err := l.take()
		if err != nil {
			return
		}
		if len(recs) == 0 {
			select {
			case <-ctx.Done():
				l.stop(errStopped)
				return
			case <-l.kick:
			}
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, c.commitTimeout())
		resp, err := c.cli.Txn(cctx).If(l.fence).Then(clientv3.OpPut(oplogKey(c.cfg.ClusterID, recs[0].Seq), string(val))).Commit()
		cancel()
		if err == nil && !resp.Succeeded {
			err = errors.New("the master view is no longer this leader's")
		}
		if err != nil {
			l.stop(fmt.Errorf("commit op log batch at seq %d: %w", recs[0].Seq, err))
			close(l.failed)
			return
		}
		last := recs[len(recs)-1].Seq
		c.stateMu.Lock()
		for _, r := range recs {
			c.st.apply(r)
		}
		c.stateMu.Unlock()
		c.applied.Store(last)
		c.commits.Add(1)
		l.mu.Lock()
		l.done = last
		l.cond.Broadcast()
		l.mu.Unlock()
		l.sinceSnap += len(recs)
		if l.sinceSnap >= c.cfg.SnapshotRecords || (l.sinceSnap > 0 && time.Since(l.lastSnap) >= c.cfg.SnapshotInterval) {
			if err := c.snapshot(ctx, l.fence); err != nil {
				c.logEtcdError(fmt.Sprintf("HA snapshot: %v (the op log keeps growing until one succeeds)", err), err)
			}
			l.sinceSnap, l.lastSnap = 0, time.Now()
		}
	}
}

// snapshot writes the committed state as chunks, then atomically (fenced)
// points the snapshot key at them and deletes the log it covers and the
// previous snapshot; then it compacts etcd's history up to the previous
// snapshot's install. Commits wait meanwhile: the state must not move.
//
// Deleting keys frees nothing in etcd: every revision stays until the
// history is compacted (180 s of puts grew etcd from 20 KB to 47 MB, and
// at the 2 GiB quota etcd refuses every write). Compacting to the
// previous install, not this one, leaves a reader one snapshot interval
// to read the log and snapshot it started on (a standby catching up reads
// at one revision); what etcd keeps is at most two intervals of log.
// Compaction is etcd-wide, as etcd's own auto-compaction is.
func (c *Candidate) snapshot(ctx context.Context, fence clientv3.Cmp) (err error) {
	start := time.Now()
	defer func() {
		c.snapDur.Observe(float64(time.Since(start).Milliseconds()))
		if err != nil {
			c.snapFail.Add(1)
		} else {
			c.snapOK.Add(1)
		}
	}()
	c.stateMu.Lock()
	b, err := c.st.encode()
	seq := c.st.Seq
	c.stateMu.Unlock()
	if err != nil {
		return err
	}
	prefix := snapshotChunks(c.cfg.ClusterID, seq)
	n := 0
	for off := 0; off < len(b) || n == 0; off += snapshotChunkBytes {
		chunk := b[off:min(off+snapshotChunkBytes, len(b))]
		cctx, cancel := context.WithTimeout(ctx, c.commitTimeout())
		_, err := c.cli.Put(cctx, fmt.Sprintf("%s%06d", prefix, n), string(chunk))
		cancel()
		if err != nil {
			return fmt.Errorf("write chunk %d of snapshot at seq %d: %w", n, seq, err)
		}
		n++
	}
	meta, _ := json.Marshal(snapshotMeta{Seq: seq, Chunks: n})
	ops := []clientv3.Op{
		clientv3.OpPut(snapshotKey(c.cfg.ClusterID), string(meta)),
		clientv3.OpDelete(oplogPrefix(c.cfg.ClusterID), clientv3.WithRange(oplogKey(c.cfg.ClusterID, seq+1))),
	}
	if old := c.snapSeq.Load(); old != 0 && old != seq {
		ops = append(ops, clientv3.OpDelete(snapshotChunks(c.cfg.ClusterID, old), clientv3.WithPrefix()))
	}
	cctx, cancel := context.WithTimeout(ctx, c.commitTimeout())
	defer cancel()
	resp, err := c.cli.Txn(cctx).If(fence).Then(ops...).Commit()
	if err == nil && !resp.Succeeded {
		err = errors.New("the master view is no longer this leader's")
	}
	if err != nil {
		return fmt.Errorf("install snapshot at seq %d: %w", seq, err)
	}
	c.snapSeq.Store(seq)
	c.snapshots.Add(1)
	compacted := ""
	if prev := c.snapRev.Swap(resp.Header.Revision); prev > 0 {
		compacted = c.compact(ctx, prev)
	}
	c.log.Info(fmt.Sprintf("HA snapshot at op log seq %d: %d bytes in %d chunks; log deleted%s", seq, len(b), n, compacted))
	return nil
}

// compact compacts etcd's history up to rev and says so for the
// snapshot's log line (a failure is logged on its own).
func (c *Candidate) compact(ctx context.Context, rev int64) string {
	cctx, cancel := context.WithTimeout(ctx, c.commitTimeout())
	defer cancel()
	_, err := c.cli.Compact(cctx, rev)
	switch {
	case err == nil:
		c.compactions.Add(1)
		return fmt.Sprintf(", etcd history compacted to revision %d", rev)
	case errors.Is(err, rpctypes.ErrCompacted):
		// Compacted further already (etcd's auto-compaction).
		return ""
	}
	c.logEtcdError(fmt.Sprintf("HA: compact etcd history to revision %d: %v (etcd's database grows until a compaction succeeds)", rev, err), err)
	return ""
}
