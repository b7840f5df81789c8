package structpack_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/structpack"
)

// The baseline: a Segment codec written out by hand for the same bytes,
// the floor a reflective codec is measured against.
type handSegments struct {
	head uint32
	lit  []byte
}

func newHandSegments(tb testing.TB, t reflect.Type) handSegments {
	lit, err := structpack.Literal(t)
	if err != nil {
		tb.Fatal(err)
	}
	h, _ := structpack.Hash(t)
	return handSegments{head: h | 1, lit: lit}
}

func appendStr(b []byte, s string) []byte {
	return append(append(b, byte(len(s))), s...)
}

func appendSeg(b []byte, s *Segment) []byte {
	b = binary.LittleEndian.AppendUint64(b, s.ID.First)
	b = binary.LittleEndian.AppendUint64(b, s.ID.Second)
	b = appendStr(b, s.Name)
	b = binary.LittleEndian.AppendUint64(b, s.Base)
	b = binary.LittleEndian.AppendUint64(b, s.Size)
	b = appendStr(b, s.TEEndpoint)
	b = appendStr(b, s.Protocol)
	return appendStr(b, s.HostID)
}

// encode assumes every length fits one byte, as in these benchmarks.
func (h handSegments) encode(dst []byte, segs []Segment, single bool) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, h.head)
	dst = append(dst, 0x04)
	dst = append(append(dst, h.lit...), 0)
	if !single {
		dst = append(dst, byte(len(segs)))
	}
	for i := range segs {
		dst = appendSeg(dst, &segs[i])
	}
	return dst
}

var errShort = errors.New("short")

type reader struct {
	b   []byte
	off int
}

func (r *reader) u64() (uint64, error) {
	if len(r.b)-r.off < 8 {
		return 0, errShort
	}
	v := binary.LittleEndian.Uint64(r.b[r.off:])
	r.off += 8
	return v, nil
}

func (r *reader) str() (string, error) {
	if r.off >= len(r.b) || len(r.b)-r.off-1 < int(r.b[r.off]) {
		return "", errShort
	}
	n := int(r.b[r.off])
	s := string(r.b[r.off+1 : r.off+1+n])
	r.off += 1 + n
	return s, nil
}

func (r *reader) seg(s *Segment) (err error) {
	if s.ID.First, err = r.u64(); err != nil {
		return err
	}
	if s.ID.Second, err = r.u64(); err != nil {
		return err
	}
	if s.Name, err = r.str(); err != nil {
		return err
	}
	if s.Base, err = r.u64(); err != nil {
		return err
	}
	if s.Size, err = r.u64(); err != nil {
		return err
	}
	if s.TEEndpoint, err = r.str(); err != nil {
		return err
	}
	if s.Protocol, err = r.str(); err != nil {
		return err
	}
	s.HostID, err = r.str()
	return err
}

func (h handSegments) decode(b []byte, segs *[]Segment, single bool) error {
	if len(b) < 5+len(h.lit)+1 || binary.LittleEndian.Uint32(b) != h.head {
		return errShort
	}
	r := reader{b: b, off: 5 + len(h.lit) + 1}
	n := 1
	if !single {
		if r.off >= len(b) {
			return errShort
		}
		n = int(b[r.off])
		r.off++
	}
	if cap(*segs) < n {
		*segs = make([]Segment, n)
	}
	*segs = (*segs)[:n]
	for i := range *segs {
		if err := r.seg(&(*segs)[i]); err != nil {
			return err
		}
	}
	if r.off != len(b) {
		return errShort
	}
	return nil
}

func benchSegments(n int) []Segment {
	segs := make([]Segment, n)
	for i := range segs {
		segs[i] = Segment{
			ID:         UUID{First: uint64(i), Second: 0x285f4b35ca785b95},
			Name:       fmt.Sprintf("127.0.0.1:%d", 13400+i),
			Base:       0x7fbea6000000 + uint64(i)<<28,
			Size:       256 << 20,
			TEEndpoint: fmt.Sprintf("127.0.0.1:%d", 13400+i),
			Protocol:   "tcp",
		}
	}
	return segs
}

// roundTrips returns one encode+decode of the message through structpack
// and through the hand-written baseline, each checked once to produce the
// same bytes.
func roundTrips(tb testing.TB, n int) (sp, hand func() error) {
	segs := benchSegments(n)
	single := n == 1
	var msg any = segs
	var typ reflect.Type = reflect.TypeFor[[]Segment]()
	if single {
		msg, typ = segs[0], reflect.TypeFor[Segment]()
	}
	hw := newHandSegments(tb, typ)
	var spBuf, hwBuf []byte
	var spOut, hwOut []Segment
	var one Segment
	sp = func() error {
		var err error
		if spBuf, err = structpack.AppendMarshal(spBuf[:0], msg); err != nil {
			return err
		}
		if single {
			return structpack.Unmarshal(spBuf, &one)
		}
		return structpack.Unmarshal(spBuf, &spOut)
	}
	hand = func() error {
		hwBuf = hw.encode(hwBuf[:0], segs, single)
		return hw.decode(hwBuf, &hwOut, single)
	}
	if err := sp(); err != nil {
		tb.Fatal(err)
	}
	if err := hand(); err != nil {
		tb.Fatal(err)
	}
	if string(spBuf) != string(hwBuf) {
		tb.Fatalf("baseline writes other bytes:\n%x\n%x", spBuf, hwBuf)
	}
	return sp, hand
}

// BenchmarkSegment times encode+decode of a Segment (MountSegment's
// payload) and of 128 of them (ReMountSegment's), reporting structpack's
// time as a ratio to the hand-written baseline measured in the same run.
func BenchmarkSegment(b *testing.B) {
	for _, n := range []int{1, 128} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			sp, hand := roundTrips(b, n)
			b.ReportAllocs()
			b.ResetTimer()
			// Interleaved in short runs so both see the same machine load.
			var tsp, thw time.Duration
			for done := 0; done < b.N; {
				k := min(32, b.N-done)
				start := time.Now()
				for range k {
					if err := hand(); err != nil {
						b.Fatal(err)
					}
				}
				mid := time.Now()
				for range k {
					if err := sp(); err != nil {
						b.Fatal(err)
					}
				}
				tsp += time.Since(mid)
				thw += mid.Sub(start)
				done += k
			}
			b.ReportMetric(float64(tsp)/float64(thw), "x_handwritten")
			b.ReportMetric(float64(tsp.Nanoseconds())/float64(b.N), "structpack_ns/op")
			b.ReportMetric(float64(thw.Nanoseconds())/float64(b.N), "handwritten_ns/op")
		})
	}
}

// TestBenchmarkBaselineAgrees keeps the baseline honest when benchmarks
// are not run.
func TestBenchmarkBaselineAgrees(t *testing.T) {
	for _, n := range []int{1, 128} {
		roundTrips(t, n)
	}
}
