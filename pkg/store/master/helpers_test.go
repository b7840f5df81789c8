package master

import (
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/alloc"
	"github.com/kvcache-ops/mc/pkg/store/policy"
)

const (
	KiB = uint64(1) << 10
	MiB = uint64(1) << 20
	GiB = uint64(1) << 30
	TiB = uint64(1) << 40
)

// fakeClock is the master's clock in tests: it moves only when told.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *fakeClock { return &fakeClock{t: time.Unix(1_700_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// newTestMaster makes a master on a fake clock with 1 MiB regions (unless
// cfg says otherwise) and no background loops.
func newTestMaster(t testing.TB, cfg Config) (*Master, *fakeClock) {
	t.Helper()
	clk := newClock()
	if cfg.Now == nil {
		cfg.Now = clk.Now
	}
	if cfg.RegionSize == 0 {
		cfg.RegionSize = MiB
	}
	if cfg.Logger == nil {
		cfg.Logger = discardLogger()
	}
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m, clk
}

func uuidOf(s string) store.UUID {
	h := fnv.New64a()
	h.Write([]byte(s))
	return store.UUID{First: 7, Second: h.Sum64()}
}

// segInfo describes a segment named name on host (an IP) at base.
func segInfo(name, host string, base, size uint64) store.SegmentInfo {
	return store.SegmentInfo{
		ID: uuidOf("seg/" + name), Name: name, Base: base, Size: size,
		Endpoint: host + ":15000", Protocol: "tcp",
	}
}

// mount mounts a segment of size bytes for the client named owner.
func mount(t testing.TB, m *Master, owner, name, host string, base, size uint64) store.SegmentInfo {
	t.Helper()
	info := segInfo(name, host, base, size)
	if err := m.MountSegment(uuidOf(owner), info); err != nil {
		t.Fatalf("mount %s: %v", name, err)
	}
	return info
}

func one(cfg ...store.ReplicateConfig) store.ReplicateConfig {
	if len(cfg) > 0 {
		return cfg[0]
	}
	return store.ReplicateConfig{ReplicaNum: 1}
}

// putStart starts one put for writer and fails the test on error.
func putStart(t testing.TB, m *Master, writer, key string, size uint64, cfg ...store.ReplicateConfig) []store.Replica {
	t.Helper()
	r := m.BatchPutStart(uuidOf(writer), "", []PutItem{{key, size}}, one(cfg...))[0]
	if r.Err != nil {
		t.Fatalf("put start %q (%d bytes): %v", key, size, r.Err)
	}
	return r.Replicas
}

// put runs PutStart and PutEnd and returns the replicas.
func put(t testing.TB, m *Master, writer, key string, size uint64, cfg ...store.ReplicateConfig) []store.Replica {
	t.Helper()
	reps := putStart(t, m, writer, key, size, cfg...)
	if err := m.BatchPutEnd(uuidOf(writer), []string{key})[0]; err != nil {
		t.Fatalf("put end %q: %v", key, err)
	}
	return reps
}

func get(m *Master, key string) ReplicaResult { return m.BatchGetReplicaList([]string{key})[0] }

func remove(m *Master, key string, force bool) error { return m.BatchRemove([]string{key}, force)[0] }

func wantCode(t testing.TB, what string, err error, code store.Code) {
	t.Helper()
	if store.CodeOf(err) != code {
		t.Fatalf("%s: got %v, want %s", what, err, code)
	}
}

func addrs(reps []store.Replica) []uint64 {
	out := make([]uint64, len(reps))
	for i, r := range reps {
		out[i] = r.Addr
	}
	slices.Sort(out)
	return out
}

// metric returns the value of a metric in m's registry (summed over label
// sets whose labels contain every label=value pair given).
func metric(t testing.TB, m *Master, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := m.Metrics().Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	found := false
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, x := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				ok := false
				for _, lp := range x.GetLabel() {
					ok = ok || lp.GetName() == labels[i] && lp.GetValue() == labels[i+1]
				}
				if !ok {
					continue next
				}
			}
			found = true
			switch {
			case x.Counter != nil:
				sum += x.Counter.GetValue()
			case x.Gauge != nil:
				sum += x.Gauge.GetValue()
			}
		}
	}
	if !found {
		t.Fatalf("metric %s%v not exported", name, labels)
	}
	return sum
}

func roundUp(n uint64) uint64 { return (n + alloc.Align - 1) &^ (alloc.Align - 1) }

// liveRep is one replica holding space: of an object, of an object's
// pending resize, or of a discarded put waiting for its release.
type liveRep struct {
	what string
	seg  *segment
	reg  *region
	addr uint64
	size uint64
}

// checkInvariants locks the whole master and checks that its metadata and
// its space agree:
//   - every replica holding space lies inside its region and its segment,
//     and no two overlap. Replicas holding space are those on a mounted
//     segment of: objects (PROCESSING or COMPLETE), pending resizes, and
//     the release queue (discarded puts until put start + release timeout,
//     old versions of a resize until the reader's lease ends);
//   - a segment's used bytes are the sum of the object bytes of those
//     replicas (not rounded up to the allocator's 64-byte granule),
//     the master's Used is the sum over segments and is at most Capacity,
//     which is the sum of the mounted sizes;
//   - each region counts its replicas, its allocator holds exactly them,
//     the segment's allocator holds exactly its regions, and each instance
//     counts the regions it owns;
//   - each shard counts its complete and soft-pinned objects, and its LRU
//     list holds exactly its complete objects;
//   - objects have replicas; a PROCESSING object has no upsert.
func checkInvariants(m *Master) error {
	for i := range m.shards {
		m.shards[i].mu.Lock()
		defer m.shards[i].mu.Unlock()
	}
	m.space.mu.Lock()
	defer m.space.mu.Unlock()
	m.pend.mu.Lock()
	defer m.pend.mu.Unlock()
	sp := &m.space

	resolve := func(r replicaRef) (*segment, bool) {
		seg := r.reg.seg
		if seg.live != nil {
			seg = seg.live
		}
		return seg, sp.segs[seg.info.ID] == seg
	}
	var live []liveRep
	var errs []error
	add := func(what string, refs []replicaRef, size uint64, mustBeLive bool) {
		for _, r := range refs {
			seg, ok := resolve(r)
			if !ok {
				switch {
				case !mustBeLive:
				case r.reg.seg.regions != nil:
					errs = append(errs, fmt.Errorf("%s: replica at 0x%x on segment %q that is not mounted", what, r.addr, seg.info.Name))
				case sp.segs[seg.info.ID] != nil:
					// A restored replica whose segment is mounted but
					// was not rebuilt around it: new objects may land
					// on its bytes.
					errs = append(errs, fmt.Errorf("%s: restored replica at 0x%x+%d not reserved in mounted segment %q", what, r.addr, size, seg.info.Name))
				}
				continue
			}
			live = append(live, liveRep{what, seg, r.reg, r.addr, size})
		}
	}
	for i := range m.shards {
		sh := &m.shards[i]
		complete, soft := 0, 0
		for k, o := range sh.objects {
			if o.key != k {
				errs = append(errs, fmt.Errorf("object under key %q is named %q", k, o.key))
			}
			if len(o.replicas) == 0 {
				errs = append(errs, fmt.Errorf("object %q (state %d) has no replica", k, o.state))
			}
			if o.state == stateComplete {
				complete++
				if o.softPin != 0 {
					soft++
				}
			} else if o.upsert != nil {
				errs = append(errs, fmt.Errorf("object %q is PROCESSING with a pending resize", k))
			}
			if o.upsert != nil && len(o.upsert.refs) == 0 {
				errs = append(errs, fmt.Errorf("object %q has a pending resize with no replica", k))
			}
			add("object "+k, o.replicas, o.size, true)
			if o.upsert != nil {
				add("resize of "+k, o.upsert.refs, o.upsert.size, true)
			}
		}
		if sh.keys != complete {
			errs = append(errs, fmt.Errorf("shard %d counts %d keys, holds %d complete objects", i, sh.keys, complete))
		}
		if sh.softPinned != soft {
			errs = append(errs, fmt.Errorf("shard %d counts %d soft-pinned, holds %d", i, sh.softPinned, soft))
		}
		if _, none := sh.policy.(noEviction); !none {
			n := 0
			sh.policy.Victims(func(e *policy.Entry[*Object]) bool {
				n++
				if o := e.V; sh.objects[o.key] != o || o.state != stateComplete {
					errs = append(errs, fmt.Errorf("shard %d: the policy holds %q, which is not a complete object of the shard", i, o.key))
				}
				return n <= complete
			})
			if n != complete || sh.policy.Len() != complete {
				errs = append(errs, fmt.Errorf("shard %d: the policy holds %d objects (Len %d), shard %d complete", i, n, sh.policy.Len(), complete))
			}
		}
	}
	for _, p := range m.pend.releases {
		add("discarded put", p.replicas, p.size, false)
	}

	// Placement: inside region and segment, no overlap.
	bySeg := map[*segment][]liveRep{}
	for _, r := range live {
		end := r.addr + roundUp(r.size)
		b := r.seg.info
		if r.addr < b.Base || end > b.Base+b.Size || end < r.addr {
			errs = append(errs, fmt.Errorf("%s: replica [0x%x, 0x%x) outside segment %q [0x%x, 0x%x)", r.what, r.addr, end, b.Name, b.Base, b.Base+b.Size))
		}
		if r.addr < r.reg.base || end > r.reg.base+roundUp(r.reg.len) {
			errs = append(errs, fmt.Errorf("%s: replica [0x%x, 0x%x) outside its region [0x%x, +%d)", r.what, r.addr, end, r.reg.base, r.reg.len))
		}
		bySeg[r.seg] = append(bySeg[r.seg], r)
	}
	var total, capacity uint64
	for _, seg := range sp.order {
		capacity += seg.info.Size
		reps := bySeg[seg]
		sort.Slice(reps, func(i, j int) bool { return reps[i].addr < reps[j].addr })
		var used uint64
		for i, r := range reps {
			used += r.size
			if i > 0 && reps[i-1].addr+roundUp(reps[i-1].size) > r.addr {
				errs = append(errs, fmt.Errorf("segment %q: %s at 0x%x+%d overlaps %s at 0x%x+%d", seg.info.Name, reps[i-1].what, reps[i-1].addr, reps[i-1].size, r.what, r.addr, r.size))
			}
		}
		if seg.used.Load() != used {
			errs = append(errs, fmt.Errorf("segment %q: used %d, its replicas hold %d", seg.info.Name, seg.used.Load(), used))
		}
		total += used
	}
	for r := range bySeg {
		if !slices.Contains(sp.order, r) {
			errs = append(errs, fmt.Errorf("segment %q holds replicas but is not in the placement order", r.info.Name))
		}
	}
	if sp.used.Load() != total {
		errs = append(errs, fmt.Errorf("master used %d, replicas hold %d", sp.used.Load(), total))
	}
	if sp.capacity.Load() != capacity {
		errs = append(errs, fmt.Errorf("master capacity %d, mounted segments sum to %d", sp.capacity.Load(), capacity))
	}
	if total > capacity {
		errs = append(errs, fmt.Errorf("used %d exceeds capacity %d", total, capacity))
	}

	// Regions.
	type regStat struct {
		n     int32
		bytes uint64
	}
	regs := map[*region]*regStat{}
	for _, r := range live {
		st := regs[r.reg]
		if st == nil {
			st = &regStat{}
			regs[r.reg] = st
		}
		st.n++
		st.bytes += roundUp(r.size)
	}
	for _, in := range sp.instances {
		for _, reg := range in.regions {
			if reg.owner != in {
				errs = append(errs, fmt.Errorf("instance %s lists a region at 0x%x it does not own", in.id, reg.base))
			}
			if sp.segs[reg.seg.info.ID] != reg.seg {
				errs = append(errs, fmt.Errorf("instance %s lists a region on unmounted segment %q", in.id, reg.seg.info.Name))
			}
			if regs[reg] == nil {
				regs[reg] = &regStat{}
			}
		}
	}
	owned := map[*instance]int{}
	segRegions := map[*segment][]*region{}
	for reg, st := range regs {
		seg := reg.seg
		if seg.live != nil {
			seg = seg.live
		}
		segRegions[seg] = append(segRegions[seg], reg)
		if reg.owner != nil {
			owned[reg.owner]++
		}
		if reg.objects != st.n {
			errs = append(errs, fmt.Errorf("region 0x%x+%d on %q counts %d objects, holds %d replicas", reg.base, reg.len, seg.info.Name, reg.objects, st.n))
		}
		if !reg.dedicated && reg.alloc.Used() != st.bytes {
			errs = append(errs, fmt.Errorf("region 0x%x+%d on %q: allocator uses %d bytes, replicas hold %d", reg.base, reg.len, seg.info.Name, reg.alloc.Used(), st.bytes))
		}
	}
	for _, in := range sp.instances {
		if in.count != owned[in] {
			errs = append(errs, fmt.Errorf("instance %s counts %d regions, owns %d live ones", in.id, in.count, owned[in]))
		}
	}
	// A dropped instance's dedicated regions keep pointing at it until
	// freed; only live instances are counted per segment.
	for _, seg := range sp.order {
		perIn := map[*instance]int{}
		for _, reg := range segRegions[seg] {
			if reg.owner != nil && sp.instances[reg.owner.id] == reg.owner {
				perIn[reg.owner]++
			}
		}
		for in, n := range seg.owned {
			if n != perIn[in] {
				errs = append(errs, fmt.Errorf("segment %q counts %d regions of instance %s, it holds %d", seg.info.Name, n, in.id, perIn[in]))
			}
		}
		for in, n := range perIn {
			if seg.owned[in] != n {
				errs = append(errs, fmt.Errorf("segment %q counts %d regions of instance %s, it holds %d", seg.info.Name, seg.owned[in], in.id, n))
			}
		}
	}
	for _, seg := range sp.order {
		rs := segRegions[seg]
		sort.Slice(rs, func(i, j int) bool { return rs[i].base < rs[j].base })
		var bytes uint64
		for i, r := range rs {
			bytes += roundUp(r.len)
			if i > 0 && rs[i-1].base+roundUp(rs[i-1].len) > r.base {
				errs = append(errs, fmt.Errorf("segment %q: regions at 0x%x and 0x%x overlap", seg.info.Name, rs[i-1].base, r.base))
			}
		}
		if seg.regions.Used() != bytes {
			errs = append(errs, fmt.Errorf("segment %q: allocator uses %d bytes, its %d live regions %d", seg.info.Name, seg.regions.Used(), len(rs), bytes))
		}
		if seg.nreg != len(rs) {
			errs = append(errs, fmt.Errorf("segment %q counts %d regions, has %d live", seg.info.Name, seg.nreg, len(rs)))
		}
	}
	// The tenant ledger charges each tenant exactly its objects' memory.
	if m.tenants != nil {
		count := map[string]uint64{}
		for i := range m.shards {
			for k, o := range m.shards[i].objects {
				t, _ := store.SplitKey(k)
				count[t] += chargeOf(o)
			}
		}
		m.tenants.mu.Lock()
		for t, c := range m.tenants.charged {
			if c != count[t] {
				errs = append(errs, fmt.Errorf("tenant %q: ledger charges %d bytes, its objects hold %d", t, c, count[t]))
			}
		}
		for t, c := range count {
			if m.tenants.charged[t] != c {
				errs = append(errs, fmt.Errorf("tenant %q: its objects hold %d bytes, ledger charges %d", t, c, m.tenants.charged[t]))
			}
		}
		for t, r := range m.tenants.reserved {
			if r != 0 {
				errs = append(errs, fmt.Errorf("tenant %q: %d bytes still reserved with no put in flight", t, r))
			}
		}
		m.tenants.mu.Unlock()
	}
	return errors.Join(errs...)
}

func mustInvariants(t testing.TB, m *Master) {
	t.Helper()
	if err := checkInvariants(m); err != nil {
		t.Fatalf("invariants:\n%v", err)
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// maintain pings for the named clients (segment owners that would be
// pinging every second) and runs one round of housekeeping.
func maintain(m *Master, alive ...string) {
	for _, c := range alive {
		m.Ping(uuidOf(c))
	}
	m.Maintain()
}
