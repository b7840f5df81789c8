package master

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/store"
	pb "github.com/kvcache-ops/mc/pkg/store/storepb"
)

// While a restarted master waits for the pool's disk tiers, a put's End
// is held; the writer's revoke (its End had no answer in time) must not
// answer "complete" before the End could: mc's client reads that as its
// put having landed. Before, the revoke answered at once.
func TestSettleHoldsEndAndRevoke(t *testing.T) {
	m, _ := newTestMaster(t, Config{Now: time.Now, TierSettle: time.Second})
	defer m.Close()
	mount(t, m, "node", "seg", "h", 1<<30, 64*MiB)
	m.NameTiers([]string{"away"}, nil)
	if _, ids, _ := m.Roster(0); !slices.Contains(ids, "away") {
		t.Fatalf("roster %v lacks the named tier", ids)
	}
	putStart(t, m, "w", "k", 4096)
	start := time.Now()
	end, rev := make(chan error, 1), make(chan error, 1)
	go func() { end <- m.BatchPutEnd(uuidOf("w"), []string{"k"})[0] }()
	time.Sleep(50 * time.Millisecond)
	go func() { rev <- m.BatchPutRevoke(uuidOf("w"), []string{"k"})[0] }()
	select {
	case err := <-end:
		t.Fatalf("End answered (%v) while a named tier is away", err)
	case err := <-rev:
		t.Fatalf("revoke answered (%v) while the End is held", err)
	case <-time.After(500 * time.Millisecond):
	}
	if err := <-end; err != nil {
		t.Fatalf("End after the bound: %v", err)
	}
	wantCode(t, "revoke after the End", <-rev, store.InvalidWrite)
	if took := time.Since(start); took < 900*time.Millisecond {
		t.Fatalf("answered after %s, before the 1 s bound", took)
	}
	if _, ids, fenced := m.Roster(0); slices.Contains(ids, "away") || !hasFence(fenced, "away") {
		t.Fatalf("roster %v, fenced %v after the bound: want the tier fenced", ids, fenced)
	}
	// Not waited for again.
	putStart(t, m, "w", "k2", 4096)
	t0 := time.Now()
	if err := m.BatchPutEnd(uuidOf("w"), []string{"k2"})[0]; err != nil {
		t.Fatal(err)
	}
	if took := time.Since(t0); took > 200*time.Millisecond {
		t.Fatalf("a put after the bound took %s", took)
	}
}

// With HA (restored from the op log) nothing is waited for.
func TestSettleNotWithHA(t *testing.T) {
	m, _ := newTestMaster(t, Config{Now: time.Now, TierSettle: 10 * time.Second})
	defer m.Close()
	if err := m.Restore(nil); err != nil {
		t.Fatal(err)
	}
	mount(t, m, "node", "seg", "h", 1<<30, 64*MiB)
	m.NameTiers([]string{"away"}, nil)
	putStart(t, m, "w", "k", 4096)
	t0 := time.Now()
	if err := m.BatchPutEnd(uuidOf("w"), []string{"k"})[0]; err != nil {
		t.Fatal(err)
	}
	if took := time.Since(t0); took > time.Second {
		t.Fatalf("an HA master held a put %s for a named tier", took)
	}
}

// A roster is a node's hint: odd names are ignored and its length
// bounded, never refused (a node that cannot re-mount serves nothing).
func TestNameTiersOddRoster(t *testing.T) {
	m, _ := newTestMaster(t, Config{Now: time.Now, TierSettle: time.Second})
	defer m.Close()
	names := []string{"", strings.Repeat("x", 1000)}
	for i := range 10_000 {
		names = append(names, fmt.Sprintf("tier-%d", i))
	}
	m.NameTiers(names, []string{"x", "@5", "id@", "id@-1", "id@abc", "id@0", strings.Repeat("y", 300) + "@5"})
	_, ids, _ := m.Roster(0)
	if len(ids) == 0 || len(ids) > maxRoster {
		t.Fatalf("%d tiers named, want 1..%d", len(ids), maxRoster)
	}
	for _, id := range ids {
		if id == "" || len(id) > 256 {
			t.Fatalf("roster kept the name %.20q (%d bytes)", id, len(id))
		}
	}
	if _, _, fenced := m.Roster(0); len(fenced) != 0 {
		t.Fatalf("malformed fences taken: %v", fenced)
	}
}

// hasFence reports whether a roster's fences (id@version) name tier id.
func hasFence(fenced []string, id string) bool {
	return slices.ContainsFunc(fenced, func(f string) bool { return strings.HasPrefix(f, id+"@") })
}

// A DROP that ended unapplied (its node's stream ended) is not a
// confirmation. Closing a master ends the streams just after it closes
// done: a call waiting on both saw either, and when it took the DROP's
// end it was acknowledged though the record stayed on disk for the next
// master to re-add (CI: TestTierDropFence, "get after an acknowledged
// upsert returned the version before it"). Each round has both ready
// before the wait, so before the fix about half the rounds acknowledged.
func TestFenceDropEndedByClose(t *testing.T) {
	defer func() { fenceWaitHook = nil }()
	for round := range 40 {
		m, _ := newTestMaster(t, Config{Now: time.Now, DropFence: 10 * time.Second})
		op := m.tiers.addDrop("k", 1, "tier-a")
		fenceWaitHook = func([]*tierOp) {
			m.Close()
			m.tiers.dropDone(op, errDetached)
		}
		out := make([]error, 1)
		m.fenceDrops([]string{"k"}, out)
		if out[0] == nil {
			t.Fatalf("round %d: acknowledged after the master closed with the key's DROP unapplied", round)
		}
		wantCode(t, "the call", out[0], store.InternalError)
	}
}

// With the master up, a DROP ended unapplied fences its tier as one not
// confirmed in time does, before the call is acknowledged: the record
// stays on disk until the node attaches again, and a master restarted
// before that must drop it, not re-add it. Before, the call was
// acknowledged at once with no fence.
func TestFenceDropEndedUnapplied(t *testing.T) {
	defer func() { fenceWaitHook = nil }()
	m, _ := newTestMaster(t, Config{Now: time.Now, DropFence: 200 * time.Millisecond})
	defer m.Close()
	op := m.tiers.addDrop("k", 1, "tier-a")
	fenceWaitHook = func([]*tierOp) { m.tiers.dropDone(op, errDetached) }
	out := make([]error, 1)
	m.fenceDrops([]string{"k"}, out)
	if out[0] != nil {
		t.Fatalf("the call failed (%v); the master is up, it is acknowledged once the tier is fenced", out[0])
	}
	if _, _, fenced := m.Roster(0); !hasFence(fenced, "tier-a") {
		t.Fatalf("fenced %v: want tier-a fenced for its unapplied DROP", fenced)
	}
	// Kept until the tier attaches again, when this master judges its
	// records itself.
	m.tierJoined("tier-a")
	if _, _, fenced := m.Roster(0); hasFence(fenced, "tier-a") {
		t.Fatalf("fenced %v after the tier attached again", fenced)
	}
}

// A DROP that ended before the call looked (its node was away when the
// key was put again) still fences: before, it was gone from the
// unconfirmed DROPs by then, and the call was acknowledged unfenced. Once
// its tier attaches again (this master judges the records it reports),
// it no longer holds calls.
func TestFenceDropEndedBeforeTheCall(t *testing.T) {
	m, _ := newTestMaster(t, Config{Now: time.Now, DropFence: 200 * time.Millisecond})
	defer m.Close()
	op := m.tiers.addDrop("k", 1, "tier-a")
	m.tiers.dropDone(op, errDetached)
	out := make([]error, 1)
	m.fenceDrops([]string{"k"}, out)
	if out[0] != nil {
		t.Fatal(out[0])
	}
	if _, _, fenced := m.Roster(0); !hasFence(fenced, "tier-a") {
		t.Fatalf("fenced %v: want tier-a fenced for the DROP it could not apply", fenced)
	}
	m.tiers.clearEnded("tier-a")
	m.tierJoined("tier-a")
	if ops := m.tiers.unconfirmed([]string{"k"}); len(ops) != 0 {
		t.Fatalf("%d DROPs still waited for after the tier attached again", len(ops))
	}
}

// A DROP is never lost to a node's full command queue: it waits in the
// overflow for the sender (which is kicked). Before, enqueue refused it,
// the DROP was never sent, and the record stayed on disk unknown to the
// master, for the next one to re-add. Other commands are still refused
// (an offload not sent leaves its object in DRAM).
func TestTierEnqueueDropOverflow(t *testing.T) {
	n := &tierNode{online: true, gen: 2, send: make(chan *pb.TierCommand, 1), kick: make(chan struct{}, 1), pending: map[uint64]*tierOp{}}
	if !n.enqueue(&pb.TierCommand{Kind: pb.TierCommand_OFFLOAD, Key: "a"}, nil) {
		t.Fatal("first command refused")
	}
	if n.enqueue(&pb.TierCommand{Kind: pb.TierCommand_OFFLOAD, Key: "b"}, nil) {
		t.Fatal("an offload taken into a full queue")
	}
	op := &tierOp{id: 9, kind: pb.TierCommand_DROP, key: "c", done: make(chan struct{})}
	if !n.enqueue(&pb.TierCommand{Kind: pb.TierCommand_DROP, Key: "c", Op: 9}, op) {
		t.Fatal("a DROP refused by a full queue")
	}
	if n.pending[9] != op {
		t.Fatal("the overflowed DROP's op is not pending (a detach would not fail it)")
	}
	select {
	case <-n.kick:
	default:
		t.Fatal("the sender was not kicked for the overflow")
	}
	if got := n.takeOverflow(10, 1); got != nil {
		t.Fatalf("an older stream's sender took %v", got)
	}
	if got := n.takeOverflow(10, 2); len(got) != 1 || got[0].GetKey() != "c" {
		t.Fatalf("overflow %v, want the DROP of c", got)
	}
}
