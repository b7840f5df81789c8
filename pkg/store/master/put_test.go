package master

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/store"
)

func TestPutLifecycle(t *testing.T) {
	m, _ := newTestMaster(t, Config{})
	mount(t, m, "node", "seg-a", "127.0.0.1", 0x10000, 64*MiB)
	w := uuidOf("writer")

	res := m.BatchPutStart(w, "", []PutItem{{"k", 4096}}, one())[0]
	if res.Err != nil || len(res.Replicas) != 1 {
		t.Fatalf("put start: %+v", res)
	}
	r := res.Replicas[0]
	if r.Complete || r.Len != 4096 || r.Segment != "seg-a" || r.Endpoint != "127.0.0.1:15000" || r.Protocol != "tcp" {
		t.Fatalf("put start replica: %+v, want PROCESSING, 4096 bytes on seg-a", r)
	}
	if r.Addr < 0x10000 || r.Addr+r.Len > 0x10000+64*MiB {
		t.Fatalf("replica at 0x%x outside its segment", r.Addr)
	}
	wantCode(t, "get while PROCESSING", get(m, "k").Err, store.ReplicaIsNotReady)
	if ex, errs := m.BatchExistKey([]string{"k"}); ex[0] || errs[0] != nil {
		t.Fatalf("exist while PROCESSING: %v %v, want false", ex[0], errs[0])
	}
	if s := m.Stats(); s.Keys != 0 || s.Processing != 1 || s.Used != 4096 {
		t.Fatalf("stats while PROCESSING: %+v", s)
	}
	if err := m.BatchPutEnd(w, []string{"k"})[0]; err != nil {
		t.Fatal(err)
	}
	g := get(m, "k")
	if g.Err != nil || len(g.Replicas) != 1 || !g.Replicas[0].Complete || g.Replicas[0].Addr != r.Addr || g.Replicas[0].Len != 4096 {
		t.Fatalf("get after end: %+v, want the put's replica, COMPLETE", g)
	}
	if ex, _ := m.BatchExistKey([]string{"k"}); !ex[0] {
		t.Fatal("exist after end: false")
	}
	if s := m.Stats(); s.Keys != 1 || s.Processing != 0 {
		t.Fatalf("stats after end: %+v", s)
	}
	wantCode(t, "second put end", m.BatchPutEnd(w, []string{"k"})[0], store.InvalidWrite)
	wantCode(t, "revoke of a complete key", m.BatchPutRevoke(w, []string{"k"})[0], store.InvalidWrite)
	wantCode(t, "revoke of an unknown key", m.BatchPutRevoke(w, []string{"nope"})[0], store.ObjectNotFound)
	wantCode(t, "end of an unknown key", m.BatchPutEnd(w, []string{"nope"})[0], store.ObjectNotFound)
	mustInvariants(t, m)
}

func TestPutRevokeFreesAtOnce(t *testing.T) {
	m, _ := newTestMaster(t, Config{})
	mount(t, m, "node", "seg-a", "127.0.0.1", 0, 64*MiB)
	mount(t, m, "node", "seg-b", "127.0.0.1", 1<<40, 64*MiB)
	put(t, m, "w", "kept", 1000)
	before := m.Stats().Used
	reps := putStart(t, m, "w", "k", 3*MiB, store.ReplicateConfig{ReplicaNum: 2})
	if len(reps) != 2 || m.Stats().Used != before+6*MiB {
		t.Fatalf("put start: %d replicas, used %d (before %d)", len(reps), m.Stats().Used, before)
	}
	if err := m.BatchPutRevoke(uuidOf("w"), []string{"k"})[0]; err != nil {
		t.Fatal(err)
	}
	if u := m.Stats().Used; u != before {
		t.Fatalf("used after revoke %d, want %d", u, before)
	}
	wantCode(t, "get after revoke", get(m, "k").Err, store.ObjectNotFound)
	// The key is free again, right away.
	put(t, m, "w", "k", 10)
	mustInvariants(t, m)
}

func TestBatchPerItemResults(t *testing.T) {
	m, _ := newTestMaster(t, Config{})
	mount(t, m, "node", "seg-a", "127.0.0.1", 0, 64*MiB)
	w := uuidOf("w")
	put(t, m, "w", "done", 10)
	long := string(make([]byte, store.MaxKeyLength+1))
	items := []PutItem{{"a", 100}, {"zero", 0}, {"done", 10}, {long, 10}, {"huge", 1 << 30}, {"b", 200}}
	res := m.BatchPutStart(w, "", items, one())
	want := []store.Code{store.OK, store.InvalidParams, store.ObjectAlreadyExists, store.InvalidKey, store.NoAvailableHandle, store.OK}
	for i, r := range res {
		wantCode(t, "put start "+items[i].Key[:min(len(items[i].Key), 8)], r.Err, want[i])
	}
	errs := m.BatchPutEnd(w, []string{"a", "missing", "b"})
	if errs[0] != nil || store.CodeOf(errs[1]) != store.ObjectNotFound || errs[2] != nil {
		t.Fatalf("put end: %v", errs)
	}
	gets := m.BatchGetReplicaList([]string{"a", "missing", "b", ""})
	if gets[0].Err != nil || gets[2].Err != nil || store.CodeOf(gets[1].Err) != store.ObjectNotFound || store.CodeOf(gets[3].Err) != store.InvalidKey {
		t.Fatalf("get: %+v", gets)
	}
	ex, exErrs := m.BatchExistKey([]string{"a", "missing", ""})
	if !ex[0] || ex[1] || exErrs[0] != nil || exErrs[1] != nil || store.CodeOf(exErrs[2]) != store.InvalidKey {
		t.Fatalf("exist: %v %v", ex, exErrs)
	}
	rm := m.BatchRemove([]string{"a", "missing", "b"}, true)
	if rm[0] != nil || store.CodeOf(rm[1]) != store.ObjectNotFound || rm[2] != nil {
		t.Fatalf("remove: %v", rm)
	}
	// A bad replica config fails every item, with the limit named.
	for _, r := range m.BatchPutStart(w, "", []PutItem{{"x", 1}, {"y", 1}}, store.ReplicateConfig{ReplicaNum: store.MaxReplicas + 1}) {
		wantCode(t, "replica_num 17", r.Err, store.InvalidParams)
		if !contains(r.Err.Error(), "replica_num 17") {
			t.Fatalf("message %q does not name replica_num", r.Err)
		}
	}
	mustInvariants(t, m)
}

func TestDuplicatePutAndAbandonedPuts(t *testing.T) {
	m, clk := newTestMaster(t, Config{})
	mount(t, m, "node", "seg-a", "127.0.0.1", 0, 64*MiB)
	put(t, m, "w", "complete", 100)
	wantCode(t, "put of a complete key", m.BatchPutStart(uuidOf("w2"), "", []PutItem{{"complete", 100}}, one())[0].Err, store.ObjectAlreadyExists)

	first := putStart(t, m, "a", "k", 1000)
	clk.Advance(29 * time.Second)
	r := m.BatchPutStart(uuidOf("b"), "", []PutItem{{"k", 1000}}, one())[0]
	wantCode(t, "second put within the discard timeout", r.Err, store.ObjectAlreadyExists)
	clk.Advance(2 * time.Second) // 31 s after the first PutStart
	used := m.Stats().Used
	second := putStart(t, m, "b", "k", 2000)
	if m.Stats().Used != used+2000 {
		t.Fatalf("used %d after replacing an abandoned put, want %d (the old space is held)", m.Stats().Used, used+2000)
	}
	if second[0].Addr == first[0].Addr {
		t.Fatal("the replacing put got the abandoned put's address while its space is held")
	}
	if got := metric(t, m, "master_put_start_discard_cnt"); got != 1 {
		t.Fatalf("discard count %v after replacing, want 1", got)
	}
	mustInvariants(t, m)
	// The old space comes back at the first put's start + release timeout.
	clk.Advance(600*time.Second - 31*time.Second - time.Second)
	maintain(m, "node")
	if m.Stats().Used != used+2000 {
		t.Fatalf("old space released before the release timeout")
	}
	clk.Advance(time.Second)
	maintain(m, "node")
	if u := m.Stats().Used; u != used-1000+2000 {
		t.Fatalf("used %d after the release timeout, want %d", u, used-1000+2000)
	}
	if got := metric(t, m, "master_put_start_release_cnt"); got != 1 {
		t.Fatalf("release count %v, want 1", got)
	}
	// The second writer's put had no PutEnd for 569 s by now: discarded.
	wantCode(t, "put end of the second, discarded, put", m.BatchPutEnd(uuidOf("b"), []string{"k"})[0], store.ObjectNotFound)
	mustInvariants(t, m)
}

func TestDiscardThenRelease(t *testing.T) {
	m, clk := newTestMaster(t, Config{})
	mount(t, m, "node", "seg-a", "127.0.0.1", 0, 64*MiB)
	putStart(t, m, "w", "k", 5000)
	base := m.Stats().Used
	clk.Advance(30*time.Second - time.Millisecond)
	maintain(m, "node")
	if s := m.Stats(); s.Processing != 1 {
		t.Fatalf("discarded before the timeout: %+v", s)
	}
	clk.Advance(time.Second) // +31 s
	maintain(m, "node")
	if s := m.Stats(); s.Processing != 0 || s.Used != base {
		t.Fatalf("after discard: %+v, want no object and the space still used (%d)", s, base)
	}
	if got := metric(t, m, "master_put_start_discard_cnt"); got != 1 {
		t.Fatalf("master_put_start_discard_cnt %v, want 1", got)
	}
	wantCode(t, "get of a discarded put", get(m, "k").Err, store.ObjectNotFound)
	err := m.BatchPutEnd(uuidOf("w"), []string{"k"})[0]
	wantCode(t, "put end after discard", err, store.ObjectNotFound)
	if !contains(err.Error(), "discard") {
		t.Fatalf("put end after discard: %q does not name the discard", err)
	}
	mustInvariants(t, m)
	clk.Advance(600*time.Second - 31*time.Second)
	maintain(m, "node")
	if m.Stats().Used != base || metric(t, m, "master_put_start_release_cnt") != 0 {
		t.Fatal("space released before 600 s")
	}
	clk.Advance(time.Millisecond)
	maintain(m, "node")
	if u := m.Stats().Used; u != 0 {
		t.Fatalf("used %d after the release timeout, want 0", u)
	}
	if got := metric(t, m, "master_put_start_release_cnt"); got != 1 {
		t.Fatalf("master_put_start_release_cnt %v, want 1", got)
	}
	mustInvariants(t, m)
}

func TestLeases(t *testing.T) {
	m, clk := newTestMaster(t, Config{KVLeaseTTL: 5 * time.Second})
	mount(t, m, "node", "seg-a", "127.0.0.1", 0, 64*MiB)
	put(t, m, "w", "k", 100)
	g := get(m, "k")
	if g.Err != nil || g.LeaseTTL != 5*time.Second {
		t.Fatalf("get: %+v, want a 5 s lease", g)
	}
	err := remove(m, "k", false)
	wantCode(t, "remove while leased", err, store.ObjectHasLease)
	clk.Advance(5*time.Second - time.Millisecond)
	wantCode(t, "remove just before the lease ends", remove(m, "k", false), store.ObjectHasLease)
	clk.Advance(time.Millisecond)
	if err := remove(m, "k", false); err != nil {
		t.Fatalf("remove after the lease: %v", err)
	}

	put(t, m, "w", "forced", 100)
	get(m, "forced")
	if err := remove(m, "forced", true); err != nil {
		t.Fatalf("forced remove of a leased key: %v", err)
	}
	putStart(t, m, "w", "writing", 100)
	wantCode(t, "forced remove of a PROCESSING key", remove(m, "writing", true), store.ReplicaIsNotReady)

	// Neither ExistKey (by default) nor the admin read lease.
	put(t, m, "w", "probed", 100)
	if ex, _ := m.BatchExistKey([]string{"probed"}); !ex[0] {
		t.Fatal("exist: false")
	}
	q := m.BatchQuery([]string{"probed"})[0]
	if q.Err != nil || q.LeaseTTL != 0 || len(q.Replicas) != 1 {
		t.Fatalf("admin query: %+v, want replicas and no lease", q)
	}
	if err := remove(m, "probed", false); err != nil {
		t.Fatalf("remove after exist and admin query: %v", err)
	}
	mustInvariants(t, m)
}

func TestExistKeyGrantLease(t *testing.T) {
	m, clk := newTestMaster(t, Config{ExistKeyGrantLease: true})
	mount(t, m, "node", "seg-a", "127.0.0.1", 0, 64*MiB)
	put(t, m, "w", "k", 100)
	m.BatchExistKey([]string{"k"})
	wantCode(t, "remove after a leasing exist", remove(m, "k", false), store.ObjectHasLease)
	clk.Advance(DefaultKVLeaseTTL)
	if err := remove(m, "k", false); err != nil {
		t.Fatal(err)
	}
}

func TestUpsertSameSizeInPlace(t *testing.T) {
	m, clk := newTestMaster(t, Config{})
	mount(t, m, "node", "seg-a", "127.0.0.1", 0, 64*MiB)
	w := uuidOf("w")
	old := put(t, m, "w", "k", 4096)
	res := m.BatchUpsertStart(w, "", []PutItem{{"k", 4096}}, one())[0]
	if res.Err != nil || !slices.Equal(addrs(res.Replicas), addrs(old)) || res.Replicas[0].Complete {
		t.Fatalf("same-size upsert: %+v, want the same addresses, PROCESSING", res)
	}
	wantCode(t, "get during an in-place upsert", get(m, "k").Err, store.ReplicaIsNotReady)
	if ex, _ := m.BatchExistKey([]string{"k"}); ex[0] {
		t.Fatal("exist during an in-place upsert: true")
	}
	if u := m.Stats().Used; u != 4096 {
		t.Fatalf("used %d during an in-place upsert, want 4096", u)
	}
	if err := m.BatchUpsertEnd(w, []string{"k"})[0]; err != nil {
		t.Fatal(err)
	}
	g := get(m, "k")
	if g.Err != nil || !slices.Equal(addrs(g.Replicas), addrs(old)) || g.Replicas[0].Len != 4096 {
		t.Fatalf("get after upsert: %+v", g)
	}
	if s := m.Stats(); s.Keys != 1 || s.Used != 4096 {
		t.Fatalf("stats: %+v", s)
	}
	mustInvariants(t, m)

	// Revoking an in-place upsert leaves a torn object: it is removed.
	clk.Advance(DefaultKVLeaseTTL)
	m.BatchUpsertStart(w, "", []PutItem{{"k", 4096}}, one())
	if err := m.BatchUpsertRevoke(w, []string{"k"})[0]; err != nil {
		t.Fatal(err)
	}
	wantCode(t, "get after revoking an in-place upsert", get(m, "k").Err, store.ObjectNotFound)
	if s := m.Stats(); s.Keys != 0 || s.Used != 0 {
		t.Fatalf("stats after revoke: %+v", s)
	}
	mustInvariants(t, m)
}

func TestUpsertResize(t *testing.T) {
	m, clk := newTestMaster(t, Config{})
	mount(t, m, "node", "seg-a", "127.0.0.1", 0, 64*MiB)
	w := uuidOf("w")
	old := put(t, m, "w", "k", 4096)
	res := m.BatchUpsertStart(w, "", []PutItem{{"k", 8192}}, one())[0]
	if res.Err != nil || res.Replicas[0].Len != 8192 || res.Replicas[0].Addr == old[0].Addr {
		t.Fatalf("resizing upsert: %+v, want new 8192-byte replicas", res)
	}
	g := get(m, "k")
	if g.Err != nil || g.Replicas[0].Addr != old[0].Addr || g.Replicas[0].Len != 4096 {
		t.Fatalf("get during a resize: %+v, want the old version", g)
	}
	if u := m.Stats().Used; u != 4096+8192 {
		t.Fatalf("used %d during a resize, want both versions", u)
	}
	// The old version was just read (leased): its End still switches,
	// and the old bytes are held until the lease ends.
	if err := m.BatchUpsertEnd(w, []string{"k"})[0]; err != nil {
		t.Fatal(err)
	}
	g = get(m, "k")
	if g.Err != nil || g.Replicas[0].Addr != res.Replicas[0].Addr || g.Replicas[0].Len != 8192 {
		t.Fatalf("get after the resize: %+v, want the new replicas", g)
	}
	if s := m.Stats(); s.Used != 4096+8192 || s.Keys != 1 {
		t.Fatalf("stats after resize: %+v", s)
	}
	clk.Advance(DefaultKVLeaseTTL)
	maintain(m, "node")
	if s := m.Stats(); s.Used != 8192 {
		t.Fatalf("stats after the old version's lease: %+v", s)
	}
	if metric(t, m, "master_put_start_release_cnt") != 0 {
		t.Fatal("freeing a leased old version counted as releasing a discarded put")
	}
	mustInvariants(t, m)

	// A revoked resize keeps the old version.
	m2, c2 := newTestMaster(t, Config{})
	mount(t, m2, "node", "seg-a", "127.0.0.1", 0, 64*MiB)
	old = put(t, m2, "w", "k", 4096)
	m2.BatchUpsertStart(w, "", []PutItem{{"k", 100}}, one())
	if err := m2.BatchUpsertRevoke(w, []string{"k"})[0]; err != nil {
		t.Fatal(err)
	}
	g = get(m2, "k")
	if g.Err != nil || g.Replicas[0].Addr != old[0].Addr || g.Replicas[0].Len != 4096 {
		t.Fatalf("get after a revoked resize: %+v, want the old version", g)
	}
	if u := m2.Stats().Used; u != 4096 {
		t.Fatalf("used %d after a revoked resize", u)
	}
	mustInvariants(t, m2)

	// Upsert of a leased key is refused.
	wantCode(t, "upsert of a leased key", m2.BatchUpsertStart(w, "", []PutItem{{"k", 4096}}, one())[0].Err, store.ObjectHasLease)
	c2.Advance(DefaultKVLeaseTTL)
	// Upsert of a missing key is a put.
	if r := m2.BatchUpsertStart(w, "", []PutItem{{"new", 10}}, one())[0]; r.Err != nil {
		t.Fatal(r.Err)
	}
	if err := m2.BatchUpsertEnd(w, []string{"new"})[0]; err != nil || get(m2, "new").Err != nil {
		t.Fatalf("upsert of a new key: %v", err)
	}
	mustInvariants(t, m2)
}

// An abandoned resize is discarded: the old version stays, and the
// resize's space comes back after the release timeout.
func TestUpsertResizeDiscarded(t *testing.T) {
	m, clk := newTestMaster(t, Config{})
	mount(t, m, "node", "seg-a", "127.0.0.1", 0, 64*MiB)
	w := uuidOf("w")
	old := put(t, m, "w", "k", 4096)
	if r := m.BatchUpsertStart(w, "", []PutItem{{"k", 10000}}, one())[0]; r.Err != nil {
		t.Fatal(r.Err)
	}
	clk.Advance(31 * time.Second)
	maintain(m, "node")
	mustInvariants(t, m)
	g := get(m, "k")
	if g.Err != nil || g.Replicas[0].Addr != old[0].Addr || g.Replicas[0].Len != 4096 {
		t.Fatalf("get after a discarded resize: %+v, want the old version", g)
	}
	wantCode(t, "upsert end after discard", m.BatchUpsertEnd(w, []string{"k"})[0], store.InvalidWrite)
	clk.Advance(600 * time.Second)
	maintain(m, "node")
	if u := m.Stats().Used; u != 4096 {
		t.Fatalf("used %d after the release, want 4096", u)
	}
	mustInvariants(t, m)
	// A later in-place upsert keeps the object's own size.
	if r := m.BatchUpsertStart(w, "", []PutItem{{"k", 4096}}, one())[0]; r.Err != nil {
		t.Fatal(r.Err)
	}
	if err := m.BatchUpsertEnd(w, []string{"k"})[0]; err != nil {
		t.Fatal(err)
	}
	if g := get(m, "k"); g.Err != nil || g.Replicas[0].Len != 4096 {
		t.Fatalf("get after an in-place upsert: %+v, want 4096 bytes", g)
	}
	mustInvariants(t, m)
}

// Only the writer that started a put may end or revoke it. A writer
// whose abandoned put was replaced by another's must not complete (or
// free) the other's put while its bytes are still being written.
func TestPutEndOnlyByItsWriter(t *testing.T) {
	m, clk := newTestMaster(t, Config{})
	mount(t, m, "node", "seg-a", "127.0.0.1", 0, 64*MiB)
	a, b := uuidOf("a"), uuidOf("b")
	putStart(t, m, "a", "k", 1000)
	wantCode(t, "put end by another writer", m.BatchPutEnd(b, []string{"k"})[0], store.InvalidWrite)
	// A revoke of a put this client does not write finds none of its
	// own (INVALID_WRITE would say its End had landed).
	wantCode(t, "revoke by another writer", m.BatchPutRevoke(b, []string{"k"})[0], store.ObjectNotFound)
	clk.Advance(31 * time.Second)
	putStart(t, m, "b", "k", 1000) // replaces a's abandoned put
	wantCode(t, "put end by the replaced writer", m.BatchPutEnd(a, []string{"k"})[0], store.InvalidWrite)
	// a's put was discarded: its revoke must not hear "complete" (before
	// the fix INVALID_WRITE, and mc's client reported a's value stored).
	wantCode(t, "revoke by the replaced writer", m.BatchPutRevoke(a, []string{"k"})[0], store.ObjectNotFound)
	wantCode(t, "get while b writes", get(m, "k").Err, store.ReplicaIsNotReady)
	if err := m.BatchPutEnd(b, []string{"k"})[0]; err != nil {
		t.Fatal(err)
	}
	clk.Advance(DefaultKVLeaseTTL)
	// Upserts too.
	m.BatchUpsertStart(a, "", []PutItem{{"k", 1000}}, one())
	wantCode(t, "upsert end by another writer", m.BatchUpsertEnd(b, []string{"k"})[0], store.InvalidWrite)
	if err := m.BatchUpsertEnd(a, []string{"k"})[0]; err != nil {
		t.Fatal(err)
	}
	m.BatchUpsertStart(b, "", []PutItem{{"k", 2000}}, one())
	wantCode(t, "resize revoke by another writer", m.BatchUpsertRevoke(a, []string{"k"})[0], store.InvalidWrite)
	if err := m.BatchUpsertRevoke(b, []string{"k"})[0]; err != nil {
		t.Fatal(err)
	}
	mustInvariants(t, m)
}

// A reader holding a lease on the old version of a resized object keeps
// its bytes: the End switches readers to the new version, but the old
// replicas are freed only when the lease ends.
func TestResizeEndKeepsLeasedOldVersion(t *testing.T) {
	m, clk := newTestMaster(t, Config{})
	mount(t, m, "node", "seg-a", "127.0.0.1", 0, 64*MiB)
	w := uuidOf("w")
	old := put(t, m, "w", "k", 4096)
	if r := m.BatchUpsertStart(w, "", []PutItem{{"k", 8192}}, one())[0]; r.Err != nil {
		t.Fatal(r.Err)
	}
	clk.Advance(time.Second)
	if g := get(m, "k"); g.Err != nil || g.Replicas[0].Addr != old[0].Addr {
		t.Fatalf("get during the resize: %+v", g) // leased until +11 s
	}
	if err := m.BatchUpsertEnd(w, []string{"k"})[0]; err != nil {
		t.Fatal(err)
	}
	if u := m.Stats().Used; u != 4096+8192 {
		t.Fatalf("used %d right after the End, want the leased old version still held", u)
	}
	mustInvariants(t, m)
	// Fill the region: nothing may land on the old bytes while leased.
	for i := 0; m.BatchPutStart(w, "", []PutItem{{fmt.Sprint("f", i), 4096}}, one())[0].Err == nil; i++ {
	}
	mustInvariants(t, m)
	clk.Advance(DefaultKVLeaseTTL)
	maintain(m, "node")
	if r := m.BatchPutStart(w, "", []PutItem{{"late", 4096}}, one()); r[0].Err != nil {
		t.Fatalf("the old version's space did not come back after its lease: %v", r[0].Err)
	}
	mustInvariants(t, m)
}

// TestRevokeOfLostResize: a resizing upsert whose new replicas' segment
// was unmounted before its End (its node silent past client_ttl) leaves
// the old version complete. The writer, whose End's answer it never got
// (its deadline), revokes to learn the outcome: "complete" told it the
// End had landed, and it reported the upsert stored while readers got
// the version before (make soak, chaos every 3 s: 41 WRONG gets). Only
// the writer whose End completed the object hears "complete".
func TestRevokeOfLostResize(t *testing.T) {
	m, clk := newTestMaster(t, Config{})
	mount(t, m, "na", "A", "10.0.0.1", 1<<30, 64*MiB)
	put(t, m, "w1", "k", 64*KiB, one(store.ReplicateConfig{ReplicaNum: 1, PreferredSegments: []string{"A"}}))
	mount(t, m, "nb", "B", "10.0.0.2", 2<<30, 64*MiB)
	up := m.BatchUpsertStart(uuidOf("w2"), "", []PutItem{{"k", 128 * KiB}}, one(store.ReplicateConfig{ReplicaNum: 1, PreferredSegments: []string{"B"}}))[0]
	if up.Err != nil || len(up.Replicas) != 1 || up.Replicas[0].Segment != "B" {
		t.Fatalf("upsert start: %+v", up)
	}
	if err := m.UnmountSegment(uuidOf("nb"), uuidOf("seg/B")); err != nil {
		t.Fatal(err)
	}
	if r := get(m, "k"); r.Err != nil || len(r.Replicas) != 1 || r.Replicas[0].Len != 64*KiB || r.Replicas[0].Segment != "A" {
		t.Fatalf("the old version after its resize lost its replicas: %+v", r)
	}
	err := m.BatchPutRevoke(uuidOf("w2"), []string{"k"})[0]
	wantCode(t, "revoke of a resize whose replicas went", err, store.ObjectNotFound)
	err = m.BatchPutEnd(uuidOf("w2"), []string{"k"})[0]
	wantCode(t, "end of a resize whose replicas went", err, store.InvalidWrite)
	if !contains(err.Error(), "dropped") {
		t.Fatalf("end of a lost resize: %v, want it to say the upsert was dropped", err)
	}
	// The writer whose End landed still hears "complete"; another does
	// not.
	put(t, m, "w1", "k2", 64*KiB)
	err = m.BatchPutRevoke(uuidOf("w1"), []string{"k2"})[0]
	wantCode(t, "revoke by the writer that completed it", err, store.InvalidWrite)
	err = m.BatchPutRevoke(uuidOf("w3"), []string{"k2"})[0]
	wantCode(t, "revoke by another client", err, store.ObjectNotFound)
	// Another writer upserts k after w2's resize was dropped: w2's late
	// revoke must still not hear "complete" (before: INVALID_WRITE, the
	// other writer's resize in progress).
	clk.Advance(DefaultKVLeaseTTL) // the gets' leases end
	if r := m.BatchUpsertStart(uuidOf("w3"), "", []PutItem{{"k", 256 * KiB}}, one())[0]; r.Err != nil {
		t.Fatal(r.Err)
	}
	err = m.BatchPutRevoke(uuidOf("w2"), []string{"k"})[0]
	wantCode(t, "revoke of a lost resize while another writer upserts", err, store.ObjectNotFound)
	// w1, whose End completed the version w3 resizes, still hears it;
	// another client does not.
	if r := m.BatchUpsertStart(uuidOf("w3"), "", []PutItem{{"k2", 256 * KiB}}, one())[0]; r.Err != nil {
		t.Fatal(r.Err)
	}
	err = m.BatchPutRevoke(uuidOf("w1"), []string{"k2"})[0]
	wantCode(t, "revoke by the writer of the version being resized", err, store.InvalidWrite)
	err = m.BatchPutRevoke(uuidOf("w2"), []string{"k2"})[0]
	wantCode(t, "revoke by a client that wrote neither version", err, store.ObjectNotFound)
	mustInvariants(t, m)
}
