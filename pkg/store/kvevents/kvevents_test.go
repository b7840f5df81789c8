package kvevents

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

func TestParseSeqHash(t *testing.T) {
	for _, c := range []struct {
		key  string
		want uint64
		ok   bool
	}{
		{"1234567", 1234567, true},
		{"0x1f2e", 7982, true},
		{"0X1F2E", 7982, true},
		{"plainkey", 0, false},
		{"", 0, false},
		{"0x", 0, false},
		{"0x1g", 0, false},
		{"0x-5", 0, false},
		{"12a", 0, false},
		{" 12", 12, true},
		{"+12", 12, true},
		{"-1", 1<<64 - 1, true},
		{"18446744073709551615", 1<<64 - 1, true},
		{"18446744073709551616", 0, false},
		{"0xffffffffffffffff", 1<<64 - 1, true},
		{"0x10000000000000000", 0, false},
		{"1_000", 0, false},
		{" ", 0, false},
		{"12 ", 0, false},
	} {
		got, ok := ParseSeqHash(c.key)
		if got != c.want || ok != c.ok {
			t.Errorf("ParseSeqHash(%q) = %d, %v; want %d, %v", c.key, got, ok, c.want, c.ok)
		}
	}
}

// The forms msgpack-c's packer picks, byte for byte.
func TestMsgpackForms(t *testing.T) {
	hex := func(b []byte) string { return fmt.Sprintf("% x", b) }
	for _, c := range []struct {
		got, want string
	}{
		{hex(appendUint(nil, 127)), "7f"},
		{hex(appendUint(nil, 128)), "cc 80"},
		{hex(appendUint(nil, 1<<16)), "ce 00 01 00 00"},
		{hex(appendInt(nil, 1700000000000)), "cf 00 00 01 8b cf e5 68 00"},
		{hex(appendInt(nil, -1)), "ff"},
		{hex(appendInt(nil, -33)), "d0 df"},
		{hex(appendInt(nil, -1<<63)), "d3 80 00 00 00 00 00 00 00"},
		{hex(appendStr(nil, "abc")), "a3 61 62 63"},
		{hex(appendStr(nil, strings.Repeat("x", 32))[:2]), "d9 20"},
		{hex(appendMapHeader(nil, 20)), "de 00 14"},
		{hex(appendArrayHeader(nil, 0)), "90"},
	} {
		if c.got != c.want {
			t.Errorf("got %s, want %s", c.got, c.want)
		}
	}
}

func FuzzDecodePayload(f *testing.F) {
	b := appendArrayHeader(nil, 3)
	b = appendInt(b, 1)
	b = appendArrayHeader(b, 1)
	b = appendEventFields(b, 1, 1, true, true, true, "default", "be", "12", "cpu", 12, true)
	b = appendUint(b, 0)
	f.Add(b)
	f.Add([]byte{0x93, 0x01, 0x90, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _, _, _ = DecodePayload(b) // must not panic
	})
}

// debianPython is Debian's interpreter, the one python3-zmq and
// python3-msgpack install into (a python3 earlier on PATH may not have
// them).
const debianPython = "/usr/bin/python3"

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newTestPublisher(t *testing.T, cfg Config) *Publisher {
	t.Helper()
	if cfg.Endpoint == "" {
		cfg.Endpoint = "tcp://127.0.0.1:0"
	}
	if cfg.BackendID == "" {
		cfg.BackendID = "pool-a"
	}
	p, err := open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func waitFor(t *testing.T, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// subscribeOne subscribes to p, its only subscriber, and waits until p
// counts it; the subscription is closed at the test's end.
func subscribeOne(t *testing.T, p *Publisher) *Subscriber {
	t.Helper()
	s, err := Subscribe(context.Background(), p.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	waitFor(t, "the subscriber", func() bool { return p.Stats().Subscribers == 1 })
	return s
}

// pyField is one [name, python type, value] of an event as sub.py saw it.
type pyMsg struct {
	Ready   bool                  `json:"ready"`
	NFrames int                   `json:"nframes"`
	Topic   string                `json:"topic"`
	SeqLen  int                   `json:"seq_len"`
	Seq     uint64                `json:"seq"`
	TS      int64                 `json:"ts"`
	DPRank  *int                  `json:"dp_rank"`
	Events  [][][]json.RawMessage `json:"events"`
}

// TestPythonConsumer: libzmq's SUB (python3-zmq) and msgpack-python
// decode what Mooncake's publisher sends for puts of 1234567, 0x1f2e and
// plainkey and a remove of 1234567: four messages, sequence 1-4, every
// field with Mooncake's name, order, type and value.
func TestPythonConsumer(t *testing.T) {
	p := newTestPublisher(t, Config{})
	go p.run()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, debianPython, "testdata/sub.py", p.Endpoint(), "4")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("python3 (Debian's python3-zmq and python3-msgpack; make deps-deb installs them): %v", err)
	}
	defer func() { _ = cmd.Wait() }()
	sc := bufio.NewScanner(out)
	sc.Buffer(nil, 1<<20)
	if !sc.Scan() {
		t.Fatalf("python consumer did not start: %s", stderr.String())
	}
	waitFor(t, "the python subscriber", func() bool { return p.Stats().Subscribers == 1 })
	ops := []struct {
		removed bool
		key     string
	}{{false, "1234567"}, {false, "0x1f2e"}, {false, "plainkey"}, {true, "1234567"}}
	for i, op := range ops {
		if op.removed {
			p.Removed(op.key, MediumCPU)
		} else {
			p.Stored(op.key, MediumCPU)
		}
		waitFor(t, "a batch", func() bool { return p.Stats().PublishedBatches == uint64(i+1) })
	}
	hashes := []string{"[1234567]", "[7982]", "[]", "[1234567]"}
	for i, op := range ops {
		if !sc.Scan() {
			t.Fatalf("message %d: python consumer ended: %s", i+1, stderr.String())
		}
		var m pyMsg
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatal(err)
		}
		if m.NFrames != 3 || m.Topic != "" || m.SeqLen != 8 || m.Seq != uint64(i+1) || m.DPRank == nil || *m.DPRank != 0 {
			t.Fatalf("message %d: frames %d topic %q seq %d (%d bytes) dp_rank %v; want 3 frames, empty topic, 8-byte seq %d, dp_rank 0", i+1, m.NFrames, m.Topic, m.Seq, m.SeqLen, m.DPRank, i+1)
		}
		if len(m.Events) != 1 {
			t.Fatalf("message %d: %d events, want 1", i+1, len(m.Events))
		}
		var got []string
		for _, f := range m.Events[0] {
			got = append(got, fmt.Sprintf("%s:%s=%s", f[0], strings.Trim(string(f[1]), `"`), f[2]))
		}
		ts := fmt.Sprint(m.TS)
		want := []string{
			fmt.Sprintf("\"event_id\":int=%d", i+1), "\"timestamp\":int=" + ts,
		}
		typ, legacy := `"stored"`, `"BlockStored"`
		if op.removed {
			typ, legacy = `"removed"`, `"BlockRemoved"`
		}
		want = append(want, `"event_type":str=`+typ, `"type":str=`+legacy,
			`"model_name":NoneType=null`, `"block_size":NoneType=null`, `"additional_salt":NoneType=null`, `"lora_name":NoneType=null`,
			`"tenant_id":str="default"`, `"backend_id":str="pool-a"`, `"group_id":NoneType=null`, `"medium":str="cpu"`, `"dp_rank":NoneType=null`,
			`"object_key":str="`+op.key+`"`, `"seq_hashes":list=`+hashes[i], `"block_hashes":list=`+hashes[i])
		if op.removed {
			want = append(want, `"base_block_idx":NoneType=null`)
		} else {
			want = append(want, `"base_block_idx":int=0`, `"parent_hash":NoneType=null`, `"token_ids":NoneType=null`, `"parent_block_hash":NoneType=null`)
		}
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("message %d event:\ngot\n%s\nwant\n%s", i+1, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		if d := time.Since(time.UnixMilli(m.TS)); d < 0 || d > time.Minute {
			t.Errorf("message %d: timestamp %d ms is not now", i+1, m.TS)
		}
	}
	if s := p.Stats(); s.PublishedEvents != 4 || s.SkippedUnparsedKeys != 1 || s.DroppedEvents != 0 {
		t.Errorf("stats %+v: want 4 published, 1 unparsed key (plainkey), 0 dropped", s)
	}
}

// A full queue drops its oldest events, counts them and skips one
// sequence number per event, as Mooncake's does.
func TestQueueFullDropsOldestAndSkipsSequence(t *testing.T) {
	p := newTestPublisher(t, Config{QueueCapacity: 3})
	s := subscribeOne(t, p)
	for i := 1; i <= 5; i++ { // the publisher goroutine is not running yet
		p.Stored(fmt.Sprint(i), MediumCPU)
	}
	if st := p.Stats(); st.DroppedEvents != 2 || st.QueueLength != 3 {
		t.Fatalf("stats %+v: want 2 dropped, 3 queued", st)
	}
	go p.run()
	b, err := s.Next()
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, e := range b.Events {
		keys = append(keys, e.ObjectKey)
	}
	if b.Seq != 3 || strings.Join(keys, ",") != "3,4,5" {
		t.Fatalf("message seq %d keys %v: want seq 3 (1 and 2 skipped for the drops) with keys 3,4,5", b.Seq, keys)
	}
}

// Without object keys, events whose key is no hash are not sent (and are
// counted); the map loses object_key; without legacy fields it loses
// type, block_hashes and parent_block_hash.
func TestNoObjectKeyNoLegacy(t *testing.T) {
	p := newTestPublisher(t, Config{NoObjectKey: true, NoLegacyFields: true})
	s := subscribeOne(t, p)
	p.Stored("plain", MediumDisk)
	p.Stored("0x10", MediumDisk)
	go p.run()
	b, err := s.Next()
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Events) != 1 || b.Seq != 1 {
		t.Fatalf("got seq %d with %d events, want seq 1 with the hashed key alone", b.Seq, len(b.Events))
	}
	e := b.Events[0]
	if len(e.Fields) != 16 || e.Medium != "disk" || len(e.SeqHashes) != 1 || e.SeqHashes[0] != 16 || e.ID != 1 {
		t.Errorf("event %+v: want 16 fields, medium disk, seq_hashes [16], event_id 1", e)
	}
	for _, k := range []string{"object_key", "type", "block_hashes", "parent_block_hash"} {
		if _, ok := e.Fields[k]; ok {
			t.Errorf("field %s sent", k)
		}
	}
	if st := p.Stats(); st.SkippedUnparsedKeys != 1 {
		t.Errorf("skipped %d, want 1", st.SkippedUnparsedKeys)
	}
}

// A subscriber that connects, subscribes and never reads: events keep
// flowing to the others, Stored never waits, and its drops are counted.
func TestStalledSubscriber(t *testing.T) {
	// A queue of one batch's worth of messages: in lock step the reading
	// subscriber has at most one batch of events out, even when a slow
	// host makes every event its own message, so only the stalled one
	// can overflow (24 MB of keys against its queue and socket buffers).
	p := newTestPublisher(t, Config{SendHWM: MooncakeMaxBatch, MaxBatch: MooncakeMaxBatch})
	go p.run()
	stalled, err := Subscribe(context.Background(), p.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	defer stalled.Close()
	good, err := Subscribe(context.Background(), p.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	waitFor(t, "two subscribers", func() bool { return p.Stats().Subscribers == 2 })
	const n = 6000
	key := strings.Repeat("k", 4000) // big messages fill the socket buffers fast
	var received atomic.Int64
	go func() {
		for {
			b, err := good.Next()
			if err != nil {
				return
			}
			received.Add(int64(len(b.Events)))
		}
	}()
	for i := range n {
		start := time.Now()
		p.Stored(fmt.Sprint(key, i), MediumCPU)
		if d := time.Since(start); d > time.Second {
			t.Fatalf("queueing an event took %s", d)
		}
		if i%MooncakeMaxBatch == MooncakeMaxBatch-1 || i == n-1 {
			// lock step with the reading subscriber: it never falls
			// behind, so any drop is the stalled one's
			waitFor(t, "the reading subscriber", func() bool { return received.Load() == int64(i+1) })
		}
	}
	if st := p.Stats(); st.SubscriberDrops == 0 || st.DroppedEvents != 0 {
		t.Errorf("stats %+v: want messages dropped for the stalled subscriber alone", st)
	}
}

// A send to a subscriber whose writer has nothing left to write is
// written by the publisher itself: waking the writer goroutine for it
// cost a wake-up (often a thread's) per send.
func TestIdleSubscriberWrittenDirectly(t *testing.T) {
	p := newTestPublisher(t, Config{PaceInterval: -1})
	go p.run()
	s := subscribeOne(t, p)
	for i := 1; i <= 20; i++ {
		p.Stored(fmt.Sprint(i), MediumCPU)
		b, err := s.Next()
		if err != nil {
			t.Fatal(err)
		}
		if b.Seq != uint64(i) || len(b.Events) != 1 || b.Events[0].ObjectKey != fmt.Sprint(i) {
			t.Fatalf("message %d: %d events, want message %d with key %d", b.Seq, len(b.Events), i, i)
		}
	}
	if n := p.sock.handed.Load(); n != 0 {
		t.Errorf("%d of 20 messages went through the subscriber's writer: want the publisher to write to an idle subscriber itself", n)
	}
}

// A subscriber that stops reading until its socket's buffers are full,
// then reads again: the publisher's own write takes what fits, ending
// within a message, and the subscriber's writer sends the rest; every
// message arrives whole and in order.
func TestDirectWriteSplitsMessage(t *testing.T) {
	p := newTestPublisher(t, Config{PaceInterval: -1})
	go p.run()
	s := subscribeOne(t, p)
	// 4000 events of 3 KB, and 1000 more at a time (up to 20000) until
	// a direct write has ended within a message: the socket's buffers
	// full (12 MB does it here; a kernel's buffers may be larger)
	key := strings.Repeat("k", 3000)
	n := 0
	for more := 4000; more > 0 && n < 20000; more-- {
		p.Stored(fmt.Sprint(key, n), MediumCPU)
		n++
		if n%50 == 0 {
			time.Sleep(time.Millisecond) // many sends, some finding the buffer full
		}
		if more == 1 && p.sock.split.Load() == 0 {
			more = 1001
		}
	}
	waitFor(t, "the queue sent", func() bool { return p.Stats().PublishedEvents == uint64(n) })
	next := 0
	for seq := uint64(1); next < n; seq++ {
		b, err := s.Next()
		if err != nil {
			t.Fatal(err)
		}
		if b.Seq != seq {
			t.Fatalf("message %d after %d", b.Seq, seq-1)
		}
		for _, e := range b.Events {
			if want := fmt.Sprint(key, next); e.ObjectKey != want || e.ID != uint64(next+1) {
				t.Fatalf("message %d: event %d key ...%s, want ...%d", b.Seq, e.ID, e.ObjectKey[len(key):], next)
			}
			next++
		}
	}
	if st := p.Stats(); st.SubscriberDrops != 0 {
		t.Errorf("%d messages dropped for a subscriber %d MB behind, want none (its queue holds 10000)", st.SubscriberDrops, n*3/1000)
	}
	if p.sock.split.Load() == 0 {
		t.Error("no direct write ended within a message: the test did not fill the socket's buffers")
	}
}

func TestEndpointErrors(t *testing.T) {
	for _, ep := range []string{"127.0.0.1:5557", "tcp://127.0.0.1", "udp://1.2.3.4:5", "tcp://h:notaport", "ipc://"} {
		if _, err := New(Config{Endpoint: ep, BackendID: "b"}); err == nil || !strings.Contains(err.Error(), "endpoint") {
			t.Errorf("New(%q) = %v, want an endpoint error", ep, err)
		}
	}
	if _, err := New(Config{Endpoint: "tcp://127.0.0.1:0"}); err == nil || !strings.Contains(err.Error(), "backend") {
		t.Errorf("no backend id: %v, want an error naming it", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, err = New(Config{Endpoint: "tcp://" + ln.Addr().String(), BackendID: "b"})
	if !errors.Is(err, syscall.EADDRINUSE) {
		t.Errorf("port in use: %v, want EADDRINUSE", err)
	}
}

// Message buffers are reused, and only once every subscriber has written
// its copy: a subscriber that stops reading for a while (its queue holds
// hundreds of messages) and one that keeps up both receive every event,
// in order, with its own key; then, with both keeping up, the publisher
// makes next to no buffer for the messages it sends.
func TestMessageBuffersReused(t *testing.T) {
	p := newTestPublisher(t, Config{QueueCapacity: -1})
	go p.run()
	const n, n2 = 40000, 100 * DefaultMaxBatch // events of each phase
	var subs [2]*Subscriber
	for i := range subs {
		s, err := Subscribe(context.Background(), p.Endpoint())
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		subs[i] = s
	}
	waitFor(t, "two subscribers", func() bool { return p.Stats().Subscribers == 2 })
	pause := make(chan struct{})
	errs := make(chan error, 2)
	var got [2]atomic.Int64
	for i, s := range subs {
		go func() {
			if i == 1 {
				<-pause
			}
			next, seq := 0, uint64(0)
			for next < n+n2 {
				b, err := s.Next()
				if err != nil {
					errs <- fmt.Errorf("subscriber %d: %w", i, err)
					return
				}
				if seq != 0 && b.Seq != seq+1 {
					errs <- fmt.Errorf("subscriber %d: message %d after %d", i, b.Seq, seq)
					return
				}
				seq = b.Seq
				for _, e := range b.Events {
					if want := fmt.Sprintf("key-%07d", next); e.ObjectKey != want || e.ID != uint64(next+1) {
						errs <- fmt.Errorf("subscriber %d: event %d is %q id %d, want %q id %d", i, next, e.ObjectKey, e.ID, want, next+1)
						return
					}
					next++
				}
				got[i].Store(int64(next))
			}
			errs <- nil
		}()
	}
	// Phase 1: one subscriber paused while half the events are sent.
	for i := range n {
		p.Stored(fmt.Sprintf("key-%07d", i), MediumCPU)
		if i == n/2 {
			waitFor(t, "messages queued for the paused subscriber", func() bool { return p.Stats().PublishedEvents > uint64(n/4) })
			close(pause)
		}
	}
	caughtUp := func(k int) func() bool {
		return func() bool { return got[0].Load() >= int64(k) && got[1].Load() >= int64(k) }
	}
	waitFor(t, "both subscribers", caughtUp(n))
	// Phase 2: both keep up (one message's events at a time).
	made, sent := p.sock.made.Load(), p.Stats().PublishedBatches
	for i := n; i < n+n2; i++ {
		p.Stored(fmt.Sprintf("key-%07d", i), MediumCPU)
		if i%DefaultMaxBatch == DefaultMaxBatch-1 {
			waitFor(t, "both subscribers", caughtUp(i+1))
		}
	}
	for range subs {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	st := p.Stats()
	made, sent = p.sock.made.Load()-made, st.PublishedBatches-sent
	if made > sent/10 {
		t.Errorf("%d message buffers made for %d messages sent to subscribers keeping up: want them reused", made, sent)
	}
	if st.SubscriberDrops != 0 {
		t.Errorf("%d messages dropped: the paused subscriber's queue (10000) holds them all", st.SubscriberDrops)
	}
}

// A message's buffer is at most twice what it holds (1 KiB at least), a
// reused one too: a subscriber that stops reading keeps its 10000
// messages' bytes, not 10000 of the largest buffers. Buffers of the
// largest messages are their own and not kept.
func TestMessageBufferSizes(t *testing.T) {
	s := &pubSocket{}
	s.initFree()
	use := func(size int) *message {
		m := s.newMessage(size)
		if c, need := cap(m.buf), size+messageRoom; c < need || c > max(2*need, 1<<minClass) {
			t.Fatalf("newMessage(%d): buffer of %d bytes, want %d to %d", size, c, need, max(2*need, 1<<minClass))
		}
		m.buf = append(m.buf, make([]byte, size)...)
		m.refs.Store(1)
		return m
	}
	for _, size := range []int{1, 300, 1 << 10, 20000, 32<<10 - messageRoom, 32 << 10, 200 << 10} {
		s.release(use(size)) // kept for reuse
		use(size)            // reused
		use(300)             // not in a large buffer
	}
	if made := s.made.Load(); made > 7+7 {
		t.Errorf("%d buffers made: want the released ones reused", made)
	}
	big := use(1 << 20)
	s.release(big)
	if m := s.newMessage(1 << 20); m == big {
		t.Error("a buffer of 1 MiB was kept for reuse")
	}
}

// The publisher's sends are paced: the first PaceBurst go out as soon as
// their events are queued; after those, events queued while it waits for
// the next interval go out together, MaxBatch to a message (here
// mooncake_master's 64), with the sequence
// numbers and event ids they would have had; Close sends what waits
// without waiting for the interval.
func TestPacedSends(t *testing.T) {
	p := newTestPublisher(t, Config{PaceInterval: time.Second, PaceBurst: 2, MaxBatch: MooncakeMaxBatch})
	go p.run()
	s := subscribeOne(t, p)
	next := func() (uint64, []string) {
		t.Helper()
		b, err := s.Next()
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for i, e := range b.Events {
			keys = append(keys, e.ObjectKey)
			if want := fmt.Sprint(e.ID); e.ObjectKey != want {
				t.Fatalf("message %d event %d: id %d for key %s, want ids to follow the keys", b.Seq, i, e.ID, e.ObjectKey)
			}
		}
		return b.Seq, keys
	}
	for i := 1; i <= 2; i++ { // the burst: at once, one message each
		p.Stored(fmt.Sprint(i), MediumCPU)
		if seq, keys := next(); seq != uint64(i) || len(keys) != 1 || keys[0] != fmt.Sprint(i) {
			t.Fatalf("message %d: keys %v, want [%d]", seq, keys, i)
		}
	}
	start := time.Now()
	for i := 3; i <= 12+2*MooncakeMaxBatch; i++ {
		p.Stored(fmt.Sprint(i), MediumCPU)
		if i <= 12 {
			time.Sleep(2 * time.Millisecond) // the publisher is woken for each
		}
	}
	for m, want := range [][2]int{{3, 66}, {67, 130}, {131, 140}} {
		seq, keys := next()
		if seq != uint64(3+m) || len(keys) != want[1]-want[0]+1 || keys[0] != fmt.Sprint(want[0]) || keys[len(keys)-1] != fmt.Sprint(want[1]) {
			t.Fatalf("message %d: %d events (%v...): want message %d with keys %d to %d", seq, len(keys), keys[:min(3, len(keys))], 3+m, want[0], want[1])
		}
	}
	if d := time.Since(start); d < 500*time.Millisecond {
		t.Errorf("the paced send came %v after the burst: want it to wait for the interval (1s)", d)
	}
	p.Stored("141", MediumCPU)
	start = time.Now()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 500*time.Millisecond {
		t.Errorf("Close took %v: want what waits for the interval sent at once", d)
	}
	if seq, keys := next(); seq != 6 || len(keys) != 1 || keys[0] != "141" {
		t.Fatalf("message %d: keys %v, want message 6 with key 141", seq, keys)
	}
}

// pacer: burst sends at once, then one per interval; the time spent
// waiting pays for the next.
func TestPacer(t *testing.T) {
	t0 := time.Unix(1000, 0)
	pc := newPacer(10*time.Millisecond, 2, t0)
	at := func(d time.Duration, want time.Duration) {
		t.Helper()
		got := pc.wait(t0.Add(d))
		if got != want {
			t.Fatalf("wait at +%v: %v, want %v", d, got, want)
		}
		if got == 0 {
			pc.spend(t0.Add(d))
		}
	}
	at(0, 0)
	at(0, 0)
	at(0, 10*time.Millisecond)
	at(10*time.Millisecond, 0) // after that wait
	at(15*time.Millisecond, 5*time.Millisecond)
	at(20*time.Millisecond, 0)
	at(time.Second, 0) // a long pause refills the burst, no more
	at(time.Second, 0)
	at(time.Second, 10*time.Millisecond)
	if w := newPacer(-1, 2, t0).wait(t0); w != 0 {
		t.Fatalf("unpaced wait: %v, want 0", w)
	}
}

// Under a steady stream of events the publisher sleeps for its next
// send's token, not for the events: a put's kick then finds nobody
// waiting for it and wakes nobody (each wake-up a futex call in the put
// path and a context switch). Events every millisecond and a send per
// 20 ms: the publisher waits for events about never, not once per send.
func TestSteadyStreamDoesNotWakePublisher(t *testing.T) {
	p := newTestPublisher(t, Config{PaceInterval: 20 * time.Millisecond, PaceBurst: 1})
	go p.run()
	start := time.Now()
	for i := 0; time.Since(start) < 400*time.Millisecond; i++ {
		p.Stored(fmt.Sprint(i), MediumCPU)
		time.Sleep(time.Millisecond)
	}
	sends := p.Stats().PublishedBatches
	if sends < 8 {
		t.Fatalf("%d sends in 400 ms at one per 20 ms: want the stream paced, not stalled", sends)
	}
	// (a stream stalled for an interval, on a loaded machine, parks it
	// once; before, every send did)
	if parks := p.parks.Load(); parks > 2+sends/4 {
		t.Errorf("the publisher waited for events %d times in %d sends: want it woken by its timer, not by the puts", parks, sends)
	}
}

// Messages carry up to MaxBatch events: DefaultMaxBatch unless set,
// mooncake_master's 64 when asked, and no more than MaxMaxBatch.
func TestMaxBatch(t *testing.T) {
	const n = DefaultMaxBatch + 44
	sizes := func(max int) (want []int) {
		for left := n; left > 0; left -= max {
			want = append(want, min(left, max))
		}
		return want
	}
	for _, c := range []struct {
		max  int
		want []int
	}{
		{0, sizes(DefaultMaxBatch)},
		{MooncakeMaxBatch, sizes(MooncakeMaxBatch)},
		{1, sizes(1)}, // every event its own message
	} {
		p := newTestPublisher(t, Config{MaxBatch: c.max})
		s, err := Subscribe(context.Background(), p.Endpoint())
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		waitFor(t, "the subscriber", func() bool { return p.Stats().Subscribers == 1 })
		for i := range n {
			p.Stored(fmt.Sprint(i), MediumCPU)
		}
		publishNow(p)
		go p.run() // for Close
		for i, n := range c.want {
			b, err := s.Next()
			if err != nil {
				t.Fatal(err)
			}
			if len(b.Events) != n || b.Seq != uint64(i+1) {
				t.Fatalf("max %d: message %d has %d events (seq %d), want %d", c.max, i+1, len(b.Events), b.Seq, n)
			}
		}
	}
	for _, bad := range []int{-1, MaxMaxBatch + 1} {
		if _, err := open(Config{Endpoint: "tcp://127.0.0.1:0", BackendID: "a", MaxBatch: bad}); err == nil || !strings.Contains(err.Error(), "events to a message") {
			t.Errorf("MaxBatch %d: err %v, want it refused", bad, err)
		}
	}
}

// A subscriber that never reads holds at most SendHWM*MooncakeMaxBatch
// events in its queue, not SendHWM messages of MaxBatch events each: the
// memory a stalled subscriber pins stays what mooncake_master's 64-event
// messages would.
func TestStalledSubscriberEventBound(t *testing.T) {
	p := newTestPublisher(t, Config{SendHWM: 4, MaxBatch: 2 * MooncakeMaxBatch})
	stalled, err := Subscribe(context.Background(), p.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	defer stalled.Close()
	waitFor(t, "the subscriber", func() bool { return p.Stats().Subscribers == 1 })
	key := strings.Repeat("k", 4000)
	for i := range 60 { // 60 messages of 512 KB: far more than the socket buffers take
		for j := range 2 * MooncakeMaxBatch {
			p.Stored(fmt.Sprint(key, i, "-", j), MediumCPU)
		}
		publishNow(p)
	}
	go p.run() // for Close
	p.sock.mu.Lock()
	var scs []*subscriberConn
	for sc := range p.sock.subs {
		scs = append(scs, sc)
	}
	p.sock.mu.Unlock()
	if len(scs) != 1 {
		t.Fatalf("%d subscribers", len(scs))
	}
	sc := scs[0]
	if n, ev := sc.unwritten.Load(), sc.events.Load(); n > 2 || ev > 4*MooncakeMaxBatch {
		t.Errorf("the stalled subscriber has %d messages (%d events) queued: want at most 2 (%d events)", n, ev, 4*MooncakeMaxBatch)
	}
	if p.Stats().SubscriberDrops == 0 {
		t.Error("no message dropped for the stalled subscriber")
	}
}
