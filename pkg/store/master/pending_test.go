package master

import (
	"fmt"
	"testing"

	"github.com/kvcache-ops/mc/pkg/store"
)

// TestEndedPutsHoldNoMemory: the master keeps nothing of a put once it
// has ended and its object has gone (removed or evicted). The discard
// scan's queue once held every put started for the discard timeout
// (30 s), and with it each put's object: a steady put stream into a full
// store grew the master (and mc bench store, which embeds one) by about
// 220 B a put for 30 s.
func TestEndedPutsHoldNoMemory(t *testing.T) {
	m, writer, _ := scaleMasterOwner(t, 0)
	defer m.Close()
	const batch, rounds = 1000, 100
	items := make([]PutItem, batch)
	keys := make([]string, batch)
	round := func(r int) {
		for i := range items {
			keys[i] = fmt.Sprintf("llama-70b/tp8/%08d/%017d", r, i)
			items[i] = PutItem{Key: keys[i], Size: 4096}
		}
		for _, res := range m.BatchPutStart(writer, "", items, store.ReplicateConfig{ReplicaNum: 1}) {
			if res.Err != nil {
				t.Fatal(res.Err)
			}
		}
		for _, err := range m.BatchPutEnd(writer, keys) {
			if err != nil {
				t.Fatal(err)
			}
		}
		for _, err := range m.BatchRemove(keys, true) {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	round(0)
	before := heapInUse()
	for r := 1; r <= rounds; r++ {
		round(r)
	}
	after := heapInUse()
	per := (float64(after) - float64(before)) / (batch * rounds)
	t.Logf("heap in use %d B before, %d B after %d puts ended and removed: %.1f B a put", before, after, batch*rounds, per)
	if per > 8 {
		t.Fatalf("the master holds %.1f B for each put that ended and was removed (heap %d -> %d B over %d puts)", per, before, after, batch*rounds)
	}
}
