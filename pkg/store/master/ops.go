package master

import (
	"context"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/kvcache-ops/mc/pkg/store"
)

// PutItem is one object a writer is about to put.
type PutItem struct {
	Key  string
	Size uint64
}

// ReplicaResult is one item's answer: where its replicas are, or why not.
type ReplicaResult struct {
	Replicas []store.Replica
	LeaseTTL time.Duration // granted read lease (GetReplicaList)
	// Sum is the writer's checksum of the value (0: none given).
	Sum uint64
	// Disk is the object's replica on a node's disk tier (BatchQuery
	// only; a get is answered with DRAM replicas, staging the object).
	Disk *DiskReplica
	// Staged, when not 0, says the replica is a staged read of the
	// object's disk copy, held for LeaseTTL unless handed back sooner
	// (ReleaseStaged).
	Staged uint64
	// DiskVersion, when not 0 (a reader that stages disk objects
	// itself: BatchGetReplicaListDirect), says the one replica is the
	// object's record on its node's disk at that version: Addr 0, Len
	// the value's, on the node's segment; the reader asks DiskService
	// (the node's TierRead endpoint) for a staged read of it on tier
	// DiskTier.
	DiskVersion uint64
	DiskService string
	DiskTier    string
	// DiskKey is the record's key on the node: the stored key, scoped
	// by its tenant with --enable_multi_tenants, which the reader does
	// not know.
	DiskKey string
	Err     error
}

// useCounter stamps Object.lastUse.
var useCounter atomic.Uint64

func checkItem(it PutItem) error {
	if err := store.CheckStoredKey(it.Key); err != nil {
		return err
	}
	switch {
	case it.Size == 0:
		return store.Errorf(store.InvalidParams, "key %q: a value of 0 bytes cannot be stored", it.Key)
	case it.Size > store.MaxValueSize:
		return store.Errorf(store.InvalidParams, "key %q: value of %d bytes exceeds the limit of %d", it.Key, it.Size, uint64(store.MaxValueSize))
	}
	return nil
}

func checkConfig(cfg store.ReplicateConfig) error {
	if cfg.ReplicaNum < 0 || cfg.ReplicaNum > store.MaxReplicas {
		return store.Errorf(store.InvalidParams, "replica_num %d: want 1 to %d", cfg.ReplicaNum, store.MaxReplicas)
	}
	return nil
}

// failAll gives every item the same error (a config no item can use).
func failAll(out []ReplicaResult, err error) []ReplicaResult {
	for i := range out {
		out[i].Err = err
	}
	return out
}

// BatchPutStart allocates replicas for each item (state PROCESSING) and
// returns where the writer must put the bytes. A key that is complete, or
// whose put started less than the discard timeout ago, is refused with
// OBJECT_ALREADY_EXISTS; an older unfinished put is replaced.
func (m *Master) BatchPutStart(client store.UUID, host string, items []PutItem, cfg store.ReplicateConfig) []ReplicaResult {
	return m.BatchPutStartWait(context.Background(), client, host, items, cfg, 0)
}

// BatchPutStartWait is BatchPutStart for a writer that lets the master
// hold its call up to wait (bounded by the KV lease TTL, and ended early
// with ctx) when read leases are all that keeps it from evicting room:
// it waits for the first of them to end, if that is within wait, instead
// of evicting an object put within the last lease TTL or failing. A
// Mooncake client sends no wait (its wire has no field for it) and gets
// Mooncake's answer at once.
func (m *Master) BatchPutStartWait(ctx context.Context, client store.UUID, host string, items []PutItem, cfg store.ReplicateConfig, wait time.Duration) []ReplicaResult {
	m.touchClient(client)
	out := make([]ReplicaResult, len(items))
	if err := checkConfig(cfg); err != nil {
		return failAll(out, err)
	}
	ar := &descArena{buf: make([]store.Replica, 0, len(items)*max(cfg.ReplicaNum, 1))}
	// Tenants: quota reserved (own objects evicted) before placing; the
	// reservations end once the batch is placed, its charge then in
	// the ledger.
	release := m.admitPuts(items, cfg, out)
	defer release()
	wait = min(wait, m.cfg.KVLeaseTTL)
	deadline := m.now() + wait.Nanoseconds()
	for i, it := range items {
		m.m.putStart.Inc()
		if out[i].Err != nil {
			continue
		}
		if err := m.watermarkWait(ctx, it, cfg, deadline); err != nil {
			out[i] = ReplicaResult{Err: err}
			continue
		}
		out[i] = m.putStart(client, host, it, cfg, ar)
	}
	m.makeRoom(ctx, client, host, items, cfg, out, ar, time.Duration(max(deadline-m.now(), 0)))
	m.syncStarts(client, items, out)
	for i, r := range out {
		if r.Err == nil {
			m.m.valueSize.Observe(float64(items[i].Size))
		} else {
			m.m.putStartFail.Inc()
			if store.CodeOf(r.Err) == store.NoAvailableHandle {
				m.m.allocFailures.Inc()
			}
		}
	}
	return out
}

// makeRoom evicts for the items of out that found no room: first only
// objects older than a lease TTL (evictForPuts with freshSpared); when
// leases are in the way and the first ends within wait, it waits for it
// and tries again; then objects put within the last lease TTL go too.
func (m *Master) makeRoom(ctx context.Context, client store.UUID, host string, items []PutItem, cfg store.ReplicateConfig, out []ReplicaResult, ar *descArena, wait time.Duration) {
	deadline := m.now() + wait.Nanoseconds()
	var largest uint64
	short := func() bool {
		for i, r := range out {
			if !wantsRoom(r.Err) {
				continue
			}
			if largest == 0 {
				largest = m.space.largestSegment()
			}
			if items[i].Size <= largest {
				return true
			}
		}
		return false
	}
	for short() {
		seen := m.evictForPuts(client, host, items, cfg, out, ar, freshSpared)
		if !short() {
			return
		}
		if seen.leased == 0 || seen.leaseEnd > deadline || wait <= 0 {
			break
		}
		// +1ms: a lease ending at t is over after t.
		d := time.Duration(seen.leaseEnd-m.now()) + time.Millisecond
		t := time.NewTimer(max(d, time.Millisecond))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return
		}
		m.m.leaseWaits.Inc()
	}
	if short() {
		m.evictForPuts(client, host, items, cfg, out, ar, freshFirst)
	}
}

// descArena holds a batch's replica descriptors in one array (as lookup
// does), instead of an allocation per key.
type descArena struct{ buf []store.Replica }

// take renders o's replicas (being written) into the arena; a nil arena
// allocates.
func (ar *descArena) take(o *Object) []store.Replica {
	if ar == nil {
		return o.descriptors(false)
	}
	n := len(ar.buf)
	ar.buf = o.appendDescriptors(ar.buf, false)
	return ar.buf[n:len(ar.buf):len(ar.buf)]
}

func (m *Master) putStart(client store.UUID, host string, it PutItem, cfg store.ReplicateConfig, ar *descArena) ReplicaResult {
	if err := checkItem(it); err != nil {
		return ReplicaResult{Err: err}
	}
	m.tiers.supersede(it.Key)
	now := m.now()
	sh := m.shardOf(it.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if old := sh.objects[it.Key]; old != nil {
		if old.state == stateComplete {
			return ReplicaResult{Err: store.Errorf(store.ObjectAlreadyExists, "key %q already exists", it.Key)}
		}
		if now-old.putStart < m.cfg.PutDiscardTimeout.Nanoseconds() && old.writer != client {
			return ReplicaResult{Err: store.Errorf(store.ObjectAlreadyExists, "key %q is being put by another writer (started %s ago)", it.Key, time.Duration(now-old.putStart).Round(time.Millisecond))}
		}
		// The same writer starting the key again has given its earlier
		// put up (an answer it never got, a failover): replaced as an
		// abandoned one is, its space held until the release timeout.
		// An abandoned put: replace it, keeping its space out of use
		// until the release timeout (its writer may still be writing).
		sh.remove(it.Key, old)
		m.pend.addRelease(old.putStart+m.cfg.PutReleaseTimeout.Nanoseconds(), old.size, old.replicas)
		m.m.putDiscards.Inc()
	}
	o := &Object{
		key: it.Key, size: it.Size, putStart: now, state: stateProcessing, writer: client,
		softPin: m.softPinExpiry(cfg, now), hardPin: cfg.HardPin,
	}
	refs, err := m.space.place(o.one[:0:1], client, host, it.Size, cfg)
	if err != nil {
		// No kick of the watermark loop: BatchPutStart evicts for
		// itself (phases.go), and with no policy there is nothing to
		// evict.
		return ReplicaResult{Err: err}
	}
	o.replicas = refs
	m.tiers.noteWrites(refs, now)
	sh.objects[it.Key] = o
	m.recharge(o, 0)
	sh.linkPending(o)
	if m.cfg.OnChange != nil {
		m.emit(Change{Op: OpPutStart, Key: o.key, Size: o.size, Replicas: o.descriptors(false), Client: client, Started: time.Unix(0, now)})
	}
	return ReplicaResult{Replicas: ar.take(o)}
}

// syncStarts makes the grants in out durable when HA asks for it
// (Config.Sync): a next leader that did not know a grant would place new
// objects in its range while the writer may still write there. Grants
// that cannot be made durable are revoked and fail.
func (m *Master) syncStarts(client store.UUID, items []PutItem, out []ReplicaResult) {
	if m.cfg.Sync == nil || m.cfg.OnChange == nil {
		return
	}
	any := false
	for _, r := range out {
		any = any || r.Err == nil
	}
	if !any {
		return
	}
	err := m.cfg.Sync()
	if err == nil {
		return
	}
	e := store.Errorf(store.UnavailableInCurrentMode, "grant not committed to the HA op log: %v", err)
	for i := range out {
		if out[i].Err == nil {
			_ = m.revoke(client, items[i].Key)
			out[i] = ReplicaResult{Err: e}
		}
	}
}

// BatchPutEnd marks each put complete: from now on readers see it.
func (m *Master) BatchPutEnd(client store.UUID, keys []string) []error {
	return m.BatchPutEndSums(client, keys, nil)
}

// BatchPutEndSums is BatchPutEnd with the writer's checksum of each value
// (sums nil, or one per key: store.Checksum's form, 0 for none), kept
// with the object for readers to check.
func (m *Master) BatchPutEndSums(client store.UUID, keys []string, sums []uint64) []error {
	return m.BatchPutEndFailed(client, keys, sums, nil)
}

// FailedReplica is a replica its writer could not write: Key indexes the
// call's keys, Segment names the replica's segment.
type FailedReplica struct {
	Key     int
	Segment string
}

// BatchPutEndFailed is BatchPutEndSums for a writer that could not write
// some replicas (failed): those are dropped and their space freed, the
// object completes with the replicas that were written, and the segments
// are avoided for placement until their nodes ping (ReportUnreachable).
// A key with no replica left fails (the writer revokes such a put).
func (m *Master) BatchPutEndFailed(client store.UUID, keys []string, sums []uint64, failed []FailedReplica) []error {
	out := make([]error, len(keys))
	if sums != nil && len(sums) != len(keys) {
		return failErrs(out, store.Errorf(store.InvalidParams, "put end: %d checksums for %d keys", len(sums), len(keys)))
	}
	var drop map[int][]string
	if len(failed) > 0 {
		drop = make(map[int][]string)
		segs := make([]string, 0, len(failed))
		for _, f := range failed {
			if f.Key < 0 || f.Key >= len(keys) {
				return failErrs(out, store.Errorf(store.InvalidParams, "put end: failed replica of key %d in a batch of %d keys", f.Key, len(keys)))
			}
			drop[f.Key] = append(drop[f.Key], f.Segment)
			segs = append(segs, f.Segment)
		}
		m.ReportUnreachable(client, segs)
	}
	for i, k := range keys {
		var sum uint64
		if sums != nil {
			sum = sums[i]
		}
		out[i] = m.putEnd(client, k, i, sum, drop[i])
	}
	m.fenceDrops(keys, out)
	return out
}

func failErrs(out []error, err error) []error {
	for i := range out {
		out[i] = err
	}
	return out
}

func (m *Master) putEnd(client store.UUID, key string, depth int, sum uint64, drop []string) error {
	sh := m.shardOf(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	o := sh.objects[key]
	if o == nil {
		return store.Errorf(store.ObjectNotFound, "key %q: no put in progress (discarded after %s, or never started)", key, m.cfg.PutDiscardTimeout)
	}
	if err := o.checkWriter(client, "end"); err != nil {
		return err
	}
	if len(drop) > 0 {
		if err := m.dropUnwritten(o, drop); err != nil {
			return err
		}
	}
	switch {
	case o.upsert != nil:
		before := m.charge(o)
		defer m.recharge(o, before)
		old, u := o.replicas, o.upsert
		o.replicas, o.upsert = u.refs, nil
		if o.ent.In() {
			sh.policy.Remove(&o.ent)
		}
		if now, busy := m.now(), o.busyUntil(); busy > now {
			// A reader still moves the old version's bytes: they are
			// freed when its lease ends.
			m.holdLocked(o.key, old, o.size, busy)
		} else {
			m.space.free(old, o.size)
		}
		// The new version's ranges were never read under an earlier
		// leader's lease.
		o.held = 0
		if u.size != 0 {
			o.size = u.size
		}
		// A new version: the disk copy of the old one goes.
		m.dropDiskLocked(o)
		o.tier = nil
	case o.state == stateComplete && o.writer != client && !o.writer.IsZero():
		return store.Errorf(store.InvalidWrite, "key %q: this client's put or upsert of it was dropped (its new replicas' segment went away, or it was discarded); the object holds another version", key)
	case o.state == stateComplete:
		return store.Errorf(store.InvalidWrite, "key %q is already complete", key)
	}
	if o.state != stateComplete {
		sh.keys++
		if o.softPin != 0 {
			sh.softPinned++
		}
	}
	// putStart of a complete object is when it became complete: eviction
	// spares it for a lease TTL (freshCut).
	// writer stays: a revoke from it (its End's answer lost) learns that
	// the End landed (revoke).
	o.state, o.inPlace, o.putStart, o.writer = stateComplete, false, m.now(), client
	o.sum = sum
	sh.unlinkPending(o)
	o.gen++
	sh.track(o, depth)
	if m.cfg.OnChange != nil {
		// o.key, not key: the caller's may point into a request's body
		// (keys decoded borrowed), which the op log would keep alive.
		m.emit(Change{Op: OpPutEnd, Key: o.key, Size: o.size, Replicas: o.descriptors(true), SoftPin: expiry(o.softPin), HardPin: o.hardPin, Sum: sum})
	}
	m.eventStored(o.key)
	return nil
}

// dropUnwritten takes the replicas on the segments in drop out of the
// version o's writer is ending (its shard locked) and frees them: the
// writer could not write them. It refuses, changing nothing, when no
// replica would be left, or when o is complete with no upsert (nothing
// being written).
func (m *Master) dropUnwritten(o *Object, drop []string) error {
	defer m.recharge(o, m.charge(o))
	refs, size := &o.replicas, o.size
	switch {
	case o.upsert != nil:
		refs = &o.upsert.refs
		if o.upsert.size != 0 {
			size = o.upsert.size
		}
	case o.state == stateComplete:
		return store.Errorf(store.InvalidWrite, "key %q is already complete", o.key)
	}
	left := 0
	for _, r := range *refs {
		if !slices.Contains(drop, r.segName()) {
			left++
		}
	}
	switch left {
	case 0:
		return store.Errorf(store.InvalidParams, "key %q: none of its replicas was written: revoke the put", o.key)
	case len(*refs):
		return nil // none of its replicas is on those segments
	}
	var gone []replicaRef
	keep := (*refs)[:0]
	for _, r := range *refs {
		if slices.Contains(drop, r.segName()) {
			gone = append(gone, r)
		} else {
			keep = append(keep, r)
		}
	}
	clear((*refs)[len(keep):])
	*refs = keep
	m.space.free(gone, size)
	m.m.droppedReplicas.Add(float64(len(gone)))
	return nil
}

// checkWriter refuses to end a put or upsert that client did not
// start. A complete object with no upsert has no writer: the caller
// answers that case itself.
func (o *Object) checkWriter(client store.UUID, what string) error {
	if (o.state != stateComplete || o.upsert != nil) && o.writer != client {
		return store.Errorf(store.InvalidWrite, "key %q: cannot %s a put started by client %s (this is client %s)", o.key, what, o.writer, client)
	}
	return nil
}

// BatchPutRevoke abandons puts: their space is freed at once (the writer
// says it stopped writing).
func (m *Master) BatchPutRevoke(client store.UUID, keys []string) []error {
	out := make([]error, len(keys))
	var done []string
	var at []int
	for i, k := range keys {
		out[i] = m.revoke(client, k)
		if store.CodeOf(out[i]) == store.InvalidWrite {
			done, at = append(done, k), append(at, i)
		}
	}
	if len(done) > 0 {
		// "Complete" tells a writer whose End had no answer (its
		// deadline, a lost connection) that the put landed: it must not
		// come before the End's own answer could, while the End still
		// waits for the key's old disk record to be dropped (fenceDrops),
		// or a caller with a short deadline would hear "stored" for a
		// put that the next master, after a restart, shadows with the
		// record.
		fenced := make([]error, len(done))
		m.fenceDrops(done, fenced)
		for j, i := range at {
			if fenced[j] != nil {
				out[i] = fenced[j]
			}
		}
	}
	return out
}

func (m *Master) revoke(client store.UUID, key string) error {
	sh := m.shardOf(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	o := sh.objects[key]
	if o == nil {
		return store.Errorf(store.ObjectNotFound, "key %q: no put in progress", key)
	}
	if (o.state != stateComplete || o.upsert != nil) && o.writer != client {
		// Another client writes the key. A revoke learns the fate of
		// its own put from the answer: "complete" (INVALID_WRITE) only
		// when the version under that writer's resize is its own.
		// Otherwise its put was replaced or dropped before the other
		// began, and taking "complete" for its End having landed would
		// report a value stored that no reader gets.
		if o.upsert != nil && o.upsert.prev == client && o.state == stateComplete {
			return store.Errorf(store.InvalidWrite, "key %q is complete (client %s now upserts it)", o.key, o.writer)
		}
		return store.Errorf(store.ObjectNotFound, "key %q: no put or upsert of this client in progress (client %s writes it)", o.key, o.writer)
	}
	switch {
	case o.upsert != nil:
		before := m.charge(o)
		m.space.free(o.upsert.refs, o.upsert.size)
		o.upsert, o.putStart, o.writer = nil, 0, lostWriter
		m.recharge(o, before)
		sh.unlinkPending(o)
		m.emit(Change{Op: OpRevoke, Key: key})
		return nil
	case o.state == stateComplete && o.writer != client && !o.writer.IsZero():
		// Not this client's version: its upsert was dropped (its new
		// replicas' segment went away, or it was discarded), or another
		// writer's completed since. "Complete" here told the writer
		// that its End had landed, and it reported a value stored that
		// readers never saw (make soak: an upsert acknowledged, the
		// version before it read back).
		return store.Errorf(store.ObjectNotFound, "key %q: no put or upsert of this client in progress, and the object holds another writer's version", key)
	case o.state == stateComplete:
		// This client's End landed (or, restored from an op log, whose
		// it is is unknown).
		return store.Errorf(store.InvalidWrite, "key %q is complete: remove it instead", key)
	}
	if o.inPlace {
		m.eventRemoved(o)
	}
	sh.remove(key, o)
	m.space.free(o.replicas, o.size)
	m.emit(Change{Op: OpRevoke, Key: key})
	if o.inPlace {
		// A same-size upsert was rewriting the bytes: the old version
		// is torn, so the object is gone.
		m.emit(Change{Op: OpRemove, Key: key})
	}
	return nil
}

// BatchUpsertStart is a put that may replace a complete object: the same
// size is rewritten in place (readers get REPLICA_IS_NOT_READY until the
// End), another size gets new replicas while the old version stays
// readable until the End.
func (m *Master) BatchUpsertStart(client store.UUID, host string, items []PutItem, cfg store.ReplicateConfig) []ReplicaResult {
	m.touchClient(client)
	out := make([]ReplicaResult, len(items))
	if err := checkConfig(cfg); err != nil {
		return failAll(out, err)
	}
	release := m.admitPuts(items, cfg, out)
	defer release()
	for i, it := range items {
		if out[i].Err == nil {
			out[i] = m.upsertStart(client, host, it, cfg)
		}
	}
	m.syncStarts(client, items, out)
	return out
}

func (m *Master) upsertStart(client store.UUID, host string, it PutItem, cfg store.ReplicateConfig) ReplicaResult {
	if err := checkItem(it); err != nil {
		return ReplicaResult{Err: err}
	}
	m.tiers.supersede(it.Key)
	sh := m.shardOf(it.Key)
	sh.mu.Lock()
	o := sh.objects[it.Key]
	if o == nil || o.state != stateComplete {
		sh.mu.Unlock()
		r := m.putStart(client, host, it, cfg, nil)
		if store.CodeOf(r.Err) == store.NoAvailableHandle {
			m.m.allocFailures.Inc()
		}
		return r
	}
	defer sh.mu.Unlock()
	now := m.now()
	switch {
	case o.upsert != nil && now-o.putStart < m.cfg.PutDiscardTimeout.Nanoseconds():
		return ReplicaResult{Err: store.Errorf(store.ObjectAlreadyExists, "key %q is being upserted by another writer", it.Key)}
	case o.lease > now:
		return ReplicaResult{Err: store.Errorf(store.ObjectHasLease, "key %q is being read (lease for %s more)", it.Key, time.Duration(o.lease-now).Round(time.Millisecond))}
	case o.busyOnTier():
		return ReplicaResult{Err: store.Errorf(store.ObjectHasLease, "key %q is being moved to or from a disk tier; retry", it.Key)}
	}
	if o.upsert != nil { // abandoned resize
		before := m.charge(o)
		m.pend.addRelease(o.putStart+m.cfg.PutReleaseTimeout.Nanoseconds(), o.upsert.size, o.upsert.refs)
		o.upsert = nil
		m.recharge(o, before)
	}
	pin := m.softPinExpiry(cfg, now)
	prev := o.writer
	o.putStart, o.writer = now, client
	o.gen++
	if it.Size == o.size && len(o.replicas) > 0 && o.held <= now {
		// Rewritten in place: a disk copy would be of the old version.
		// (Not an object a previous leader may have leased: its
		// readers' bytes would change under them.)
		m.dropDiskLocked(o)
		o.tier = nil
		sh.remove(it.Key, o)
		sh.objects[it.Key] = o
		m.recharge(o, 0)
		o.softPin, o.hardPin = pin, cfg.HardPin
		o.state, o.inPlace = stateProcessing, true
		m.tiers.noteWrites(o.replicas, now)
		sh.linkPending(o)
		if m.cfg.OnChange != nil {
			m.emit(Change{Op: OpPutStart, Key: o.key, Size: o.size, Replicas: o.descriptors(false), Client: client, Started: time.Unix(0, now)})
		}
		return ReplicaResult{Replicas: o.descriptors(false)}
	}
	refs, err := m.space.place(nil, client, host, it.Size, cfg)
	if err != nil {
		m.m.allocFailures.Inc()
		m.kickEviction()
		o.putStart = 0
		sh.unlinkPending(o)
		return ReplicaResult{Err: err}
	}
	m.tiers.noteWrites(refs, now)
	before := m.charge(o)
	o.upsert = &upsertState{refs: refs, size: it.Size, prev: prev}
	m.recharge(o, before)
	if (pin != 0) != (o.softPin != 0) {
		if pin != 0 {
			sh.softPinned++
		} else {
			sh.softPinned--
		}
	}
	o.softPin, o.hardPin = pin, cfg.HardPin
	sh.linkPending(o)
	out := make([]store.Replica, len(refs))
	for i, r := range refs {
		out[i] = r.descriptor(it.Size, false)
	}
	if m.cfg.OnChange != nil {
		m.emit(Change{Op: OpPutStart, Key: o.key, Size: it.Size, Replicas: out, Client: client, Started: time.Unix(0, now)})
	}
	return ReplicaResult{Replicas: out}
}

// BatchUpsertEnd completes upserts (as PutEnd).
func (m *Master) BatchUpsertEnd(client store.UUID, keys []string) []error {
	return m.BatchPutEnd(client, keys)
}

// BatchUpsertRevoke abandons upserts (as PutRevoke; a resize keeps the
// old version).
func (m *Master) BatchUpsertRevoke(client store.UUID, keys []string) []error {
	return m.BatchPutRevoke(client, keys)
}

// BatchGetReplicaList returns the complete replicas of each key and grants
// a read lease of the KV lease TTL: the object is not evicted or removed
// (unless forced) while the reader moves its bytes.
func (m *Master) BatchGetReplicaList(keys []string) []ReplicaResult {
	return m.lookup(keys, true)
}

// BatchGetReplicaListBy is BatchGetReplicaList for a caller with a
// deadline: a read of a disk object waits for room in its node's staging
// pool until then (at most loadWait).
func (m *Master) BatchGetReplicaListBy(deadline time.Time, keys []string) []ReplicaResult {
	out, _ := m.lookupUntil(keys, true, false, deadline, nil, nil)
	return out
}

// BatchGetReplicaListDirect is BatchGetReplicaList for a reader that
// stages disk objects itself (mc's client): an object whose only copy is
// on a node's disk is answered with where its record is (DiskVersion,
// DiskService), not staged by the master, unless this read promotes it
// into DRAM.
func (m *Master) BatchGetReplicaListDirect(deadline time.Time, keys []string) []ReplicaResult {
	out, _ := m.lookupUntil(keys, true, true, deadline, nil, nil)
	return out
}

// BatchQuery is the admin read: replicas, no lease, no touch of the
// eviction order.
func (m *Master) BatchQuery(keys []string) []ReplicaResult {
	return m.lookup(keys, false)
}

func (m *Master) lookup(keys []string, lease bool) []ReplicaResult {
	out, _ := m.lookupInto(keys, lease, nil, nil)
	return out
}

// lookupInto is lookup into a caller's scratch (a hot wire handler's,
// reused across calls): out is resized to the keys, descs holds every
// result's descriptors. It returns both, grown as needed; the results
// point into descs, so the caller keeps both until it is done with them.
func (m *Master) lookupInto(keys []string, lease bool, out []ReplicaResult, descs []store.Replica) ([]ReplicaResult, []store.Replica) {
	return m.lookupUntil(keys, lease, false, time.Time{}, out, descs)
}

// lookupUntil is lookupInto for a caller with a deadline (zero: none):
// reads of disk objects wait for their loads (which wait for room to
// stage them), until then or loadBound, whichever comes first. direct:
// the reader stages disk objects itself (DiskVersion).
func (m *Master) lookupUntil(keys []string, lease, direct bool, deadline time.Time, out []ReplicaResult, descs []store.Replica) ([]ReplicaResult, []store.Replica) {
	start := m.now()
	out, descs = m.lookupRaw(keys, lease, direct, deadline, start, out, descs)
	if lease && m.early.end.Load() > start {
		m.awaitEarly(keys, lease, direct, deadline, start, out)
	}
	if lease {
		m.m.getReplicaList.Add(float64(len(keys)))
		// Counted once per call: each counter is an atomic every caller
		// shares. Memory and disk hits are the tier's (readLocked).
		var failed int
		for _, r := range out {
			if r.Err != nil {
				failed++
			}
		}
		m.m.getReplicaListFail.Add(float64(failed))
		m.m.totalGets.Add(float64(len(keys)))
		m.m.validGets.Add(float64(len(keys) - failed))
	}
	return out, descs
}

// lookupRaw is lookupUntil without the early hold's wait and the
// counters, at now.
func (m *Master) lookupRaw(keys []string, lease, direct bool, deadline time.Time, now int64, out []ReplicaResult, descs []store.Replica) ([]ReplicaResult, []store.Replica) {
	out = slices.Grow(out[:0], len(keys))[:len(keys)]
	clear(out)
	// One array for every key's descriptors (most keys have one replica);
	// each result is a full slice of its own part of it.
	descs = slices.Grow(descs[:0], len(keys))
	var loads []*tierOp
	var loadIdx []int
	// The batch's use stamps, reserved at once; in key order.
	stamp := useCounter.Add(uint64(len(keys))) - uint64(len(keys))
	for i, k := range keys {
		var load *tierOp
		out[i], load = m.lookupOne(k, i, lease, direct, deadline, now, stamp+uint64(i)+1, &descs)
		if load != nil {
			loads = append(loads, load)
			loadIdx = append(loadIdx, i)
		}
	}
	if len(loads) > 0 {
		out = m.awaitDisk(keys, lease, direct, deadline, now, out, &descs, loads, loadIdx)
	}
	return out, descs
}

// lookupOne answers one key; with a lease, an object whose only copy is
// on disk starts loading (or joins the load under way) and the load is
// returned instead of an answer.
func (m *Master) lookupOne(k string, depth int, lease, direct bool, deadline time.Time, now int64, stamp uint64, descs *[]store.Replica) (ReplicaResult, *tierOp) {
	var r ReplicaResult
	if err := store.CheckStoredKey(k); err != nil {
		r.Err = err
		return r, nil
	}
	sh := m.shardOf(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	o := sh.objects[k]
	switch {
	case o == nil:
		r.Err = store.Errorf(store.ObjectNotFound, "key %q not found", k)
	case o.state != stateComplete:
		r.Err = store.Errorf(store.ReplicaIsNotReady, "key %q is still being written", k)
	case lease && len(o.replicas) == 0 && o.tier != nil && o.tier.early && m.early.in(now):
		// Re-added from before this master in its first moments: a
		// fence may still be heard of it (earlyHold).
		r.Err = errEarly
	case lease && len(o.replicas) == 0 && o.onDisk() && (o.tier.stage != nil || direct && o.tier.loading == nil) && m.promoteDue(o) && m.promoteLoad(o, &r, deadline):
		// The read that promotes: loaded into the segment, not shared.
		return r, o.tier.loading
	case lease && len(o.replicas) == 0 && o.tier != nil && o.tier.stage != nil:
		// A staged copy readers hold now: this read shares it.
		n := len(*descs)
		*descs = append(*descs, m.grantStagedLocked(o, now))
		r.Replicas = (*descs)[n:len(*descs):len(*descs)]
		// The object's lease is any read's; the copy's hold on its range
		// is the staging TTL, unless handed back sooner.
		r.Sum, r.Staged, r.LeaseTTL = o.sum, o.tier.stage.id, m.stagedTTL()
		o.lease = max(o.lease, now+m.cfg.KVLeaseTTL.Nanoseconds())
		sh.touch(o, depth, stamp)
	case lease && len(o.replicas) == 0 && o.onDisk() && direct && o.tier.loading == nil:
		// The reader asks the node itself: the master only says where
		// the record is.
		r = m.diskReadLocked(o, now, descs)
		if r.Err == nil {
			sh.touch(o, depth, stamp)
		}
	case lease && len(o.replicas) == 0 && o.onDisk():
		r.Sum = o.sum
		op, err := m.stageLocked(o, deadline)
		if err != nil {
			r.Err = err
		}
		return r, op
	default:
		n := len(*descs)
		*descs = o.appendDescriptors(*descs, true)
		r.Replicas = (*descs)[n:len(*descs):len(*descs)]
		r.Sum = o.sum
		if lease {
			o.lease = max(o.lease, now+m.cfg.KVLeaseTTL.Nanoseconds())
			sh.touch(o, depth, stamp)
			m.readLocked(sh, o, depth)
			r.LeaseTTL = m.cfg.KVLeaseTTL
		} else if o.onDisk() {
			r.Disk = m.diskReplicaLocked(o)
		}
	}
	return r, nil
}

// BatchExistKey reports whether each key is complete. It grants a lease
// only with Config.ExistKeyGrantLease.
func (m *Master) BatchExistKey(keys []string) ([]bool, []error) {
	exists := make([]bool, len(keys))
	errs := make([]error, len(keys))
	now := m.now()
	for i, k := range keys {
		m.m.existKey.Inc()
		if err := store.CheckStoredKey(k); err != nil {
			errs[i] = err
			m.m.existKeyFail.Inc()
			continue
		}
		sh := m.shardOf(k)
		sh.mu.Lock()
		if o := sh.objects[k]; o != nil && o.state == stateComplete {
			exists[i] = true
			if m.cfg.ExistKeyGrantLease {
				o.lease = max(o.lease, now+m.cfg.KVLeaseTTL.Nanoseconds())
			}
		}
		sh.mu.Unlock()
	}
	return exists, errs
}

// BatchRemove removes objects. A key being read (leased) is refused with
// OBJECT_HAS_LEASE unless force; a key still being written is refused
// even when forced.
func (m *Master) BatchRemove(keys []string, force bool) []error {
	return m.BatchRemoveIf(keys, force, nil)
}

// BatchRemoveIf is BatchRemove of the keys whose objects are still the
// versions of the writers' checksums in sums (one per key; nil: any
// version): another version fails INVALID_VERSION and stays. A reader
// that found every replica of a key corrupt removes that version only,
// not one a writer put since its read.
func (m *Master) BatchRemoveIf(keys []string, force bool, sums []uint64) []error {
	if sums != nil && len(sums) != len(keys) {
		return failErrsN(len(keys), store.Errorf(store.InvalidParams, "%d checksums for %d keys", len(sums), len(keys)))
	}
	out := make([]error, len(keys))
	now := m.now()
	for i, k := range keys {
		m.m.remove.Inc()
		var sum *uint64
		if sums != nil {
			sum = &sums[i]
		}
		out[i] = m.remove(k, force, now, sum)
		if out[i] != nil {
			m.m.removeFail.Inc()
		}
	}
	m.fenceDrops(keys, out)
	return out
}

// remove removes key's object (only the version of the writer's
// checksum *sum when sum is not nil).
func (m *Master) remove(key string, force bool, now int64, sum *uint64) error {
	if err := store.CheckStoredKey(key); err != nil {
		return err
	}
	sh := m.shardOf(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	o := sh.objects[key]
	if o == nil {
		sh.era.left(key) // a record from before this master is not re-added
	}
	if err := removable(key, o, force, now); err != nil {
		return err
	}
	if sum != nil && o.sum != *sum {
		return store.Errorf(store.InvalidVersion, "key %q holds another version (checksum 0x%x) than the one to remove (0x%x): not removed", key, o.sum, *sum)
	}
	m.eventRemoved(o)
	sh.remove(key, o)
	m.releaseLocked(o)
	m.emit(Change{Op: OpRemove, Key: key})
	return nil
}

// removable says why object o under key cannot be removed now, or nil.
// The caller holds its shard's lock.
func removable(key string, o *Object, force bool, now int64) error {
	switch {
	case o == nil:
		return store.Errorf(store.ObjectNotFound, "key %q not found", key)
	case o.state != stateComplete || o.upsert != nil:
		return store.Errorf(store.ReplicaIsNotReady, "key %q is being written; it cannot be removed until its put ends", key)
	case o.lease > now && !force:
		return store.Errorf(store.ObjectHasLease, "key %q is being read (lease for %s more); remove with force to override", key, time.Duration(o.lease-now).Round(time.Millisecond))
	}
	return nil
}

// RemoveAll removes every complete object not being read; it returns how
// many went.
func (m *Master) RemoveAll() int { return m.RemoveAllIn("") }

// RemoveAllIn is RemoveAll of tenant's keys ("" or without multi-tenant
// mode: every key, as Mooncake's RemoveAll with an empty tenant id).
func (m *Master) RemoveAllIn(tenant string) int {
	now := m.now()
	n := 0
	sc := m.scope(tenant)
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		for k, o := range sh.objects {
			if _, ok := sc.user(k); !ok {
				continue
			}
			if o.state == stateComplete && o.upsert == nil && o.lease <= now {
				m.eventRemoved(o)
				sh.remove(k, o)
				m.releaseLocked(o)
				m.emit(Change{Op: OpRemove, Key: k})
				n++
			}
		}
		sh.mu.Unlock()
	}
	if n > 0 {
		m.fenceDrops(nil, nil)
	}
	return n
}

// Keys calls fn with every complete key (in no order) until fn returns
// false. Admin reads: no lease, no touch.
func (m *Master) Keys(prefix string, fn func(key string, size uint64) bool) {
	m.KeysIn("", prefix, fn)
}

// KeysIn is Keys over tenant's keys (every key for "" or without
// multi-tenant mode), given to fn without their scope.
func (m *Master) KeysIn(tenant, prefix string, fn func(key string, size uint64) bool) {
	sc := m.scope(tenant)
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		var batch []PutItem
		for k, o := range sh.objects {
			if o.state != stateComplete {
				continue
			}
			if u, ok := sc.user(k); ok && strings.HasPrefix(u, prefix) {
				batch = append(batch, PutItem{u, o.size})
			}
		}
		sh.mu.Unlock()
		for _, it := range batch {
			if !fn(it.Key, it.Size) {
				return
			}
		}
	}
}

// Segments lists the mounted segments.
func (m *Master) Segments() []SegmentStatus { return m.space.list() }

// Stats is a summary of the master's state.
type Stats struct {
	Keys         int
	SoftPinned   int
	HardPinned   int
	Processing   int
	Used         uint64
	Capacity     uint64
	Segments     int
	Clients      int
	EvictedKeys  uint64
	EvictedBytes uint64
}

// Stats counts keys and space.
func (m *Master) Stats() Stats {
	var s Stats
	now := m.now()
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		for _, o := range sh.objects {
			if o.state != stateComplete {
				s.Processing++
				continue
			}
			s.Keys++
			if o.hardPin {
				s.HardPinned++
			} else if o.softPin > now {
				s.SoftPinned++
			}
		}
		sh.mu.Unlock()
	}
	s.Used, s.Capacity = m.space.used.Load(), m.space.capacity.Load()
	s.Segments = len(m.space.list())
	s.Clients = m.ActiveClients()
	s.EvictedKeys, s.EvictedBytes = m.m.evictedKeys.Load(), m.m.evictedBytes.Load()
	return s
}

// awaitDisk finishes a lookup's reads of disk objects: it waits for the
// loads it started (or joined) and answers them from the staged copies
// (a node whose staging pool is full waits for room before it answers),
// until the deadline (at most loadBound).
func (m *Master) awaitDisk(keys []string, lease, direct bool, deadline time.Time, start int64, out []ReplicaResult, descs *[]store.Replica, loads []*tierOp, loadIdx []int) []ReplicaResult {
	// A read granted after a wait: its lease, as told, counts from when
	// the call began (start), so that a reader bounding its read by the
	// time it sent the call plus the lease (store.Client's LEASE_EXPIRED
	// check) stays inside the real lease.
	regrant := func(i int) (ReplicaResult, *tierOp) {
		now := m.now()
		r, load := m.lookupOne(keys[i], i, lease, direct, deadline, now, useCounter.Add(1), descs)
		if r.LeaseTTL > 0 {
			r.LeaseTTL += time.Duration(now - start)
		}
		return r, load
	}
	bound := m.loadBound(deadline)
	timer := time.NewTimer(bound)
	defer timer.Stop()
	for len(loads) > 0 {
		// Wait for the first load to land.
		cases := make([]reflect.SelectCase, 0, 1+len(loads))
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(timer.C)})
		for _, op := range loads {
			cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(op.done)})
		}
		if chosen, _, _ := reflect.Select(cases); chosen == 0 {
			break
		}
		var left []*tierOp
		var leftIdx []int
		for j, op := range loads {
			i := loadIdx[j]
			select {
			case <-op.done:
			default:
				left, leftIdx = append(left, op), append(leftIdx, i)
				continue
			}
			if op.err != nil {
				out[i].Err = op.err
				continue
			}
			var again *tierOp
			if out[i], again = regrant(i); again != nil {
				// Its copy went (its readers done) and another load began.
				left, leftIdx = append(left, again), append(leftIdx, i)
			}
		}
		loads, loadIdx = left, leftIdx
	}
	for _, i := range loadIdx {
		out[i].Err = store.Errorf(store.RPCTimeout, "key %q: its disk copy did not load within %s", keys[i], bound.Round(time.Millisecond))
	}
	return out
}

// promoteLoad starts o's promotion into free room of its node's segment
// (shard locked); false when there is none (the read shares the staged
// copy instead). r gets the object's checksum, or the load's error.
func (m *Master) promoteLoad(o *Object, r *ReplicaResult, deadline time.Time) bool {
	op, err := m.loadLocked(o, true, deadline)
	if op == nil && err == nil {
		return false
	}
	r.Sum, r.Err = o.sum, err
	return true
}
