package coll

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine/meta"
)

// killMidCollective runs an all-reduce large enough to take many slots on
// every rank and closes victim's engine while it runs: every survivor's
// call fails naming victim, and the next all-reduce is right over the
// survivors.
func killMidCollective(t *testing.T, c *testCluster, victim int) {
	t.Helper()
	n := len(c.groups)
	const cnt = 20000 // 80 KB: ~300 slots of 256 bytes per ring step
	errs := c.parallel(n, func(r int) error {
		g := c.groups[r]
		if g == nil {
			return nil
		}
		if r == victim {
			// The victim stops mid-collective, then its engine goes,
			// as when its process dies.
			go func() {
				time.Sleep(5 * time.Millisecond)
				g.halt.Store(true)
			}()
			err := AllReduceOf(ctxT(t), g, inputs[float32](r, cnt, Sum), Sum)
			c.engines[r].Close()
			if !errors.Is(err, errHalted) {
				return fmt.Errorf("victim finished before it was halted: %v", err)
			}
			return nil
		}
		return AllReduceOf(ctxT(t), g, inputs[float32](r, cnt, Sum), Sum)
	})
	if errs[victim] != nil {
		t.Fatal(errs[victim])
	}
	c.groups[victim] = nil
	for r, err := range errs {
		if r == victim || c.groups[r] == nil {
			continue
		}
		var re *RankError
		if !errors.As(err, &re) || !slices.Contains(re.Ranks, victim) {
			t.Fatalf("rank %d: all_reduce while rank %d died: %v, want a RankError naming %d", r, victim, err, victim)
		}
	}
	checkAllReduce[float32](t, c, cnt, Sum)
	for r, g := range c.groups {
		if g != nil && slices.Contains(g.ActiveRanks(), victim) {
			t.Fatalf("rank %d: active ranks %v still hold %d", r, g.ActiveRanks(), victim)
		}
	}
}

func TestRankKilledMidCollective(t *testing.T) {
	c := newCluster(t, meta.NewMemory(), 4, 4, testConfig())
	checkAllReduce[float32](t, c, 301, Sum)
	killMidCollective(t, c, 2)
	if got := c.groups[0].ActiveRanks(); !slices.Equal(got, []int{0, 1, 3}) {
		t.Fatalf("active ranks %v, want [0 1 3]", got)
	}
	// Every collective works over the survivors, blocks of rank 2 untouched.
	c.each(func(r int, g *Group) error {
		recv := make([]byte, 3*4)
		if err := g.AllGather(ctxT(t), pattern(r, 3, 0), recv); err != nil {
			return err
		}
		for q := 0; q < 4; q++ {
			want := pattern(q, 3, 0)
			if q == 2 {
				want = make([]byte, 3)
			}
			if !slices.Equal(recv[q*3:q*3+3], want) {
				return fmt.Errorf("all_gather block %d: %v, want %v", q, recv[q*3:q*3+3], want)
			}
		}
		return nil
	})
	// A second failure, of the ring's first rank.
	killMidCollective(t, c, 0)
	if got := c.groups[1].ActiveRanks(); !slices.Equal(got, []int{1, 3}) {
		t.Fatalf("active ranks %v, want [1 3]", got)
	}
	// A rooted collective with a dead root says so.
	err := c.groups[1].Broadcast(ctxT(t), make([]byte, 4), 2)
	if !errors.Is(err, ErrRankFailed) {
		t.Fatalf("broadcast from dead root: %v", err)
	}
}

// TestPeerWaitingElsewhere: a rank that never writes to the dead one (its
// right neighbour in the ring only receives from it) learns the failure
// from the store, as do ranks blocked behind it.
func TestRankDiesBetweenCollectives(t *testing.T) {
	c := newCluster(t, meta.NewMemory(), 3, 3, testConfig())
	c.kill(1)
	errs := c.parallel(3, func(r int) error {
		if c.groups[r] == nil {
			return nil
		}
		return c.groups[r].Barrier(ctxT(t))
	})
	for _, r := range []int{0, 2} {
		var re *RankError
		if !errors.As(errs[r], &re) || !slices.Equal(re.Ranks, []int{1}) {
			t.Fatalf("rank %d: %v, want a RankError naming rank 1", r, errs[r])
		}
	}
	checkAllReduce[int64](t, c, 5, Sum)
}

// TestAbandonedCollective: a rank whose context ends leaves the group, and
// its peers fail over it instead of waiting for the timeout.
func TestAbandonedCollective(t *testing.T) {
	c := newCluster(t, meta.NewMemory(), 3, 3, testConfig())
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	// Rank 0 alone enters a barrier nobody else joins.
	err := c.groups[0].Barrier(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("abandoned barrier: %v", err)
	}
	if err := c.groups[0].Barrier(ctxT(t)); !errors.Is(err, ErrInactive) {
		t.Fatalf("barrier after leaving: %v, want ErrInactive", err)
	}
	c.groups[0].Close()
	c.groups[0] = nil
	errs := c.parallel(3, func(r int) error {
		if c.groups[r] == nil {
			return nil
		}
		return c.groups[r].Barrier(ctxT(t))
	})
	for _, r := range []int{1, 2} {
		if !errors.Is(errs[r], ErrRankFailed) {
			t.Fatalf("rank %d: %v, want rank 0 failed", r, errs[r])
		}
	}
	checkAllReduce[int32](t, c, 3, Sum)
}

// join starts rank r in extension mode and recovers it from the healthy
// ranks, as the seed design orders it.
func (c *testCluster) join(t *testing.T, r int) {
	t.Helper()
	c.engines[r] = c.newEngine(r)
	joined := make(chan error, 1)
	go func() {
		g, err := JoinGroup(ctxT(t), c.config(r, 0, len(c.groups)))
		c.groups[r] = g
		joined <- err
	}()
	healthy := slices.DeleteFunc(slices.Clone(c.groups), func(g *Group) bool { return g == nil })
	for {
		ready, err := healthy[0].GetPeerState(ctxT(t), []int{r})
		if err != nil {
			t.Fatal(err)
		}
		if ready[0] {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	errs := c.parallel(len(healthy), func(i int) error {
		if ready, err := healthy[i].GetPeerState(ctxT(t), []int{r}); err != nil || !ready[0] {
			return fmt.Errorf("peer state of %d: %v %v", r, ready, err)
		}
		return healthy[i].RecoverRanks(ctxT(t), []int{r})
	})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("healthy rank %d: %v", healthy[i].Rank(), err)
		}
	}
	if err := <-joined; err != nil {
		t.Fatalf("join rank %d: %v", r, err)
	}
}

func TestReplacementJoins(t *testing.T) {
	c := newCluster(t, meta.NewMemory(), 3, 5, testConfig())
	if got := c.groups[0].ActiveRanks(); !slices.Equal(got, []int{0, 1, 2}) {
		t.Fatalf("reserved slots active: %v", got)
	}
	// A reserved slot.
	c.join(t, 3)
	if got := c.groups[3].ActiveRanks(); !slices.Equal(got, []int{0, 1, 2, 3}) || c.groups[0].Size() != 4 {
		t.Fatalf("after join: active %v size %d", got, c.groups[0].Size())
	}
	checkAllReduce[float64](t, c, 301, Sum)
	checkAllReduce[int32](t, c, 2, Max)
	// A failed rank's replacement.
	killMidCollective(t, c, 1)
	c.join(t, 1)
	checkAllReduce[float32](t, c, 301, Sum)
	if got := c.groups[1].ActiveRanks(); !slices.Equal(got, []int{0, 1, 2, 3}) {
		t.Fatalf("after replacement: %v", got)
	}
	// Growing the size first, then joining the new slot.
	c.each(func(r int, g *Group) error { return g.ExtendGroupSizeTo(ctxT(t), 5) })
	if c.groups[2].Size() != 5 || slices.Contains(c.groups[2].ActiveRanks(), 4) {
		t.Fatalf("extended: size %d active %v", c.groups[2].Size(), c.groups[2].ActiveRanks())
	}
	c.join(t, 4)
	checkAllReduce[int64](t, c, 7, Product)
	testDataMovement(t, c, 5, 9)
}

func TestJoinRefusesActiveSlot(t *testing.T) {
	c := newCluster(t, meta.NewMemory(), 2, 3, testConfig())
	e := c.newEngine(1)
	defer e.Close()
	cfg := c.config(1, 0, 3)
	cfg.Engine = e
	if _, err := JoinGroup(ctxT(t), cfg); err == nil {
		t.Fatal("joined over an active rank")
	}
	if err := c.groups[0].RecoverRanks(ctxT(t), []int{2}); err == nil {
		t.Fatal("recovered a rank that never joined")
	}
}

func TestSubgroups(t *testing.T) {
	c := newCluster(t, meta.NewMemory(), 4, 5, testConfig())
	subs := make([]*Group, 5)
	c.each(func(r int, g *Group) error {
		s, err := g.NewSubgroup(ctxT(t), []int{3, 1})
		if err != nil {
			return err
		}
		subs[r] = s
		if (s != nil) != (r == 1 || r == 3) {
			return fmt.Errorf("membership of subgroup [3 1]: %v", s != nil)
		}
		if s == nil {
			return nil
		}
		data := []int32{int32(r), 1}
		if err := AllReduceOf(ctxT(t), s, data, Sum); err != nil {
			return err
		}
		if !slices.Equal(data, []int32{4, 2}) {
			return fmt.Errorf("subgroup all_reduce: %v", data)
		}
		// Sub rank 0 is group rank 3.
		buf := []byte{byte(r)}
		if err := s.Broadcast(ctxT(t), buf, 0); err != nil {
			return err
		}
		if buf[0] != 3 {
			return fmt.Errorf("subgroup broadcast from sub rank 0: %d", buf[0])
		}
		return nil
	})
	// After a join, a subgroup with the new rank, created by all.
	c.join(t, 4)
	c.each(func(r int, g *Group) error {
		s, err := g.NewSubgroup(ctxT(t), []int{0, 2, 4})
		if err != nil || s == nil {
			return err
		}
		data := []float64{float64(r)}
		if err := AllReduceOf(ctxT(t), s, data, Sum); err != nil {
			return err
		}
		if data[0] != 6 {
			return fmt.Errorf("subgroup [0 2 4] all_reduce: %v", data)
		}
		return nil
	})
	// A subgroup member's failure shows in the subgroup.
	c.kill(1)
	subs[1] = nil
	err := subs[3].Barrier(ctxT(t))
	if !errors.Is(err, ErrRankFailed) {
		t.Fatalf("subgroup barrier with its other member dead: %v", err)
	}
	if got := subs[3].ActiveRanks(); !slices.Equal(got, []int{0}) {
		t.Fatalf("subgroup active ranks %v, want [0]", got)
	}
}

// The rendezvous on the real backends: etcd (listing) and Mooncake's HTTP
// metadata server (no listing: one read per key).
func TestBackends(t *testing.T) {
	ee, err := meta.StartEtcd(context.Background(), meta.EtcdConfig{Listen: "127.0.0.1:0", NoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ee.Close()
	srv := httptest.NewServer(meta.NewHTTPHandler())
	defer srv.Close()
	for name, addr := range map[string]string{"etcd": "etcd://" + ee.Endpoints()[0], "http": srv.URL + "/metadata"} {
		t.Run(name, func(t *testing.T) {
			be, err := meta.Open(context.Background(), addr, meta.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { be.Close() }) // after the cluster's cleanup
			c := newCluster(t, be, 3, 4, testConfig())
			checkAllReduce[float32](t, c, 301, Sum)
			killMidCollective(t, c, 1)
			c.join(t, 3)
			checkAllReduce[int32](t, c, 9, Min)
		})
	}
}

// A group that finished leaves nothing in the store, also after a rank
// failed during the run, so a new group of the same name forms with every
// rank active. Without Finish the old records stay: New takes a rank's
// old record for the rank being present, and a rank marked failed cannot
// create its slot again.
func TestFinishFreesTheName(t *testing.T) {
	t.Run("memory", func(t *testing.T) {
		finishTwice(t, newCluster(t, meta.NewMemory(), 3, 3, testConfig()))
	})
	t.Run("http", func(t *testing.T) { // no listing: the keys are removed one by one
		srv := httptest.NewServer(meta.NewHTTPHandler())
		defer srv.Close()
		be, err := meta.Open(context.Background(), srv.URL+"/metadata", meta.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer be.Close()
		finishTwice(t, newCluster(t, be, 3, 3, testConfig()))
	})
}

func finishTwice(t *testing.T, c *testCluster) {
	t.Helper()
	ctx := ctxT(t)
	c.each(func(r int, g *Group) error { return g.Barrier(ctx) })
	c.kill(2) // fails during the run
	errs := c.parallel(2, func(r int) error { return c.groups[r].Finish(ctx) })
	for r, err := range errs {
		if err != nil {
			t.Fatalf("finish rank %d: %v", r, err)
		}
	}
	if kvs, err := c.st.ListKeys(ctx, "mc-coll/"+c.name+"/"); err == nil && len(kvs) > 0 {
		t.Fatalf("records left after every rank finished: %v", kvs)
	}
	for _, k := range []string{"size", "state/2", "rank/0", "rank/1", "rank/2", "done/0"} {
		if _, found, err := c.st.ReadKey(ctx, "mc-coll/"+c.name+"/"+k); err != nil || found {
			t.Fatalf("record %s left (%v)", k, err)
		}
	}
	for r := range c.groups {
		c.groups[r] = nil
		if c.engines[r] != nil {
			c.engines[r].Close()
		}
		c.engines[r] = c.newEngine(r)
	}
	// The same name again: every rank comes up active and they reduce.
	errs = c.parallel(3, func(r int) error {
		g, err := New(ctx, c.config(r, 3, 3))
		c.groups[r] = g
		return err
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("second group, rank %d: %v", r, err)
		}
	}
	c.each(func(r int, g *Group) error {
		if act := g.ActiveRanks(); len(act) != 3 {
			return fmt.Errorf("second group active %v", act)
		}
		v := []float64{float64(r)}
		if err := AllReduceOf(ctx, g, v, Sum); err != nil {
			return err
		}
		if v[0] != 3 {
			return fmt.Errorf("sum %v, want 3", v[0])
		}
		return nil
	})
}

// A lone rank whose peers never come ends with ErrJoinTimeout after
// JoinTimeout, naming the ranks that never came, instead of waiting
// forever (issue 40.4).
func TestNewJoinTimeoutNamesMissingRanks(t *testing.T) {
	be := meta.NewMemory()
	st, err := meta.StoreOf(be)
	if err != nil {
		t.Fatal(err)
	}
	c := &testCluster{t: t, be: be, st: st, name: t.Name()}
	eng := c.newEngine(0)
	defer eng.Close()
	cfg := testConfig()
	cfg.Group, cfg.Rank, cfg.WorldSize, cfg.Engine, cfg.Store, cfg.JoinTimeout = t.Name(), 0, 3, eng, st, 300*time.Millisecond
	t0 := time.Now()
	g, err := New(context.Background(), cfg)
	if g != nil {
		g.Close()
	}
	if !errors.Is(err, ErrJoinTimeout) || !strings.Contains(err.Error(), "ranks 1,2 of 3 not there after 300ms") {
		t.Fatalf("New = %v, want ErrJoinTimeout naming ranks 1,2", err)
	}
	if d := time.Since(t0); d < 300*time.Millisecond || d > 5*time.Second {
		t.Fatalf("gave up after %s, want about 300ms", d)
	}
}
