package rdma

import (
	"bytes"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/diag/glog"
)

// bareStore is a store whose endpoints own no QPs, for policy tests.
func bareStore(kind StoreType, max int) (*EndpointStore, *int) {
	destroyed := new(int)
	build := func(path string) (*Endpoint, error) {
		e := &Endpoint{peer: path}
		e.active.Store(true)
		return e, nil
	}
	return newEndpointStore(kind, max, time.Minute, build, func(*Endpoint) { *destroyed++ }), destroyed
}

// captureLogs sends slog's default logger to a glog handler on a buffer
// for the test's duration.
func captureLogs(t testing.TB) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	old := slog.Default()
	glog.Setup(&buf, slog.LevelInfo)
	t.Cleanup(func() { slog.SetDefault(old) })
	return &buf
}

func mustInsert(t *testing.T, s *EndpointStore, paths ...string) {
	t.Helper()
	for _, p := range paths {
		if _, err := s.Insert(p); err != nil {
			t.Fatal(err)
		}
	}
}

func evictedIn(log string) []string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if i := strings.Index(l, "] "); i >= 0 && strings.HasSuffix(l, " evicted") {
			out = append(out, strings.TrimSuffix(l[i+2:], " evicted"))
		}
	}
	return out
}

func TestFIFOVictimOrder(t *testing.T) {
	logs := captureLogs(t)
	s, destroyed := bareStore(FIFO, 3)
	mustInsert(t, s, "a@x", "b@x", "c@x")
	s.Get("a@x") // FIFO ignores use
	mustInsert(t, s, "d@x", "e@x")
	if !s.Delete("c@x") {
		t.Fatal("delete c")
	}
	mustInsert(t, s, "f@x", "g@x")
	if got, want := evictedIn(logs.String()), []string{"a@x", "b@x", "d@x"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("evicted %v, want %v\n%s", got, want, logs)
	}
	if got, want := s.order(), []string{"g@x", "f@x", "e@x"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
	// Retired endpoints are idle here, so inserts already reclaimed some.
	if s.Waiting()+*destroyed != 4 {
		t.Fatalf("waiting %d + destroyed %d, want 4 (3 evicted, 1 deleted)", s.Waiting(), *destroyed)
	}
	if !strings.Contains(logs.String(), "] a@x evicted\n") || strings.Contains(logs.String(), "c@x") {
		t.Fatalf("eviction lines wrong or delete not silent:\n%s", logs)
	}
	if l := strings.SplitN(logs.String(), "\n", 2)[0]; l[0] != 'I' {
		t.Fatalf("eviction not at INFO: %q", l)
	}
}

func TestSIEVEVictimOrder(t *testing.T) {
	logs := captureLogs(t)
	s, _ := bareStore(SIEVE, 3)
	// Inserts are visited. The first eviction walks a, b, c clearing
	// their bits, wraps to the oldest and evicts a; the hand rests on b.
	mustInsert(t, s, "a@x", "b@x", "c@x", "d@x")
	// The hand is at b, unvisited: b goes, the hand moves to c.
	mustInsert(t, s, "e@x")
	// c was used: the walk from the hand clears c, d and e (both inserted
	// visited), wraps to the oldest, c, now unvisited, and evicts it.
	s.Get("c@x")
	mustInsert(t, s, "f@x")
	if got, want := evictedIn(logs.String()), []string{"a@x", "b@x", "c@x"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("evicted %v, want %v", got, want)
	}
	if got, want := s.order(), []string{"f@x", "e@x", "d@x"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
	// The hand rests on d (c's newer neighbour). Deleting d during the
	// walk moves the hand to e, which the last walk left unvisited.
	s.Delete("d@x")
	mustInsert(t, s, "g@x") // room: no eviction
	mustInsert(t, s, "h@x")
	if got := evictedIn(logs.String()); got[len(got)-1] != "e@x" {
		t.Fatalf("after deleting the hand's entry evicted %v, want e@x last", got)
	}
	if got, want := s.order(), []string{"h@x", "g@x", "f@x"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}

// TestSIEVEMatchesReference replays a pseudo-random sequence against a
// plain-slice model of rdma.md's SIEVE.
func TestSIEVEMatchesReference(t *testing.T) {
	logs := captureLogs(t)
	const max = 5
	s, _ := bareStore(SIEVE, max)
	type ent struct {
		path    string
		visited bool
	}
	var list []ent // index 0 = oldest
	hand := -1     // -1: start at the oldest
	var want []string
	seed := uint32(7)
	rnd := func(n int) int { seed = seed*1664525 + 1013904223; return int(seed>>16) % n }
	find := func(p string) int {
		for i, e := range list {
			if e.path == p {
				return i
			}
		}
		return -1
	}
	for step := 0; step < 2000; step++ {
		p := fmt.Sprintf("p%d@x", rnd(12))
		switch rnd(3) {
		case 0: // get
			s.Get(p)
			if i := find(p); i >= 0 {
				list[i].visited = true
			}
		case 1: // insert
			mustInsert(t, s, p)
			if i := find(p); i >= 0 {
				list[i].visited = true
				break
			}
			if len(list) >= max {
				i := hand
				if i < 0 {
					i = 0
				}
				for list[i].visited {
					list[i].visited = false
					i = (i + 1) % len(list)
				}
				want = append(want, list[i].path)
				list = append(list[:i], list[i+1:]...)
				hand = i
				if hand >= len(list) {
					hand = -1
				}
			}
			list = append(list, ent{p, true})
			if hand == -1 && len(list) == 1 {
				hand = -1
			}
		case 2: // delete
			s.Delete(p)
			if i := find(p); i >= 0 {
				list = append(list[:i], list[i+1:]...)
				if hand > i {
					hand--
				} else if hand == i && hand >= len(list) {
					hand = -1
				}
			}
		}
	}
	got := evictedIn(logs.String())
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("evictions diverge from the model:\n got %v\nwant %v", got, want)
	}
	if len(want) < 100 {
		t.Fatalf("only %d evictions: the sequence does not exercise eviction", len(want))
	}
}

func TestReclaimWaitsForQuiescence(t *testing.T) {
	logs := captureLogs(t)
	s, destroyed := bareStore(FIFO, 4)
	now := time.Unix(1000, 0)
	s.now = func() time.Time { return now }
	e, _ := s.Insert("busy@x")
	e.depth = make([]atomicInt32s, 1)
	e.depth[0].Add(1)
	mustInsert(t, s, "idle@x")
	s.Delete("busy@x")
	s.Delete("idle@x")
	if n := s.Reclaim(); n != 1 || *destroyed != 1 || s.Waiting() != 1 {
		t.Fatalf("reclaimed %d, destroyed %d, waiting %d; want the idle one only", n, *destroyed, s.Waiting())
	}
	e.depth[0].Add(-1)
	if n := s.Reclaim(); n != 1 || s.Waiting() != 0 {
		t.Fatalf("after drain reclaimed %d, waiting %d", n, s.Waiting())
	}
	if strings.Contains(logs.String(), "Forcibly") {
		t.Fatalf("unexpected forced destroy:\n%s", logs)
	}

	// Stuck work requests: destroyed after the grace period, with a warning.
	e, _ = s.Insert("stuck@x")
	e.depth = make([]atomicInt32s, 1)
	e.depth[0].Add(3)
	s.Delete("stuck@x")
	now = now.Add(time.Minute - time.Second)
	if s.Reclaim() != 0 {
		t.Fatal("destroyed before the grace period")
	}
	now = now.Add(time.Second)
	if s.Reclaim() != 1 {
		t.Fatal("not destroyed after the grace period")
	}
	if !strings.Contains(logs.String(), "Forcibly destroying endpoint stuck@x with 3 outstanding work requests") || !strings.HasPrefix(logs.String(), "W") {
		t.Fatalf("no warning for the forced destroy:\n%s", logs)
	}
}

func TestPLOGSuffix(t *testing.T) {
	err := fmt.Errorf("create qp: %w", errnoENOMEM)
	if got := "Failed to create QP" + plogSuffix(err); got != "Failed to create QP: Cannot allocate memory [12]" {
		t.Fatalf("got %q", got)
	}
}
