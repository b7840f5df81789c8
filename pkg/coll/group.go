package coll

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine"
	"github.com/kvcache-ops/mc/pkg/engine/meta"
)

// Defaults for Config.
const (
	DefaultSlots     = 2
	DefaultSlotSize  = 1 << 20
	DefaultTimeout   = 30 * time.Second
	DefaultSmallSize = 64 << 10
	// MaxSlots bounds Config.Slots, the mailbox slots per peer.
	MaxSlots = 64
)

// Sentinel errors callers branch on.
var (
	// ErrRankFailed is matched by a *RankError.
	ErrRankFailed = errors.New("rank failed")
	// ErrInactive: this rank is not (or no longer) active in the group:
	// a peer marked it failed, or it abandoned a collective.
	ErrInactive = errors.New("this rank is inactive in the group")
	// ErrClosed: the group was closed.
	ErrClosed = errors.New("group closed")
	// ErrJoinTimeout: New waited Config.JoinTimeout and some initial
	// ranks had not published themselves.
	ErrJoinTimeout = errors.New("ranks did not join in time")
)

// RankError fails a collective during which ranks were found failed (by
// this rank or another); they are inactive from then on, and the next
// collective runs over the survivors.
type RankError struct {
	Ranks []int // group ranks newly inactive
	Err   error // what this rank saw, when it detected the failure itself
}

func (e *RankError) Error() string {
	s := "rank"
	if len(e.Ranks) > 1 {
		s = "ranks"
	}
	for i, r := range e.Ranks {
		if i > 0 {
			s += ","
		}
		s += " " + strconv.Itoa(r)
	}
	if e.Err != nil {
		return s + " failed: " + e.Err.Error()
	}
	return s + " failed (marked inactive by a peer)"
}

func (e *RankError) Is(target error) bool { return target == ErrRankFailed }
func (e *RankError) Unwrap() error        { return e.Err }

// Config describes one rank of a group.
type Config struct {
	// Group names the group in the store; every rank uses the same name,
	// and a name is used for one group's lifetime (its records stay).
	Group string
	// Rank is this rank, WorldSize the initial number of ranks.
	Rank, WorldSize int
	// MaxWorldSize reserves slots for ranks that join later (inactive
	// until recovered); 0 means WorldSize.
	MaxWorldSize int
	// Engine moves the bytes; the group registers its buffers with it and
	// unregisters them on Close (the engine stays the caller's).
	Engine *engine.Engine
	// Store is the rendezvous: the metadata backend's key-value view
	// (meta.StoreOf of an etcd, HTTP or memory backend).
	Store meta.Store
	// Slots per peer mailbox (pipelining depth) and bytes per slot:
	// larger messages are cut into slot-sized pieces. Every rank must use
	// the same values. Defaults DefaultSlots and DefaultSlotSize.
	Slots, SlotSize int
	// Timeout: a peer that makes no progress this long while its engine
	// still answers is marked inactive (one whose engine is gone is
	// found by its failed writes within about PingInterval). Default 30 s.
	Timeout time.Duration
	// JoinTimeout bounds how long New waits for the other initial ranks
	// to publish themselves; then it fails with ErrJoinTimeout, naming
	// the ranks that never came. 0 waits until ctx ends.
	JoinTimeout time.Duration
	// SmallSize: all-reduces and broadcasts up to this many bytes use the
	// latency-bound algorithms (one round of direct messages), larger ones
	// the ring and the pipelined chain. Default 64 KiB.
	SmallSize int
}

func (c *Config) defaults() error {
	if c.Group == "" {
		c.Group = "default"
	}
	if c.MaxWorldSize == 0 {
		c.MaxWorldSize = c.WorldSize
	}
	if c.Slots == 0 {
		c.Slots = DefaultSlots
	}
	if c.SlotSize == 0 {
		c.SlotSize = DefaultSlotSize
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.SmallSize <= 0 {
		c.SmallSize = DefaultSmallSize
	}
	switch {
	case c.Engine == nil:
		return errors.New("no engine")
	case c.Store == nil:
		return errors.New("no rendezvous store")
	case c.WorldSize < 0 || c.MaxWorldSize < 1 || c.WorldSize > c.MaxWorldSize:
		return fmt.Errorf("world size %d, max world size %d: want 1 <= world size <= max world size", c.WorldSize, c.MaxWorldSize)
	case c.Rank < 0 || c.Rank >= c.MaxWorldSize:
		return fmt.Errorf("rank %d outside [0, %d)", c.Rank, c.MaxWorldSize)
	case c.Slots < 1 || c.Slots > MaxSlots:
		return fmt.Errorf("slots %d: want 1-%d", c.Slots, MaxSlots)
	case c.SlotSize < 64 || c.SlotSize%64 != 0:
		return fmt.Errorf("slot size %d: want a positive multiple of 64", c.SlotSize)
	}
	return nil
}

// Group is one rank's handle on a group. Collectives on a group are
// serialised (one at a time); every active rank calls the same sequence.
type Group struct {
	cfg     Config
	z       *rendezvous
	sub     string // "" for the root group, "sub<k>/" for a subgroup
	members []int  // root rank of each group rank
	rank    int
	lay     layout
	eng     *engine.Engine

	inbox *engine.Memory // peers write here (remote)
	words *engine.Memory // sources of flag, ack and ping writes (local)
	work  *engine.Memory // staging for outgoing data (local), grown on demand

	mu      sync.Mutex
	cur     *view // installed: what collectives run over
	next    *view // newer, read from the store, installed at the next collective
	peers   []*peer
	async   []asyncWrite
	pings   map[int]*engine.Batch
	nsub    int
	closed  bool
	evicted bool
	root    *Group // nil for the root group

	halt atomic.Bool // tests: stop as a crashed process would
}

// peer is the channel state towards one group rank.
type peer struct {
	info             rankInfo
	seg              *engine.Segment
	sendSeq, recvSeq uint32
}

type asyncWrite struct {
	peer int
	b    *engine.Batch
}

// view is the group's membership at one version.
type view struct {
	version uint32
	size    int
	active  []bool // per group rank, capacity long
	infos   []*rankInfo
	epochs  []int
}

func (v *view) activeRanks() []int {
	var out []int
	for r := 0; r < v.size; r++ {
		if v.active[r] {
			out = append(out, r)
		}
	}
	return out
}

// New creates rank cfg.Rank of a group of cfg.WorldSize ranks and returns
// once every initial rank has published itself (or ctx ends).
func New(ctx context.Context, cfg Config) (*Group, error) {
	g, err := open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if g.cfg.Rank >= g.cfg.WorldSize {
		g.release()
		return nil, fmt.Errorf("create group %q: rank %d is a reserved slot (world size %d): use JoinGroup", g.cfg.Group, g.cfg.Rank, g.cfg.WorldSize)
	}
	fail := func(err error) (*Group, error) {
		g.release()
		return nil, fmt.Errorf("create group %q rank %d: %w", g.cfg.Group, g.cfg.Rank, err)
	}
	var sr sizeRecord
	found, err := g.z.get(ctx, "size", &sr)
	if err != nil {
		return fail(err)
	}
	if !found {
		if err := g.z.put(ctx, "size", sizeRecord{Initial: cfg.WorldSize, Size: cfg.WorldSize}); err != nil {
			return fail(err)
		}
	} else if sr.Initial != g.cfg.WorldSize {
		return fail(fmt.Errorf("the group exists with world size %d, not %d", sr.Initial, g.cfg.WorldSize))
	}
	st := rankState{Active: true}
	if _, err := g.z.get(ctx, stateKey(g.cfg.Rank), &st); err != nil {
		return fail(err)
	}
	if !st.Active {
		return fail(fmt.Errorf("rank %d is inactive in the group (failed earlier): use JoinGroup", g.cfg.Rank))
	}
	if err := g.publish(ctx, st.Epoch); err != nil {
		return fail(err)
	}
	missing := func(v *view) []int {
		var out []int
		for r := 0; r < g.cfg.WorldSize; r++ {
			if !v.active[r] && v.infos[r] == nil {
				out = append(out, r)
			}
		}
		return out
	}
	actx, cancel := ctx, context.CancelFunc(func() {})
	if cfg.JoinTimeout > 0 {
		actx, cancel = context.WithTimeout(ctx, cfg.JoinTimeout)
	}
	v, err := g.await(actx, func(v *view) bool { return len(missing(v)) == 0 })
	cancel()
	if err != nil && ctx.Err() == nil && actx.Err() != nil {
		// The join timed out, not the caller: name who never came.
		if last, lerr := g.loadView(ctx); lerr == nil {
			return fail(fmt.Errorf("%w: %s of %d not there after %s", ErrJoinTimeout, RankNames(missing(last)), g.cfg.WorldSize, cfg.JoinTimeout))
		}
		return fail(fmt.Errorf("%w: not every rank of %d there after %s", ErrJoinTimeout, g.cfg.WorldSize, cfg.JoinTimeout))
	}
	if err != nil {
		return fail(err)
	}
	if err := g.install(ctx, v); err != nil {
		return fail(err)
	}
	return g, nil
}

// RankNames is "rank 1" or "ranks 1,3", as errors and reports name ranks.
func RankNames(ranks []int) string {
	s := make([]string, len(ranks))
	for i, r := range ranks {
		s[i] = strconv.Itoa(r)
	}
	if len(s) == 1 {
		return "rank " + s[0]
	}
	return "ranks " + strings.Join(s, ",")
}

// JoinGroup starts a rank in extension mode: it takes reserved or failed
// slot cfg.Rank, publishes itself and blocks until the healthy ranks have
// called GetPeerState and RecoverRanks for it (or ctx ends). WorldSize is
// ignored (the group's size is read from the store).
func JoinGroup(ctx context.Context, cfg Config) (*Group, error) {
	if cfg.WorldSize == 0 {
		cfg.WorldSize = 1
	}
	if cfg.WorldSize > cfg.MaxWorldSize && cfg.MaxWorldSize > 0 {
		cfg.WorldSize = cfg.MaxWorldSize
	}
	g, err := open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*Group, error) {
		g.release()
		return nil, fmt.Errorf("join group %q as rank %d: %w", g.cfg.Group, g.cfg.Rank, err)
	}
	sr, err := g.z.size(ctx)
	if err != nil {
		return fail(err)
	}
	g.cfg.WorldSize = sr.Initial
	st := rankState{Active: g.cfg.Rank < sr.Initial}
	if _, err := g.z.get(ctx, stateKey(g.cfg.Rank), &st); err != nil {
		return fail(err)
	}
	if st.Active {
		return fail(fmt.Errorf("rank %d is active: join a reserved or failed slot", g.cfg.Rank))
	}
	if err := g.publish(ctx, st.Epoch+1); err != nil {
		return fail(err)
	}
	slog.Info("coll: waiting to be recovered", "group", g.cfg.Group, "rank", g.cfg.Rank, "epoch", st.Epoch+1)
	v, err := g.await(ctx, func(v *view) bool { return v.active[g.rank] })
	if err != nil {
		return fail(err)
	}
	var n struct {
		Count int `json:"count"`
	}
	if _, err := g.z.get(ctx, "subgroups", &n); err != nil {
		return fail(err)
	}
	g.nsub = n.Count
	if err := g.install(ctx, v); err != nil {
		return fail(err)
	}
	return g, nil
}

// open validates cfg and registers the group's buffers.
func open(ctx context.Context, cfg Config) (*Group, error) {
	if err := cfg.defaults(); err != nil {
		return nil, fmt.Errorf("group %q: %w", cfg.Group, err)
	}
	members := make([]int, cfg.MaxWorldSize)
	for i := range members {
		members[i] = i
	}
	g := &Group{cfg: cfg, z: newRendezvous(cfg.Store, cfg.Group), members: members, rank: cfg.Rank, eng: cfg.Engine}
	if err := g.register(ctx); err != nil {
		return nil, fmt.Errorf("group %q: %w", cfg.Group, err)
	}
	return g, nil
}

func (g *Group) register(ctx context.Context) error {
	g.lay = newLayout(len(g.members), g.cfg.Slots, g.cfg.SlotSize)
	var err error
	if g.inbox, err = g.eng.RegisterMemory(ctx, g.lay.inboxLen, "cpu:0", true); err != nil {
		return fmt.Errorf("register inbox: %w", err)
	}
	if g.words, err = g.eng.RegisterMemory(ctx, g.lay.wordsLen, "cpu:0", false); err != nil {
		g.eng.UnregisterMemory(ctx, g.inbox)
		return fmt.Errorf("register flag words: %w", err)
	}
	g.peers = make([]*peer, len(g.members))
	g.pings = make(map[int]*engine.Batch)
	return nil
}

func (g *Group) publish(ctx context.Context, epoch int) error {
	return g.z.put(ctx, g.sub+"rank/"+strconv.Itoa(g.rank), rankInfo{
		Segment: g.eng.SegmentName(), Inbox: g.inbox.Addr(), InboxLen: g.inbox.Len(),
		Capacity: len(g.members), Slots: g.cfg.Slots, SlotSize: g.cfg.SlotSize, Epoch: epoch,
	})
}

// await polls the store until ok holds for the group's view.
func (g *Group) await(ctx context.Context, ok func(*view) bool) (*view, error) {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		v, err := g.loadView(ctx)
		if err != nil {
			return nil, err
		}
		if ok(v) {
			return v, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-tick.C:
		}
	}
}

// loadView reads the membership: the size, the root ranks' states, and
// this group's rank records. A rank is active when its state is active
// and its record belongs to its current epoch.
func (g *Group) loadView(ctx context.Context) (*view, error) {
	sr, err := g.z.size(ctx)
	if err != nil {
		return nil, err
	}
	rootCap := len(g.members)
	if g.root != nil {
		rootCap = len(g.root.members)
	}
	states, err := g.z.states(ctx, rootCap, sr.Initial)
	if err != nil {
		return nil, err
	}
	n := len(g.members)
	v := &view{size: sr.Size, active: make([]bool, n), infos: make([]*rankInfo, n), epochs: make([]int, n)}
	if g.root != nil {
		v.size = n
	}
	recs, err := g.z.records(ctx, g.sub+"rank/", n)
	if err != nil {
		return nil, err
	}
	v.version = uint32(v.size)
	for i, rr := range g.members {
		st := states[rr]
		v.epochs[i] = st.Epoch
		v.version += uint32(st.Epoch)
		if recs[i] != nil {
			info := new(rankInfo)
			if err := json.Unmarshal(recs[i], info); err != nil {
				return nil, fmt.Errorf("rendezvous record %srank/%d: %w", g.sub, i, err)
			}
			v.infos[i] = info
		}
		v.active[i] = st.Active && v.infos[i] != nil && v.infos[i].Epoch == st.Epoch && i < v.size
	}
	return v, nil
}

// install makes v the view collectives run over: channels towards every
// active peer start afresh at v's version, and each peer is told (by the
// ack words of its mailbox here) that it may write.
func (g *Group) install(ctx context.Context, v *view) error {
	for attempt := 0; ; attempt++ {
		if !v.active[g.rank] {
			g.evicted = true
			return ErrInactive
		}
		g.settle(ctx, v)
		failed := -1
		var ferr error
		for i := range g.peers {
			p := g.peers[i]
			if i == g.rank || !v.active[i] {
				if p != nil && p.seg != nil {
					p.seg.Close()
				}
				g.peers[i] = nil
				continue
			}
			info := *v.infos[i]
			if info.Capacity != g.lay.capacity || info.Slots != g.lay.slots || info.SlotSize != g.lay.slotSize {
				return fmt.Errorf("rank %d uses capacity %d, %d slots of %d bytes; this rank %d, %d of %d", i, info.Capacity, info.Slots, info.SlotSize, g.lay.capacity, g.lay.slots, g.lay.slotSize)
			}
			if p == nil || p.info != info {
				if p != nil && p.seg != nil {
					p.seg.Close()
				}
				seg, err := g.eng.OpenSegment(ctx, info.Segment)
				if err != nil {
					failed, ferr = i, err
					break
				}
				p = &peer{info: info, seg: seg}
				g.peers[i] = p
			}
			p.sendSeq, p.recvSeq = 0, 0
		}
		if failed >= 0 {
			if attempt >= len(g.peers) {
				return fmt.Errorf("rank %d: %w", failed, ferr)
			}
			slog.Warn("coll: peer unreachable at install", "group", g.cfg.Group, "rank", failed, "err", ferr)
			nv, err := g.markFailed(ctx, failed)
			if err != nil {
				return err
			}
			v = nv
			continue
		}
		break
	}
	g.cur, g.next = v, nil
	for i, p := range g.peers {
		if p == nil {
			continue
		}
		for s := 0; s < g.lay.slots; s++ {
			g.setWord(g.lay.ackSrc(i, s), pack(v.version, 0))
		}
		g.post(i, g.words.Addr()+uint64(g.lay.ackSrc(i, 0)), p, g.lay.ackOff(g.rank, 0), 8*g.lay.slots)
	}
	slog.Debug("coll: view installed", "group", g.cfg.Group, "rank", g.rank, "version", v.version, "active", v.activeRanks())
	return nil
}

// markFailed records root rank of group rank r as inactive and returns
// the store's view afterwards.
func (g *Group) markFailed(ctx context.Context, r int) (*view, error) {
	z, initial := g.z, g.cfg.WorldSize
	if g.root != nil {
		z, initial = g.root.z, g.root.cfg.WorldSize
	}
	if err := z.setState(ctx, g.members[r], initial, false); err != nil {
		return nil, err
	}
	return g.loadView(ctx)
}

// Rank is this rank in the group; Size the group's size (ranks of every
// state below it are addressed by rank in collectives' buffers).
func (g *Group) Rank() int { return g.rank }

// Size is the number of rank slots collectives address (initial world
// size, grown by ExtendGroupSizeTo and recoveries).
func (g *Group) Size() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.view().size
}

// ActiveRanks returns the active ranks, ascending: the mask collectives
// honour.
func (g *Group) ActiveRanks() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.view().activeRanks()
}

func (g *Group) view() *view {
	if g.next != nil {
		return g.next
	}
	return g.cur
}

// Refresh re-reads the membership from the store; the next collective
// runs over it. Collectives refresh by themselves when they wait on a
// peer, so this is only for callers that want ActiveRanks current.
func (g *Group) Refresh(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	v, err := g.loadView(ctx)
	if err != nil {
		return err
	}
	if v.version != g.cur.version {
		g.next = v
	}
	return nil
}

// GetPeerState reports, for each rank, whether it is up: a joining rank
// waits in JoinGroup for that slot, or it has been recovered already. Healthy ranks call it with the same ranks in
// the same order, then RecoverRanks.
func (g *Group) GetPeerState(ctx context.Context, ranks []int) ([]bool, error) {
	if g.root != nil {
		return nil, errors.New("get peer state: ranks join the root group, not a subgroup")
	}
	sr, err := g.z.size(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]bool, len(ranks))
	for i, r := range ranks {
		if r < 0 || r >= len(g.members) {
			return nil, fmt.Errorf("get peer state: rank %d outside [0, %d)", r, len(g.members))
		}
		st := rankState{Active: r < sr.Initial}
		if _, err := g.z.get(ctx, stateKey(r), &st); err != nil {
			return nil, err
		}
		var info rankInfo
		found, err := g.z.get(ctx, "rank/"+strconv.Itoa(r), &info)
		if err != nil {
			return nil, err
		}
		waiting := !st.Active && found && info.Epoch == st.Epoch+1
		// Already recovered by a faster healthy rank counts as ready too.
		up := st.Active && found && info.Epoch == st.Epoch
		out[i] = waiting || up
	}
	return out, nil
}

// RecoverRanks makes joined ranks active (growing the size when a rank
// is beyond it); the next collective includes them. Every healthy rank
// calls it with the same ranks, after GetPeerState said they wait.
func (g *Group) RecoverRanks(ctx context.Context, ranks []int) error {
	if g.root != nil {
		return errors.New("recover ranks: ranks join the root group, not a subgroup")
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.usable(); err != nil {
		return err
	}
	ready, err := g.GetPeerState(ctx, ranks)
	if err != nil {
		return fmt.Errorf("recover ranks: %w", err)
	}
	grow := 0
	for i, r := range ranks {
		if !ready[i] {
			return fmt.Errorf("recover rank %d: it has not joined (no JoinGroup waiting for this slot)", r)
		}
		if err := g.z.setState(ctx, r, g.cfg.WorldSize, true); err != nil {
			return fmt.Errorf("recover rank %d: %w", r, err)
		}
		grow = max(grow, r+1)
	}
	if err := g.growTo(ctx, grow); err != nil {
		return fmt.Errorf("recover ranks: %w", err)
	}
	v, err := g.loadView(ctx)
	if err != nil {
		return fmt.Errorf("recover ranks: %w", err)
	}
	return g.install(ctx, v)
}

// ExtendGroupSizeTo grows the group's size to n (at most MaxWorldSize):
// the new slots are inactive until ranks join them. Healthy ranks call it
// in the same order.
func (g *Group) ExtendGroupSizeTo(ctx context.Context, n int) error {
	if g.root != nil {
		return errors.New("extend group size: a subgroup's size is fixed")
	}
	if n < 1 || n > len(g.members) {
		return fmt.Errorf("extend group size to %d: want 1 to max world size %d", n, len(g.members))
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.usable(); err != nil {
		return err
	}
	if err := g.growTo(ctx, n); err != nil {
		return fmt.Errorf("extend group size to %d: %w", n, err)
	}
	v, err := g.loadView(ctx)
	if err != nil {
		return err
	}
	return g.install(ctx, v)
}

func (g *Group) growTo(ctx context.Context, n int) error {
	sr, err := g.z.size(ctx)
	if err != nil {
		return err
	}
	if n <= sr.Size {
		return nil
	}
	return g.z.put(ctx, "size", sizeRecord{Initial: sr.Initial, Size: n})
}

// NewSubgroup creates a group of the given ranks of g (group rank i of the
// subgroup is ranks[i]). Every active rank of g calls it, in the same
// order relative to other NewSubgroup calls; ranks not in the list get a
// nil group. Members inactive now stay inactive in the subgroup; a member
// that fails later is inactive in both.
func (g *Group) NewSubgroup(ctx context.Context, ranks []int) (*Group, error) {
	root := g
	if g.root != nil {
		root = g.root
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.usable(); err != nil {
		return nil, err
	}
	members := make([]int, len(ranks))
	me := -1
	for i, r := range ranks {
		if r < 0 || r >= len(g.members) || slices.Index(ranks[:i], r) >= 0 {
			return nil, fmt.Errorf("new subgroup: rank %d is outside the group or repeated", r)
		}
		members[i] = g.members[r]
		if r == g.rank {
			me = i
		}
	}
	root.nsub++ // the root counts every subgroup of the tree
	k := root.nsub
	if err := root.z.put(ctx, "subgroups", struct {
		Count int `json:"count"`
	}{k}); err != nil {
		return nil, fmt.Errorf("new subgroup: %w", err)
	}
	if me < 0 {
		return nil, nil
	}
	cfg := g.cfg
	cfg.Rank, cfg.WorldSize, cfg.MaxWorldSize = me, len(ranks), len(ranks)
	s := &Group{cfg: cfg, z: root.z, sub: fmt.Sprintf("sub%d/", k), members: members, rank: me, eng: g.eng, root: root}
	s.cfg.Group = fmt.Sprintf("%s/sub%d", root.cfg.Group, k)
	if err := s.register(ctx); err != nil {
		return nil, fmt.Errorf("new subgroup: %w", err)
	}
	cv := g.view()
	st, _ := root.z.states(ctx, len(root.members), root.cfg.WorldSize)
	epoch := 0
	if st != nil {
		epoch = st[s.members[me]].Epoch
	}
	if err := s.publish(ctx, epoch); err != nil {
		s.release()
		return nil, fmt.Errorf("new subgroup: %w", err)
	}
	v, err := s.await(ctx, func(v *view) bool {
		for i, r := range ranks {
			if cv.active[r] && v.infos[i] == nil {
				return false
			}
		}
		return true
	})
	if err == nil {
		err = s.install(ctx, v)
	}
	if err != nil {
		s.release()
		return nil, fmt.Errorf("new subgroup: %w", err)
	}
	return s, nil
}

func (g *Group) usable() error {
	switch {
	case g.closed:
		return ErrClosed
	case g.evicted:
		return ErrInactive
	}
	return nil
}

// Close releases the group's buffers (the engine stays open). Peers see
// this rank fail at their next collective with it.
func (g *Group) Close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil
	}
	g.closed = true
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	g.settle(ctx, nil)
	for _, p := range g.peers {
		if p != nil && p.seg != nil {
			p.seg.Close()
		}
	}
	return g.release()
}

// Finish ends the group's run on this rank, and every active rank calls
// it: after a barrier (every active rank is past its last collective)
// the rank records under done/<r> that it finished, and the one that
// finds every active rank done removes the group's records from the
// store. Then it closes the group. Records left in the store would be
// taken by the next group of that name for ranks present (New waits for
// a record per rank, and an old one passes) or say its ranks failed, so
// a name is free again only after a Finish. Root groups only.
func (g *Group) Finish(ctx context.Context) error {
	if g.root != nil {
		return errors.New("finish: a subgroup's records are its root group's")
	}
	var err error
	for range 4 {
		// A rank failing now fails the barrier; the survivors go again.
		if err = g.Barrier(ctx); !errors.Is(err, ErrRankFailed) {
			break
		}
	}
	if err != nil {
		g.Close()
		return fmt.Errorf("finish group %q rank %d: %w", g.cfg.Group, g.rank, err)
	}
	act := g.ActiveRanks()
	// Past the barrier the records go even when ctx ends now (an
	// interrupt): one rank's missing done record keeps them all.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.cfg.Timeout)
	defer cancel()
	if err := g.finished(fctx, act); err != nil {
		g.Close()
		return fmt.Errorf("finish group %q rank %d: %w", g.cfg.Group, g.rank, err)
	}
	return g.Close()
}

// finished records this rank done and removes the group's records when
// every rank of act is.
func (g *Group) finished(ctx context.Context, act []int) error {
	if err := g.z.put(ctx, "done/"+strconv.Itoa(g.rank), struct{}{}); err != nil {
		return err
	}
	recs, err := g.z.records(ctx, "done/", len(g.members))
	if err != nil {
		return err
	}
	for _, r := range act {
		if recs[r] == nil {
			return nil // a later rank removes them
		}
	}
	slog.Debug("coll: every rank finished, removing the group's records", "group", g.cfg.Group, "rank", g.rank)
	return g.z.removeAll(ctx, len(g.members))
}

func (g *Group) release() error {
	ctx := context.Background()
	var errs []error
	for _, m := range []*engine.Memory{g.work, g.words, g.inbox} {
		if m != nil {
			errs = append(errs, g.eng.UnregisterMemory(ctx, m))
		}
	}
	g.work, g.words, g.inbox = nil, nil, nil
	err := errors.Join(errs...)
	if errors.Is(err, engine.ErrEngineClosed) {
		return nil
	}
	return err
}
