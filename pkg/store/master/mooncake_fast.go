package master

import (
	"encoding/binary"
	"strings"
	"sync"

	"github.com/kvcache-ops/mc/pkg/cororpc"
	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/mooncake"
	"github.com/kvcache-ops/mc/pkg/structpack"
)

// The Mooncake wire's hot path. master_bench and a serving cluster spend
// most of the master's time answering BatchGetReplicaList, and the
// general route (Go values of Mooncake's types, each descriptor boxed into
// its variant, then struct_pack by reflection) allocated some 350 bytes
// per key: the garbage collector, not the lookups, set the pace. Here the
// answer is written straight from the lookup's results into a reused
// buffer, byte for byte what structpack.Marshal writes for the same
// []mooncake.ExpectList (a test holds the two equal over random batches),
// and every answer's buffer goes back to a pool once written
// (cororpc.ServerOptions.Recycle).

// preEncoded is a handler's answer already in struct_pack bytes: wrap sends
// it as it is.
type preEncoded []byte

// bodyPool holds answer buffers; larger ones are left to the collector
// so the pool does not pin a rare huge answer's memory.
var bodyPool = sync.Pool{New: func() any { return new([]byte) }}

const maxPooledBody = 1 << 20

func getBody() []byte { return (*bodyPool.Get().(*[]byte))[:0] }

func recycleBody(b []byte) {
	if cap(b) > maxPooledBody {
		return
	}
	b = b[:0]
	bodyPool.Put(&b)
}

// getScratch is a BatchGetReplicaList handler's lookup scratch.
type getScratch struct {
	keys  []string // borrowed from the request body
	res   []ReplicaResult
	descs []store.Replica
}

var getScratchPool = sync.Pool{New: func() any { return new(getScratch) }}

// answerShape is what differs between the two answers written here:
// []mooncake.ExpectList (BatchGetReplicaList: each list is a
// GetReplicaListResponse, with a lease and an optional checksum after the
// descriptors) and []mooncake.ExpectDescs (BatchPutStart: the descriptors
// alone). h1 and h2 are the message's start up to its element count, for
// one-byte and two-byte container lengths: taken from structpack itself,
// so the hash, metainfo and literal are its own.
type answerShape struct {
	h1, h2 []byte
	lists  bool
}

func shapeOf[T any](lists bool) func() answerShape {
	return sync.OnceValue(func() answerShape {
		empty, err := structpack.Marshal([]T{})
		if err != nil {
			panic(err) // the types are fixed; the tests encode them
		}
		h1 := empty[:len(empty)-1] // the count, 0, is the last byte
		wide, err := structpack.Marshal(make([]T, 256))
		if err != nil {
			panic(err)
		}
		return answerShape{h1: h1, h2: wide[:len(h1)], lists: lists}
	})
}

var (
	listsShape = shapeOf[mooncake.ExpectList](true)
	descsShape = shapeOf[mooncake.ExpectDescs](false)
)

// appendLists writes the answer lists would give for rs (ids from next
// on, as lists reserves them) to dst. ok is false when some length needs
// more than two bytes, which the general route handles.
func appendLists(dst []byte, rs []ReplicaResult, next uint64) (out []byte, failed, ok bool) {
	return appendAnswers(dst, rs, next, listsShape())
}

// appendDescs writes a BatchPutStart answer: what struct_pack writes for
// the []mooncake.ExpectDescs the general route builds (descriptors
// numbered from next on).
func appendDescs(dst []byte, rs []ReplicaResult, next uint64) (out []byte, failed, ok bool) {
	return appendAnswers(dst, rs, next, descsShape())
}

func appendAnswers(dst []byte, rs []ReplicaResult, next uint64, shape answerShape) (out []byte, failed, ok bool) {
	maxLen := len(rs)
	for i := range rs {
		if rs[i].Err != nil {
			continue
		}
		maxLen = max(maxLen, len(rs[i].Replicas))
		for _, r := range rs[i].Replicas {
			maxLen = max(maxLen, len(r.Protocol), len(r.Endpoint))
		}
	}
	if maxLen > 0xffff {
		return dst, false, false
	}
	wide := maxLen > 0xff
	size := func(b []byte, n int) []byte {
		if wide {
			return binary.LittleEndian.AppendUint16(b, uint16(n))
		}
		return append(b, byte(n))
	}
	if wide {
		dst = append(dst, shape.h2...)
	} else {
		dst = append(dst, shape.h1...)
	}
	dst = size(dst, len(rs))
	for i := range rs {
		r := &rs[i]
		if r.Err != nil {
			failed = true
			dst = append(dst, 0) // tl::expected holding its error
			dst = binary.LittleEndian.AppendUint32(dst, uint32(codeOf(r.Err)))
			continue
		}
		dst = append(dst, 1)
		dst = size(dst, len(r.Replicas))
		for _, rep := range r.Replicas {
			next++
			st := mooncake.ReplicaProcessing
			if rep.Complete {
				st = mooncake.ReplicaComplete
			}
			dst = binary.LittleEndian.AppendUint64(dst, next)
			dst = append(dst, 0) // the variant's first alternative: memory
			dst = binary.LittleEndian.AppendUint64(dst, rep.Len)
			dst = binary.LittleEndian.AppendUint64(dst, rep.Addr)
			dst = append(size(dst, len(rep.Protocol)), rep.Protocol...)
			dst = append(size(dst, len(rep.Endpoint)), rep.Endpoint...)
			dst = binary.LittleEndian.AppendUint32(dst, uint32(st))
		}
		if shape.lists {
			dst = binary.LittleEndian.AppendUint64(dst, uint64(r.LeaseTTL.Milliseconds()))
			dst = append(dst, 0) // no checksum
		}
	}
	return dst, failed, true
}

// reserveIDs takes the descriptor ids of rs's replicas with one atomic
// add and returns the number before the first.
func (s *mooncakeServer) reserveIDs(rs []ReplicaResult) uint64 {
	total := 0
	for i := range rs {
		if rs[i].Err == nil {
			total += len(rs[i].Replicas)
		}
	}
	return s.nextID.Add(uint64(total)) - uint64(total)
}

// putStartAnswer renders a BatchPutStart's results.
func (s *mooncakeServer) putStartAnswer(rs []ReplicaResult) (any, bool) {
	next := s.reserveIDs(rs)
	body, failed, ok := appendDescs(getBody(), rs, next)
	if ok {
		return preEncoded(body), failed
	}
	recycleBody(body)
	out := make([]mooncake.ExpectDescs, len(rs))
	for i, r := range rs {
		if r.Err != nil {
			out[i], failed = mooncake.ExpectDescs{Error: codeOf(r.Err), HasError: true}, true
			continue
		}
		d := s.descriptorsFrom(r.Replicas, next, nil)
		next += uint64(len(d))
		out[i] = mooncake.ExpectDescs{Value: d}
	}
	return out, failed
}

// batchGetAnswer answers a BatchGetReplicaList request. Its keys are
// decoded without copies (they point into the request's body, which
// outlives the call) and looked up into pooled scratch: a batch of gets
// allocates next to nothing.
func (s *mooncakeServer) batchGetAnswer(req *cororpc.Request) (_ any, failed bool, _ error) {
	sc := getScratchPool.Get().(*getScratch)
	defer func() {
		// No stale pointers kept in the pool (the request's body among
		// them).
		clear(sc.keys)
		clear(sc.res)
		clear(sc.descs)
		getScratchPool.Put(sc)
	}()
	var tenant string
	if err := s.argsBorrow("BatchGetReplicaList", req, &sc.keys, &tenant); err != nil {
		return nil, false, err
	}
	if err := batchErr("BatchGetReplicaList", len(sc.keys)); err != nil {
		return nil, false, err
	}
	t, terr := s.m.ReadTenant(tenant)
	if terr != nil {
		out := make([]mooncake.ExpectList, len(sc.keys))
		for i := range out {
			out[i] = mooncake.ExpectList{Error: codeOf(terr), HasError: true}
		}
		return out, true, nil
	}
	if store.NeedsScope(t, sc.keys) {
		scopeInPlace(t, sc.keys)
	}
	sc.res, sc.descs = s.m.lookupInto(sc.keys, true, sc.res, sc.descs)
	next := s.reserveIDs(sc.res)
	body, failed, ok := appendLists(getBody(), sc.res, next)
	if !ok {
		recycleBody(body)
		out, failed := s.listsFrom(sc.res, next)
		return out, failed, nil
	}
	return preEncoded(body), failed, nil
}

// scopeInPlace replaces keys by tenant t's stored keys, all of them in one
// allocation.
func scopeInPlace(t string, keys []string) {
	n := 0
	for _, k := range keys {
		n += len(t) + 1 + len(k)
	}
	var b strings.Builder
	b.Grow(n)
	for _, k := range keys {
		b.WriteString(t)
		b.WriteByte(store.TenantSeparator)
		b.WriteString(k)
	}
	all, off := b.String(), 0
	for i, k := range keys {
		l := len(t) + 1 + len(k)
		keys[i] = all[off : off+l]
		off += l
	}
}
