package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine"
)

// Buffer is memory registered with the client's engine: PutFrom reads a
// value from it and GetInto writes one into it with no copy on the way.
type Buffer struct{ mem *engine.Memory }

// RegisterBuffer registers size bytes for zero-copy puts and gets.
func (c *Client) RegisterBuffer(ctx context.Context, size int) (*Buffer, error) {
	if err := c.enter(); err != nil {
		return nil, err
	}
	defer c.leave()
	m, err := c.eng.RegisterMemory(ctx, size, "cpu:0", false)
	if err != nil {
		return nil, err
	}
	return &Buffer{mem: m}, nil
}

// Bytes is the buffer's memory.
func (b *Buffer) Bytes() []byte { return b.mem.Bytes() }

// Len is the buffer's size.
func (b *Buffer) Len() int { return b.mem.Len() }

// ReleaseBuffer unregisters a buffer.
func (c *Client) ReleaseBuffer(ctx context.Context, b *Buffer) error {
	if err := c.enter(); err != nil {
		return err
	}
	defer c.leave()
	return c.eng.UnregisterMemory(ctx, b.mem)
}

// Slice is a part of a Buffer.
type Slice struct {
	Buf      *Buffer
	Off, Len int
}

func (s Slice) addr() (uint64, error) {
	if s.Buf == nil || s.Off < 0 || s.Len < 0 || s.Off+s.Len > s.Buf.Len() {
		return 0, Errorf(InvalidParams, "slice [%d, +%d) is outside its buffer", s.Off, s.Len)
	}
	return s.Buf.mem.Addr() + uint64(s.Off), nil
}

// PutOption adjusts one put's ReplicateConfig.
type PutOption func(*ReplicateConfig)

// WithReplicas asks for n replicas on distinct segments (best effort).
func WithReplicas(n int) PutOption { return func(c *ReplicateConfig) { c.ReplicaNum = n } }

// WithConfig replaces the whole ReplicateConfig.
func WithConfig(rc ReplicateConfig) PutOption { return func(c *ReplicateConfig) { *c = rc } }

func (c *Client) replicate(opts []PutOption) ReplicateConfig {
	rc := c.cfg.Replicate
	for _, o := range opts {
		o(&rc)
	}
	return rc
}

// Put stores value under key. The value is copied once into the client's
// registered staging memory; PutFrom avoids that copy.
func (c *Client) Put(ctx context.Context, key string, value []byte, opts ...PutOption) error {
	return c.BatchPut(ctx, []string{key}, [][]byte{value}, opts...)[0]
}

// BatchPut stores values under keys, with one master round trip to start
// them, one batch of transfers and one round trip to end them.
func (c *Client) BatchPut(ctx context.Context, keys []string, values [][]byte, opts ...PutOption) []error {
	began := time.Now()
	errs := make([]error, len(keys))
	if err := c.enter(); err != nil {
		return failAll(errs, err)
	}
	defer c.leave()
	if len(values) != len(keys) {
		for i := range errs {
			errs[i] = Errorf(InvalidParams, "%d keys but %d values", len(keys), len(values))
		}
		return errs
	}
	src := make([]local, len(keys))
	defer c.unstage(ctx, src)
	for i, v := range values {
		if err := CheckKey(keys[i]); err != nil {
			errs[i] = err // before staging: the key is refused anyway
			continue
		}
		if len(v) == 0 {
			errs[i] = Errorf(InvalidParams, "key %q: a value of 0 bytes cannot be stored", keys[i])
			continue
		}
		s, err := c.staged(ctx, len(v))
		if err != nil {
			errs[i] = err
			continue
		}
		copy(s.bytes(), v)
		src[i] = s
	}
	c.put(ctx, began, keys, src, c.replicate(opts), errs, false)
	return errs
}

// PutFrom stores the bytes of s under key with no copy.
func (c *Client) PutFrom(ctx context.Context, key string, s Slice, opts ...PutOption) error {
	return c.BatchPutFrom(ctx, []string{key}, []Slice{s}, opts...)[0]
}

// BatchPutFrom stores each slice under its key with no copy.
func (c *Client) BatchPutFrom(ctx context.Context, keys []string, slices []Slice, opts ...PutOption) []error {
	began := time.Now()
	errs := make([]error, len(keys))
	if err := c.enter(); err != nil {
		return failAll(errs, err)
	}
	defer c.leave()
	src := make([]local, len(keys))
	for i := range keys {
		if i >= len(slices) {
			errs[i] = Errorf(InvalidParams, "%d keys but %d slices", len(keys), len(slices))
			continue
		}
		a, err := slices[i].addr()
		if err != nil {
			errs[i] = err
			continue
		}
		src[i] = local{addr: a, n: uint64(slices[i].Len), buf: slices[i].Buf.mem.Bytes()[slices[i].Off:][:slices[i].Len]}
	}
	c.put(ctx, began, keys, src, c.replicate(opts), errs, false)
	return errs
}

// Upsert stores value under key whether or not it exists.
func (c *Client) Upsert(ctx context.Context, key string, value []byte, opts ...PutOption) error {
	began := time.Now()
	if err := c.enter(); err != nil {
		return err
	}
	defer c.leave()
	errs := []error{nil}
	if len(value) == 0 {
		return Errorf(InvalidParams, "key %q: a value of 0 bytes cannot be stored", key)
	}
	s, err := c.staged(ctx, len(value))
	if err != nil {
		return err
	}
	src := []local{s}
	defer c.unstage(ctx, src)
	copy(s.bytes(), value)
	c.put(ctx, began, []string{key}, src, c.replicate(opts), errs, true)
	return errs[0]
}

// put runs the put protocol for the items whose errs entry is nil and
// whose key keeps the key rule (CheckKey). began is when the caller's put
// began (before its values were staged).
func (c *Client) put(ctx context.Context, began time.Time, keys []string, src []local, rc ReplicateConfig, errs []error, upsert bool) {
	items := make([]putItem, 0, len(keys))
	idx := make([]int, 0, len(keys))
	for i, k := range keys {
		if errs[i] == nil {
			errs[i] = CheckKey(k)
		}
		if errs[i] == nil {
			items = append(items, putItem{key: k, n: src[i].n})
			idx = append(idx, i)
		}
	}
	if len(idx) == 0 {
		return
	}
	if c.beforePutStart != nil {
		c.beforePutStart(keys)
	}
	if ctx.Err() != nil {
		// Staging the values used up the caller's time (a big copy,
		// page faults): nothing was sent, so nothing is to revoke.
		err := notSent(ctx, began)
		for _, i := range idx {
			errs[i] = fmt.Errorf("%w; %q not stored (nothing was sent)", err, keys[i])
		}
		return
	}
	lists, listErrs, err := c.w.putStart(ctx, items, rc, upsert)
	if err != nil {
		for _, i := range idx {
			errs[i] = err
		}
		if unsure(err) {
			// The grants may have been made (and, with HA, logged)
			// with the answer lost, or be made yet (the start is on
			// its way; the master gives back a grant whose caller gave
			// up before the answer): give them back (see below).
			ks := make([]string, len(idx))
			for j, i := range idx {
				ks[j] = keys[i]
			}
			res := c.w.putRevoke(context.WithoutCancel(ctx), ks, upsert, nil)
			for j, i := range idx {
				errs[i] = settled(ks[j], err, res[j], false)
			}
		}
		return
	}
	if c.afterPutStart != nil {
		// Tests stall a writer here, between its grant and its bytes.
		c.afterPutStart(keys)
	}
	var reqs []xfer
	var lost []string
	for j, i := range idx {
		if listErrs[j] != nil {
			errs[i] = listErrs[j]
			if unsure(listErrs[j]) {
				lost = append(lost, keys[i])
			}
			continue
		}
		for _, r := range lists[j] {
			reqs = append(reqs, xfer{item: i, op: engine.Write, local: src[i].addr, rep: r})
		}
	}
	// The checksums are taken while the bytes move (the transfer reads
	// the same memory; neither writes it).
	var sums []uint64
	var summed chan struct{}
	if c.cfg.Checksums {
		sums = make([]uint64, len(keys))
		summed = make(chan struct{})
		go func() {
			defer close(summed)
			for _, i := range idx {
				if errs[i] == nil && src[i].buf != nil {
					sums[i] = Checksum(src[i].buf[:src[i].n])
				}
			}
		}()
	}
	// A replica that could not be written does not fail the put when
	// another one was (and the wire can end it without that replica):
	// the master drops it and avoids its segment until its node pings.
	failed := make([]error, len(keys))
	wrote := make([]int, len(keys))
	var bad []failedReplica // key: index in keys
	var unreachable []string
	for j, err := range c.transferEach(ctx, reqs) {
		x := reqs[j]
		if err == nil {
			wrote[x.item]++
			continue
		}
		if failed[x.item] == nil {
			failed[x.item] = err
		}
		bad = append(bad, failedReplica{key: x.item, segment: x.rep.Segment})
		if !slices.Contains(unreachable, x.rep.Segment) {
			unreachable = append(unreachable, x.rep.Segment)
		}
	}
	if summed != nil {
		<-summed
	}
	var end, revoke []string
	var endSums []uint64
	var endIdx, revokeIdx []int
	endAt := make([]int, len(keys)) // an item's index in end, +1
	for j, i := range idx {
		if errs[i] != nil {
			continue
		}
		if err := failed[i]; err != nil && (wrote[i] == 0 || !c.w.endsPartial()) {
			errs[i] = err
			revoke = append(revoke, keys[i])
			revokeIdx = append(revokeIdx, i)
			continue
		} else if err != nil {
			c.partialPuts.Add(1)
			c.log.Warn(fmt.Sprintf("put %q: stored with %d of %d replicas: %v", keys[i], wrote[i], len(lists[j]), err))
		}
		end = append(end, keys[i])
		endAt[i] = len(end)
		endIdx = append(endIdx, i)
		if sums != nil {
			endSums = append(endSums, sums[i])
		}
	}
	// The failed replicas of the keys that end, by their index in end.
	var endFailed []failedReplica
	for _, f := range bad {
		if k := endAt[f.key]; k > 0 {
			endFailed = append(endFailed, failedReplica{key: k - 1, segment: f.segment})
		}
	}
	// Grants the master may have made (and, with HA, logged) though it
	// answered with an error go back too.
	if n := len(revoke); n+len(lost) > 0 {
		res := c.w.putRevoke(context.WithoutCancel(ctx), append(revoke, lost...), upsert, unreachable)
		for j, i := range revokeIdx {
			errs[i] = settled(keys[i], errs[i], res[j], false)
		}
	}
	if len(end) > 0 {
		res := c.w.putEnd(ctx, end, endSums, endFailed, upsert)
		var again []string
		var againIdx []int
		for j, i := range endIdx {
			errs[i] = res[j]
			if unsure(res[j]) {
				again = append(again, end[j])
				againIdx = append(againIdx, i)
			}
		}
		if len(again) > 0 {
			// The end may not have reached the master (a failover, a
			// lost connection, the caller's deadline): give the grant
			// back, so the key is free at once (and the next HA leader,
			// which has the grant from the op log, does not hold the
			// key as being written until the discard timeout). An end
			// that did land makes the revoke fail, saying the object
			// is complete: the put then succeeded.
			res := c.w.putRevoke(context.WithoutCancel(ctx), again, upsert, nil)
			for j, i := range againIdx {
				errs[i] = settled(again[j], errs[i], res[j], true)
			}
		}
	}
}

// settled is the outcome of a put of key that failed with cause and
// whose grant was then revoked, the revoke answering rev: not stored
// (the revoke freed the grant, or found none to free), stored (ended:
// the put's end had been sent, and the revoke found the object
// complete), or unknown, with how to find out.
func settled(key string, cause, rev error, ended bool) error {
	switch {
	case rev == nil || CodeOf(rev) == ObjectNotFound:
		return fmt.Errorf("%w; %q not stored (its put was revoked)", cause, key)
	case ended && CodeOf(rev) == InvalidWrite:
		return nil
	case !ended:
		// No byte reached an object that can complete: only the
		// grant may be left, holding the key until the master
		// discards it.
		return fmt.Errorf("%w; %q not stored, but revoking its put failed (%v): the key may stay reserved until the master discards the unfinished put (--put_start_discard_timeout_sec, 30 s)", cause, key, rev)
	}
	return fmt.Errorf("%w; whether %q was stored is unknown (revoking its put failed: %v): `mc store exists` (Client.Exist) tells", cause, key, rev)
}

// notSent is the error of a put whose caller's context ended before its
// start was sent: it names the deadline and the time that really passed
// since the put began (a 100 ms-deadline put of 64 MiB once said "gave up
// after 0s" 3 s after it began: the time went on staging its value).
func notSent(ctx context.Context, began time.Time) error {
	took := time.Since(began).Round(time.Millisecond)
	if dl, ok := ctx.Deadline(); ok && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return Errorf(RPCTimeout, "put start: the caller's deadline, %s after the put began, passed before it was sent to the master: gave up after %s, spent staging the values",
			dl.Sub(began).Round(time.Millisecond), took)
	}
	return fmt.Errorf("put start: cancelled before it was sent to the master, after %s: %w", took, ctx.Err())
}

// unsure reports whether a call that failed with err may still have
// taken effect on the master (its answer lost on the way).
func unsure(err error) bool {
	switch CodeOf(err) {
	case RPCFail, RPCTimeout, UnavailableInCurrentMode:
		return true
	}
	return false
}

// Get returns the value of key. It is read into the client's staging
// memory and copied out once; GetInto avoids that copy.
func (c *Client) Get(ctx context.Context, key string) ([]byte, error) {
	v, errs := c.BatchGet(ctx, []string{key})
	return v[0], errs[0]
}

// BatchGet returns the values of keys: one master round trip, one batch
// of transfers (and more only for replicas that failed).
func (c *Client) BatchGet(ctx context.Context, keys []string) ([][]byte, []error) {
	vals := make([][]byte, len(keys))
	errs := make([]error, len(keys))
	if err := c.enter(); err != nil {
		return vals, failAll(errs, err)
	}
	defer c.leave()
	asked := time.Now()
	reps, sums := c.replicaLists(ctx, keys, errs)
	dst := make([]local, len(keys))
	defer c.unstage(ctx, dst)
	for i := range keys {
		if errs[i] != nil {
			continue
		}
		s, err := c.staged(ctx, int(reps[i][0].Len))
		if err != nil {
			errs[i] = err
			continue
		}
		dst[i] = s
	}
	c.read(ctx, asked, keys, reps, sums, dst, errs)
	for i := range keys {
		if errs[i] == nil {
			vals[i] = append([]byte(nil), dst[i].bytes()...)
		}
	}
	return vals, errs
}

// GetInto reads key's value into s and returns its length. s must be at
// least as long as the value.
func (c *Client) GetInto(ctx context.Context, key string, s Slice) (int, error) {
	n, errs := c.BatchGetInto(ctx, []string{key}, []Slice{s})
	return n[0], errs[0]
}

// BatchGetInto reads each key's value into its slice with no copy.
func (c *Client) BatchGetInto(ctx context.Context, keys []string, slices []Slice) ([]int, []error) {
	errs := make([]error, len(keys))
	ns := make([]int, len(keys))
	if err := c.enter(); err != nil {
		return ns, failAll(errs, err)
	}
	defer c.leave()
	asked := time.Now()
	reps, sums := c.replicaLists(ctx, keys, errs)
	dst := make([]local, len(keys))
	for i := range keys {
		if errs[i] != nil {
			continue
		}
		if i >= len(slices) {
			errs[i] = Errorf(InvalidParams, "%d keys but %d slices", len(keys), len(slices))
			continue
		}
		a, err := slices[i].addr()
		if err != nil {
			errs[i] = err
			continue
		}
		if n := reps[i][0].Len; n > uint64(slices[i].Len) {
			errs[i] = Errorf(InvalidParams, "key %q: value of %d bytes does not fit a slice of %d", keys[i], n, slices[i].Len)
			continue
		}
		n := reps[i][0].Len
		dst[i] = local{addr: a, n: n, buf: slices[i].Buf.mem.Bytes()[slices[i].Off:][:n]}
	}
	c.read(ctx, asked, keys, reps, sums, dst, errs)
	for i := range keys {
		if errs[i] == nil {
			ns[i] = int(dst[i].n)
		}
	}
	return ns, errs
}

// replicaLists asks the master where each key's replicas are (granting a
// read lease).
func (c *Client) replicaLists(ctx context.Context, keys []string, errs []error) ([][]Replica, []uint64) {
	out := make([][]Replica, len(keys))
	send, idx := validKeys(keys, errs)
	if len(send) == 0 {
		return out, nil
	}
	lists, listSums, listErrs, err := c.w.replicaLists(ctx, send)
	var sums []uint64
	if listSums != nil && c.cfg.Checksums {
		sums = make([]uint64, len(keys))
	}
	for j := range send {
		i := at(idx, j)
		if err != nil {
			errs[i] = err
			continue
		}
		if sums != nil {
			sums[i] = listSums[j]
		}
		switch reps := lists[j]; {
		case listErrs[j] != nil:
			errs[i] = listErrs[j]
		case len(reps) == 0:
			errs[i] = Errorf(ObjectNotFound, "key %q has no complete replica", keys[i])
		default:
			out[i] = c.orderReplicas(reps)
		}
	}
	return out, sums
}

// orderReplicas puts the replicas this process holds first (a memcpy),
// then those on this host.
func (c *Client) orderReplicas(reps []Replica) []Replica {
	if len(reps) < 2 {
		return reps
	}
	own := c.eng.SegmentName()
	rank := func(r Replica) int {
		switch {
		case r.Endpoint == own:
			return 0
		case hostOf(r.Endpoint) == c.host:
			return 1
		}
		return 2
	}
	for i := 1; i < len(reps); i++ {
		for j := i; j > 0 && rank(reps[j]) < rank(reps[j-1]); j-- {
			reps[j], reps[j-1] = reps[j-1], reps[j]
		}
	}
	return reps
}

// read moves each item's value from its first replica, falling back to
// the next replica for items whose transfer failed or whose bytes do not
// match the writer's checksum (sums: nil, or per key, 0 for none). A key
// whose every replica holds other bytes fails with INVALID_REPLICA and
// is removed, so that the next put stores it anew.
//
// asked is when the replica lists were asked for: the read leases began
// after it, so a read that ends past asked plus its lease may have read
// a range the master had since given to another object (the reader was
// stopped, swapped out or slowed past its lease): it fails LEASE_EXPIRED
// rather than return those bytes.
func (c *Client) read(ctx context.Context, asked time.Time, keys []string, reps [][]Replica, sums []uint64, dst []local, errs []error) {
	c.stageDisk(ctx, asked, keys, reps, dst, errs)
	defer c.releaseStaged(ctx, reps)
	try := make([]int, len(keys))
	var bad []int // per key, replicas that failed their checksum (with sums only)
	if sums != nil {
		bad = make([]int, len(keys))
	}
	for round := 0; ; round++ {
		var reqs []xfer
		for i := range keys {
			if errs[i] != nil || try[i] < 0 || try[i] >= len(reps[i]) {
				continue
			}
			r := reps[i][try[i]]
			if r.Len != dst[i].n {
				errs[i] = Errorf(InvalidReplica, "key %q: replica on %s has %d bytes, another %d", keys[i], r.Segment, r.Len, dst[i].n)
				continue
			}
			reqs = append(reqs, xfer{item: i, op: engine.Read, local: dst[i].addr, rep: r})
		}
		if len(reqs) == 0 {
			return
		}
		if c.beforeTransfer != nil {
			c.beforeTransfer()
		}
		// A staged read whose bytes were moved while the node read them
		// (stageStream) needs no transfer: the rest (lease, checksum)
		// holds for it as for any.
		move := reqs
		if slices.ContainsFunc(reqs, func(x xfer) bool { return x.rep.moved }) {
			move = slices.DeleteFunc(slices.Clone(reqs), func(x xfer) bool { return x.rep.moved })
		}
		failed := c.transfer(ctx, move, len(keys))
		took := time.Since(asked)
		for _, x := range reqs {
			if failed[x.item] == nil && x.rep.Lease > 0 && took >= x.rep.Lease {
				failed[x.item] = Errorf(LeaseExpired, "key %q: the read from %s ended %s after the replica list was asked for, past its read lease of %s: the range may hold another object's bytes by now; not returned (a reader stopped or slowed that long; get it again)",
					keys[x.item], x.rep.Segment, took.Round(time.Millisecond), x.rep.Lease)
				// Every replica's lease began with this one: none is
				// trustworthy now.
				try[x.item] = len(reps[x.item]) - 1
			}
		}
		if sums != nil {
			c.verify(keys, sums, reqs, dst, failed)
		}
		for _, x := range reqs {
			i := x.item
			if err := failed[i]; err != nil {
				if bad != nil && CodeOf(err) == InvalidReplica {
					bad[i]++
				}
				try[i]++
				if try[i] >= len(reps[i]) {
					errs[i] = fmt.Errorf("every replica failed, last: %w", err)
					if bad != nil && bad[i] == len(reps[i]) {
						errs[i] = err
						c.dropCorrupt(ctx, keys[i], sums[i])
					}
				} else {
					c.log.Warn(fmt.Sprintf("get %q: replica on %s failed, trying the next: %v", keys[i], x.rep.Segment, err))
				}
			} else {
				try[i] = -1
			}
		}
	}
}

// beforeStagedRelease, if set (tests only), runs before a get hands its
// staged reads back: a child process stalls there to be killed holding
// them.
var beforeStagedRelease func(ids []uint64)

// releaseStaged hands back the staged reads of disk objects among reps
// once their transfers are over (read returns), so their ranges of the
// nodes' staging pools serve the next reads at once. It does not hold
// up the get: the call goes in the background (the caller is inside
// enter, so Close waits for it); one that is lost is covered by the
// master's staging TTL.
func (c *Client) releaseStaged(ctx context.Context, reps [][]Replica) {
	var ids, direct []uint64
	for _, rs := range reps {
		for _, r := range rs {
			if r.Staged != 0 {
				if r.StagedAt != "" {
					direct = append(direct, r.Staged)
				} else {
					ids = append(ids, r.Staged)
				}
				break
			}
		}
	}
	if beforeStagedRelease != nil && len(ids)+len(direct) > 0 {
		beforeStagedRelease(append(slices.Clone(ids), direct...))
	}
	c.releaseDirect(ctx, reps)
	sr, ok := c.w.(stagedReleaser)
	if len(ids) == 0 || !ok {
		return
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		if err := sr.releaseStaged(context.WithoutCancel(ctx), ids); err != nil {
			c.log.Debug(fmt.Sprintf("hand back %d staged reads: %v (the master's staging TTL frees them)", len(ids), err))
		}
	}()
}

// verify checks the bytes each successful read brought against the
// writer's checksum; a mismatch fails that replica (INVALID_REPLICA) and
// is counted.
func (c *Client) verify(keys []string, sums []uint64, reqs []xfer, dst []local, failed []error) {
	for _, x := range reqs {
		i := x.item
		want := sums[i]
		if failed[i] != nil || want == 0 || dst[i].buf == nil {
			continue
		}
		b := dst[i].buf[:x.rep.Len]
		if c.afterRead != nil {
			c.afterRead(keys[i], b)
		}
		if got := Checksum(b); got != want {
			c.mismatches.Add(1)
			failed[i] = Errorf(InvalidReplica, "key %q: the replica on %s holds other bytes than were put (CRC32C 0x%08x, the writer's 0x%08x): not returned", keys[i], x.rep.Segment, uint32(got), uint32(want))
			c.log.Warn(failed[i].Error())
		}
	}
}

// dropCorrupt removes the version (the writer's checksum sum) of a key
// whose every replica failed its checksum (best effort): a get of it can
// only fail, and a put of it anew must not be refused as existing. A
// version put since the read stays: it is not the one found corrupt.
func (c *Client) dropCorrupt(ctx context.Context, key string, sum uint64) {
	cr, ok := c.w.(condRemover)
	if !ok {
		// Only a wire that gives checksums finds a corrupt version,
		// and mc's is the one that does.
		return
	}
	switch err := cr.removeIf(context.WithoutCancel(ctx), []string{key}, []uint64{sum})[0]; {
	case err == nil:
		c.log.Warn(fmt.Sprintf("removed %q: its every replica failed its checksum", key))
	case CodeOf(err) == InvalidVersion || CodeOf(err) == ObjectNotFound:
		// A writer replaced or removed it since: nothing to drop.
	default:
		c.log.Warn(fmt.Sprintf("remove %q, whose every replica failed its checksum: %v", key, err))
	}
}

// xfer is one replica transfer of one item.
type xfer struct {
	item  int
	op    engine.Opcode
	local uint64
	rep   Replica
}

// transfer runs reqs as one engine batch and returns, indexed by item
// (items < n), the error of each item that had a failed transfer.
func (c *Client) transfer(ctx context.Context, reqs []xfer, n int) []error {
	failed := make([]error, n)
	for j, err := range c.transferEach(ctx, reqs) {
		if err != nil && failed[reqs[j].item] == nil {
			failed[reqs[j].item] = err
		}
	}
	return failed
}

// transferEach runs reqs as one engine batch and returns the error of
// each request (nil for those that moved their bytes).
func (c *Client) transferEach(ctx context.Context, reqs []xfer) []error {
	failed := make([]error, len(reqs))
	if len(reqs) == 0 {
		return failed
	}
	ereqs := make([]engine.Request, 0, len(reqs))
	sent := make([]int, 0, len(reqs))
	segs := make([]*engine.Segment, 0, len(reqs))
	for j, x := range reqs {
		seg, err := c.openSegment(ctx, x.rep.Endpoint)
		if err == nil && !seg.Holds(x.rep.Addr, x.rep.Len) {
			// The node renewed its memory since this handle read its
			// descriptor: read it again, once.
			c.dropSegment(x.rep.Endpoint, seg)
			seg, err = c.openSegment(ctx, x.rep.Endpoint)
		}
		if err != nil {
			failed[j] = err
			continue
		}
		ereqs = append(ereqs, engine.Request{Op: x.op, Source: x.local, Segment: seg, Target: x.rep.Addr, Length: x.rep.Len})
		sent = append(sent, j)
		segs = append(segs, seg)
	}
	if len(ereqs) == 0 {
		return failed
	}
	b, err := c.eng.AllocateBatch(len(ereqs))
	if err != nil {
		for _, j := range sent {
			failed[j] = Errorf(TransferFail, "%v", err)
		}
		return failed
	}
	if _, err := b.Submit(ereqs...); err != nil {
		for _, j := range sent {
			failed[j] = Errorf(TransferFail, "%v", err)
		}
		return failed
	}
	if err := b.Wait(ctx); err != nil && ctx.Err() != nil {
		if c.abandon(ctx, b, ereqs) {
			// Reads into the client's staging memory, which stays taken
			// until they end: the caller gets its answer at its deadline
			// (a stopped node's reads end only when the master drops it,
			// or at the transport's status timeout).
			for i, j := range sent {
				if st, _ := b.TaskStatus(i); st.Status != engine.Completed {
					x := reqs[j]
					// Wraps the caller's ctx.Err(): callers tell an
					// interruption by errors.Is (mc store replay's
					// online run took one for a failed request).
					failed[j] = fmt.Errorf("%w: %w", Errorf(TransferFail, "%s %d bytes at 0x%x on %s (%s): %s", x.op, x.rep.Len, x.rep.Addr, x.rep.Segment, x.rep.Endpoint, deadlineNote(ctx)), ctx.Err())
				}
			}
			return failed
		}
		// Writes: the put is revoked once this returns, and a write
		// landing after that could reach whatever takes the range next;
		// and the caller's own memory: it may reuse it. Wait them out.
		_ = b.Wait(context.Background())
	}
	for i, j := range sent {
		st, _ := b.TaskStatus(i)
		if st.Status == engine.Failed {
			x := reqs[j]
			failed[j] = Errorf(TransferFail, "%s %d bytes at 0x%x on %s (%s): %v", x.op, x.rep.Len, x.rep.Addr, x.rep.Segment, x.rep.Endpoint, st.Err)
			c.dropSegment(x.rep.Endpoint, segs[i])
		}
	}
	_ = b.Free()
	return failed
}

// local is a value's place in registered memory; own marks memory
// registered just for it.
type local struct {
	addr, n uint64
	buf     []byte
	own     *engine.Memory
	staged  bool
}

func (l local) bytes() []byte { return l.buf }

// staged takes n bytes of staging memory, or registers memory of its own
// for a value larger than the staging area can give.
func (c *Client) staged(ctx context.Context, n int) (local, error) {
	c.stageMu.Lock()
	addr, err := c.stageAlc.Alloc(uint64(n))
	c.stageMu.Unlock()
	if err == nil {
		off := addr - c.stage.Addr()
		return local{addr: addr, n: uint64(n), buf: c.stage.Bytes()[off : off+uint64(n)], staged: true}, nil
	}
	m, err := c.eng.RegisterMemory(ctx, n, "cpu:0", false)
	if err != nil {
		return local{}, fmt.Errorf("memory for a value of %d bytes: %w", n, err)
	}
	return local{addr: m.Addr(), n: uint64(n), buf: m.Bytes()[:n], own: m}, nil
}

// abandon hands the tasks of b, a batch whose caller's deadline passed,
// to a goroutine that waits them out and frees it, if every task reads
// into the client's staging memory: unstage then keeps their ranges until
// they end. It reports whether it did.
func (c *Client) abandon(ctx context.Context, b *engine.Batch, reqs []engine.Request) bool {
	if c.stage == nil {
		return false
	}
	lo, hi := c.stage.Addr(), c.stage.Addr()+uint64(c.stage.Len())
	for _, r := range reqs {
		if r.Op != engine.Read || r.Source < lo || r.Source+r.Length > hi {
			return false
		}
	}
	l := &lingering{reqs: reqs, done: make(chan struct{})}
	c.lingerMu.Lock()
	c.lingering = append(c.lingering, l)
	c.lingerMu.Unlock()
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		_ = b.Wait(context.Background())
		_ = b.Free()
		c.lingerMu.Lock()
		c.lingering = slices.DeleteFunc(c.lingering, func(x *lingering) bool { return x == l })
		c.lingerMu.Unlock()
		close(l.done)
	}()
	return true
}

// lingering is a batch of reads whose caller gave up: its staging ranges
// are freed when done is closed.
type lingering struct {
	reqs []engine.Request
	done chan struct{}
}

// lingerOver returns the done channels of the abandoned reads into
// [addr, addr+n).
func (c *Client) lingerOver(addr, n uint64) []chan struct{} {
	c.lingerMu.Lock()
	defer c.lingerMu.Unlock()
	var out []chan struct{}
	for _, l := range c.lingering {
		for _, r := range l.reqs {
			if r.Source < addr+n && addr < r.Source+r.Length {
				out = append(out, l.done)
				break
			}
		}
	}
	return out
}

func deadlineNote(ctx context.Context) string {
	if d, ok := ctx.Deadline(); ok {
		return fmt.Sprintf("still in flight at the caller's deadline (%s ago)", time.Since(d).Round(time.Millisecond))
	}
	return "still in flight when the caller gave up"
}

func (c *Client) unstage(ctx context.Context, ls []local) {
	for _, l := range ls {
		switch {
		case l.staged:
			if waits := c.lingerOver(l.addr, l.n); len(waits) > 0 {
				// Reads the caller gave up on still land there.
				go func() {
					for _, w := range waits {
						<-w
					}
					c.stageMu.Lock()
					_ = c.stageAlc.Free(l.addr, l.n)
					c.stageMu.Unlock()
				}()
				continue
			}
			c.stageMu.Lock()
			_ = c.stageAlc.Free(l.addr, l.n)
			c.stageMu.Unlock()
		case l.own != nil:
			_ = c.eng.UnregisterMemory(context.WithoutCancel(ctx), l.own)
		}
	}
}

// Exist reports whether key is stored (complete).
func (c *Client) Exist(ctx context.Context, key string) (bool, error) {
	ex, errs := c.BatchExist(ctx, []string{key})
	return ex[0], errs[0]
}

// BatchExist reports whether each key is stored.
func (c *Client) BatchExist(ctx context.Context, keys []string) ([]bool, []error) {
	if err := c.enter(); err != nil {
		return make([]bool, len(keys)), failAll(make([]error, len(keys)), err)
	}
	defer c.leave()
	ex, errs := make([]bool, len(keys)), make([]error, len(keys))
	send, idx := validKeys(keys, errs)
	if len(send) == 0 {
		return ex, errs
	}
	sex, serrs := c.w.exist(ctx, send)
	if idx == nil {
		return sex, serrs
	}
	for j, i := range idx {
		ex[i], errs[i] = sex[j], serrs[j]
	}
	return ex, errs
}

// Remove removes key; a key being read is refused (OBJECT_HAS_LEASE)
// unless force.
func (c *Client) Remove(ctx context.Context, key string, force bool) error {
	return c.BatchRemove(ctx, []string{key}, force)[0]
}

// BatchRemove removes keys.
func (c *Client) BatchRemove(ctx context.Context, keys []string, force bool) []error {
	if err := c.enter(); err != nil {
		return failAll(make([]error, len(keys)), err)
	}
	defer c.leave()
	errs := make([]error, len(keys))
	send, idx := validKeys(keys, errs)
	if len(send) == 0 {
		return errs
	}
	serrs := c.w.remove(ctx, send, force)
	if idx == nil {
		return serrs
	}
	for j, i := range idx {
		errs[i] = serrs[j]
	}
	return errs
}

// RemoveAll removes every stored object not being read and returns how
// many went.
func (c *Client) RemoveAll(ctx context.Context) (uint64, error) {
	if err := c.enter(); err != nil {
		return 0, err
	}
	defer c.leave()
	return c.w.removeAll(ctx)
}

// Query returns key's replicas without taking a lease (an admin read).
func (c *Client) Query(ctx context.Context, key string) ([]Replica, error) {
	if err := c.enter(); err != nil {
		return nil, err
	}
	defer c.leave()
	if err := CheckKey(key); err != nil {
		return nil, err
	}
	return c.w.query(ctx, key)
}

// validKeys refuses, in errs, each key that breaks the key rule
// (CheckKey), so that it never reaches the wire: mc's gRPC cannot even
// encode a key that is not UTF-8, and the whole batch would fail with
// it. It returns the keys to send and, when some were refused, their
// indices in keys (idx is nil when every key is sent: see at).
func validKeys(keys []string, errs []error) (send []string, idx []int) {
	for i, k := range keys {
		if err := CheckKey(k); err != nil {
			errs[i] = err
			if idx == nil {
				idx = make([]int, i, len(keys))
				for j := range idx {
					idx[j] = j
				}
			}
			continue
		}
		if idx != nil {
			idx = append(idx, i)
		}
	}
	if idx == nil {
		return keys, nil
	}
	send = make([]string, len(idx))
	for j, i := range idx {
		send[j] = keys[i]
	}
	return send, idx
}

// at is the index in keys of the j-th key validKeys sent.
func at(idx []int, j int) int {
	if idx == nil {
		return j
	}
	return idx[j]
}
