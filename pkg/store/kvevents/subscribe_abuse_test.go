package kvevents

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"runtime"
	"testing"
)

// subscribeFrame is a ZMTP 3.0 subscription (sub) or cancel of topic.
func subscribeFrame(sub bool, topic []byte) []byte {
	body := append([]byte{0}, topic...)
	if sub {
		body[0] = 1
	}
	f := []byte{flagLong}
	f = binary.BigEndian.AppendUint64(f, uint64(len(body)))
	return append(f, body...)
}

// TestSubscriptionsHoldNoMemory: a subscriber that sends thousands of
// large subscriptions does not make the publisher keep them (before, one
// subscriber's 20000 subscriptions of 60 KB held 1.2 GB of a master's
// memory until it left), and subscriptions to everything still count
// as ZMQ's do: two subscribes need two cancels.
func TestSubscriptionsHoldNoMemory(t *testing.T) {
	p := newTestPublisher(t, Config{PaceInterval: -1})
	go p.run()
	c, r := rawSubscriber(t, p) // subscribed to everything once
	const n, size = 1000, 60 << 10
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	before := heap()
	var batch bytes.Buffer
	for i := range n {
		topic := bytes.Repeat([]byte{'x'}, size)
		copy(topic, fmt.Sprintf("%08d", i))
		batch.Write(subscribeFrame(true, topic))
		if batch.Len() > 4<<20 || i == n-1 {
			if _, err := c.Write(batch.Bytes()); err != nil {
				t.Fatal(err)
			}
			batch.Reset()
		}
	}
	// A cancel of the subscription to everything, read after every
	// topic above: when no subscriber is left subscribed, the publisher
	// has read them all.
	if _, err := c.Write(subscribeFrame(false, nil)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the cancel after the topics", func() bool { return p.Stats().Subscribers == 0 })
	grown := int64(heap()) - int64(before)
	if grown > 16<<20 {
		t.Errorf("heap grew %d MB after %d subscriptions of %d KB", grown>>20, n, size>>10)
	}
	// Two subscribes to everything and one cancel leave it subscribed.
	frames := append(subscribeFrame(true, nil), subscribeFrame(true, nil)...)
	if _, err := c.Write(append(frames, subscribeFrame(false, nil)...)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the subscriber", func() bool { return p.Stats().Subscribers == 1 })
	p.Stored("k1", MediumCPU)
	if _, err := readRawMessage(c, r); err != nil {
		t.Fatalf("subscribed twice, cancelled once: no message: %v", err)
	}
	if _, err := c.Write(subscribeFrame(false, nil)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the last cancel", func() bool { return p.Stats().Subscribers == 0 })
}
