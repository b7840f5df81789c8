package master

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/store"
)

// FuzzMaster decodes a sequence of operations from the input (3 bytes
// each: op, a, b) and runs them against a master on a fake clock: mount
// and unmount segments, put start/end/revoke, upserts, gets, removes,
// evictions, restores, clock jumps with housekeeping. After every
// operation checkInvariants must hold: no two replicas holding space
// overlap (objects, pending resizes, discarded puts awaiting release),
// each lies inside its region and segment, used bytes are the sum over
// those replicas and at most the capacity, regions and instances count
// what they hold, and the key count is the number of complete objects.
func FuzzMaster(f *testing.F) {
	f.Add([]byte{0, 0, 0, 2, 0, 3, 3, 0, 0, 6, 0, 0, 7, 0, 1})
	f.Add([]byte{0, 0, 0, 0, 1, 0, 2, 9, 5, 5, 9, 20, 9, 3, 0, 3, 9, 0, 1, 0, 0, 6, 9, 0})
	f.Add([]byte{0, 2, 0, 2, 1, 27, 2, 2, 27, 2, 3, 27, 3, 1, 0, 3, 2, 0, 8, 0, 0, 9, 4, 0, 9, 4, 1})
	f.Add([]byte{12, 1, 5, 12, 9, 7, 0, 1, 0, 6, 1, 0, 7, 9, 0, 2, 0, 12, 3, 0, 0})
	f.Fuzz(func(t *testing.T, in []byte) { runOps(t, in) })
}

// TestMasterRandomOps runs the fuzz body on pseudo-random inputs, so the
// invariants are exercised on every test run, not only under -fuzz.
func TestMasterRandomOps(t *testing.T) {
	seed := uint64(0x9e3779b97f4a7c15)
	for i := range 100 {
		in := make([]byte, 3*150)
		for j := range in {
			seed ^= seed << 13
			seed ^= seed >> 7
			seed ^= seed << 17
			in[j] = byte(seed)
		}
		t.Run(fmt.Sprint(i), func(t *testing.T) { runOps(t, in) })
	}
}

const fuzzMaxOps = 200

var (
	fuzzSegs = []struct {
		host       string
		base, size uint64
	}{
		{"127.0.0.1", 0, 4 * MiB},
		{"127.0.0.2", 0x7f0000000000, 2 * MiB},
		{"127.0.0.3", 1 << 20, 8*MiB + 4096},
		{"127.0.0.1", 0x1000, MiB},
	}
	fuzzSizes = []uint64{1, 100, 4096, 64 * KiB, 100 * KiB, 128 * KiB, 300 * KiB, MiB, 3 * MiB, 9 * MiB}
	fuzzJumps = []time.Duration{time.Millisecond, time.Second, 10 * time.Second, 31 * time.Second, 600 * time.Second}
)

func runOps(t *testing.T, in []byte) {
	in = in[:min(len(in), 3*fuzzMaxOps)]
	no := false
	cfg := Config{RegionSize: 256 * KiB, KVLeaseTTL: 5 * time.Second, GracefulUnmountWait: time.Millisecond}
	if len(in)%2 == 1 {
		cfg.AllowEvictSoftPinned = &no
		cfg.MaxRegionsPerInstance = 3
	}
	m, clk := newTestMaster(t, cfg)
	segInfoOf := func(i int) (string, store.SegmentInfo) {
		s := fuzzSegs[i]
		return fmt.Sprint("n", i), segInfo(fmt.Sprint("s", i), s.host, s.base, s.size)
	}
	var log []string
	for p := 0; p+3 <= len(in); p += 3 {
		op, a, b := in[p], int(in[p+1]), int(in[p+2])
		key := fmt.Sprint("k", a%8)
		writer := uuidOf(fmt.Sprint("w", b%3))
		rc := store.ReplicateConfig{ReplicaNum: 1 + a/8%3, SoftPin: a&64 != 0, HardPin: a&128 != 0}
		if b&128 != 0 {
			rc.PreferredSegments = []string{fmt.Sprint("s", b%4)}
		}
		size := fuzzSizes[b/3%len(fuzzSizes)]
		var what string
		switch op % 13 {
		case 0:
			owner, info := segInfoOf(a % 4)
			what = fmt.Sprintf("mount %s: %v", info.Name, m.MountSegment(uuidOf(owner), info))
		case 1:
			owner, info := segInfoOf(a % 4)
			if b&1 == 0 {
				what = fmt.Sprintf("unmount %s: %v", info.Name, m.UnmountSegment(uuidOf(owner), info.ID))
			} else {
				what = fmt.Sprintf("graceful unmount %s: %v", info.Name, m.GracefulUnmountSegment(t.Context(), uuidOf(owner), info.ID))
			}
		case 2:
			r := m.BatchPutStart(writer, fuzzSegs[b%4].host, []PutItem{{key, size}}, rc)[0]
			what = fmt.Sprintf("put start %s %d %+v: %d replicas, %v", key, size, rc, len(r.Replicas), r.Err)
		case 3:
			what = fmt.Sprintf("put end %s: %v", key, m.BatchPutEnd(writer, []string{key})[0])
		case 4:
			what = fmt.Sprintf("revoke %s: %v", key, m.BatchPutRevoke(writer, []string{key})[0])
		case 5:
			r := m.BatchUpsertStart(writer, "", []PutItem{{key, size}}, rc)[0]
			what = fmt.Sprintf("upsert start %s %d: %d replicas, %v", key, size, len(r.Replicas), r.Err)
		case 6:
			r := get(m, key)
			what = fmt.Sprintf("get %s: %d replicas, %v", key, len(r.Replicas), r.Err)
		case 7:
			what = fmt.Sprintf("remove %s force=%v: %v", key, b&1 == 1, remove(m, key, b&1 == 1))
		case 8:
			if a&1 == 0 {
				what = fmt.Sprintf("evict if needed: %d", m.EvictIfNeeded())
			} else {
				what = fmt.Sprintf("evict %d: %d", uint64(b)*64*KiB, m.Evict(uint64(b)*64*KiB))
			}
		case 9:
			d := fuzzJumps[a%len(fuzzJumps)]
			clk.Advance(d)
			if b&1 == 0 { // nodes alive
				for i := range fuzzSegs {
					m.Ping(uuidOf(fmt.Sprint("n", i)))
				}
			}
			m.Maintain()
			what = fmt.Sprintf("advance %s, maintain (nodes pinging: %v)", d, b&1 == 0)
		case 10:
			ex, err := m.BatchExistKey([]string{key})
			what = fmt.Sprintf("exist %s: %v %v", key, ex[0], err[0])
		case 11:
			what = fmt.Sprintf("remove all: %d", m.RemoveAll())
		case 12:
			_, info := segInfoOf(a % 4)
			addr := info.Base + uint64(b)*16*KiB
			ro := RestoredObject{Key: key, Size: size, Replicas: []RestoredReplica{{Segment: info, Addr: addr}}}
			var up string
			if a&8 != 0 {
				// With a resize under way (lost, with no range, when
				// a&16 is set), its writer writer.
				u := &RestoredUpsert{Size: size + 4096, Writer: writer, Started: clk.Now().Add(-fuzzJumps[a%len(fuzzJumps)])}
				if a&16 == 0 {
					u.Replicas = []RestoredReplica{{Segment: info, Addr: addr + (size+4096+16*KiB)&^(16*KiB-1)}}
				}
				ro.Upsert, up = u, fmt.Sprintf(" with a resize %+v", *u)
			}
			err := m.Restore([]RestoredObject{ro})
			what = fmt.Sprintf("restore %s %d at %s+0x%x%s: %v", key, size, info.Name, addr-info.Base, up, err)
		}
		log = append(log, what)
		if err := checkInvariants(m); err != nil {
			t.Fatalf("after op %d:\n  %s\n%v", len(log), joinLines(log), err)
		}
		if s := m.Stats(); s.Keys != m.KeyCount() || s.Used > s.Capacity {
			t.Fatalf("after op %d:\n  %s\nstats %+v, key count %d", len(log), joinLines(log), s, m.KeyCount())
		}
	}
}

func joinLines(l []string) string {
	out := ""
	for i, s := range l {
		if i > 0 {
			out += "\n  "
		}
		out += fmt.Sprintf("%d: %s", i+1, s)
	}
	return out
}
