package coll

import (
	"context"
	"fmt"
	"slices"
)

// Buffers of the rooted and all-to-all collectives are indexed by group
// rank over Size() slots; blocks of inactive ranks are neither sent nor
// written. On error, output buffers (and in-place ones) hold unspecified
// bytes.

// run serialises a collective and starts it over the installed view; f
// gets the active ranks and this rank's index among them.
func (g *Group) run(ctx context.Context, f func(act []int, mi int) error) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.begin(ctx); err != nil {
		return err
	}
	act := g.cur.activeRanks()
	return f(act, slices.Index(act, g.rank))
}

func mod(a, n int) int { return ((a % n) + n) % n }

func (g *Group) checkRoot(root int) error {
	if root < 0 || root >= g.cur.size {
		return fmt.Errorf("root %d outside the group of %d", root, g.cur.size)
	}
	if !g.cur.active[root] {
		return fmt.Errorf("root %d is inactive: %w", root, ErrRankFailed)
	}
	return nil
}

func (g *Group) checkBlocks(what string, n, per int) error {
	if n != per*g.cur.size {
		return fmt.Errorf("%s: %d bytes, want %d (block of %d x group size %d)", what, n, per*g.cur.size, per, g.cur.size)
	}
	return nil
}

func checkElems(buf []byte, dt DType, op ReduceOp) error {
	if err := checkTypes(dt, op); err != nil {
		return err
	}
	if len(buf)%dt.Size() != 0 {
		return fmt.Errorf("buffer of %d bytes is not a whole number of %v", len(buf), dt)
	}
	return nil
}

// copyTo is a recv callback that copies into dst at the message offset.
func copyTo(dst []byte) func(int, []byte) {
	return func(off int, b []byte) { copy(dst[off:], b) }
}

// AllReduce replaces buf on every active rank with the element-wise
// reduction of all active ranks' buf.
func (g *Group) AllReduce(ctx context.Context, buf []byte, dt DType, op ReduceOp) error {
	if err := checkElems(buf, dt, op); err != nil {
		return fmt.Errorf("all_reduce: %w", err)
	}
	return g.run(ctx, func(act []int, mi int) error {
		if len(act) == 1 || len(buf) == 0 {
			return nil
		}
		if len(buf) <= g.cfg.SmallSize {
			return g.reduceDirect(ctx, act, mi, buf, dt, op, -1)
		}
		work, addr, staged, err := g.source(ctx, buf)
		if err != nil {
			return err
		}
		es, P := dt.Size(), len(act)
		cnt := len(buf) / es
		bounds := func(c int) (int, int) { return c * cnt / P * es, (c + 1) * cnt / P * es }
		if err := g.ring(ctx, act, mi, work, addr, bounds, true, true, dt, op); err != nil {
			return err
		}
		if staged {
			copy(buf, work)
		}
		return nil
	})
}

// reduceDirect is the latency-bound reduction: one round in which every
// contributor sends its buffer to every receiver (all ranks, or root), and
// receivers reduce in rank order, so every rank gets the same bits.
func (g *Group) reduceDirect(ctx context.Context, act []int, mi int, buf []byte, dt DType, op ReduceOp, root int) error {
	work, addr, err := g.staging(ctx, len(buf))
	if err != nil {
		return err
	}
	copy(work, buf)
	parts := make([][]byte, len(act))
	parts[mi] = work
	var sends []*sendOp
	var recvs []*recvOp
	for j, r := range act {
		if j == mi {
			continue
		}
		if root < 0 || r == root {
			sends = append(sends, &sendOp{peer: r, src: addr, n: len(buf)})
		}
		if root < 0 || g.rank == root {
			parts[j] = make([]byte, len(buf))
			recvs = append(recvs, &recvOp{peer: r, n: len(buf), fn: copyTo(parts[j])})
		}
	}
	if err := g.exchange(ctx, sends, recvs); err != nil {
		return err
	}
	if root >= 0 && g.rank != root {
		return nil
	}
	// Reduce in a fresh (aligned) buffer: buf may start anywhere.
	acc := make([]byte, len(buf))
	copy(acc, parts[0])
	for _, p := range parts[1:] {
		reduceInto(dt, op, acc, p)
	}
	copy(buf, acc)
	return nil
}

// ring runs a ring's reduce-scatter pass (after which the rank at index i
// of act holds chunk i reduced over act) and/or its all-gather pass
// (which circulates chunk i from the rank at index i to all). Both run as
// one stream to the right neighbour and one from the left, not step by
// step: every chunk a rank sends after its first is the one it has just
// received (and reduced), so each slot is forwarded as soon as it is
// processed and the pipeline never drains between steps.
func (g *Group) ring(ctx context.Context, act []int, mi int, work []byte, addr uint64, bounds func(int) (int, int), rs, ag bool, dt DType, op ReduceOp) error {
	P := len(act)
	if P == 1 {
		return nil
	}
	type seg struct {
		lo, hi int
		reduce bool
	}
	var sendSegs, recvSegs []seg
	add := func(sendChunk, recvChunk int, reduce bool) {
		s0, s1 := bounds(mod(sendChunk, P))
		r0, r1 := bounds(mod(recvChunk, P))
		sendSegs = append(sendSegs, seg{s0, s1, false})
		recvSegs = append(recvSegs, seg{r0, r1, reduce})
	}
	for k := 0; rs && k < P-1; k++ {
		add(mi-k-1, mi-k-2, true)
	}
	for k := 0; ag && k < P-1; k++ {
		add(mi-k, mi-k-1, false)
	}
	send := &sendOp{peer: act[mod(mi+1, P)]}
	for _, sg := range sendSegs {
		send.spans = append(send.spans, span{addr + uint64(sg.lo), sg.hi - sg.lo})
		send.n += sg.hi - sg.lo
	}
	first := sendSegs[0].hi - sendSegs[0].lo
	have := first
	send.avail = &have
	recv := &recvOp{peer: act[mod(mi-1, P)]}
	for _, sg := range recvSegs {
		recv.n += sg.hi - sg.lo
		recv.ends = append(recv.ends, recv.n)
	}
	ri, segStart := 0, 0
	recv.fn = func(off int, b []byte) {
		end := off + len(b)
		for len(b) > 0 {
			for off >= segStart+recvSegs[ri].hi-recvSegs[ri].lo {
				segStart += recvSegs[ri].hi - recvSegs[ri].lo
				ri++
			}
			sg := recvSegs[ri]
			within := off - segStart
			l := min(len(b), sg.hi-sg.lo-within)
			dst := work[sg.lo+within : sg.lo+within+l]
			if sg.reduce {
				reduceInto(dt, op, dst, b[:l])
			} else {
				copy(dst, b[:l])
			}
			off += l
			b = b[l:]
		}
		have = first + end
	}
	var sends []*sendOp
	var recvs []*recvOp
	if send.n > 0 {
		sends = []*sendOp{send}
	}
	if recv.n > 0 {
		recvs = []*recvOp{recv}
	}
	return g.exchange(ctx, sends, recvs)
}

// Broadcast copies root's buf to every active rank's buf: directly from
// the root when small, else along a pipelined chain (each rank forwards a
// slot as soon as it has it).
func (g *Group) Broadcast(ctx context.Context, buf []byte, root int) error {
	return g.run(ctx, func(act []int, mi int) error {
		if err := g.checkRoot(root); err != nil {
			return fmt.Errorf("broadcast: %w", err)
		}
		P := len(act)
		if P == 1 || len(buf) == 0 {
			return nil
		}
		if len(buf) <= g.cfg.SmallSize || P == 2 {
			if g.rank != root {
				return g.exchange(ctx, nil, []*recvOp{{peer: root, n: len(buf), fn: copyTo(buf)}})
			}
			_, addr, _, err := g.source(ctx, buf)
			if err != nil {
				return err
			}
			var sends []*sendOp
			for _, r := range act {
				if r != root {
					sends = append(sends, &sendOp{peer: r, src: addr, n: len(buf)})
				}
			}
			return g.exchange(ctx, sends, nil)
		}
		ri := slices.Index(act, root)
		pos := mod(mi-ri, P) // position in the chain root, root+1, ...
		next, prev := act[mod(mi+1, P)], act[mod(mi-1, P)]
		if pos == P-1 {
			return g.exchange(ctx, nil, []*recvOp{{peer: prev, n: len(buf), fn: copyTo(buf)}})
		}
		if pos == 0 {
			_, addr, _, err := g.source(ctx, buf)
			if err != nil {
				return err
			}
			return g.exchange(ctx, []*sendOp{{peer: next, src: addr, n: len(buf)}}, nil)
		}
		// A forwarder receives into registered memory and sends from it.
		work, addr, inPlace := buf, uint64(0), false
		if addr, inPlace = g.registered(buf); !inPlace {
			var err error
			if work, addr, err = g.staging(ctx, len(buf)); err != nil {
				return err
			}
		}
		have := 0
		recv := &recvOp{peer: prev, n: len(buf), fn: func(off int, b []byte) {
			copy(work[off:], b)
			have = off + len(b)
		}}
		if err := g.exchange(ctx, []*sendOp{{peer: next, src: addr, n: len(buf), avail: &have}}, []*recvOp{recv}); err != nil {
			return err
		}
		if !inPlace {
			copy(buf, work)
		}
		return nil
	})
}

// AllGather gathers every active rank's send into recv at its rank's
// block: len(recv) = len(send) x Size(). A ring over the active ranks.
func (g *Group) AllGather(ctx context.Context, send, recv []byte) error {
	return g.run(ctx, func(act []int, mi int) error {
		b := len(send)
		if err := g.checkBlocks("all_gather recv", len(recv), b); err != nil {
			return err
		}
		copy(recv[g.rank*b:], send)
		work, addr, staged, err := g.source(ctx, recv)
		if err != nil {
			return err
		}
		bounds := func(c int) (int, int) { return act[c] * b, (act[c] + 1) * b }
		if err := g.ring(ctx, act, mi, work, addr, bounds, false, true, 0, 0); err != nil {
			return err
		}
		if staged {
			for _, r := range act {
				copy(recv[r*b:(r+1)*b], work[r*b:])
			}
		}
		return nil
	})
}

// ReduceScatter reduces send (Size() blocks of len(recv)) over the active
// ranks; each rank gets its own block's reduction in recv.
func (g *Group) ReduceScatter(ctx context.Context, send, recv []byte, dt DType, op ReduceOp) error {
	if err := checkElems(recv, dt, op); err != nil {
		return fmt.Errorf("reduce_scatter: %w", err)
	}
	return g.run(ctx, func(act []int, mi int) error {
		b := len(recv)
		if err := g.checkBlocks("reduce_scatter send", len(send), b); err != nil {
			return err
		}
		work, addr, err := g.staging(ctx, len(send))
		if err != nil {
			return err
		}
		copy(work, send)
		bounds := func(c int) (int, int) { return act[c] * b, (act[c] + 1) * b }
		if err := g.ring(ctx, act, mi, work, addr, bounds, true, false, dt, op); err != nil {
			return err
		}
		copy(recv, work[g.rank*b:])
		return nil
	})
}

// AllToAll sends block j of send to rank j, which stores it as block i of
// its recv (i the sender): len(send) = len(recv) = block x Size().
func (g *Group) AllToAll(ctx context.Context, send, recv []byte) error {
	return g.run(ctx, func(act []int, mi int) error {
		if len(send) != len(recv) || len(send)%g.cur.size != 0 {
			return fmt.Errorf("all_to_all: send %d and recv %d bytes: want equal, a multiple of group size %d", len(send), len(recv), g.cur.size)
		}
		b := len(send) / g.cur.size
		work, addr, _, err := g.source(ctx, send)
		if err != nil {
			return err
		}
		var sends []*sendOp
		var recvs []*recvOp
		for _, r := range act {
			if r == g.rank || b == 0 {
				continue
			}
			sends = append(sends, &sendOp{peer: r, src: addr + uint64(r*b), n: b})
			recvs = append(recvs, &recvOp{peer: r, n: b, fn: copyTo(recv[r*b : (r+1)*b])})
		}
		if err := g.exchange(ctx, sends, recvs); err != nil {
			return err
		}
		copy(recv[g.rank*b:(g.rank+1)*b], work[g.rank*b:])
		return nil
	})
}

// Reduce leaves the reduction of every active rank's buf in root's buf
// (others' buf is unchanged).
func (g *Group) Reduce(ctx context.Context, buf []byte, root int, dt DType, op ReduceOp) error {
	if err := checkElems(buf, dt, op); err != nil {
		return fmt.Errorf("reduce: %w", err)
	}
	return g.run(ctx, func(act []int, mi int) error {
		if err := g.checkRoot(root); err != nil {
			return fmt.Errorf("reduce: %w", err)
		}
		if len(act) == 1 || len(buf) == 0 {
			return nil
		}
		return g.reduceDirect(ctx, act, mi, buf, dt, op, root)
	})
}

// Gather collects every active rank's send into root's recv at the
// sender's block (len(recv) = len(send) x Size(); recv is only used on
// root).
func (g *Group) Gather(ctx context.Context, send, recv []byte, root int) error {
	return g.run(ctx, func(act []int, mi int) error {
		if err := g.checkRoot(root); err != nil {
			return fmt.Errorf("gather: %w", err)
		}
		b := len(send)
		if g.rank != root {
			if b == 0 {
				return nil
			}
			work, addr, err := g.staging(ctx, b)
			if err != nil {
				return err
			}
			copy(work, send)
			return g.exchange(ctx, []*sendOp{{peer: root, src: addr, n: b}}, nil)
		}
		if err := g.checkBlocks("gather recv", len(recv), b); err != nil {
			return err
		}
		var recvs []*recvOp
		for _, r := range act {
			if r != root && b > 0 {
				recvs = append(recvs, &recvOp{peer: r, n: b, fn: copyTo(recv[r*b : (r+1)*b])})
			}
		}
		copy(recv[root*b:], send)
		return g.exchange(ctx, nil, recvs)
	})
}

// Scatter sends block r of root's send (Size() blocks of len(recv)) to
// rank r's recv.
func (g *Group) Scatter(ctx context.Context, send, recv []byte, root int) error {
	return g.run(ctx, func(act []int, mi int) error {
		if err := g.checkRoot(root); err != nil {
			return fmt.Errorf("scatter: %w", err)
		}
		b := len(recv)
		if g.rank != root {
			if b == 0 {
				return nil
			}
			return g.exchange(ctx, nil, []*recvOp{{peer: root, n: b, fn: copyTo(recv)}})
		}
		if err := g.checkBlocks("scatter send", len(send), b); err != nil {
			return err
		}
		work, addr, err := g.staging(ctx, len(send))
		if err != nil {
			return err
		}
		copy(work, send)
		var sends []*sendOp
		for _, r := range act {
			if r != root && b > 0 {
				sends = append(sends, &sendOp{peer: r, src: addr + uint64(r*b), n: b})
			}
		}
		copy(recv, send[root*b:])
		return g.exchange(ctx, sends, nil)
	})
}

// Barrier returns once every active rank has entered it.
func (g *Group) Barrier(ctx context.Context) error {
	var one [4]byte
	return g.AllReduce(ctx, one[:], Int32, Sum)
}

// Send sends buf to rank dst, which receives it with Recv of the same
// length; messages between two ranks arrive in order.
func (g *Group) Send(ctx context.Context, buf []byte, dst int) error {
	return g.run(ctx, func(act []int, mi int) error {
		if err := g.checkPeer(dst); err != nil {
			return fmt.Errorf("send: %w", err)
		}
		if len(buf) == 0 {
			return nil
		}
		_, addr, _, err := g.source(ctx, buf)
		if err != nil {
			return err
		}
		return g.exchange(ctx, []*sendOp{{peer: dst, src: addr, n: len(buf)}}, nil)
	})
}

// Recv receives len(buf) bytes sent by rank src with Send.
func (g *Group) Recv(ctx context.Context, buf []byte, src int) error {
	return g.run(ctx, func(act []int, mi int) error {
		if err := g.checkPeer(src); err != nil {
			return fmt.Errorf("recv: %w", err)
		}
		if len(buf) == 0 {
			return nil
		}
		return g.exchange(ctx, nil, []*recvOp{{peer: src, n: len(buf), fn: copyTo(buf)}})
	})
}

func (g *Group) checkPeer(r int) error {
	if r == g.rank {
		return fmt.Errorf("rank %d is this rank", r)
	}
	return g.checkRoot(r)
}

// Bytes views a typed slice as its bytes, for the untyped collectives.
func Bytes[T Elem](s []T) []byte { return asBytes(s) }

// AllReduceOf is AllReduce over a typed slice.
func AllReduceOf[T Elem](ctx context.Context, g *Group, data []T, op ReduceOp) error {
	return g.AllReduce(ctx, asBytes(data), DTypeOf[T](), op)
}

// ReduceScatterOf is ReduceScatter over typed slices.
func ReduceScatterOf[T Elem](ctx context.Context, g *Group, send, recv []T, op ReduceOp) error {
	return g.ReduceScatter(ctx, asBytes(send), asBytes(recv), DTypeOf[T](), op)
}

// ReduceOf is Reduce over a typed slice.
func ReduceOf[T Elem](ctx context.Context, g *Group, data []T, root int, op ReduceOp) error {
	return g.Reduce(ctx, asBytes(data), root, DTypeOf[T](), op)
}
