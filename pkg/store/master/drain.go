package master

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvcache-ops/mc/pkg/store"
)

// Drain jobs empty segments before maintenance (mc store drain, Mooncake's
// drain_jobs API). The master marks the segments DRAINING (no new
// placements), then finds every complete object whose only safe replicas
// are there and has the node that holds each one write it into a range the
// master allocates elsewhere: the node fetches these copy tasks with
// DrainTasks, moves the bytes with its engine and reports back, and the
// master adds the replica if the object is still the one copied (not
// removed, re-put or upserted meanwhile). Bytes never pass through the
// master. Units are planned hottest first in the eviction policy's order,
// and planning repeats until a plan finds nothing left (objects written
// during the drain are moved once complete).

// DrainStatus is a drain job's state, numbered as Mooncake's JobStatus.
type DrainStatus int

const (
	DrainCreated DrainStatus = iota
	DrainPlanning
	DrainRunning
	DrainSucceeded
	DrainFailed
	DrainCanceled
)

func (s DrainStatus) String() string {
	if s < 0 || s > DrainCanceled {
		return fmt.Sprintf("UNKNOWN(%d)", int(s))
	}
	return [...]string{"CREATED", "PLANNING", "RUNNING", "SUCCEEDED", "FAILED", "CANCELED"}[s]
}

// Done reports whether the job has ended.
func (s DrainStatus) Done() bool { return s >= DrainSucceeded }

// DrainRequest asks for a drain job.
type DrainRequest struct {
	// Segments are the segment names to empty.
	Segments []string
	// Targets, when given, are the only segments copies may go to;
	// otherwise the allocation strategy picks among every segment in
	// service.
	Targets []string
	// MaxConcurrency bounds the copies in flight (default 16).
	MaxConcurrency int
	// Unmount unmounts the segments gracefully once every object is safe.
	Unmount bool
	// Force unmounts them (with Unmount) even when some objects found no
	// room elsewhere: those are lost, and the job says how many.
	Force bool
}

// DrainJob is a drain job's state as queries report it.
type DrainJob struct {
	ID       store.UUID
	Status   DrainStatus
	Request  DrainRequest
	Created  time.Time
	Updated  time.Time
	Finished time.Time
	// Units: objects that needed a copy. Succeeded were copied; Failed
	// could not be (retries exhausted, or their source was lost);
	// Blocked found no room; Active are being copied; Skipped changed
	// under the copy (removed, re-put) and needed none after all.
	Succeeded, Failed, Blocked, Active, Skipped int
	// Planned is the units found so far and PlannedBytes their bytes:
	// with Succeeded and MigratedBytes, the progress.
	Planned       int
	PlannedBytes  uint64
	MigratedBytes uint64
	// LostObjects and LostBytes would be (or, with Force, were) lost:
	// objects with no replica outside the segments and no room found;
	// LostPinned of them are pinned.
	LostObjects, LostPinned int
	LostBytes               uint64
	Unmounted               bool
	Message                 string
	Code                    store.Code
}

const (
	defaultDrainConcurrency = 16
	maxDrainConcurrency     = 1024
	// drainTaskTimeout is how long a node may take to report a copy
	// before the master gives the unit up (and retries it).
	drainTaskTimeout = 30 * time.Second
	drainMaxTries    = 3
	// keepFinishedDrains bounds the ended jobs kept for queries.
	keepFinishedDrains = 64
	// drainReplanEvery paces plans while a job waits for writes on its
	// segments or for its targets' pings.
	drainReplanEvery = 200 * time.Millisecond
)

type drainUnit struct {
	job   *drainJob
	key   string
	obj   *Object
	gen   uint16
	size  uint64
	src   replicaRef
	owner store.UUID // the client holding the source segment
	dst   replicaRef
	id    uint64
	// queued and sent: when the unit was queued for its node and when
	// the node fetched it (unix nanos; sent 0 until fetched).
	queued, sent int64
}

type drainJob struct {
	DrainJob
	segs    []*segment
	targets []*segment
	inst    store.UUID // placement instance of the job's copies
	queue   []*drainUnit
	active  map[uint64]*drainUnit
	// settling counts units in neither queue nor active: a result taken
	// off active and not yet queued again or committed, or a unit taken
	// off the queue and being placed. The job is not idle meanwhile, or
	// a plan in between would copy their objects a second time.
	settling int
	noRoom   bool
	cancel   bool
	failMsg  string
	kick     chan struct{}
	// tries counts the failed copies of each key across plans: a key
	// out of tries is not planned again.
	tries map[string]int
	// avoid holds target segments a copy to just failed on (until the
	// time given): retries go elsewhere while the master has not yet
	// noticed a dead node. copiedTo is when a copy last landed on each
	// segment: the job ends only once each holder has pinged since, so
	// a target that died after its copies does not pass for safe.
	avoid    map[*segment]int64
	copiedTo map[*segment]int64
	// nextPlan paces plans while the job waits (only runDrain's
	// goroutine touches it).
	nextPlan time.Time
}

// idleLocked reports whether j has no copy queued, out or being settled
// (under drains.mu): only then may it plan again.
func (j *drainJob) idleLocked() bool {
	return len(j.active) == 0 && len(j.queue) == 0 && j.settling == 0
}

// drains is the master's drain jobs and the copy tasks waiting for nodes.
type drains struct {
	mu     sync.Mutex
	jobs   map[store.UUID]*drainJob
	ended  []store.UUID // finished jobs, oldest first
	nextID uint64
	tasks  map[store.UUID]*nodeTasks // by source client
	// pollers are the clients that have asked for drain tasks: the nodes
	// that can make copies (a mooncake_client node never asks).
	pollers map[store.UUID]bool
}

type nodeTasks struct {
	queue []*drainUnit
	wake  chan struct{}
}

func (d *drains) init() {
	d.jobs = make(map[store.UUID]*drainJob)
	d.tasks = make(map[store.UUID]*nodeTasks)
	d.pollers = make(map[store.UUID]bool)
}

func (q *nodeTasks) remove(u *drainUnit) {
	q.queue = slices.DeleteFunc(q.queue, func(x *drainUnit) bool { return x == u })
}

// forget drops what is kept for a client that left: its poller mark,
// and its task queue when empty (a job's units there end with the job).
func (d *drains) forget(client store.UUID) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.pollers, client)
	if q := d.tasks[client]; q != nil && len(q.queue) == 0 {
		delete(d.tasks, client)
	}
}

func (d *drains) nodeQueue(client store.UUID) *nodeTasks {
	q := d.tasks[client]
	if q == nil {
		q = &nodeTasks{wake: make(chan struct{}, 1)}
		d.tasks[client] = q
	}
	return q
}

// CreateDrainJob validates req, marks its segments DRAINING and starts
// the job. Segments already draining (another job's) are refused.
func (m *Master) CreateDrainJob(req DrainRequest) (store.UUID, error) {
	if len(req.Segments) == 0 {
		return store.UUID{}, store.Errorf(store.InvalidParams, "drain: no segment named")
	}
	if req.MaxConcurrency < 0 || req.MaxConcurrency > maxDrainConcurrency {
		return store.UUID{}, store.Errorf(store.InvalidParams, "drain: max_concurrency %d: want 1 to %d (0: %d)", req.MaxConcurrency, maxDrainConcurrency, defaultDrainConcurrency)
	}
	if req.MaxConcurrency == 0 {
		req.MaxConcurrency = defaultDrainConcurrency
	}
	req.Segments = slices.Clone(req.Segments)
	req.Targets = slices.Clone(req.Targets)
	j := &drainJob{active: make(map[uint64]*drainUnit), kick: make(chan struct{}, 1), tries: make(map[string]int),
		avoid: make(map[*segment]int64), copiedTo: make(map[*segment]int64)}
	j.ID = store.NewUUID()
	j.inst = j.ID
	j.Request = req
	now := time.Now()
	j.Created, j.Updated = now, now
	m.drains.mu.Lock()
	defer m.drains.mu.Unlock()
	m.space.mu.Lock()
	for _, name := range req.Segments {
		seg := m.space.byName[name]
		switch {
		case seg == nil:
			m.space.mu.Unlock()
			return store.UUID{}, store.Errorf(store.SegmentNotFound, "drain: segment %q is not mounted", name)
		case seg.status == SegDraining:
			m.space.mu.Unlock()
			return store.UUID{}, store.Errorf(store.UnavailableInCurrentStatus, "drain: segment %q is already being drained by job %s", name, m.drainOf(seg))
		case seg.status >= SegGracefullyUnmounting:
			m.space.mu.Unlock()
			return store.UUID{}, store.Errorf(store.UnavailableInCurrentStatus, "drain: segment %q is unmounting", name)
		case slices.Contains(j.segs, seg):
			m.space.mu.Unlock()
			return store.UUID{}, store.Errorf(store.InvalidParams, "drain: segment %q named twice", name)
		case !m.drains.pollers[seg.owner]:
			m.space.mu.Unlock()
			return store.UUID{}, store.Errorf(store.UnavailableInCurrentStatus, "drain: segment %q's node (client %s) takes no drain tasks: a mooncake_client node, or an mc node older than drain, cannot copy its objects out", name, seg.owner)
		}
		j.segs = append(j.segs, seg)
	}
	for _, name := range req.Targets {
		seg := m.space.byName[name]
		switch {
		case seg == nil:
			m.space.mu.Unlock()
			return store.UUID{}, store.Errorf(store.SegmentNotFound, "drain: target segment %q is not mounted", name)
		case slices.Contains(j.segs, seg):
			m.space.mu.Unlock()
			return store.UUID{}, store.Errorf(store.InvalidParams, "drain: segment %q is both drained and a target", name)
		case seg.status != SegOK:
			m.space.mu.Unlock()
			return store.UUID{}, store.Errorf(store.UnavailableInCurrentStatus, "drain: target segment %q is %s", name, seg.status)
		}
		j.targets = append(j.targets, seg)
	}
	for _, seg := range j.segs {
		seg.status = SegDraining
	}
	m.space.mu.Unlock()
	j.Status = DrainPlanning
	m.drains.jobs[j.ID] = j
	rec := j.DrainJob
	m.emit(Change{Op: OpDrain, Drain: &rec})
	m.log.Info(fmt.Sprintf("drain job %s: draining segments %s (targets %s, %d copies at a time, unmount %v, force %v)",
		j.ID, strings.Join(req.Segments, ","), orAny(req.Targets), req.MaxConcurrency, req.Unmount, req.Force))
	m.wg.Add(1)
	kick(j.kick) // plan at once, not at the first tick
	go m.runDrain(j)
	return j.ID, nil
}

func orAny(names []string) string {
	if len(names) == 0 {
		return "any"
	}
	return strings.Join(names, ",")
}

// drainOf names the live job draining seg (drains.mu held).
func (m *Master) drainOf(seg *segment) string {
	for _, j := range m.drains.jobs {
		if !j.Status.Done() && slices.Contains(j.segs, seg) {
			return j.ID.String()
		}
	}
	return "?"
}

// QueryDrainJob reports a job.
func (m *Master) QueryDrainJob(id store.UUID) (DrainJob, error) {
	m.drains.mu.Lock()
	defer m.drains.mu.Unlock()
	j := m.drains.jobs[id]
	if j == nil {
		return DrainJob{}, store.Errorf(store.JobNotFound, "drain job %s not found (jobs live on the master that created them; finished ones are kept for the last %d)", id, keepFinishedDrains)
	}
	out := j.DrainJob
	out.Active = len(j.active)
	out.Request.Segments = slices.Clone(out.Request.Segments)
	out.Request.Targets = slices.Clone(out.Request.Targets)
	return out, nil
}

// DrainJobs lists the jobs, newest first.
func (m *Master) DrainJobs() []DrainJob {
	m.drains.mu.Lock()
	ids := make([]store.UUID, 0, len(m.drains.jobs))
	for id := range m.drains.jobs {
		ids = append(ids, id)
	}
	m.drains.mu.Unlock()
	out := make([]DrainJob, 0, len(ids))
	for _, id := range ids {
		if j, err := m.QueryDrainJob(id); err == nil {
			out = append(out, j)
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Created.After(out[b].Created) })
	return out
}

// CancelDrainJob stops a job: no new copies start, those under way are
// let finish (or time out), and the segments return to service.
func (m *Master) CancelDrainJob(id store.UUID) error {
	m.drains.mu.Lock()
	j := m.drains.jobs[id]
	if j == nil {
		m.drains.mu.Unlock()
		return store.Errorf(store.JobNotFound, "drain job %s not found", id)
	}
	if j.Status.Done() {
		st := j.Status
		m.drains.mu.Unlock()
		return store.Errorf(store.UnavailableInCurrentStatus, "drain job %s has ended (%s)", id, st)
	}
	j.cancel = true
	m.drains.mu.Unlock()
	kick(j.kick)
	return nil
}

func kick(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// runDrain drives a job until it ends.
func (m *Master) runDrain(j *drainJob) {
	defer m.wg.Done()
	// Results and cancels kick the job; the tick is for timeouts and
	// for the wait on copies' holders at the end.
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-m.done:
			m.endDrain(j, DrainFailed, store.UnavailableInCurrentMode, "the master stopped")
			return
		case <-t.C:
		case <-j.kick:
		}
		if m.drainStep(j) {
			return
		}
	}
}

// drainStep advances j; it reports whether the job has ended.
func (m *Master) drainStep(j *drainJob) bool {
	now := m.now()
	// A draining segment that went away (its node was lost): the job
	// cannot finish its promise.
	for _, seg := range j.segs {
		if !m.space.isMounted(seg) {
			m.failDrainUnits(j, fmt.Sprintf("source segment %s unmounted", seg.info.Name))
			m.endDrain(j, DrainFailed, store.SegmentNotFound, fmt.Sprintf("segment %s was unmounted mid-drain (its node lost or unmounted): the copies made so far stay valid; its other objects are gone with it", seg.info.Name))
			return true
		}
	}
	m.drains.mu.Lock()
	var timedOut, unfetched []*drainUnit
	limit := drainTaskTimeout.Nanoseconds()
	for id, u := range j.active {
		switch {
		case u.sent != 0 && now-u.sent > limit:
			delete(j.active, id)
			timedOut = append(timedOut, u)
		case u.sent == 0 && now-u.queued > limit:
			delete(j.active, id)
			m.drains.nodeQueue(u.owner).remove(u)
			unfetched = append(unfetched, u)
		}
	}
	m.drains.mu.Unlock()
	for _, u := range timedOut {
		// The node may still write into the range: hold it as a
		// discarded put's space is held.
		m.pend.addRelease(now+limit, u.size, []replicaRef{u.dst})
		m.log.Warn(fmt.Sprintf("drain job %s: the copy of %q got no answer in %s from client %s", j.ID, u.key, drainTaskTimeout, u.owner))
		m.retryDrainUnit(u, "no answer from the node")
	}
	for _, u := range unfetched {
		m.space.free([]replicaRef{u.dst}, u.size)
		m.log.Warn(fmt.Sprintf("drain job %s: client %s did not fetch its copy tasks in %s (a node that is not mc's, or an mc node older than drain, cannot take part)", j.ID, u.owner, drainTaskTimeout))
		m.retryDrainUnit(u, "the node does not fetch drain tasks")
	}
	m.drains.mu.Lock()
	cancel, idle := j.cancel, j.idleLocked()
	m.drains.mu.Unlock()
	if cancel {
		m.drains.mu.Lock()
		j.queue = nil // not placed yet: nothing to free
		busy := len(j.active) > 0 || j.settling > 0
		m.drains.mu.Unlock()
		m.withdrawQueued(j)
		if busy {
			return false
		}
		m.endDrain(j, DrainCanceled, 0, "canceled")
		return true
	}
	if !idle {
		m.dispatchDrain(j)
		return false
	}
	if time.Now().Before(j.nextPlan) {
		return false
	}
	all, writing := m.planDrain(j)
	m.drains.mu.Lock()
	units := make([]*drainUnit, 0, len(all))
	for _, u := range all {
		if j.tries[u.key] < drainMaxTries {
			units = append(units, u)
		}
	}
	if j.Status == DrainPlanning {
		j.Status = DrainRunning
	}
	j.Updated = time.Now()
	m.drains.mu.Unlock()
	if len(units) == 0 {
		if writing > 0 || !m.drainCopiesConfirmed(j) {
			// Objects being written there (moved once complete), or a
			// copy's holder not heard from since it landed: plan again
			// later, not at every tick (a plan scans every object).
			j.nextPlan = time.Now().Add(drainReplanEvery)
			return false
		}
		return m.finishDrain(j, all)
	}
	m.drains.mu.Lock()
	for _, u := range units {
		j.Planned++
		j.PlannedBytes += u.size
	}
	j.queue = units
	m.drains.mu.Unlock()
	m.dispatchDrain(j)
	return false
}

// planDrain lists the objects of j's segments that need a copy, hottest
// first, and counts those still being written there.
func (m *Master) planDrain(j *drainJob) (units []*drainUnit, writing int) {
	type ranked struct {
		u *drainUnit
		r rank
	}
	var list []ranked
	policy := m.shards[0].policy.Name()
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		m.space.mu.Lock() // segment states (lock order: shard, then space)
		for key, o := range sh.objects {
			src, ok := drainSource(j, o)
			if !ok {
				continue
			}
			if o.state != stateComplete || o.upsert != nil || o.inPlace {
				writing++
				continue
			}
			list = append(list, ranked{&drainUnit{job: j, key: key, obj: o, gen: o.gen, size: o.size, src: src, owner: liveSeg(src.reg.seg).owner}, rankOf(policy, o)})
		}
		m.space.mu.Unlock()
		sh.mu.Unlock()
	}
	// Hottest first: the reverse of the eviction order.
	sort.Slice(list, func(a, b int) bool { return list[a].r.cmp(list[b].r) > 0 })
	units = make([]*drainUnit, len(list))
	for i, x := range list {
		units[i] = x.u
	}
	return units, writing
}

// liveSeg resolves a restored replica's placeholder segment to the
// mounted one (space.mu held).
func liveSeg(seg *segment) *segment {
	if seg.live != nil {
		return seg.live
	}
	return seg
}

// drainSource returns o's replica on one of j's segments when o has no
// replica on a segment in service (shard lock and space.mu held).
func drainSource(j *drainJob, o *Object) (replicaRef, bool) {
	var src replicaRef
	found := false
	for _, r := range o.replicas {
		seg := liveSeg(r.reg.seg)
		if slices.Contains(j.segs, seg) {
			if !found {
				src, found = r, true
			}
			continue
		}
		if seg.status == SegOK {
			return replicaRef{}, false // safe elsewhere
		}
	}
	if !found && o.upsert != nil {
		for _, r := range o.upsert.refs {
			if slices.Contains(j.segs, liveSeg(r.reg.seg)) {
				return r, true // a resize being written there: wait for it
			}
		}
	}
	return src, found
}

// dispatchDrain places and hands out units while the job has room in
// flight.
func (m *Master) dispatchDrain(j *drainJob) {
	for {
		m.drains.mu.Lock()
		if j.cancel || len(j.queue) == 0 || len(j.active) >= j.Request.MaxConcurrency {
			m.drains.mu.Unlock()
			return
		}
		u := j.queue[0]
		j.queue = j.queue[1:]
		// Off the queue and not yet active while it is placed: the job
		// is not idle meanwhile, or a plan in this window copies the
		// object a second time (make test: two tasks for one key after
		// a failed copy was queued again).
		j.settling++
		m.drains.mu.Unlock()
		if h := drainPlacing.Load(); h != nil {
			(*h)(j)
		}
		ok, err := m.placeDrainUnit(u)
		m.drains.mu.Lock()
		j.settling--
		switch {
		case err != nil:
			// No room for this one: the others may fit (move what
			// fits); it is not planned again, and the end counts it.
			j.noRoom = true
			j.Blocked++
			j.tries[u.key] = drainMaxTries
			if j.failMsg == "" {
				j.failMsg = err.Error()
			}
			m.drains.mu.Unlock()
			continue
		case !ok:
			j.Skipped++ // changed since the plan: nothing to copy
			m.drains.mu.Unlock()
			continue
		}
		m.drains.nextID++
		u.id = m.drains.nextID
		u.queued, u.sent = m.now(), 0
		j.active[u.id] = u
		q := m.drains.nodeQueue(u.owner)
		q.queue = append(q.queue, u)
		m.drains.mu.Unlock()
		kick(q.wake)
	}
}

// placeDrainUnit checks that u's object still needs the copy and gives
// it a destination range.
func (m *Master) placeDrainUnit(u *drainUnit) (bool, error) {
	sh := m.shardOf(u.key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	o := sh.objects[u.key]
	if o != u.obj || o.gen != u.gen || o.state != stateComplete || o.inPlace || o.upsert != nil {
		return false, nil
	}
	dst, ok, err := m.space.placeDrain(u.job, o, u.size, m.drainAvoid(u.job))
	if err != nil || !ok {
		return false, err
	}
	u.dst = dst
	return true, nil
}

// drainAvoid lists the segments j's copies keep off for now.
func (m *Master) drainAvoid(j *drainJob) []*segment {
	m.drains.mu.Lock()
	defer m.drains.mu.Unlock()
	now := m.now()
	var out []*segment
	for seg, until := range j.avoid {
		if until > now {
			out = append(out, seg)
		} else {
			delete(j.avoid, seg)
		}
	}
	return out
}

// drainCopiesConfirmed reports whether every segment j copied to is
// mounted and its node has pinged since the last copy landed there.
func (m *Master) drainCopiesConfirmed(j *drainJob) bool {
	m.drains.mu.Lock()
	copied := make(map[*segment]int64, len(j.copiedTo))
	for seg, at := range j.copiedTo {
		copied[seg] = at
	}
	m.drains.mu.Unlock()
	for seg, at := range copied {
		if !m.space.isMounted(seg) {
			continue // dropped: the plan sees its objects again
		}
		m.clientsMu.RLock()
		c := m.clients[seg.owner]
		m.clientsMu.RUnlock()
		if c != nil && c.lastPing.Load() < at {
			return false
		}
	}
	return true
}

// placeDrain allocates a range of size bytes for a copy of o on a
// segment in service that o has no replica on: one of the job's targets
// when it names them, else as the allocation strategy places a put. It
// reports false when o needs no copy any more (shard lock held).
func (s *space) placeDrain(j *drainJob, o *Object, size uint64, avoid []*segment) (replicaRef, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := drainSource(j, o); !ok {
		return replicaRef{}, false, nil
	}
	in := s.instances[j.inst]
	if in == nil {
		in = &instance{id: j.inst}
		s.instances[j.inst] = in
	}
	used := make([]*segment, 0, len(o.replicas)+len(avoid))
	for _, r := range o.replicas {
		used = append(used, liveSeg(r.reg.seg))
	}
	used = append(used, avoid...)
	var ref replicaRef
	ok := false
	if len(j.targets) > 0 {
		for _, seg := range j.targets {
			if s.segs[seg.info.ID] != seg || !s.eligible(seg, used) {
				continue
			}
			if size < s.regionSize(seg)/2 {
				if ref, ok = s.inOwnRegions(in, seg, size, 0); ok {
					break
				}
			}
			if ref, ok = s.newRegion(in, seg, size, 0); ok {
				break
			}
		}
	} else {
		ref, ok = s.placeOne(in, "", size, store.ReplicateConfig{ReplicaNum: 1}, used)
	}
	if !ok {
		where := "on any segment in service"
		if len(j.targets) > 0 {
			where = "on the target segments"
		}
		return replicaRef{}, false, store.Errorf(store.NoAvailableHandle, "no room for %d bytes %s", size, where)
	}
	ref.reg.seg.used.Add(size)
	s.used.Add(size)
	s.noteGrew()
	return ref, true, nil
}

func (s *space) isMounted(seg *segment) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.segs[seg.info.ID] == seg
}

// DrainTask is one copy a node makes: Size bytes at SrcAddr of its own
// segment into Dst (a replica descriptor of the new range).
type DrainTask struct {
	ID      uint64
	Key     string
	SrcAddr uint64
	Size    uint64
	Dst     store.Replica
}

// DrainResult is a node's report on a task: Err nil when the bytes are
// there.
type DrainResult struct {
	ID  uint64
	Err error
}

// DrainTasks is a node's side of drain jobs: it applies the node's
// results, then returns up to max copy tasks for the node's segments,
// waiting up to wait (or ctx) when there are none.
func (m *Master) DrainTasks(ctx context.Context, client store.UUID, results []DrainResult, max int, wait time.Duration) []DrainTask {
	m.drains.mu.Lock()
	m.drains.pollers[client] = true
	m.drains.mu.Unlock()
	if len(results) > 0 {
		m.applyDrainResults(results)
	}
	if max <= 0 {
		return nil
	}
	var timer *time.Timer
	for {
		m.drains.mu.Lock()
		q := m.drains.nodeQueue(client)
		if len(q.queue) > 0 {
			n := min(max, len(q.queue))
			out := make([]DrainTask, 0, n)
			now := m.now()
			for _, u := range q.queue[:n] {
				u.sent = now
				out = append(out, DrainTask{ID: u.id, Key: u.key, SrcAddr: u.src.addr, Size: u.size, Dst: u.dst.descriptor(u.size, false)})
			}
			q.queue = append(q.queue[:0], q.queue[n:]...)
			m.drains.mu.Unlock()
			return out
		}
		m.drains.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(wait)
			defer timer.Stop()
		}
		select {
		case <-q.wake:
		case <-timer.C:
			return nil
		case <-ctx.Done():
			return nil
		case <-m.done:
			return nil
		}
	}
}

// drainResultTaken, when set (tests), runs after a copy's result took its
// unit off the job's active set and before the unit is queued again or
// committed.
var drainResultTaken atomic.Pointer[func(*drainJob)]

// drainPlacing, when set (tests), runs while dispatchDrain places a unit
// it took off the job's queue. Both hooks are atomic: a job's own
// goroutine dispatches while a test sets them.
var drainPlacing atomic.Pointer[func(*drainJob)]

func (m *Master) applyDrainResults(results []DrainResult) {
	kicked := map[*drainJob]bool{}
	var committed []*drainUnit
	for _, r := range results {
		m.drains.mu.Lock()
		var u *drainUnit
		for _, j := range m.drains.jobs {
			if x := j.active[r.ID]; x != nil {
				u = x
				delete(j.active, r.ID)
				j.settling++
				break
			}
		}
		m.drains.mu.Unlock()
		if u == nil {
			continue // timed out or its job ended: its range was dealt with
		}
		if h := drainResultTaken.Load(); h != nil {
			(*h)(u.job)
		}
		kicked[u.job] = true
		if r.Err != nil {
			m.drains.mu.Lock()
			u.job.avoid[u.dst.reg.seg] = m.now() + (5 * time.Second).Nanoseconds()
			m.drains.mu.Unlock()
			m.space.free([]replicaRef{u.dst}, u.size)
			m.retryDrainUnit(u, r.Err.Error())
		} else if m.commitDrainUnit(u) {
			committed = append(committed, u)
		} else {
			m.drains.mu.Lock()
			u.job.Skipped++
			m.drains.mu.Unlock()
		}
		m.drains.mu.Lock()
		u.job.settling--
		m.drains.mu.Unlock()
	}
	// A copy counts once it is durable (HA: in the op log), so a job's
	// figures never run ahead of what a new leader would know.
	durable := true
	if len(committed) > 0 && m.cfg.Sync != nil {
		if err := m.cfg.Sync(); err != nil {
			durable = false
			m.log.Warn(fmt.Sprintf("drain: committing %d copies to the op log: %v", len(committed), err))
		}
	}
	m.drains.mu.Lock()
	now := time.Now()
	for _, u := range committed {
		if durable {
			u.job.Succeeded++
			u.job.MigratedBytes += u.size
		}
		u.job.copiedTo[u.dst.reg.seg] = m.now()
		u.job.Updated = now
	}
	m.drains.mu.Unlock()
	for j := range kicked {
		m.dispatchDrain(j)
		kick(j.kick)
	}
}

// commitDrainUnit adds u's copy to its object if the object is still the
// one copied; otherwise the copy's range is freed (a removed or re-put
// object is not resurrected).
func (m *Master) commitDrainUnit(u *drainUnit) bool {
	sh := m.shardOf(u.key)
	sh.mu.Lock()
	o := sh.objects[u.key]
	if o != u.obj || o.gen != u.gen || o.state != stateComplete || o.inPlace || o.upsert != nil || !m.space.isMounted(u.dst.reg.seg) {
		sh.mu.Unlock()
		m.space.free([]replicaRef{u.dst}, u.size)
		return false
	}
	before := m.charge(o)
	o.replicas = append(o.replicas, u.dst)
	m.recharge(o, before)
	ch := Change{Op: OpPutEnd, Key: u.key, Size: o.size, Replicas: o.descriptors(true), SoftPin: expiry(o.softPin), HardPin: o.hardPin}
	if o.onDisk() {
		ch.Op, ch.Version, ch.Tier = OpPromote, o.tier.version, o.tier.node.id
	}
	m.emit(ch)
	sh.mu.Unlock()
	return true
}

// retryDrainUnit queues u again (up to drainMaxTries) or counts it
// failed.
func (m *Master) retryDrainUnit(u *drainUnit, why string) {
	m.drains.mu.Lock()
	defer m.drains.mu.Unlock()
	j := u.job
	j.tries[u.key]++
	tries := j.tries[u.key]
	u.dst, u.sent = replicaRef{}, 0
	if tries < drainMaxTries && !j.Status.Done() && !j.cancel {
		j.queue = append([]*drainUnit{u}, j.queue...)
		return
	}
	j.Failed++
	if j.failMsg == "" {
		j.failMsg = fmt.Sprintf("copy of %q failed %d times: %s", u.key, tries, why)
	}
	m.log.Warn(fmt.Sprintf("drain job %s: giving up on %q after %d tries: %s", j.ID, u.key, tries, why))
}

// failDrainUnits ends every copy of j in flight: their ranges are held
// until a late write cannot land.
func (m *Master) failDrainUnits(j *drainJob, why string) {
	m.withdrawQueued(j)
	m.drains.mu.Lock()
	now := m.now()
	for id, u := range j.active {
		delete(j.active, id)
		j.Failed++
		m.pend.addRelease(now+drainTaskTimeout.Nanoseconds(), u.size, []replicaRef{u.dst})
	}
	for _, u := range j.queue {
		if u.dst.reg != nil {
			m.space.free([]replicaRef{u.dst}, u.size)
		}
	}
	j.queue = nil
	m.drains.mu.Unlock()
}

// withdrawQueued takes j's tasks no node has fetched yet off the node
// queues, freeing their ranges.
func (m *Master) withdrawQueued(j *drainJob) {
	m.drains.mu.Lock()
	var freed []*drainUnit
	for _, q := range m.drains.tasks {
		keep := q.queue[:0]
		for _, u := range q.queue {
			if u.job == j {
				delete(j.active, u.id)
				freed = append(freed, u)
				continue
			}
			keep = append(keep, u)
		}
		clear(q.queue[len(keep):])
		q.queue = keep
	}
	m.drains.mu.Unlock()
	for _, u := range freed {
		m.space.free([]replicaRef{u.dst}, u.size)
	}
}

// finishDrain ends a job whose last plan, units, has nothing left it
// may copy: what is in it has no room or is out of tries.
func (m *Master) finishDrain(j *drainJob, units []*drainUnit) bool {
	var lostBytes uint64
	pinned := 0
	now := m.now()
	var names []string
	for _, u := range units {
		lostBytes += u.size
		if u.obj.hardPin || u.obj.softPin > now {
			pinned++
			if len(names) < 10 {
				names = append(names, u.key)
			}
		}
	}
	m.drains.mu.Lock()
	j.LostObjects, j.LostBytes, j.LostPinned = len(units), lostBytes, pinned
	failMsg, failed := j.failMsg, j.Failed
	m.drains.mu.Unlock()
	if len(units) > 0 {
		msg := fmt.Sprintf("%d objects (%s) have no replica outside the drained segments", len(units), fmtBytes(lostBytes))
		if pinned > 0 {
			msg += fmt.Sprintf(", %d of them pinned (%s)", pinned, strings.Join(names, ", "))
		}
		if failMsg != "" {
			msg += ": " + failMsg
		}
		if j.Request.Unmount && j.Request.Force {
			m.log.Warn(fmt.Sprintf("drain job %s: unmounting anyway (--force): %s are lost", j.ID, msg))
			m.unmountDrained(j)
			m.endDrain(j, DrainFailed, store.NoAvailableHandle, msg+"; unmounted anyway (force): they are lost")
			return true
		}
		m.endDrain(j, DrainFailed, store.NoAvailableHandle, msg+"; the segments are back in service (force with unmount to drop them)")
		return true
	}
	if failed > 0 {
		// Every object is safe now (a later plan found no unit), though
		// some copies failed on the way.
		failMsg = ""
	}
	if j.Request.Unmount {
		m.unmountDrained(j)
		m.endDrain(j, DrainSucceeded, 0, "every object has a replica elsewhere; segments unmounted")
		return true
	}
	m.endDrain(j, DrainSucceeded, 0, "every object has a replica elsewhere; segments DRAINED (no new placements) until unmounted")
	return true
}

func (m *Master) unmountDrained(j *drainJob) {
	for _, seg := range j.segs {
		if err := m.GracefulUnmountSegment(context.Background(), store.UUID{}, seg.info.ID); err != nil {
			m.log.Warn(fmt.Sprintf("drain job %s: unmount %s: %v", j.ID, seg.info.Name, err))
			continue
		}
	}
	m.drains.mu.Lock()
	j.Unmounted = true
	m.drains.mu.Unlock()
}

// endDrain records j's end and gives its segments their state back.
func (m *Master) endDrain(j *drainJob, st DrainStatus, code store.Code, msg string) {
	m.drains.mu.Lock()
	if j.Status.Done() {
		m.drains.mu.Unlock()
		return
	}
	j.Status, j.Code, j.Message = st, code, msg
	j.Updated = time.Now()
	j.Finished = j.Updated
	m.drains.ended = append(m.drains.ended, j.ID)
	for len(m.drains.ended) > keepFinishedDrains {
		delete(m.drains.jobs, m.drains.ended[0])
		m.drains.ended = m.drains.ended[1:]
	}
	rec := j.DrainJob
	m.drains.mu.Unlock()
	m.emit(Change{Op: OpDrain, Drain: &rec})
	m.space.mu.Lock()
	for _, seg := range j.segs {
		if seg.status != SegDraining {
			continue
		}
		if st == DrainSucceeded {
			seg.status = SegDrained
		} else {
			seg.status = SegOK
		}
	}
	m.space.mu.Unlock()
	m.space.dropInstance(j.inst)
	m.drains.mu.Lock()
	line := fmt.Sprintf("drain job %s %s: %d objects copied (%s), %d failed, %d blocked, %d skipped: %s", j.ID, st, j.Succeeded, fmtBytes(j.MigratedBytes), j.Failed, j.Blocked, j.Skipped, msg)
	m.drains.mu.Unlock()
	if st == DrainSucceeded {
		m.log.Info(line)
	} else {
		m.log.Warn(line)
	}
}

// RestoreDrains installs the drain jobs an HA op log recorded, on a new
// leader. A job that was running ran on a leader that is gone: its
// copies committed to the log are kept, and it ends FAILED with a
// message saying so (the segments' DRAINING state went with the old
// leader, so they are in service again).
func (m *Master) RestoreDrains(jobs []DrainJob) {
	now := time.Now()
	for _, j := range jobs {
		if !j.Status.Done() {
			j.Status, j.Code, j.Updated, j.Finished = DrainFailed, store.UnavailableInCurrentMode, now, now
			j.Message = "the master running this job lost leadership (HA failover): the copies it committed are kept; the segments are back in service; run the drain again"
			rec := j
			m.emit(Change{Op: OpDrain, Drain: &rec})
			m.log.Warn(fmt.Sprintf("drain job %s: %s", j.ID, j.Message))
		}
		j.Active = 0
		m.drains.mu.Lock()
		if m.drains.jobs[j.ID] == nil {
			m.drains.jobs[j.ID] = &drainJob{DrainJob: j, active: map[uint64]*drainUnit{}, kick: make(chan struct{}, 1), tries: map[string]int{}}
			m.drains.ended = append(m.drains.ended, j.ID)
		}
		m.drains.mu.Unlock()
	}
}
