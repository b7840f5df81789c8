package ha

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/master"
)

func seg(name string, id uint64) *store.SegmentInfo {
	return &store.SegmentInfo{ID: store.UUID{First: id}, Name: name, Base: 0x1000, Size: 0x10000, Endpoint: name, Protocol: "tcp"}
}

// Where a removed object's space was reused before the remove's record
// was committed, the newer object wins and the stale one is not restored
// over it; replicas on a segment the log never saw mounted are dropped.
func TestRestoredResolvesOverlapsAndUnknownSegments(t *testing.T) {
	s := newState()
	for _, r := range []record{
		{Seq: 1, Op: "mount", Segment: seg("a", 1)},
		{Seq: 2, Op: "mount", Segment: seg("b", 2)},
		{Seq: 3, Op: "put_end", Key: "old", Size: 0x100, Reps: []rep{{"a", 0x1000}, {"b", 0x1000}}},
		{Seq: 4, Op: "put_end", Key: "new", Size: 0x80, Reps: []rep{{"a", 0x1080}}},
		{Seq: 5, Op: "put_end", Key: "lost", Size: 0x80, Reps: []rep{{"gone", 0x1000}}},
		{Seq: 6, Op: "put_end", Key: "fine", Size: 0x80, Reps: []rep{{"a", 0x2000}}},
		{Seq: 6, Op: "remove", Key: "fine"}, // a replayed seq: ignored
	} {
		s.apply(r)
	}
	objs, dropped := s.restored()
	got := map[string][]string{}
	for _, o := range objs {
		for _, r := range o.Replicas {
			got[o.Key] = append(got[o.Key], r.Segment.Name)
		}
	}
	if dropped != 1 || len(got) != 3 || len(got["old"]) != 1 || got["old"][0] != "b" || len(got["new"]) != 1 || len(got["fine"]) != 1 {
		t.Fatalf("restored %v (dropped %d): want old only on b, new and fine whole, lost dropped", got, dropped)
	}
}

// An unmount drops the segment's replicas, and objects left with none.
func TestApplyUnmount(t *testing.T) {
	s := newState()
	for _, r := range []record{
		{Seq: 1, Op: "mount", Segment: seg("a", 1)},
		{Seq: 2, Op: "mount", Segment: seg("b", 2)},
		{Seq: 3, Op: "put_end", Key: "two", Size: 8, Reps: []rep{{"a", 0x1000}, {"b", 0x1000}}},
		{Seq: 4, Op: "put_end", Key: "one", Size: 8, Reps: []rep{{"a", 0x1100}}},
		{Seq: 5, Op: "unmount", Segment: seg("a", 1)},
	} {
		s.apply(r)
	}
	if _, ok := s.Objects["one"]; ok || len(s.Objects["two"].Reps) != 1 || s.Objects["two"].Reps[0].Seg != "b" || len(s.Segments) != 1 || s.Seq != 5 {
		t.Fatalf("after unmount: %+v, segments %v", s.Objects, s.Segments)
	}
}

func TestDecodeBatchRejects(t *testing.T) {
	for _, in := range []string{``, `[]`, `{}`, `[{"s":2},{"s":4}]`, `[{"s":"x"}]`} {
		if _, err := decodeBatch([]byte(in)); err == nil {
			t.Errorf("decodeBatch(%q): no error", in)
		}
	}
	recs, err := decodeBatch([]byte(`[{"s":7,"o":"remove","k":"x"},{"s":8,"o":"evict","k":"y"}]`))
	if err != nil || len(recs) != 2 || recs[1].Op != "evict" {
		t.Fatalf("decodeBatch: %+v, %v", recs, err)
	}
}

// FuzzApplyBatch: whatever etcd holds under the op log, decoding and
// applying it never panics, and the state restores.
func FuzzApplyBatch(f *testing.F) {
	f.Add([]byte(`[{"s":1,"o":"mount","g":{"ID":{"First":1,"Second":0},"Name":"a","Base":4096,"Size":65536}},{"s":2,"o":"put_end","k":"x","z":16,"r":[{"g":"a","a":4096}]}]`))
	f.Add([]byte(`[{"s":1,"o":"mount","g":{"ID":{"First":1,"Second":0},"Name":"a","Base":4096,"Size":65536}},{"s":2,"o":"put_end","k":"","z":16,"r":[{"g":"a","a":4096}]}]`))
	f.Add([]byte(`[{"s":1,"o":"unmount"},{"s":2,"o":"put_end","k":"x","z":18446744073709551615,"r":[{"g":"a","a":18446744073709551615}]}]`))
	// Ranges the master's allocator cannot hold: off the granule, past
	// the segment's whole granules, on a segment below one granule.
	f.Add([]byte(`[{"s":1,"o":"mount","g":{"ID":{"First":1,"Second":0},"Name":"a","Base":4096,"Size":100}},{"s":2,"o":"put_end","k":"x","z":80,"r":[{"g":"a","a":4096}]},{"s":3,"o":"put_end","k":"y","z":8,"r":[{"g":"a","a":4097}]}]`))
	f.Add([]byte(`[{"s":1,"o":"mount","g":{"ID":{"First":1,"Second":0},"Name":"a","Base":0,"Size":10}},{"s":2,"o":"put_end","k":"x","z":1,"r":[{"g":"a","a":0}]},{"s":3,"o":"hold","k":"x","z":1,"r":[{"g":"a","a":0}],"at":1}]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		recs, err := decodeBatch(b)
		if err != nil {
			return
		}
		s := newState()
		for _, r := range recs {
			s.apply(r)
		}
		objs, _ := s.restored()
		m, err := master.New(master.Config{})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Restore(objs); err != nil {
			t.Fatalf("the master refuses the restored state: %v", err)
		}
	})
}

// Disk replicas in the op log: an offload leaves the object with only its
// disk replica (its DRAM range may be reused: it must not be restored), a
// promotion gives it DRAM replicas again, and an unmount of its node's
// segment keeps an object that still has its disk copy.
func TestApplyDiskReplicas(t *testing.T) {
	s := newState()
	for _, r := range []record{
		{Seq: 1, Op: "mount", Segment: seg("a", 1)},
		{Seq: 2, Op: "put_end", Key: "off", Size: 0x100, Reps: []rep{{"a", 0x1000}}},
		{Seq: 3, Op: "put_end", Key: "prom", Size: 0x100, Reps: []rep{{"a", 0x1100}}},
		{Seq: 4, Op: "disk_only", Key: "off", Size: 0x100, Ver: 7, Tier: "t1"},
		{Seq: 5, Op: "disk_only", Key: "prom", Size: 0x100, Ver: 8, Tier: "t1"},
		{Seq: 6, Op: "put_end", Key: "reuse", Size: 0x100, Reps: []rep{{"a", 0x1000}}},
		{Seq: 7, Op: "promote", Key: "prom", Size: 0x100, Reps: []rep{{"a", 0x2000}}, Ver: 8, Tier: "t1"},
	} {
		s.apply(r)
	}
	objs, dropped := s.restored()
	got := map[string]master.RestoredObject{}
	for _, o := range objs {
		got[o.Key] = o
	}
	if dropped != 0 || len(objs) != 3 {
		t.Fatalf("restored %+v, %d dropped", objs, dropped)
	}
	if o := got["off"]; len(o.Replicas) != 0 || o.DiskTier != "t1" || o.DiskVersion != 7 {
		t.Fatalf("offloaded object restored as %+v: want only its disk replica", o)
	}
	if o := got["prom"]; len(o.Replicas) != 1 || o.Replicas[0].Addr != 0x2000 || o.DiskTier != "t1" || o.DiskVersion != 8 {
		t.Fatalf("promoted object restored as %+v", o)
	}
	if o := got["reuse"]; len(o.Replicas) != 1 || o.Replicas[0].Addr != 0x1000 {
		t.Fatalf("object in the freed range restored as %+v", o)
	}
	s.apply(record{Seq: 8, Op: "unmount", Segment: seg("a", 1)})
	objs, _ = s.restored()
	if len(objs) != 2 {
		t.Fatalf("after the unmount: %+v; want the two with disk replicas", objs)
	}
	for _, o := range objs {
		if len(o.Replicas) != 0 || o.DiskTier != "t1" {
			t.Fatalf("after the unmount: %+v", o)
		}
	}
}

// A change that comes after the op log stopped is not committed, so its
// Sync must fail: a put acknowledged then would be missing from the log
// the next leader replays. (A dying leader serves while its term winds
// down; TestFailoverLosesNothing caught one such put: acknowledged 4 ms
// after the kill, not found after the failover.)
func TestSyncFailsOnceTheLogStopped(t *testing.T) {
	c := &Candidate{cfg: Config{ClusterID: "sync-test"}}
	l := newCommitter(c, 7, 0, nil)
	l.stop(errStopped)
	l.onChange(master.Change{Op: master.OpPutEnd, Key: "after-the-stop", Size: 1})
	if err := l.sync(); err == nil {
		t.Fatal("sync after the log stopped returned nil: the put would be acknowledged but is in no log")
	}
	// And the term's gates refuse calls from then on.
	c.ready.Store(true)
	tm := &term{log: l}
	c.cur.Store(tm)
	if c.serving(tm) {
		t.Fatal("a term whose op log stopped still serves")
	}
	if c.serving(&term{log: newCommitter(c, 8, 0, nil)}) {
		t.Fatal("a term that is not the current one serves")
	}
	cur := &term{log: newCommitter(c, 9, 0, nil)}
	cur.setDeadline(time.Now().Add(time.Minute))
	c.cur.Store(cur)
	if !c.serving(cur) {
		t.Fatal("the current term with a live op log does not serve")
	}
}

// Grants (put_start) the op log holds come back as puts still being
// written, or, once abandoned (discarded, superseded), as reservations
// until their release timeout; ended, revoked or unmounted ones do not.
func TestRestoredGrants(t *testing.T) {
	now := time.Unix(10000, 0)
	at := func(d time.Duration) int64 { return now.Add(-d).UnixNano() }
	w := store.UUID{First: 7}
	s := newState()
	for _, r := range []record{
		{Seq: 1, Op: "mount", Segment: seg("a", 1)},
		{Seq: 2, Op: "mount", Segment: seg("b", 2)},
		{Seq: 3, Op: "put_start", Key: "writing", Size: 0x100, Reps: []rep{{"a", 0x1000}}, W: &w, At: at(time.Second)},
		{Seq: 4, Op: "put_start", Key: "ended", Size: 0x100, Reps: []rep{{"a", 0x2000}}, W: &w, At: at(time.Second)},
		{Seq: 5, Op: "put_end", Key: "ended", Size: 0x100, Reps: []rep{{"a", 0x2000}}},
		{Seq: 6, Op: "put_start", Key: "revoked", Size: 0x100, Reps: []rep{{"a", 0x3000}}, W: &w, At: at(time.Second)},
		{Seq: 7, Op: "revoke", Key: "revoked"},
		{Seq: 8, Op: "put_start", Key: "dropped", Size: 0x100, Reps: []rep{{"a", 0x4000}}, W: &w, At: at(time.Minute)},
		{Seq: 9, Op: "discard", Key: "dropped"},
		{Seq: 10, Op: "put_start", Key: "again", Size: 0x100, Reps: []rep{{"a", 0x5000}}, W: &w, At: at(time.Hour)},
		{Seq: 11, Op: "put_start", Key: "again", Size: 0x100, Reps: []rep{{"a", 0x6000}}, W: &w, At: at(time.Minute)},
		{Seq: 12, Op: "put_start", Key: "onb", Size: 0x100, Reps: []rep{{"b", 0x1000}}, W: &w, At: at(time.Second)},
		{Seq: 13, Op: "unmount", Segment: seg("b", 2)},
		{Seq: 14, Op: "put_end", Key: "up", Size: 0x100, Reps: []rep{{"a", 0x7000}}},
		{Seq: 15, Op: "put_start", Key: "up", Size: 0x100, Reps: []rep{{"a", 0x7000}}, W: &w, At: at(time.Second)},
		{Seq: 16, Op: "put_end", Key: "grow", Size: 0x100, Reps: []rep{{"a", 0x8000}}},
		{Seq: 17, Op: "put_start", Key: "grow", Size: 0x200, Reps: []rep{{"a", 0x9000}}, W: &w, At: at(time.Second)},
		{Seq: 18, Op: "put_end", Key: "orphan", Size: 0x100, Reps: []rep{{"never-mounted", 0x1000}}},
		{Seq: 19, Op: "put_start", Key: "orphan", Size: 0x200, Reps: []rep{{"a", 0xa000}}, W: &w, At: at(time.Second)},
		{Seq: 20, Op: "mount", Segment: seg("c", 3)},
		{Seq: 21, Op: "put_end", Key: "lost", Size: 0x100, Reps: []rep{{"a", 0xb000}}},
		{Seq: 22, Op: "put_start", Key: "lost", Size: 0x200, Reps: []rep{{"c", 0x1000}}, W: &w, At: at(time.Second)},
		{Seq: 23, Op: "unmount", Segment: seg("c", 3)},
	} {
		s.apply(r)
	}
	// Through a snapshot, as a standby or the next leader reads it.
	b, err := s.encode()
	if err != nil {
		t.Fatal(err)
	}
	if s, err = decodeState(b); err != nil {
		t.Fatal(err)
	}
	objs, _ := s.restoredAt(now, 10*time.Minute)
	type got struct {
		pending  bool
		reserved bool
		addr     uint64
	}
	seen := map[string][]got{}
	for _, o := range objs {
		for _, r := range o.Replicas {
			seen[o.Key] = append(seen[o.Key], got{o.Pending, !o.ReserveUntil.IsZero(), r.Addr})
			if o.Pending && (o.Writer != w || now.Sub(o.Started) > time.Minute) {
				t.Errorf("%q restored with writer %v started %v", o.Key, o.Writer, o.Started)
			}
		}
	}
	want := map[string][]got{
		"writing": {{true, false, 0x1000}},
		"ended":   {{false, false, 0x2000}},
		"dropped": {{false, true, 0x4000}},  // discarded a minute ago: held
		"again":   {{true, false, 0x6000}},  // the hour-old grant is past release
		"up":      {{true, false, 0x7000}},  // rewritten in place: torn
		"grow":    {{false, false, 0x8000}}, // resized: the object, its resize on it (below)
		"orphan":  {{false, true, 0xa000}},  // resized, the object lost: its writer may write
		"lost":    {{false, false, 0xb000}}, // its resize's segment went: no writer's (below)
	}
	if len(seen) != len(want) {
		t.Fatalf("restored %v, want %v", seen, want)
	}
	for k, w := range want {
		if len(seen[k]) != 1 || seen[k][0] != w[0] {
			t.Errorf("%q: restored %v, want %v", k, seen[k], w)
		}
	}
	for _, o := range objs {
		switch u := o.Upsert; {
		case o.Key == "grow" && (u == nil || u.Size != 0x200 || u.Writer != w || len(u.Replicas) != 1 || u.Replicas[0].Addr != 0x9000 || now.Sub(u.Started) != time.Second):
			t.Errorf("grow: its resize restored as %+v, want 0x200 bytes at 0x9000 of writer %v, a second old", u, w)
		case o.Key == "lost" && (u == nil || len(u.Replicas) != 0):
			t.Errorf("lost: restored with resize %+v, want one with no replica (no writer's version)", u)
		case o.Key != "grow" && o.Key != "lost" && u != nil:
			t.Errorf("%q restored with a resize %+v", o.Key, u)
		}
	}
}

// A put's checksum goes through the op log and a snapshot to the next
// leader, so its readers still check what they read.
func TestRestoredKeepsChecksum(t *testing.T) {
	s := newState()
	s.apply(record{Seq: 1, Op: "mount", Segment: seg("a", 1)})
	r := recordOf(master.Change{Op: master.OpPutEnd, Key: "k", Size: 0x100, Replicas: []store.Replica{{Segment: "a", Addr: 0x1000, Len: 0x100}}, Sum: store.Checksum([]byte("v"))})
	r.Seq = 2
	s.apply(r)
	b, err := s.encode()
	if err != nil {
		t.Fatal(err)
	}
	if s, err = decodeState(b); err != nil {
		t.Fatal(err)
	}
	objs, _ := s.restored()
	if len(objs) != 1 || objs[0].Sum != store.Checksum([]byte("v")) {
		t.Fatalf("restored %+v, want k with its checksum", objs)
	}
}

// A hold record (ranges a read lease covered when they left their
// object: the old version of an upsert read meanwhile) is restored as a
// reservation until that lease ends, so a next leader does not place
// new objects over bytes the reader may still be moving; after its end,
// or once a newer object was placed there (the old leader reused the
// range after the lease), it holds nothing.
func TestRestoredHolds(t *testing.T) {
	now := time.Unix(1000, 0)
	until := now.Add(3 * time.Second)
	s := newState()
	for _, r := range []record{
		{Seq: 1, Op: "mount", Segment: seg("a", 1)},
		{Seq: 2, Op: "put_end", Key: "k", Size: 0x100, Reps: []rep{{"a", 0x1000}}},
		// Upserted while read: the old range is held, the new version
		// elsewhere.
		{Seq: 3, Op: "hold", Key: "k", Size: 0x100, Reps: []rep{{"a", 0x1000}}, At: until.UnixNano()},
		{Seq: 4, Op: "put_end", Key: "k", Size: 0x100, Reps: []rep{{"a", 0x2000}}},
		// Another, whose range was reused after its lease ended.
		{Seq: 5, Op: "put_end", Key: "j", Size: 0x100, Reps: []rep{{"a", 0x3000}}},
		{Seq: 6, Op: "hold", Key: "j", Size: 0x100, Reps: []rep{{"a", 0x3000}}, At: until.UnixNano()},
		{Seq: 7, Op: "remove", Key: "j"},
		{Seq: 8, Op: "put_end", Key: "i", Size: 0x80, Reps: []rep{{"a", 0x3000}}},
	} {
		s.apply(r)
	}
	held := func(at time.Time) map[uint64]time.Time {
		objs, _ := s.restoredAt(at, time.Second)
		out := map[uint64]time.Time{}
		for _, o := range objs {
			if !o.ReserveUntil.IsZero() {
				out[o.Replicas[0].Addr] = o.ReserveUntil
			}
		}
		return out
	}
	if h := held(now); len(h) != 1 || !h[0x1000].Equal(until) {
		t.Fatalf("reservations within the lease: %v, want 0x1000 until %v", h, until)
	}
	if h := held(until.Add(time.Millisecond)); len(h) != 0 {
		t.Fatalf("reservations after the lease ended: %v", h)
	}
	// The record survives a snapshot (the state's JSON).
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	s2 := newState()
	if err := json.Unmarshal(b, s2); err != nil {
		t.Fatal(err)
	}
	objs, _ := s2.restoredAt(now, time.Second)
	n := 0
	for _, o := range objs {
		if !o.ReserveUntil.IsZero() && o.ReserveUntil.Equal(until) {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("after a snapshot round trip: %d held reservations, want 1", n)
	}
}
