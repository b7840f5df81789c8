package coll

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/kvcache-ops/mc/pkg/engine"
)

// layout places the mailboxes in a rank's inbox and the source words in
// its local word buffer. Every word is 8-byte aligned, so a peer's
// engine write of it lands as one store.
//
// inbox: ready[from][slot] | ack[to][slot] | ping | pad to 4 KiB | data[from][slot]
// words: flag[to][slot]    | ack[to][slot] | ping
type layout struct {
	capacity, slots, slotSize int
	hdr                       int
	inboxLen, wordsLen        int
}

func newLayout(capacity, slots, slotSize int) layout {
	l := layout{capacity: capacity, slots: slots, slotSize: slotSize}
	words := 2*capacity*slots + 1
	l.hdr = (words*8 + 4095) &^ 4095
	l.inboxLen = l.hdr + capacity*slots*slotSize
	l.wordsLen = words * 8
	return l
}

func (l layout) readyOff(from, s int) int { return (from*l.slots + s) * 8 }
func (l layout) ackOff(to, s int) int     { return (l.capacity*l.slots + to*l.slots + s) * 8 }
func (l layout) pingOff() int             { return 2 * l.capacity * l.slots * 8 }
func (l layout) dataOff(from, s int) int  { return l.hdr + (from*l.slots+s)*l.slotSize }

// The word buffer mirrors the header: flag sources where ready words are,
// ack sources where ack words are.
func (l layout) flagSrc(to, s int) int { return l.readyOff(to, s) }
func (l layout) ackSrc(to, s int) int  { return l.ackOff(to, s) }

// A flag or ack word: the view version in the high half, so words left
// over from an earlier view never match, and the message sequence number
// of the channel in the low half.
func pack(version, seq uint32) uint64 { return uint64(version)<<32 | uint64(seq) }

func wordAt(m *engine.Memory, off int) *uint64 {
	return (*uint64)(unsafe.Pointer(&m.Bytes()[off]))
}

func (g *Group) setWord(off int, v uint64) { atomic.StoreUint64(wordAt(g.words, off), v) }
func (g *Group) inboxWord(off int) uint64  { return atomic.LoadUint64(wordAt(g.inbox, off)) }

// maxRequest bounds one engine request, so a slot's bytes spread over the
// engine's TCP lanes.
const maxRequest = 1 << 20

// span is a piece of registered local memory.
type span struct {
	addr uint64
	n    int
}

// write submits engine writes of n bytes from local address src to the
// peer's inbox at offset off.
func (g *Group) write(src uint64, p *peer, off, n int) *engine.Batch {
	return g.writeSpans([]span{{src, n}}, p, off)
}

// writeSpans writes the pieces back to back into the peer's inbox from
// offset off, cut into requests of at most maxRequest bytes.
func (g *Group) writeSpans(pieces []span, p *peer, off int) *engine.Batch {
	k := 0
	for _, sp := range pieces {
		k += (sp.n + maxRequest - 1) / maxRequest
	}
	b, err := g.eng.AllocateBatch(max(k, 1))
	if err != nil {
		return nil
	}
	reqs := make([]engine.Request, 0, k)
	dst := p.info.Inbox + uint64(off)
	for _, sp := range pieces {
		for done := 0; done < sp.n; done += maxRequest {
			l := min(maxRequest, sp.n-done)
			reqs = append(reqs, engine.Request{Op: engine.Write, Source: sp.addr + uint64(done), Segment: p.seg, Target: dst, Length: uint64(l)})
			dst += uint64(l)
		}
	}
	if _, err := b.Submit(reqs...); err != nil {
		return nil
	}
	return b
}

// post submits a write whose completion nobody waits for now: flags, acks
// and hellos. Failures surface when the write is reaped.
func (g *Group) post(peerRank int, src uint64, p *peer, off, n int) {
	g.async = append(g.async, asyncWrite{peer: peerRank, b: g.write(src, p, off, n)})
}

// batchErr is the outcome of a finished batch (nil batch: the engine
// refused it, which only happens once it is closed).
func batchErr(b *engine.Batch) error {
	if b == nil {
		return engine.ErrEngineClosed
	}
	return b.Wait(context.Background())
}

func done(b *engine.Batch) bool { return b == nil || b.Pending() == 0 }

// reap drops finished posted writes and returns the first failed one's
// peer (-1 if none).
func (g *Group) reap() (int, error) {
	keep := g.async[:0]
	bad, berr := -1, error(nil)
	for _, a := range g.async {
		if !done(a.b) {
			keep = append(keep, a)
			continue
		}
		if err := batchErr(a.b); err != nil && bad < 0 {
			bad, berr = a.peer, err
		}
	}
	clear(g.async[len(keep):])
	g.async = keep
	return bad, berr
}

// settle waits (bounded) for posted writes to peers still active in v
// (all of them when v is nil) and forgets the rest: a write to a failed
// peer may hang until its TCP status timeout. Waiting matters because
// channels restart at a new version: a late write of the old one must not
// land on top of the new one's.
func (g *Group) settle(ctx context.Context, v *view) {
	deadline := time.Now().Add(g.cfg.Timeout)
	for _, a := range g.async {
		if a.b == nil || (v != nil && !v.active[a.peer]) {
			continue
		}
		for !done(a.b) && time.Now().Before(deadline) && ctx.Err() == nil {
			time.Sleep(50 * time.Microsecond)
		}
	}
	clear(g.async)
	g.async = g.async[:0]
}

// sendOp streams n bytes to a peer, one slot-sized message at a time, at
// most slots messages in flight: the bytes at local address src, or the
// concatenation of spans when set (a ring's chunks, which lie apart).
// avail, when set, is how many bytes are ready (a forwarding rank sends
// what it has received).
type sendOp struct {
	peer  int
	src   uint64
	spans []span
	n     int
	avail *int

	next     int
	ends     []int
	inflight []inflight
}

type inflight struct {
	seq  uint32
	slot int
	b    *engine.Batch
}

// recvOp takes n bytes from a peer, handing each slot's bytes to fn with
// their offset in the message before the slot is released. ends are the
// stream's segment ends, as the sender's spans (nil: one segment).
type recvOp struct {
	peer int
	n    int
	fn   func(off int, b []byte)
	ends []int
	got  int
}

// msgEnd is where the message starting at pos ends: one slot, never across
// a segment end, so a forwarding rank's messages map one to one onto the
// ones it receives (a message straddling two would wait on bytes the
// sender itself waits for: around a ring, a deadlock).
func msgEnd(pos, n, slot int, ends []int) int {
	end := min(pos+slot, n)
	for _, e := range ends {
		if e > pos {
			return min(end, e)
		}
	}
	return end
}

func spanEnds(spans []span) []int {
	if spans == nil {
		return nil
	}
	ends := make([]int, len(spans))
	pos := 0
	for i, sp := range spans {
		pos += sp.n
		ends[i] = pos
	}
	return ends
}

func (s *sendOp) finished() bool { return s.next >= s.n && len(s.inflight) == 0 }

// pieces returns the memory of stream bytes [from, to).
func (s *sendOp) pieces(from, to int) []span {
	if s.spans == nil {
		return []span{{s.src + uint64(from), to - from}}
	}
	var out []span
	pos := 0
	for _, sp := range s.spans {
		lo, hi := max(from, pos), min(to, pos+sp.n)
		if lo < hi {
			out = append(out, span{sp.addr + uint64(lo-pos), hi - lo})
		}
		pos += sp.n
		if pos >= to {
			break
		}
	}
	return out
}

// Polling: an idle wait yields (runtime.Gosched) a few rounds, so a word
// that lands within microseconds is seen at once, then sleeps for a
// microsecond at a time. A Go timer on an otherwise idle process fires
// late (the runtime's poller sleeps in whole milliseconds), but what ends
// a wait here is always bytes arriving on one of this process's engine
// sockets (the peer's write to the inbox, or the reply to this rank's
// write): that socket event wakes the runtime, which then runs the long
// expired timer, so the nap lasts about as long as the wait for the bytes.
// Longer spinning starves the engine goroutines that bring them (and
// peers on the same cores). Store polls and pings only start once a wait
// is slowAfter long.
const (
	spinRounds   = 16
	nap          = time.Microsecond
	maxNap       = 100 * time.Microsecond
	slowAfter    = 2 * time.Millisecond
	storeEvery   = 50 * time.Millisecond
	PingInterval = 200 * time.Millisecond
)

// errHalted ends the collectives of a group halted by a test that
// simulates a crash: the rank stops where it is, touching nothing more.
var errHalted = errors.New("rank halted")

// exchange runs sends and recvs (at most one of each per peer) to
// completion under the installed view.
func (g *Group) exchange(ctx context.Context, sends []*sendOp, recvs []*recvOp) error {
	v := g.cur
	ver := v.version
	K := uint32(g.lay.slots)
	me := g.rank
	// A failed exchange leaves data writes in flight: they join the posted
	// writes, so the next view's install waits for them to land rather
	// than have them overwrite the new view's first messages.
	defer func() {
		for _, s := range sends {
			for _, c := range s.inflight {
				g.async = append(g.async, asyncWrite{peer: s.peer, b: c.b})
			}
		}
	}()
	// A posted write of an earlier collective that failed means its peer
	// is gone: everyone should learn it now.
	if bad, err := g.reap(); bad >= 0 && v.active[bad] {
		return g.peerFailed(ctx, bad, err)
	}
	idle := 0
	lastProgress := time.Now()
	lastStore := lastProgress
	lastPing := lastProgress
	for {
		if g.halt.Load() {
			return errHalted
		}
		progress, pending := false, false
		for _, s := range sends {
			if s.finished() {
				continue
			}
			pending = true
			p := g.peers[s.peer]
			for len(s.inflight) > 0 && done(s.inflight[0].b) {
				c := s.inflight[0]
				if err := batchErr(c.b); err != nil {
					return g.peerFailed(ctx, s.peer, err)
				}
				// The data is in the peer's slot: now say so.
				off := g.lay.flagSrc(s.peer, c.slot)
				g.setWord(off, pack(ver, c.seq))
				g.post(s.peer, g.words.Addr()+uint64(off), p, g.lay.readyOff(me, c.slot), 8)
				s.inflight = s.inflight[1:]
				progress = true
			}
			if s.spans != nil && s.ends == nil {
				s.ends = spanEnds(s.spans)
			}
			for s.next < s.n && len(s.inflight) < int(K) {
				end := msgEnd(s.next, s.n, g.lay.slotSize, s.ends)
				if s.avail != nil && *s.avail < end {
					break
				}
				seq := p.sendSeq + 1
				slot := int(seq % K)
				need := pack(ver, 0)
				if seq > K {
					need = pack(ver, seq-K)
				}
				// An ack word of a newer version is a peer that moved on
				// (a hello): it reads nothing more of this version.
				if w := g.inboxWord(g.lay.ackOff(s.peer, slot)); w < need {
					break
				}
				p.sendSeq = seq
				b := g.writeSpans(s.pieces(s.next, end), p, g.lay.dataOff(me, slot))
				s.inflight = append(s.inflight, inflight{seq: seq, slot: slot, b: b})
				s.next = end
				progress = true
			}
			if !s.finished() {
				pending = true
			}
		}
		for _, r := range recvs {
			if r.got >= r.n {
				continue
			}
			p := g.peers[r.peer]
			for r.got < r.n {
				seq := p.recvSeq + 1
				slot := int(seq % K)
				if g.inboxWord(g.lay.readyOff(r.peer, slot)) != pack(ver, seq) {
					break
				}
				l := msgEnd(r.got, r.n, g.lay.slotSize, r.ends) - r.got
				off := g.lay.dataOff(r.peer, slot)
				r.fn(r.got, g.inbox.Bytes()[off:off+l])
				p.recvSeq = seq
				r.got += l
				aoff := g.lay.ackSrc(r.peer, slot)
				g.setWord(aoff, pack(ver, seq))
				g.post(r.peer, g.words.Addr()+uint64(aoff), p, g.lay.ackOff(me, slot), 8)
				progress = true
			}
			if r.got < r.n {
				pending = true
			}
		}
		if !pending {
			// Posted writes still running are reaped by the next
			// exchange: an ack to a peer that has finished (and may
			// have left) must not fail a collective that is done.
			return nil
		}
		now := time.Now()
		if progress {
			idle = 0
			lastProgress = now
			continue
		}
		if idle++; idle < spinRounds {
			runtime.Gosched()
			continue
		}
		// Doubling naps: short ones while a reply is likely, longer
		// ones so that many idle ranks in one process leave the runtime
		// time to poll its sockets.
		time.Sleep(min(nap<<min(idle-spinRounds, 16), maxNap))
		waited := now.Sub(lastProgress)
		if waited < slowAfter {
			continue
		}
		// Slow path: this wait is long enough to be worth asking why.
		if err := ctx.Err(); err != nil {
			return g.abandon(err)
		}
		if bad, err := g.reap(); bad >= 0 {
			return g.peerFailed(ctx, bad, err)
		}
		waitingOn := waitingOn(sends, recvs)
		if now.Sub(lastStore) >= storeEvery {
			lastStore = now
			if err := g.checkView(ctx, v); err != nil {
				return err
			}
		}
		if waited >= PingInterval && now.Sub(lastPing) >= PingInterval {
			lastPing = now
			if bad, err := g.ping(waitingOn); bad >= 0 {
				return g.peerFailed(ctx, bad, err)
			}
		}
		if waited >= g.cfg.Timeout && len(waitingOn) > 0 {
			return g.peerFailed(ctx, waitingOn[0], fmt.Errorf("no progress for %v", waited.Round(time.Millisecond)))
		}
	}
}

// waitingOn lists the peers an exchange still waits for, receivers'
// senders first (a silent sender is the likelier culprit).
func waitingOn(sends []*sendOp, recvs []*recvOp) []int {
	var out []int
	for _, r := range recvs {
		if r.got < r.n && !slices.Contains(out, r.peer) {
			out = append(out, r.peer)
		}
	}
	for _, s := range sends {
		if !s.finished() && !slices.Contains(out, s.peer) {
			out = append(out, s.peer)
		}
	}
	return out
}

// ping writes a word into each waited-on peer's inbox: an engine that is
// gone (process killed, engine closed) fails the write at once, so a
// dead peer is found within PingInterval rather than at the timeout.
func (g *Group) ping(peers []int) (int, error) {
	for _, r := range peers {
		if b, ok := g.pings[r]; ok {
			if !done(b) {
				continue
			}
			delete(g.pings, r)
			if err := batchErr(b); err != nil {
				return r, err
			}
		}
		if p := g.peers[r]; p != nil {
			g.pings[r] = g.write(g.words.Addr()+uint64(g.lay.wordsLen-8), p, g.lay.pingOff(), 8)
		}
	}
	return -1, nil
}

// checkView reads the membership; a participant of v that is now inactive
// fails the collective.
func (g *Group) checkView(ctx context.Context, v *view) error {
	nv, err := g.loadView(ctx)
	if err != nil {
		slog.Warn("coll: membership read failed", "group", g.cfg.Group, "err", err)
		return nil
	}
	if nv.version == v.version {
		return nil
	}
	g.next = nv
	if !nv.active[g.rank] {
		g.evicted = true
		return ErrInactive
	}
	if gone := lost(v, nv); len(gone) > 0 {
		return &RankError{Ranks: gone}
	}
	return nil
}

func lost(v, nv *view) []int {
	var out []int
	for r, a := range v.active {
		if a && !nv.active[r] {
			out = append(out, r)
		}
	}
	return out
}

// peerFailed marks rank r inactive for everyone and fails the collective
// naming every participant lost by then.
func (g *Group) peerFailed(ctx context.Context, r int, cause error) error {
	slog.Warn("coll: peer failed", "group", g.cfg.Group, "rank", g.rank, "peer", r, "err", cause)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.cfg.Timeout)
	defer cancel()
	nv, err := g.markFailed(sctx, r)
	if err != nil {
		return &RankError{Ranks: []int{r}, Err: fmt.Errorf("%w (and recording it failed: %v)", cause, err)}
	}
	g.next = nv
	if !nv.active[g.rank] {
		g.evicted = true
	}
	gone := lost(g.cur, nv)
	if !slices.Contains(gone, r) {
		gone = append(gone, r)
		slices.Sort(gone)
	}
	return &RankError{Ranks: gone, Err: fmt.Errorf("rank %d: %w", r, cause)}
}

// abandon handles a collective this rank gives up (ctx ended): its
// channels are now out of step with its peers', so it leaves the group
// (marks itself inactive) rather than corrupt the next collective.
func (g *Group) abandon(cause error) error {
	ctx, cancel := context.WithTimeout(context.Background(), g.cfg.Timeout)
	defer cancel()
	if _, err := g.markFailed(ctx, g.rank); err != nil {
		slog.Warn("coll: could not record leaving the group", "group", g.cfg.Group, "rank", g.rank, "err", err)
	}
	g.evicted = true
	return fmt.Errorf("collective abandoned, rank %d left the group: %w", g.rank, cause)
}

// begin starts a collective: the group must be usable, and a newer view
// learnt since the last one is installed.
func (g *Group) begin(ctx context.Context) error {
	if err := g.usable(); err != nil {
		return err
	}
	if g.next != nil && g.next.version != g.cur.version {
		if err := g.install(ctx, g.next); err != nil {
			if errors.Is(err, ErrInactive) {
				return err
			}
			return fmt.Errorf("install membership: %w", err)
		}
	}
	return nil
}

// staging returns n bytes of registered local memory for outgoing data,
// growing the work buffer when needed.
func (g *Group) staging(ctx context.Context, n int) ([]byte, uint64, error) {
	if n == 0 {
		return nil, 0, nil
	}
	if g.work == nil || g.work.Len() < n {
		size := 1 << 16
		for size < n {
			size <<= 1
		}
		m, err := g.eng.RegisterMemory(ctx, size, "cpu:0", false)
		if err != nil {
			return nil, 0, fmt.Errorf("staging buffer: %w", err)
		}
		if g.work != nil {
			// Writes to failed peers may still hold it: then it stays
			// registered until the engine closes.
			if err := g.eng.UnregisterMemory(ctx, g.work); err != nil {
				slog.Debug("coll: old staging buffer kept", "err", err)
			}
		}
		g.work = m
	}
	return g.work.Bytes()[:n], g.work.Addr(), nil
}

// source returns registered memory holding buf's bytes to send from: buf
// itself when it lies in memory registered with the group's engine (no
// copy: the caller registered its buffers, as with NCCL), else the staging
// buffer with buf copied in (staged true).
func (g *Group) source(ctx context.Context, buf []byte) (work []byte, addr uint64, staged bool, err error) {
	if a, ok := g.registered(buf); ok {
		return buf, a, false, nil
	}
	work, addr, err = g.staging(ctx, len(buf))
	if err != nil {
		return nil, 0, false, err
	}
	copy(work, buf)
	return work, addr, true, nil
}

func (g *Group) registered(buf []byte) (uint64, bool) {
	if len(buf) == 0 {
		return 0, false
	}
	a := uint64(uintptr(unsafe.Pointer(&buf[0])))
	if a%8 != 0 {
		return 0, false // reductions read it as elements: stage it
	}
	for _, m := range g.eng.Memory() {
		if m == g.inbox || m == g.words || m == g.work {
			continue
		}
		if a >= m.Addr() && a+uint64(len(buf)) <= m.Addr()+uint64(m.Len()) {
			return a, true
		}
	}
	return 0, false
}
