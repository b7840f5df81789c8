package master

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/store"
)

type span struct{ addr, len uint64 }

func overlaps(a, b span) bool { return a.addr < b.addr+b.len && b.addr < a.addr+a.len }

// restoredFixture restores 20 objects on segment s (not mounted), spread
// over its 64 MiB.
func restoredFixture(t *testing.T, m *Master) (store.SegmentInfo, []RestoredObject) {
	t.Helper()
	s := segInfo("s", "127.0.0.1", 0x10000000, 64*MiB)
	var objs []RestoredObject
	for i := range 20 {
		objs = append(objs, RestoredObject{
			Key:      fmt.Sprint("old", i),
			Size:     256*KiB + uint64(i)*1000,
			Replicas: []RestoredReplica{{Segment: s, Addr: s.Base + uint64(i)*3*MiB + 4096}},
		})
	}
	if err := m.Restore(objs); err != nil {
		t.Fatal(err)
	}
	return s, objs
}

// Mooncake #3826 / #1336: a master that learnt of objects before their
// segment is (re-)mounted must never place new objects over them.
func TestRestoreThenMountNeverOverlaps(t *testing.T) {
	// No eviction: the restored objects are older than every new one,
	// and a put into the full segment would evict them for room (freeing
	// their ranges for reuse, as the removal below does) rather than fail.
	m, _ := newTestMaster(t, Config{EvictionPolicy: policyNone})
	s, objs := restoredFixture(t, m)
	var restored []span
	var total uint64
	for _, o := range objs {
		restored = append(restored, span{o.Replicas[0].Addr, o.Size})
		total += o.Size
	}
	if g := get(m, "old3"); g.Err != nil || g.Replicas[0].Addr != objs[3].Replicas[0].Addr || g.Replicas[0].Endpoint != s.Endpoint {
		t.Fatalf("get of a restored object: %+v", g)
	}
	if err := m.MountSegment(uuidOf("node"), s); err != nil {
		t.Fatal(err)
	}
	if st := m.Stats(); st.Used != total || st.Capacity != 64*MiB || st.Keys != 20 {
		t.Fatalf("after mount: %+v, want used %d", st, total)
	}
	mustInvariants(t, m)
	// Fill the segment with new objects of several writers.
	n := 0
	for i := 0; ; i++ {
		r := m.BatchPutStart(uuidOf(fmt.Sprint("w", i%4)), "", []PutItem{{fmt.Sprint("new", i), 20*KiB + uint64(i%7)*4096}}, one())[0]
		if r.Err != nil {
			wantCode(t, "put into a full segment", r.Err, store.NoAvailableHandle)
			break
		}
		n++
		got := span{r.Replicas[0].Addr, r.Replicas[0].Len}
		for j, old := range restored {
			if overlaps(got, old) {
				t.Fatalf("new object %d at 0x%x+%d overlaps restored old%d at 0x%x+%d", i, got.addr, got.len, j, old.addr, old.len)
			}
		}
	}
	if n < 1000 {
		t.Fatalf("only %d new objects fit", n)
	}
	mustInvariants(t, m)
	// Removing a restored object returns its space, for reuse.
	used := m.Stats().Used
	if err := remove(m, "old5", false); err != nil {
		t.Fatal(err)
	}
	if u := m.Stats().Used; u != used-objs[5].Size {
		t.Fatalf("used %d after removing a restored object, want %d", u, used-objs[5].Size)
	}
	r := put(t, m, "late", "reuse", 256*KiB)
	if !overlaps(span{r[0].Addr, r[0].Len}, restored[5]) {
		t.Fatalf("the freed range 0x%x+%d was not reused (got 0x%x)", restored[5].addr, restored[5].len, r[0].Addr)
	}
	mustInvariants(t, m)
}

func TestRestoreRefusals(t *testing.T) {
	m, _ := newTestMaster(t, Config{})
	s := mount(t, m, "node", "s", "127.0.0.1", 0x1000000, 64*MiB)
	err := m.Restore([]RestoredObject{{Key: "k", Size: 100, Replicas: []RestoredReplica{{Segment: s, Addr: s.Base}}}})
	wantCode(t, "restore onto a mounted segment", err, store.SegmentAlreadyExists)
	other := segInfo("other", "127.0.0.2", 0x1000000, 64*MiB)
	for _, addr := range []uint64{other.Base - 64, other.Base + 64*MiB - 64, ^uint64(0) - 10} {
		err = m.Restore([]RestoredObject{{Key: "k", Size: 100, Replicas: []RestoredReplica{{Segment: other, Addr: addr}}}})
		wantCode(t, fmt.Sprintf("restore of a replica at 0x%x outside its segment", addr), err, store.InvalidReplica)
	}
	if m.Stats().Keys != 0 {
		t.Fatal("a refused restore left objects")
	}
}

// A restored object removed before its segment is mounted must not keep
// its range reserved once the segment comes.
func TestRestoreRemovedBeforeMount(t *testing.T) {
	m, _ := newTestMaster(t, Config{})
	s, objs := restoredFixture(t, m)
	if err := remove(m, "old0", false); err != nil {
		t.Fatal(err)
	}
	if err := m.MountSegment(uuidOf("node"), s); err != nil {
		t.Fatal(err)
	}
	var want uint64
	for _, o := range objs[1:] {
		want += o.Size
	}
	if u := m.Stats().Used; u != want {
		t.Fatalf("used %d after mount, want %d (old0 was removed before)", u, want)
	}
	mustInvariants(t, m)
}

func TestUnmountDropsReplicas(t *testing.T) {
	m, _ := newTestMaster(t, Config{})
	a := mount(t, m, "na", "a", "127.0.0.1", 0, 64*MiB)
	mount(t, m, "nb", "b", "127.0.0.2", 0, 64*MiB)
	two := store.ReplicateConfig{ReplicaNum: 2}
	onA := store.ReplicateConfig{ReplicaNum: 1, PreferredSegments: []string{"a"}}
	onB := store.ReplicateConfig{ReplicaNum: 1, PreferredSegments: []string{"b"}}
	put(t, m, "w", "both", 1000, two)
	put(t, m, "w", "only-a", 1000, onA)
	put(t, m, "w", "only-b", 1000, onB)
	putStart(t, m, "w", "writing-a", 1000, onA)
	if err := m.UnmountSegment(uuidOf("nb"), a.ID); store.CodeOf(err) != store.InvalidParams {
		t.Fatalf("unmount of another client's segment: %v", err)
	}
	if err := m.UnmountSegment(uuidOf("na"), a.ID); err != nil {
		t.Fatal(err)
	}
	g := get(m, "both")
	if g.Err != nil || len(g.Replicas) != 1 || g.Replicas[0].Segment != "b" {
		t.Fatalf("get of a two-replica object: %+v, want its replica on b", g)
	}
	wantCode(t, "get of an object that lived only on a", get(m, "only-a").Err, store.ObjectNotFound)
	if get(m, "only-b").Err != nil {
		t.Fatal("only-b lost")
	}
	wantCode(t, "put end of a put whose only replica was unmounted", m.BatchPutEnd(uuidOf("w"), []string{"writing-a"})[0], store.ObjectNotFound)
	if s := m.Stats(); s.Used != 2000 || s.Capacity != 64*MiB || s.Keys != 2 || s.Segments != 1 {
		t.Fatalf("after unmount: %+v", s)
	}
	wantCode(t, "second unmount", m.UnmountSegment(uuidOf("na"), a.ID), store.SegmentNotFound)
	mustInvariants(t, m)
	// The segment can come back, empty.
	mount(t, m, "na", "a", "127.0.0.1", 0, 64*MiB)
	put(t, m, "w", "again", 1000, onA)
	mustInvariants(t, m)
}

// A resizing upsert whose old or new replicas lose their segment.
func TestUnmountDuringResize(t *testing.T) {
	onA := store.ReplicateConfig{ReplicaNum: 1, PreferredSegments: []string{"a"}}
	onB := store.ReplicateConfig{ReplicaNum: 1, PreferredSegments: []string{"b"}}
	for _, gone := range []string{"a", "b"} {
		t.Run("unmount "+gone, func(t *testing.T) {
			m, _ := newTestMaster(t, Config{})
			segs := map[string]store.SegmentInfo{
				"a": mount(t, m, "na", "a", "127.0.0.1", 0, 64*MiB),
				"b": mount(t, m, "nb", "b", "127.0.0.2", 0, 64*MiB),
			}
			w := uuidOf("w")
			put(t, m, "w", "k", 1000, onA)
			if r := m.BatchUpsertStart(w, "", []PutItem{{"k", 5000}}, onB)[0]; r.Err != nil || r.Replicas[0].Segment != "b" {
				t.Fatalf("resize onto b: %+v", r)
			}
			if err := m.UnmountSegment(uuidOf("n"+gone), segs[gone].ID); err != nil {
				t.Fatal(err)
			}
			mustInvariants(t, m)
			err := m.BatchUpsertEnd(w, []string{"k"})[0]
			g := get(m, "k")
			switch gone {
			case "a": // the old version is gone; the new one may complete
				if err == nil && (g.Err != nil || g.Replicas[0].Len != 5000) {
					t.Fatalf("after end: %v %+v", err, g)
				}
			case "b": // the new replicas are gone: the old version stays
				if g.Err != nil || len(g.Replicas) != 1 || g.Replicas[0].Len != 1000 || g.Replicas[0].Segment != "a" {
					t.Fatalf("after end (%v): %+v, want the old version on a", err, g)
				}
			}
			mustInvariants(t, m)
		})
	}
}

// Unmounting a segment that held a writer's dedicated region gives the
// writer its region budget back.
func TestUnmountReturnsRegionBudget(t *testing.T) {
	m, _ := newTestMaster(t, Config{MaxRegionsPerInstance: 1})
	a := mount(t, m, "na", "a", "127.0.0.1", 0, 64*MiB)
	put(t, m, "w", "big", MiB) // a dedicated region
	if err := m.UnmountSegment(uuidOf("na"), a.ID); err != nil {
		t.Fatal(err)
	}
	mount(t, m, "nb", "b", "127.0.0.2", 0, 64*MiB)
	put(t, m, "w", "next", MiB)
	mustInvariants(t, m)
}

func TestGracefulUnmountWaitsForLeases(t *testing.T) {
	m, clk := newTestMaster(t, Config{GracefulUnmountWait: 10 * time.Second})
	a := mount(t, m, "na", "a", "127.0.0.1", 0, 64*MiB)
	mount(t, m, "nb", "b", "127.0.0.2", 0, 64*MiB)
	put(t, m, "w", "k", 1000, store.ReplicateConfig{ReplicaNum: 1, PreferredSegments: []string{"a"}})
	get(m, "k") // a read holds a lease
	done := make(chan error, 1)
	go func() { done <- m.GracefulUnmountSegment(context.Background(), uuidOf("na"), a.ID) }()
	deadline := time.Now().Add(5 * time.Second)
	for segStatus(m, "a") != "GRACEFULLY_UNMOUNTING" {
		if time.Now().After(deadline) {
			t.Fatal("segment never became GRACEFULLY_UNMOUNTING")
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case err := <-done:
		t.Fatalf("graceful unmount returned (%v) while a lease was held", err)
	case <-time.After(100 * time.Millisecond):
	}
	// Nothing new is placed on a leaving segment.
	for i := range 10 {
		if r := put(t, m, "w", fmt.Sprint("n", i), 1000, store.ReplicateConfig{ReplicaNum: 1, PreferredSegments: []string{"a"}}); r[0].Segment != "b" {
			t.Fatalf("put placed on a segment being unmounted: %+v", r)
		}
	}
	clk.Advance(DefaultKVLeaseTTL) // the read ends
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("graceful unmount still waiting after the lease ended")
	}
	if segStatus(m, "a") != "" || get(m, "k").Err == nil {
		t.Fatal("segment a or its object still there")
	}
	mustInvariants(t, m)
}

func TestGracefulUnmountWaitIsBounded(t *testing.T) {
	m, _ := newTestMaster(t, Config{GracefulUnmountWait: 50 * time.Millisecond})
	a := mount(t, m, "na", "a", "127.0.0.1", 0, 64*MiB)
	put(t, m, "w", "k", 1000)
	get(m, "k")
	start := time.Now()
	if err := m.GracefulUnmountSegment(context.Background(), uuidOf("na"), a.ID); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el < 50*time.Millisecond {
		t.Fatalf("returned after %s with a lease held, want it to wait the 50 ms bound", el)
	}
	if m.Stats().Segments != 0 {
		t.Fatal("segment still mounted")
	}
	// ctx ends the wait too.
	b := mount(t, m, "nb", "b", "127.0.0.1", 0, 64*MiB)
	put(t, m, "w", "k2", 1000)
	get(m, "k2")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := m.GracefulUnmountSegment(ctx, uuidOf("nb"), b.ID); err != nil || m.Stats().Segments != 0 {
		t.Fatalf("graceful unmount with a done ctx: %v", err)
	}
}

func segStatus(m *Master, name string) string {
	for _, s := range m.Segments() {
		if s.Info.Name == name {
			return s.Status.String()
		}
	}
	return ""
}

func TestClientTTL(t *testing.T) {
	m, clk := newTestMaster(t, Config{})
	a := mount(t, m, "node", "a", "127.0.0.1", 0, 64*MiB)
	mount(t, m, "other", "b", "127.0.0.2", 0, 64*MiB)
	put(t, m, "w", "on-a", 1000, store.ReplicateConfig{ReplicaNum: 1, PreferredSegments: []string{"a"}})
	if _, st := m.Ping(uuidOf("node")); st != store.ClientOK {
		t.Fatalf("ping: %v", st)
	}
	clk.Advance(DefaultClientTTL)
	maintain(m, "other")
	if m.Stats().Segments != 2 {
		t.Fatal("client dropped at exactly client_ttl")
	}
	clk.Advance(time.Millisecond)
	maintain(m, "other")
	if s := m.Stats(); s.Segments != 1 || s.Keys != 0 || s.Used != 0 || s.Capacity != 64*MiB {
		t.Fatalf("after client_ttl: %+v, want the silent node's segment and objects gone", s)
	}
	if metric(t, m, "master_active_clients") != float64(m.ActiveClients()) {
		t.Fatal("master_active_clients disagrees")
	}
	if _, st := m.Ping(uuidOf("node")); st != store.ClientNeedRemount {
		t.Fatalf("ping of a dropped client: %v, want NEED_REMOUNT", st)
	}
	errs := m.ReMountSegment(uuidOf("node"), []store.SegmentInfo{a})
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
	if _, st := m.Ping(uuidOf("node")); st != store.ClientOK {
		t.Fatalf("ping after re-mount: %v", st)
	}
	// Re-mounting what is already mounted is fine for its owner only.
	if errs := m.ReMountSegment(uuidOf("node"), []store.SegmentInfo{a}); errs[0] != nil {
		t.Fatalf("re-mount of an own mounted segment: %v", errs[0])
	}
	errs = m.ReMountSegment(uuidOf("thief"), []store.SegmentInfo{a})
	wantCode(t, "re-mount of another client's segment", errs[0], store.SegmentAlreadyExists)
	wantCode(t, "mount without a client id", m.MountSegment(store.UUID{}, segInfo("z", "127.0.0.1", 0, MiB)), store.InvalidParams)
	bad := segInfo("y", "127.0.0.1", ^uint64(0)-10, MiB)
	wantCode(t, "mount of a segment whose end overflows", m.MountSegment(uuidOf("node"), bad), store.InvalidParams)
	mustInvariants(t, m)
}

// A writer that goes silent returns its regions once they empty; the
// objects in them outlive it.
func TestDroppedWriterReturnsEmptyRegion(t *testing.T) {
	m, clk := newTestMaster(t, Config{})
	mount(t, m, "node", "a", "127.0.0.1", 0, 64*MiB)
	put(t, m, "w", "k", 1000)
	if n := segRegions(m, "a"); n != 1 {
		t.Fatalf("%d regions, want the writer's one", n)
	}
	clk.Advance(DefaultClientTTL + time.Second)
	maintain(m, "node")
	if n := segRegions(m, "a"); n != 1 {
		t.Fatalf("%d regions after the writer was dropped, want its one (the object lives on)", n)
	}
	if r := m.BatchGetReplicaList([]string{"k"}); r[0].Err != nil {
		t.Fatalf("object of a dropped writer: %v", r[0].Err)
	}
	if err := remove(m, "k", true); err != nil {
		t.Fatal(err)
	}
	if n := segRegions(m, "a"); n != 0 {
		t.Fatalf("%d regions after its last object went, want 0", n)
	}
	mustInvariants(t, m)
}

// Restored replicas that the segment's allocator could not reserve
// (overlapping, or not on its 64-byte grid) are refused by Restore: else
// the mount fails, the node mounts again, and new objects land on the
// restored bytes.
func TestRestoreRefusesUnreservableReplicas(t *testing.T) {
	m, _ := newTestMaster(t, Config{})
	s := segInfo("s", "127.0.0.1", 0x10000, 64*MiB)
	r := func(key string, addr, size uint64) RestoredObject {
		return RestoredObject{Key: key, Size: size, Replicas: []RestoredReplica{{Segment: s, Addr: addr}}}
	}
	if err := m.Restore([]RestoredObject{r("a", s.Base, 1000)}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		objs []RestoredObject
	}{
		{"overlapping an earlier restore", []RestoredObject{r("b", s.Base+512, 100)}},
		{"overlapping within one restore", []RestoredObject{r("c", s.Base+MiB, 100), r("d", s.Base+MiB+64, 100)}},
		{"off the 64-byte grid", []RestoredObject{r("e", s.Base+2*MiB+8, 100)}},
		{"of 0 bytes", []RestoredObject{r("f", s.Base+3*MiB, 0)}},
	} {
		wantCode(t, "restore "+tc.name, m.Restore(tc.objs), store.InvalidReplica)
	}
	if k := m.Stats().Keys; k != 1 {
		t.Fatalf("%d keys after refused restores, want 1", k)
	}
	if err := m.MountSegment(uuidOf("node"), s); err != nil {
		t.Fatal(err)
	}
	if u := m.Stats().Used; u != 1000 {
		t.Fatalf("used %d after mount, want 1000", u)
	}
	mustInvariants(t, m)
}

// A re-mount under the same id with another range is refused with a
// message naming both ranges; the same range is a no-op.
func TestReMountWithAnotherRangeRefused(t *testing.T) {
	m, _ := newTestMaster(t, Config{})
	a := mount(t, m, "node", "a", "127.0.0.1", 0x1000000, 64*MiB)
	if errs := m.ReMountSegment(uuidOf("node"), []store.SegmentInfo{a}); errs[0] != nil {
		t.Fatalf("same range: %v", errs[0])
	}
	moved := a
	moved.Base += 4096
	errs := m.ReMountSegment(uuidOf("node"), []store.SegmentInfo{moved})
	wantCode(t, "re-mount with another base", errs[0], store.SegmentAlreadyExists)
	if !strings.Contains(errs[0].Error(), "unmount it first") {
		t.Fatalf("message %q does not say what to do", errs[0])
	}
	mustInvariants(t, m)
}

// A segment known only from a restore (an HA failover) whose node never
// re-mounts is dropped after 3 × client_ttl: objects that lived only
// there are gone, objects with another replica keep that one. A segment
// that re-mounts in time keeps its objects.
func TestRestoredSegmentThatNeverReturns(t *testing.T) {
	m, clk := newTestMaster(t, Config{})
	live := mount(t, m, "node", "live", "127.0.0.2", 0x40000000, 64*MiB)
	gone := segInfo("gone", "127.0.0.3", 0x10000000, 64*MiB)
	back := segInfo("back", "127.0.0.4", 0x20000000, 64*MiB)
	err := m.Restore([]RestoredObject{
		{Key: "only-gone", Size: MiB, Replicas: []RestoredReplica{{Segment: gone, Addr: gone.Base}}},
		{Key: "two", Size: MiB, Replicas: []RestoredReplica{{Segment: gone, Addr: gone.Base + 2*MiB}, {Segment: back, Addr: back.Base}}},
		{Key: "only-back", Size: MiB, Replicas: []RestoredReplica{{Segment: back, Addr: back.Base + 2*MiB}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = live
	clk.Advance(DefaultClientTTL)
	maintain(m, "node")
	if r := get(m, "only-gone"); r.Err != nil {
		t.Fatalf("dropped before the grace: %v", r.Err)
	}
	if err := m.MountSegment(uuidOf("node-back"), back); err != nil {
		t.Fatal(err)
	}
	clk.Advance(2*DefaultClientTTL + time.Second)
	maintain(m, "node", "node-back")
	wantCode(t, "object only on a segment that never returned", get(m, "only-gone").Err, store.ObjectNotFound)
	if r := get(m, "two"); r.Err != nil || len(r.Replicas) != 1 || r.Replicas[0].Segment != "back" {
		t.Fatalf("two: %+v, want its replica on the returned segment only", r)
	}
	if r := get(m, "only-back"); r.Err != nil {
		t.Fatalf("only-back: %v", r.Err)
	}
	mustInvariants(t, m)
}

// Most clients silent at once (a master too busy to answer pings, or a
// network split) are held up to three TTLs; one silent node among live
// ones is dropped at its TTL.
func TestMassSilenceHoldsClients(t *testing.T) {
	m, clk := newTestMaster(t, Config{ClientTTL: 10 * time.Second})
	for _, n := range []string{"a", "b", "c", "d"} {
		mount(t, m, n, n, "10.0.0.1", 0, 64*MiB)
	}
	put(t, m, "w", "k", 4096, store.ReplicateConfig{ReplicaNum: 1, PreferredSegments: []string{"a"}})
	clk.Advance(15 * time.Second)
	maintain(m, "d", "w") // a, b and c silent together
	if got := len(m.Segments()); got != 4 {
		t.Fatalf("%d segments after 3 of 4 nodes went silent together, want all 4 held", got)
	}
	if r := get(m, "k"); r.Err != nil {
		t.Fatalf("k lost while its node was held: %v", r.Err)
	}
	clk.Advance(10 * time.Second)
	maintain(m, "a", "d", "w") // a is back: b and c (2 of 5) are dropped
	if got := len(m.Segments()); got != 2 {
		t.Fatalf("%d segments once most clients pinged again, want 2 (b and c dropped)", got)
	}
	clk.Advance(11 * time.Second)
	maintain(m, "d", "w")
	if got := len(m.Segments()); got != 1 {
		t.Fatalf("%d segments after a alone went silent, want 1", got)
	}
	// Silent together beyond three TTLs: dropped after all.
	m2, clk2 := newTestMaster(t, Config{ClientTTL: 10 * time.Second})
	for _, n := range []string{"a", "b", "c"} {
		mount(t, m2, n, n, "10.0.0.1", 0, 64*MiB)
	}
	clk2.Advance(25 * time.Second)
	maintain(m2)
	if got := len(m2.Segments()); got != 3 {
		t.Fatalf("%d segments at 2.5 TTLs of silence together, want 3", got)
	}
	clk2.Advance(6 * time.Second)
	maintain(m2)
	if got := len(m2.Segments()); got != 0 {
		t.Fatalf("%d segments after 3 TTLs of silence, want 0", got)
	}
}

// A node restarted under the same name at the same endpoint (a new
// segment id) replaces its earlier incarnation, whose objects went with
// its memory; under another endpoint the name is still refused. Over
// mc's gRPC a re-mount of a segment the master does not know is refused
// (the node renews it), while one it knows is taken back.
func TestMountNewIncarnation(t *testing.T) {
	m, _ := newTestMaster(t, Config{})
	old := mount(t, m, "node", "n", "127.0.0.1", 0x10000000, 64*MiB)
	put(t, m, "w", "k", 4096)
	next := old
	next.ID, next.Base = uuidOf("seg/n-2"), 0x20000000
	if err := m.MountSegment(uuidOf("node-2"), next); err != nil {
		t.Fatalf("mount of a new incarnation: %v", err)
	}
	if segs := m.Segments(); len(segs) != 1 || segs[0].Info.ID != next.ID {
		t.Fatalf("segments after the new incarnation: %+v", segs)
	}
	if r := m.BatchGetReplicaList([]string{"k"})[0]; store.CodeOf(r.Err) != store.ObjectNotFound {
		t.Fatalf("get of an object of the old incarnation: %+v, want OBJECT_NOT_FOUND", r)
	}
	other := next
	other.ID, other.Endpoint = uuidOf("seg/n-3"), "127.0.0.2:15000"
	if err := m.MountSegment(uuidOf("node-3"), other); store.CodeOf(err) != store.SegmentAlreadyExists {
		t.Fatalf("mount of the name at another endpoint: %v, want SEGMENT_ALREADY_EXISTS", err)
	}
	if errs := m.ReMountKnown(uuidOf("node-2"), []store.SegmentInfo{next}); errs[0] != nil {
		t.Fatalf("re-mount of a known segment: %v", errs[0])
	}
	if errs := m.ReMountKnown(uuidOf("node"), []store.SegmentInfo{old}); store.CodeOf(errs[0]) != store.SegmentNotFound {
		t.Fatalf("re-mount of a forgotten segment: %v, want SEGMENT_NOT_FOUND", errs[0])
	}
}

// A node that pings while the master drops it (client_ttl, or an
// unregister) is told to re-mount. It took back its segment, still marked
// mounted then, and the drop's unmount removed it a moment later: the
// node went on pinging with a segment the master no longer had, and never
// renewed its memory (TestFenceNodeRemount in a clean-clone CI run). A
// segment being unmounted is not taken back: the node renews it.
func TestRemountWhileDropped(t *testing.T) {
	m, _ := newTestMaster(t, Config{})
	info := mount(t, m, "node", "A", "10.0.0.1", 1<<30, 64*MiB)
	put(t, m, "w", "k", 64*KiB)
	var remount []error
	hook := func(id store.UUID) {
		if id != uuidOf("node") {
			return
		}
		// What the node does on a ping now.
		if _, st := m.Ping(id); st == store.ClientNeedRemount {
			remount = m.ReMountKnown(id, []store.SegmentInfo{info})
		}
	}
	clientForgotten.Store(&hook)
	defer clientForgotten.Store(nil)
	if err := m.UnregisterClient(uuidOf("node")); err != nil {
		t.Fatal(err)
	}
	if len(remount) != 1 {
		t.Fatalf("the node was not told to re-mount while dropped: %v", remount)
	}
	wantCode(t, "re-mount of a segment being unmounted", remount[0], store.SegmentNotFound)
	if len(m.Segments()) != 0 {
		t.Fatalf("segments %+v after the drop, want none (the node mounts renewed memory anew)", m.Segments())
	}
	mustInvariants(t, m)
}

// A resizing upsert under way at a restore (RestoredObject.Upsert) is
// its writer's on the restored object, as on the master that granted it:
// its range is held, the writer's End completes it and its revoke gives
// it back; one whose range could not be located answers its writer that
// it was dropped; one older than the discard timeout is discarded as the
// master would have discarded it. No answer tells the writer "complete",
// which its client takes for its End having landed.
func TestRestoredResize(t *testing.T) {
	m, clk := newTestMaster(t, Config{PutDiscardTimeout: 30 * time.Second})
	s := segInfo("s", "127.0.0.1", 0x10000000, 64*MiB)
	w, other := uuidOf("writer"), uuidOf("other")
	now := clk.Now()
	at := func(i uint64) []RestoredReplica { return []RestoredReplica{{Segment: s, Addr: s.Base + i*MiB}} }
	objs := []RestoredObject{
		{Key: "ended", Size: 4096, Replicas: at(0), Upsert: &RestoredUpsert{Size: 2 * MiB, Replicas: at(10), Writer: w, Started: now}},
		{Key: "revoked", Size: 4096, Replicas: at(1), Upsert: &RestoredUpsert{Size: 2 * MiB, Replicas: at(20), Writer: w, Started: now}},
		{Key: "lost", Size: 4096, Replicas: at(2), Upsert: &RestoredUpsert{Size: 2 * MiB, Writer: w, Started: now}},
		{Key: "old", Size: 4096, Replicas: at(3), Upsert: &RestoredUpsert{Size: 2 * MiB, Replicas: at(30), Writer: w, Started: now.Add(-time.Minute)}},
	}
	if err := m.Restore(objs); err != nil {
		t.Fatal(err)
	}
	if err := m.MountSegment(uuidOf("node"), s); err != nil {
		t.Fatal(err)
	}
	if u, want := m.Stats().Used, uint64(4*4096+3*2*MiB); u != want {
		t.Fatalf("used %d after the mount, want %d (the resizes' ranges held)", u, want)
	}
	mustInvariants(t, m)
	for _, k := range []string{"ended", "revoked", "lost"} {
		if g := get(m, k); g.Err != nil || g.Replicas[0].Addr != objs[slicesIndex(objs, k)].Replicas[0].Addr || g.Replicas[0].Len != 4096 {
			t.Fatalf("get %q while its resize is under way: %+v, want the old version", k, g)
		}
	}
	// Another client cannot end or revoke the writer's resize.
	wantCode(t, "another client's End", m.BatchUpsertEnd(other, []string{"ended"})[0], store.InvalidWrite)
	wantCode(t, "another client's revoke", m.BatchUpsertRevoke(other, []string{"revoked"})[0], store.ObjectNotFound)

	if err := m.BatchUpsertEnd(w, []string{"ended"})[0]; err != nil {
		t.Fatalf("the writer's End of its restored resize: %v", err)
	}
	if g := get(m, "ended"); g.Err != nil || g.Replicas[0].Addr != s.Base+10*MiB || g.Replicas[0].Len != 2*MiB {
		t.Fatalf("get after the End: %+v, want the resize's range", g)
	}
	if err := m.BatchUpsertRevoke(w, []string{"revoked"})[0]; err != nil {
		t.Fatalf("the writer's revoke of its restored resize: %v", err)
	}
	wantCode(t, "the writer's revoke of a resize that could not be restored", m.BatchUpsertRevoke(w, []string{"lost"})[0], store.ObjectNotFound)
	wantCode(t, "the writer's End of a resize that could not be restored", m.BatchUpsertEnd(w, []string{"lost"})[0], store.InvalidWrite)
	// The minute-old one is past the discard timeout: discarded at the
	// next sweep, its writer told so.
	m.discardStale(m.now())
	wantCode(t, "the writer's revoke of a discarded restored resize", m.BatchUpsertRevoke(w, []string{"old"})[0], store.ObjectNotFound)
	for _, k := range []string{"revoked", "lost", "old"} {
		if g := get(m, k); g.Err != nil || g.Replicas[0].Len != 4096 {
			t.Fatalf("get %q: %+v, want the old version", k, g)
		}
	}
	mustInvariants(t, m)
}

func slicesIndex(objs []RestoredObject, key string) int {
	for i, o := range objs {
		if o.Key == key {
			return i
		}
	}
	return -1
}

// An HA leader restores objects the previous leader may have granted
// read leases on, leases this one never saw: a reader may still move
// their bytes for up to a lease TTL. Until ReadLeasedUntil their ranges
// are not reused: removes and upserts go ahead (the freed range waits),
// an upsert of the same size is not written in place, and eviction
// passes them by. After it, all is as before.
func TestRestoredReadLeaseHoldsRanges(t *testing.T) {
	m, clk := newTestMaster(t, Config{})
	s := segInfo("s", "127.0.0.1", 0x10000000, 8*MiB)
	const size = 512 * KiB
	until := clk.Now().Add(5 * time.Second)
	var objs []RestoredObject
	for i := range 8 {
		objs = append(objs, RestoredObject{Key: fmt.Sprint("old", i), Size: size, ReadLeasedUntil: until,
			Replicas: []RestoredReplica{{Segment: s, Addr: s.Base + uint64(i)*MiB}}})
	}
	if err := m.Restore(objs); err != nil {
		t.Fatal(err)
	}
	if err := m.MountSegment(uuidOf("node"), s); err != nil {
		t.Fatal(err)
	}
	at := func(i int) span { return span{objs[i].Replicas[0].Addr, size} }
	// A same-size upsert is placed anew, not written over the bytes a
	// reader may be moving.
	up := m.BatchUpsertStart(uuidOf("w"), "", []PutItem{{"old0", size}}, one())[0]
	if up.Err != nil {
		t.Fatal(up.Err)
	}
	if overlaps(span{up.Replicas[0].Addr, size}, at(0)) {
		t.Fatalf("upsert of a restored object under a previous leader's read lease rewrites it in place at 0x%x", up.Replicas[0].Addr)
	}
	if err := m.BatchUpsertEnd(uuidOf("w"), []string{"old0"})[0]; err != nil {
		t.Fatal(err)
	}
	// Removed: the key goes at once (no refusal), its range waits.
	if err := remove(m, "old1", false); err != nil {
		t.Fatalf("remove of a restored object: %v", err)
	}
	// Fill the segment, and more (eviction then takes the new objects):
	// nothing lands on old0's or old1's range, and no restored object is
	// evicted for room.
	for i := range 40 {
		r := m.BatchPutStart(uuidOf("w"), "", []PutItem{{fmt.Sprint("new", i), size}}, one())[0]
		if r.Err != nil {
			wantCode(t, "put into a full segment", r.Err, store.NoAvailableHandle)
			break
		}
		got := span{r.Replicas[0].Addr, size}
		for _, j := range []int{0, 1} {
			if overlaps(got, at(j)) {
				t.Fatalf("new%d at 0x%x reuses old%d's range before the previous leader's leases ended", i, got.addr, j)
			}
		}
		if err := m.BatchPutEnd(uuidOf("w"), []string{fmt.Sprint("new", i)})[0]; err != nil {
			t.Fatal(err)
		}
	}
	for i := 2; i < 8; i++ {
		if g := get(m, fmt.Sprint("old", i)); g.Err != nil {
			t.Fatalf("old%d gone before the previous leader's leases ended: %v", i, g.Err)
		}
	}
	mustInvariants(t, m)
	// Once they have ended, the ranges serve again.
	clk.Advance(6 * time.Second)
	m.releaseDue(clk.Now().UnixNano())
	reused := false
	for i := 0; i < 4; i++ {
		r := m.BatchPutStart(uuidOf("w"), "", []PutItem{{fmt.Sprint("late", i), size}}, one())[0]
		if r.Err != nil {
			break
		}
		got := span{r.Replicas[0].Addr, size}
		reused = reused || overlaps(got, at(0)) || overlaps(got, at(1))
	}
	if !reused {
		t.Fatal("the held ranges were not reused after the previous leader's leases ended")
	}
	mustInvariants(t, m)
}

// Ranges that leave an object while a read lease covers them (the old
// version of an upsert read meanwhile) are freed when the lease ends,
// and the op log hears of it (OpHold), so that a next HA leader does not
// reuse them before either.
func TestHoldTellsTheOpLog(t *testing.T) {
	var holds []Change
	m, clk := newTestMaster(t, Config{KVLeaseTTL: 5 * time.Second, OnChange: func(c Change) {
		if c.Op == OpHold {
			holds = append(holds, c)
		}
	}})
	mount(t, m, "n1", "s1", "127.0.0.1", 0, 8*MiB)
	old := put(t, m, "w", "k", 100*KiB)
	up := m.BatchUpsertStart(uuidOf("w"), "", []PutItem{{"k", 200 * KiB}}, one())[0]
	if up.Err != nil {
		t.Fatal(up.Err)
	}
	if g := get(m, "k"); g.Err != nil || g.Replicas[0].Addr != old[0].Addr {
		t.Fatalf("get during the upsert: %+v", g)
	}
	leaseEnd := clk.Now().Add(5 * time.Second)
	if err := m.BatchUpsertEnd(uuidOf("w"), []string{"k"})[0]; err != nil {
		t.Fatal(err)
	}
	if len(holds) != 1 || holds[0].Key != "k" || holds[0].Size != 100*KiB || len(holds[0].Replicas) != 1 ||
		holds[0].Replicas[0].Addr != old[0].Addr || !holds[0].Started.Equal(leaseEnd) {
		t.Fatalf("holds told: %+v, want k's old range (0x%x, 100 KiB) until %v", holds, old[0].Addr, leaseEnd)
	}
	// Not reused before the lease's end.
	for i := range 60 {
		r := m.BatchPutStart(uuidOf("w"), "", []PutItem{{fmt.Sprint("n", i), 100 * KiB}}, one())[0]
		if r.Err != nil {
			break
		}
		if overlaps(span{r.Replicas[0].Addr, 100 * KiB}, span{old[0].Addr, 100 * KiB}) {
			t.Fatalf("n%d placed over k's old version while its read lease lasts", i)
		}
	}
}

// A put refused because the only objects eviction could take are held
// for a previous HA leader's reads says so; once the hold ends, their
// ranges serve as any.
func TestRestoredHeldRefusalSaysWhy(t *testing.T) {
	m, clk := newTestMaster(t, Config{})
	objs := restoreFull(t, m, clk.Now().Add(5*time.Second))
	r := m.BatchPutStart(uuidOf("w"), "", []PutItem{{"new", 512 * KiB}}, one())[0]
	wantCode(t, "put into a segment full of held objects", r.Err, store.NoAvailableHandle)
	if !strings.Contains(r.Err.Error(), "8 of them restored by this HA leader") {
		t.Fatalf("the refusal does not say why: %v", r.Err)
	}
	// Once they ended, a removed one's range serves at once.
	clk.Advance(6 * time.Second)
	if err := remove(m, "old3", false); err != nil {
		t.Fatal(err)
	}
	r = m.BatchPutStart(uuidOf("w"), "", []PutItem{{"new", 512 * KiB}}, one())[0]
	if r.Err != nil || r.Replicas[0].Addr != objs[3].Replicas[0].Addr {
		t.Fatalf("put once the previous leader's leases ended: %+v, want old3's range", r)
	}
}

// Objects restored at a takeover (or a restart with a state) are as
// evictable as any once their segment is mounted: a put into a segment
// full of them evicts one for room. Before, the put's check of what
// eviction could free looked the restored replicas' segments up by the
// placeholders they were restored on, found none in service and failed
// the put as hopeless ("at most 0 B ... with every evictable object
// gone") until the background watermark loop evicted some.
func TestRestoredObjectsEvictableForPuts(t *testing.T) {
	m, _ := newTestMaster(t, Config{})
	restoreFull(t, m, time.Time{})
	r := m.BatchPutStart(uuidOf("w"), "", []PutItem{{"new", 512 * KiB}}, one())[0]
	if r.Err != nil {
		t.Fatalf("put into a segment full of restored objects: %v", r.Err)
	}
	left := 0
	for i := range 8 {
		if get(m, fmt.Sprint("old", i)).Err == nil {
			left++
		}
	}
	if left != 7 {
		t.Fatalf("%d restored objects left after the put, want 7 (one evicted for its room)", left)
	}
	mustInvariants(t, m)
}

// restoreFull restores 8 objects of 512 KiB filling a 4 MiB segment,
// read-leased by a previous leader until heldUntil (zero: not), and
// mounts the segment.
func restoreFull(t *testing.T, m *Master, heldUntil time.Time) []RestoredObject {
	t.Helper()
	s := segInfo("s", "127.0.0.1", 0x10000000, 4*MiB)
	var objs []RestoredObject
	for i := range 8 {
		objs = append(objs, RestoredObject{Key: fmt.Sprint("old", i), Size: 512 * KiB, ReadLeasedUntil: heldUntil,
			Replicas: []RestoredReplica{{Segment: s, Addr: s.Base + uint64(i)*512*KiB}}})
	}
	if err := m.Restore(objs); err != nil {
		t.Fatal(err)
	}
	if err := m.MountSegment(uuidOf("node"), s); err != nil {
		t.Fatal(err)
	}
	return objs
}
