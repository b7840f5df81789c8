package master

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/store"
)

// drainMaster is a test master with segments A (node "na") and B (node
// "nb"), each of the given sizes, and the drain loop running.
func drainMaster(t *testing.T, sizeA, sizeB uint64) (*Master, *fakeClock) {
	t.Helper()
	m, clk := newTestMaster(t, Config{})
	t.Cleanup(m.Close)
	mount(t, m, "na", "A", "10.0.0.1", 1<<40, sizeA)
	mount(t, m, "nb", "B", "10.0.0.2", 2<<40, sizeB)
	poll(m, "na", "nb")
	return m, clk
}

// poll has nodes ask for drain tasks once, as a node's drain loop does
// as soon as it has mounted.
func poll(m *Master, nodes ...string) {
	for _, n := range nodes {
		m.DrainTasks(context.Background(), uuidOf(n), nil, 0, 0)
	}
}

func onA() store.ReplicateConfig {
	return store.ReplicateConfig{ReplicaNum: 1, PreferredSegments: []string{"A"}}
}

// fetch takes up to max of node's drain tasks, waiting a little: the
// job hands them out as it places them, so it fetches until max or a
// fetch finds none.
func fetch(m *Master, node string, max int) []DrainTask {
	var out []DrainTask
	for len(out) < max {
		got := m.DrainTasks(context.Background(), uuidOf(node), nil, max-len(out), 200*time.Millisecond)
		if len(got) == 0 {
			break
		}
		out = append(out, got...)
	}
	return out
}

// report tells the master node's tasks went as errs says (nil: done).
func report(m *Master, node string, tasks []DrainTask, errs ...error) {
	res := make([]DrainResult, len(tasks))
	for i, tk := range tasks {
		res[i].ID = tk.ID
		if i < len(errs) {
			res[i].Err = errs[i]
		}
	}
	m.DrainTasks(context.Background(), uuidOf(node), res, 0, 0)
}

func waitJob(t *testing.T, m *Master, id store.UUID, ok func(DrainJob) bool) DrainJob {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		j, err := m.QueryDrainJob(id)
		if err != nil {
			t.Fatal(err)
		}
		if ok(j) {
			return j
		}
		if time.Now().After(deadline) {
			t.Fatalf("drain job %s: still %s (%+v)", id, j.Status, j)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func ended(j DrainJob) bool { return j.Status.Done() }

func segsOf(reps []store.Replica) []string {
	var out []string
	for _, r := range reps {
		out = append(out, r.Segment)
	}
	slices.Sort(out)
	return out
}

func TestDrainCopiesUnsafeObjectsHottestFirst(t *testing.T) {
	m, _ := drainMaster(t, 8*MiB, 8*MiB)
	var srcAddr = map[string]uint64{}
	for i := range 10 {
		k := fmt.Sprintf("k%d", i)
		srcAddr[k] = put(t, m, "w", k, 64*KiB, onA())[0].Addr
	}
	put(t, m, "w", "safe", 64*KiB, store.ReplicateConfig{ReplicaNum: 2})
	get(m, "k3") // the most recently used: the hottest under lru

	id, err := m.CreateDrainJob(DrainRequest{Segments: []string{"A"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := segStatus(m, "A"); got != "DRAINING" {
		t.Fatalf("A is %s during the drain, want DRAINING", got)
	}
	tasks := fetch(m, "na", 100)
	if len(tasks) != 10 {
		t.Fatalf("node A got %d tasks, want 10 (the safe object needs none)", len(tasks))
	}
	if tasks[0].Key != "k3" {
		t.Errorf("first task copies %q, want the hottest, k3", tasks[0].Key)
	}
	for _, tk := range tasks {
		if tk.Dst.Segment != "B" || tk.SrcAddr != srcAddr[tk.Key] || tk.Size != 64*KiB || tk.Dst.Len != tk.Size {
			t.Fatalf("task %+v: want a copy of %q's replica at 0x%x into B", tk, tk.Key, srcAddr[tk.Key])
		}
	}
	if other := m.DrainTasks(context.Background(), uuidOf("nb"), nil, 100, 10*time.Millisecond); len(other) != 0 {
		t.Fatalf("node B got %d tasks for A's objects", len(other))
	}
	report(m, "na", tasks)
	j := waitJob(t, m, id, ended)
	if j.Status != DrainSucceeded || j.Succeeded != 10 || j.MigratedBytes != 10*64*KiB || j.Failed+j.Blocked+j.Skipped != 0 {
		t.Fatalf("job: %+v", j)
	}
	for i := range 10 {
		k := fmt.Sprintf("k%d", i)
		if got := segsOf(get(m, k).Replicas); !slices.Equal(got, []string{"A", "B"}) {
			t.Fatalf("%s is on %v after the drain, want A and B", k, got)
		}
	}
	if got := segStatus(m, "A"); got != "DRAINED" {
		t.Fatalf("A is %s after the drain, want DRAINED", got)
	}
	for i := range 5 {
		if got := segsOf(put(t, m, "w2", fmt.Sprintf("new%d", i), 64*KiB)); !slices.Equal(got, []string{"B"}) {
			t.Fatalf("a put after the drain went to %v, want B only", got)
		}
	}
	mustInvariants(t, m)
}

func TestDrainDoesNotResurrectRemovedOrRewritten(t *testing.T) {
	m, _ := drainMaster(t, 8*MiB, 8*MiB)
	for _, k := range []string{"gone", "reput", "upsert", "kept"} {
		put(t, m, "w", k, 64*KiB, onA())
	}
	id, err := m.CreateDrainJob(DrainRequest{Segments: []string{"A"}})
	if err != nil {
		t.Fatal(err)
	}
	tasks := fetch(m, "na", 100)
	if len(tasks) != 4 {
		t.Fatalf("%d tasks, want 4", len(tasks))
	}
	// While the copies are under way: a remove, a remove and put again,
	// and a same-size upsert (rewritten in place on A).
	if err := remove(m, "gone", true); err != nil {
		t.Fatal(err)
	}
	if err := remove(m, "reput", true); err != nil {
		t.Fatal(err)
	}
	reput := put(t, m, "w", "reput", 32*KiB)
	up := m.BatchUpsertStart(uuidOf("w"), "", []PutItem{{"upsert", 64 * KiB}}, one())[0]
	if up.Err != nil {
		t.Fatal(up.Err)
	}
	if err := m.BatchUpsertEnd(uuidOf("w"), []string{"upsert"})[0]; err != nil {
		t.Fatal(err)
	}
	report(m, "na", tasks)
	// "upsert" changed under its copy: it is planned again.
	again := fetch(m, "na", 100)
	if len(again) != 1 || again[0].Key != "upsert" {
		t.Fatalf("second round: %+v, want one copy of upsert", again)
	}
	report(m, "na", again)
	j := waitJob(t, m, id, ended)
	if j.Status != DrainSucceeded || j.Succeeded != 2 || j.Skipped != 3 {
		t.Fatalf("job: %+v, want kept and upsert copied, three skipped", j)
	}
	wantCode(t, "get removed key", get(m, "gone").Err, store.ObjectNotFound)
	if r := get(m, "reput"); r.Err != nil || len(r.Replicas) != 1 || r.Replicas[0] != reput[0] && r.Replicas[0].Len != 32*KiB {
		t.Fatalf("reput: %+v, want only its new 32 KiB version", r)
	}
	for _, k := range []string{"kept", "upsert"} {
		if got := segsOf(get(m, k).Replicas); !slices.Equal(got, []string{"A", "B"}) {
			t.Fatalf("%s on %v, want A and B", k, got)
		}
	}
	mustInvariants(t, m)
}

func TestDrainNoRoomStopsAndCountsLoss(t *testing.T) {
	for _, force := range []bool{false, true} {
		t.Run(fmt.Sprintf("force=%v", force), func(t *testing.T) {
			m, _ := drainMaster(t, 8*MiB, MiB)
			pin := onA()
			pin.HardPin = true
			put(t, m, "w", "k0", 512*KiB, pin) // coldest: copied last
			for i := 1; i < 4; i++ {
				put(t, m, "w", fmt.Sprintf("k%d", i), 512*KiB, onA())
			}
			id, err := m.CreateDrainJob(DrainRequest{Segments: []string{"A"}, Unmount: true, Force: force})
			if err != nil {
				t.Fatal(err)
			}
			var copied int
			for {
				tasks := fetch(m, "na", 100)
				if len(tasks) == 0 {
					break
				}
				copied += len(tasks)
				report(m, "na", tasks)
			}
			j := waitJob(t, m, id, ended)
			if copied != 2 || j.Succeeded != 2 || j.Status != DrainFailed || j.LostObjects != 2 || j.LostBytes != MiB || j.LostPinned != 1 || !contains(j.Message, "k0") {
				t.Fatalf("copied %d; job %+v: want 2 copied, 2 objects (1 MiB, k0 pinned) without room", copied, j)
			}
			if force {
				if !j.Unmounted || segStatus(m, "A") != "" {
					t.Fatalf("forced: unmounted %v, A %s", j.Unmounted, segStatus(m, "A"))
				}
				wantCode(t, "lost object", get(m, "k0").Err, store.ObjectNotFound)
			} else {
				if j.Unmounted || segStatus(m, "A") != "OK" {
					t.Fatalf("not forced: unmounted %v, A %s (want it back in service)", j.Unmounted, segStatus(m, "A"))
				}
				if r := get(m, "k0"); r.Err != nil {
					t.Fatalf("k0 lost without force: %v", r.Err)
				}
			}
			mustInvariants(t, m)
		})
	}
}

func TestDrainCancel(t *testing.T) {
	m, _ := drainMaster(t, 8*MiB, 8*MiB)
	for i := range 5 {
		put(t, m, "w", fmt.Sprintf("k%d", i), 64*KiB, onA())
	}
	id, err := m.CreateDrainJob(DrainRequest{Segments: []string{"A"}, MaxConcurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	inflight := fetch(m, "na", 1) // one fetched, one queued for the node
	if len(inflight) != 1 {
		t.Fatalf("%d tasks", len(inflight))
	}
	waitJob(t, m, id, func(j DrainJob) bool { return j.Active == 2 })
	usedBefore := m.space.used.Load()
	if err := m.CancelDrainJob(id); err != nil {
		t.Fatal(err)
	}
	time.Sleep(150 * time.Millisecond)
	if j, _ := m.QueryDrainJob(id); j.Status.Done() {
		t.Fatalf("job ended (%s) with a copy in flight", j.Status)
	}
	report(m, "na", inflight)
	j := waitJob(t, m, id, ended)
	if j.Status != DrainCanceled || j.Succeeded != 1 {
		t.Fatalf("job %+v: want CANCELED with the copy in flight kept", j)
	}
	if got := segStatus(m, "A"); got != "OK" {
		t.Fatalf("A is %s after cancel, want OK", got)
	}
	// The queued copy's range went back; the finished copy's stays.
	if used := m.space.used.Load(); used != usedBefore-64*KiB {
		t.Fatalf("used %d after cancel, want %d (queued copy freed)", used, usedBefore-64*KiB)
	}
	if tasks := m.DrainTasks(context.Background(), uuidOf("na"), nil, 10, 10*time.Millisecond); len(tasks) != 0 {
		t.Fatalf("node still gets %d tasks after cancel", len(tasks))
	}
	wantCode(t, "cancel again", m.CancelDrainJob(id), store.UnavailableInCurrentStatus)
	mustInvariants(t, m)
}

func TestDrainRefusesBadRequests(t *testing.T) {
	m, _ := drainMaster(t, 8*MiB, 8*MiB)
	put(t, m, "w", "k", 64*KiB, onA())
	_, err := m.CreateDrainJob(DrainRequest{Segments: []string{"nope"}})
	wantCode(t, "unknown segment", err, store.SegmentNotFound)
	mount(t, m, "moon", "M", "10.0.0.9", 9<<40, 8*MiB) // never polls: a mooncake_client
	_, err = m.CreateDrainJob(DrainRequest{Segments: []string{"M"}})
	wantCode(t, "a node that takes no drain tasks", err, store.UnavailableInCurrentStatus)
	if got := segStatus(m, "M"); got != "OK" {
		t.Fatalf("a refused drain left M %s", got)
	}
	_, err = m.CreateDrainJob(DrainRequest{})
	wantCode(t, "no segment", err, store.InvalidParams)
	_, err = m.CreateDrainJob(DrainRequest{Segments: []string{"A"}, Targets: []string{"A"}})
	wantCode(t, "target drained", err, store.InvalidParams)
	_, err = m.CreateDrainJob(DrainRequest{Segments: []string{"A"}, MaxConcurrency: -1})
	wantCode(t, "bad concurrency", err, store.InvalidParams)
	if _, err := m.CreateDrainJob(DrainRequest{Segments: []string{"A"}}); err != nil {
		t.Fatal(err)
	}
	_, err = m.CreateDrainJob(DrainRequest{Segments: []string{"B", "A"}})
	wantCode(t, "overlapping drain", err, store.UnavailableInCurrentStatus)
	if got := segStatus(m, "B"); got != "OK" {
		t.Fatalf("a refused drain left B %s", got)
	}
	_, err = m.QueryDrainJob(store.NewUUID())
	wantCode(t, "unknown job", err, store.JobNotFound)
}

// drainOneToBC drains A, which holds one object k, to targets B and C.
func drainOneToBC(t *testing.T) (*Master, *fakeClock, store.UUID) {
	t.Helper()
	m, clk := drainMaster(t, 8*MiB, 8*MiB)
	mount(t, m, "nc", "C", "10.0.0.3", 3<<40, 8*MiB)
	poll(m, "nc")
	put(t, m, "w", "k", 64*KiB, onA())
	id, err := m.CreateDrainJob(DrainRequest{Segments: []string{"A"}, Targets: []string{"B", "C"}})
	if err != nil {
		t.Fatal(err)
	}
	return m, clk, id
}

func TestDrainRetriesFailedAndSilentCopies(t *testing.T) {
	m, clk, id := drainOneToBC(t)
	first := fetch(m, "na", 10)
	report(m, "na", first, store.Errorf(store.TransferFail, "target B died"))
	second := fetch(m, "na", 10)
	if len(second) != 1 || second[0].ID == first[0].ID {
		t.Fatalf("after a failure: %+v, want the copy again", second)
	}
	// No answer at all: given up after the task timeout, and retried.
	clk.Advance(drainTaskTimeout + time.Second)
	third := fetch(m, "na", 10)
	if len(third) != 1 {
		t.Fatalf("after a silent node: %+v, want the copy again", third)
	}
	report(m, "na", second) // late: ignored
	report(m, "na", third, store.Errorf(store.TransferFail, "again"))
	j := waitJob(t, m, id, ended)
	if j.Status != DrainFailed || j.Failed != 1 || j.LostObjects != 1 || !contains(j.Message, "3 times") {
		t.Fatalf("job %+v: want FAILED after 3 tries", j)
	}
	if got := segStatus(m, "A"); got != "OK" {
		t.Fatalf("A is %s, want OK", got)
	}
	// The silent copy's range is held until a late write cannot land.
	clk.Advance(drainTaskTimeout + time.Second)
	maintain(m, "na", "nb", "nc", "w")
	mustInvariants(t, m)
}

func TestDrainFailsWhenItsSegmentGoes(t *testing.T) {
	m, _ := drainMaster(t, 8*MiB, 8*MiB)
	put(t, m, "w", "k", 64*KiB, onA())
	put(t, m, "w", "k2", 64*KiB, onA())
	id, err := m.CreateDrainJob(DrainRequest{Segments: []string{"A"}, MaxConcurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	report(m, "na", fetch(m, "na", 10))
	if err := m.UnmountSegment(uuidOf("na"), uuidOf("seg/A")); err != nil {
		t.Fatal(err)
	}
	j := waitJob(t, m, id, ended)
	if j.Status != DrainFailed || j.Code != store.SegmentNotFound || j.Succeeded != 1 || !contains(j.Message, "unmounted mid-drain") {
		t.Fatalf("job %+v", j)
	}
	var kept int
	for _, k := range []string{"k", "k2"} {
		if r := get(m, k); r.Err == nil {
			kept++
			if segsOf(r.Replicas)[0] != "B" {
				t.Fatalf("%s: %v", k, r.Replicas)
			}
		}
	}
	if kept != 1 {
		t.Fatalf("%d objects survive, want the one copied", kept)
	}
	mustInvariants(t, m)
}

// An object being written on the draining segment when the drain starts
// is waited for, then moved.
func TestDrainWaitsForWritesInProgress(t *testing.T) {
	m, _ := drainMaster(t, 8*MiB, 8*MiB)
	put(t, m, "w", "done", 64*KiB, onA())
	putStart(t, m, "w", "writing", 64*KiB, onA())
	id, err := m.CreateDrainJob(DrainRequest{Segments: []string{"A"}})
	if err != nil {
		t.Fatal(err)
	}
	first := fetch(m, "na", 10)
	if len(first) != 1 || first[0].Key != "done" {
		t.Fatalf("first round: %+v, want only the complete object", first)
	}
	report(m, "na", first)
	time.Sleep(100 * time.Millisecond)
	if j, _ := m.QueryDrainJob(id); j.Status.Done() {
		t.Fatalf("job ended (%s) with an object still being written on A", j.Status)
	}
	if err := m.BatchPutEnd(uuidOf("w"), []string{"writing"})[0]; err != nil {
		t.Fatal(err)
	}
	second := fetch(m, "na", 10)
	if len(second) != 1 || second[0].Key != "writing" {
		t.Fatalf("after the put ended: %+v, want its copy", second)
	}
	report(m, "na", second)
	if j := waitJob(t, m, id, ended); j.Status != DrainSucceeded || j.Succeeded != 2 {
		t.Fatalf("job %+v", j)
	}
}

// The drain paths answer bad requests with Mooncake's error shape and
// HTTP status, naming what is wrong; a good one creates a job the query
// path shows.
func TestDrainAdminBadRequests(t *testing.T) {
	m, _ := drainMaster(t, 8*MiB, 8*MiB)
	srv := httptest.NewServer(NewAdminHandler(m, AdminOptions{}))
	defer srv.Close()
	post := func(path, body string) (int, map[string]any) {
		resp, err := http.Post(srv.URL+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var v map[string]any
		json.NewDecoder(resp.Body).Decode(&v)
		return resp.StatusCode, v
	}
	for _, c := range []struct {
		body   string
		status int
		code   store.Code
		says   string
	}{
		{`{"segments": [`, 400, store.InvalidParams, "Invalid JSON"},
		{`{"segments": []}`, 400, store.InvalidParams, "no segment"},
		{`{"segments": ["A"], "max_concurrency": -3}`, 400, store.InvalidParams, "max_concurrency"},
		{`{"segments": ["nope"]}`, 404, store.SegmentNotFound, "nope"},
		{`{"segments": ["A"], "target_segments": ["A"]}`, 400, store.InvalidParams, "both drained and a target"},
	} {
		status, v := post("/api/v1/drain_jobs", c.body)
		if status != c.status || v["success"] != false || store.Code(v["error_code"].(float64)) != c.code || !strings.Contains(v["error_message"].(string), c.says) {
			t.Errorf("%s: %d %v, want %d %s saying %q", c.body, status, v, c.status, c.code, c.says)
		}
	}
	for path, want := range map[string]int{
		"/api/v1/drain_jobs/query":            400,
		"/api/v1/drain_jobs/query?job_id=x":   400,
		"/api/v1/drain_jobs/query?job_id=1-2": 404,
	} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s: %d, want %d", path, resp.StatusCode, want)
		}
	}
	if status, _ := post("/api/v1/drain_jobs/cancel?job_id=1-2", ""); status != 404 {
		t.Errorf("cancel of an unknown job: %d, want 404", status)
	}
	status, v := post("/api/v1/drain_jobs", `{"segments": ["A"], "max_concurrency": 4}`)
	if status != 200 || v["status"] != "CREATED" {
		t.Fatalf("create: %d %v", status, v)
	}
	resp, err := http.Get(srv.URL + "/api/v1/drain_jobs/query?job_id=" + v["job_id"].(string))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var q store.DrainJobStatus
	if err := json.NewDecoder(resp.Body).Decode(&q); err != nil || q.JobID != v["job_id"] || q.MaxConcurrency != 4 || q.TypeName != "DRAIN" {
		t.Fatalf("query: %+v %v", q, err)
	}
}

// A unit is in neither the job's queue nor its active set twice in its
// life: when a copy's result took it off the active set and it is not
// yet queued again (a failure) or committed (a success), and when
// dispatchDrain took it off the queue to place it. A plan in either
// window saw the job idle and planned the object's copy a second time
// (TestDrainRetriesFailedAndSilentCopies got two tasks for one key: under
// load, and in a clean-clone CI run). The job is never idle then.
func TestDrainNotIdleOffQueueAndActive(t *testing.T) {
	for _, c := range []struct {
		name    string
		hook    *atomic.Pointer[func(*drainJob)]
		minSeen int
	}{
		{"result settling", &drainResultTaken, 2},
		{"placing", &drainPlacing, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, _, id := drainOneToBC(t)
			var seen, idle int
			hook := func(j *drainJob) {
				if j.ID != id {
					return
				}
				m.drains.mu.Lock()
				seen++
				if j.idleLocked() {
					idle++
				}
				m.drains.mu.Unlock()
			}
			c.hook.Store(&hook)
			t.Cleanup(func() { c.hook.Store(nil) })
			first := fetch(m, "na", 10)
			if len(first) != 1 {
				t.Fatalf("tasks %+v, want the copy of k", first)
			}
			report(m, "na", first, store.Errorf(store.TransferFail, "target died")) // queued again
			again := fetch(m, "na", 10)
			if len(again) != 1 || again[0].Key != "k" || again[0].ID == first[0].ID {
				t.Fatalf("after one failure: %+v, want one new copy of k", again)
			}
			report(m, "na", again) // committed
			m.drains.mu.Lock()     // the job's goroutine may run the hook too
			ran, wasIdle := seen, idle
			m.drains.mu.Unlock()
			if ran < c.minSeen || wasIdle != 0 {
				t.Fatalf("the hook ran %d times, the job idle during %d of them; want at least %d, 0", ran, wasIdle, c.minSeen)
			}
			if j := waitJob(t, m, id, ended); j.Status != DrainSucceeded || j.Succeeded != 1 {
				t.Fatalf("job %+v: want SUCCEEDED with one copy", j)
			}
		})
	}
}
