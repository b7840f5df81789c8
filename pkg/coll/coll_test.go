package coll

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/kvcache-ops/mc/pkg/engine"
	"github.com/kvcache-ops/mc/pkg/engine/meta"
)

// input is rank r's element i: small integers (exact in every type and
// order), negative ones for max/min, 1..3 for products.
func input[T Elem](r, i int, op ReduceOp) T {
	if op == Product {
		return T((r+i)%3 + 1)
	}
	return T((r*7+i*3)%23 - 5)
}

func inputs[T Elem](r, n int, op ReduceOp) []T {
	out := make([]T, n)
	for i := range out {
		out[i] = input[T](r, i, op)
	}
	return out
}

// reference reduces ranks' inputs element by element, in rank order.
func reference[T Elem](ranks []int, n int, op ReduceOp) []T {
	out := inputs[T](ranks[0], n, op)
	for _, r := range ranks[1:] {
		reduceT(op, out, inputs[T](r, n, op))
	}
	return out
}

func checkAllReduce[T Elem](t *testing.T, c *testCluster, n int, op ReduceOp) {
	t.Helper()
	act := c.groups[firstLive(c)].ActiveRanks()
	want := reference[T](act, n, op)
	c.each(func(r int, g *Group) error {
		data := inputs[T](r, n, op)
		if err := AllReduceOf(ctxT(t), g, data, op); err != nil {
			return err
		}
		if !slices.Equal(data, want) {
			return fmt.Errorf("all_reduce %v %v of %d: got %v, want %v", DTypeOf[T](), op, n, head(data), head(want))
		}
		return nil
	})
}

func firstLive(c *testCluster) int {
	for r, g := range c.groups {
		if g != nil {
			return r
		}
	}
	return -1
}

func head[T any](s []T) []T { return s[:min(len(s), 8)] }

// pattern is rank r's distinct bytes for the data-movement collectives.
func pattern(r, n, salt int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r*37 + i*11 + salt)
	}
	return b
}

func TestCollectivesAgainstReference(t *testing.T) {
	for _, n := range []int{2, 3, 4, 8} {
		t.Run(fmt.Sprintf("ranks=%d", n), func(t *testing.T) {
			c := newCluster(t, meta.NewMemory(), n, n, testConfig())
			// 1 element, 7 (no rank count divides it, the direct path),
			// 301 (ring, several slots per chunk, uneven chunks).
			for _, cnt := range []int{1, 7, 301} {
				for _, op := range []ReduceOp{Sum, Max, Min, Product} {
					checkAllReduce[int32](t, c, cnt, op)
					checkAllReduce[int64](t, c, cnt, op)
					checkAllReduce[float32](t, c, cnt, op)
					checkAllReduce[float64](t, c, cnt, op)
				}
			}
			for _, size := range []int{1, 7, 1001} {
				testDataMovement(t, c, n, size)
			}
		})
	}
}

func testDataMovement(t *testing.T, c *testCluster, n, size int) {
	all := make([]int, n)
	for i := range all {
		all[i] = i
	}
	root := n - 1
	c.each(func(r int, g *Group) error {
		buf := pattern(r, size, 1)
		if err := g.Broadcast(ctxT(t), buf, root); err != nil {
			return err
		}
		if want := pattern(root, size, 1); !bytes.Equal(buf, want) {
			return fmt.Errorf("broadcast %d bytes from %d: got %v, want %v", size, root, head(buf), head(want))
		}
		return nil
	})
	c.each(func(r int, g *Group) error {
		recv := make([]byte, size*n)
		if err := g.AllGather(ctxT(t), pattern(r, size, 2), recv); err != nil {
			return err
		}
		for q := 0; q < n; q++ {
			if !bytes.Equal(recv[q*size:(q+1)*size], pattern(q, size, 2)) {
				return fmt.Errorf("all_gather %d bytes: block %d wrong", size, q)
			}
		}
		return nil
	})
	c.each(func(r int, g *Group) error {
		send := pattern(r, size*n, 3)
		recv := make([]byte, size*n)
		if err := g.AllToAll(ctxT(t), send, recv); err != nil {
			return err
		}
		for q := 0; q < n; q++ {
			if want := pattern(q, size*n, 3)[r*size : (r+1)*size]; !bytes.Equal(recv[q*size:(q+1)*size], want) {
				return fmt.Errorf("all_to_all block %d bytes: block from %d wrong", size, q)
			}
		}
		return nil
	})
	c.each(func(r int, g *Group) error {
		recv := make([]byte, size*n)
		if err := g.Gather(ctxT(t), pattern(r, size, 4), recv, 0); err != nil {
			return err
		}
		if r != 0 {
			return nil
		}
		for q := 0; q < n; q++ {
			if !bytes.Equal(recv[q*size:(q+1)*size], pattern(q, size, 4)) {
				return fmt.Errorf("gather %d bytes: block %d wrong", size, q)
			}
		}
		return nil
	})
	c.each(func(r int, g *Group) error {
		recv := make([]byte, size)
		var send []byte
		if r == root {
			send = pattern(root, size*n, 5)
		}
		if err := g.Scatter(ctxT(t), send, recv, root); err != nil {
			return err
		}
		if want := pattern(root, size*n, 5)[r*size : (r+1)*size]; !bytes.Equal(recv, want) {
			return fmt.Errorf("scatter %d bytes: got %v, want %v", size, head(recv), head(want))
		}
		return nil
	})
	// Elements: size of them per block.
	c.each(func(r int, g *Group) error {
		send := inputs[float32](r, size*n, Sum)
		recv := make([]float32, size)
		if err := ReduceScatterOf(ctxT(t), g, send, recv, Sum); err != nil {
			return err
		}
		want := reference[float32](all, size*n, Sum)[r*size : (r+1)*size]
		if !slices.Equal(recv, want) {
			return fmt.Errorf("reduce_scatter %d elements: got %v, want %v", size, head(recv), head(want))
		}
		return nil
	})
	c.each(func(r int, g *Group) error {
		data := inputs[int64](r, size, Max)
		if err := ReduceOf(ctxT(t), g, data, 1, Max); err != nil {
			return err
		}
		want := inputs[int64](r, size, Max)
		if r == 1 {
			want = reference[int64](all, size, Max)
		}
		if !slices.Equal(data, want) {
			return fmt.Errorf("reduce %d elements to 1: got %v, want %v", size, head(data), head(want))
		}
		return g.Barrier(ctxT(t))
	})
	// Send/Recv around the ring, even ranks first so nobody deadlocks.
	c.each(func(r int, g *Group) error {
		next, prev := (r+1)%n, (r+n-1)%n
		got := make([]byte, size)
		send := func() error { return g.Send(ctxT(t), pattern(r, size, 6), next) }
		recv := func() error { return g.Recv(ctxT(t), got, prev) }
		first, second := send, recv
		if r%2 == 1 {
			first, second = recv, send
		}
		if err := first(); err != nil {
			return err
		}
		if err := second(); err != nil {
			return err
		}
		if !bytes.Equal(got, pattern(prev, size, 6)) {
			return fmt.Errorf("recv %d bytes from %d: wrong bytes", size, prev)
		}
		return nil
	})
}

// TestRegisteredBuffers: buffers in memory registered with the engine are
// sent from and reduced into directly (no staging copy); results are the
// same.
func TestRegisteredBuffers(t *testing.T) {
	const n, cnt = 4, 1001
	c := newCluster(t, meta.NewMemory(), n, n, testConfig())
	all := []int{0, 1, 2, 3}
	c.each(func(r int, g *Group) error {
		m, err := c.engines[r].RegisterMemory(ctxT(t), 4*cnt*n+cnt, "cpu:0", false)
		if err != nil {
			return err
		}
		defer c.engines[r].UnregisterMemory(context.Background(), m)
		if _, ok := g.registered(m.Bytes()[:8]); !ok {
			return fmt.Errorf("registered memory not recognised")
		}
		data := typed[float32](m.Bytes()[:4*cnt])
		copy(data, inputs[float32](r, cnt, Sum))
		if err := AllReduceOf(ctxT(t), g, data, Sum); err != nil {
			return err
		}
		if want := reference[float32](all, cnt, Sum); !slices.Equal(data, want) {
			return fmt.Errorf("all_reduce in registered memory: got %v, want %v", head(data), head(want))
		}
		buf := m.Bytes()[:cnt]
		copy(buf, pattern(r, cnt, 7))
		if err := g.Broadcast(ctxT(t), buf, 2); err != nil {
			return err
		}
		if !bytes.Equal(buf, pattern(2, cnt, 7)) {
			return fmt.Errorf("broadcast in registered memory: wrong bytes")
		}
		recv := m.Bytes()[cnt : cnt+cnt*n]
		if err := g.AllGather(ctxT(t), pattern(r, cnt, 8), recv); err != nil {
			return err
		}
		for q := 0; q < n; q++ {
			if !bytes.Equal(recv[q*cnt:(q+1)*cnt], pattern(q, cnt, 8)) {
				return fmt.Errorf("all_gather into registered memory: block %d wrong", q)
			}
		}
		return nil
	})
}

// TestUnalignedBuffers: byte buffers that do not start on an element
// boundary (a caller's b[1:]) reduce right, in both algorithms.
func TestUnalignedBuffers(t *testing.T) {
	c := newCluster(t, meta.NewMemory(), 3, 3, testConfig())
	for _, cnt := range []int{3, 301} {
		want := reference[float64]([]int{0, 1, 2}, cnt, Sum)
		c.each(func(r int, g *Group) error {
			raw := make([]byte, 8*cnt+1)
			buf := raw[1:]
			copy(buf, Bytes(inputs[float64](r, cnt, Sum)))
			if err := g.AllReduce(ctxT(t), buf, Float64, Sum); err != nil {
				return err
			}
			got := make([]float64, cnt)
			copy(Bytes(got), buf)
			if !slices.Equal(got, want) {
				return fmt.Errorf("unaligned all_reduce of %d: got %v, want %v", cnt, head(got), head(want))
			}
			return nil
		})
	}
}

// Ranks whose engines run under auto on one host reach each other through
// shared memory: every byte of their collectives (data, flags, acks)
// moves by shm, none over tcp, as each engine counts it; the results are
// those over tcp. A rank whose engine offers no shared memory (tcp) is
// reached over tcp by the others and reaches them over tcp itself.
func TestSameHostRanksUseSHM(t *testing.T) {
	auto := []string{"auto", "auto", "auto", "auto"}
	mixed := []string{"auto", "auto", "tcp", "auto"}
	for _, c := range []struct {
		name      string
		protocols []string
		want      []string // per rank: engine.Stats.Transport over the collectives
	}{
		{"auto", auto, []string{"shm", "shm", "shm", "shm"}},
		{"one-tcp-rank", mixed, []string{"shm+tcp", "shm+tcp", "tcp", "shm+tcp"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cl := newClusterOver(t, meta.NewMemory(), 4, 4, testConfig(), c.protocols)
			before := make([]engine.Stats, 4)
			for r, e := range cl.engines {
				before[r] = e.Stats()
			}
			checkAllReduce[float32](t, cl, 3, Sum)    // direct
			checkAllReduce[float32](t, cl, 1000, Sum) // ring, across slots
			checkAllReduce[int64](t, cl, 777, Max)
			for r, e := range cl.engines {
				d := e.Stats().Sub(before[r])
				if got := d.Transport(); got != c.want[r] {
					t.Errorf("rank %d (engine %q) moved bytes through %q (%v), want %q", r, c.protocols[r], got, d.TransportBytes, c.want[r])
				}
				if d.Failed != [2]uint64{} {
					t.Errorf("rank %d: failed tasks %v", r, d.Failed)
				}
			}
		})
	}
}
