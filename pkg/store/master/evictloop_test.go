package master

import (
	"fmt"
	"testing"
	"time"
)

// Below the high watermark the watermark loop sleeps instead of waking
// every EvictionInterval (issue 39: an idle pool's timer wake-ups).
func TestEvictionLoopSleepsBelowWatermark(t *testing.T) {
	m, _ := evictFixture(t, Config{EvictionInterval: time.Millisecond}, 10)
	m.Start()
	defer m.Close()
	time.Sleep(300 * time.Millisecond)
	if n := m.evictLooks.Load(); n > 3 {
		t.Fatalf("watermark loop ran %d rounds in 300ms at 10%% usage; want at most 3 (it should sleep %s below the watermark)", n, evictionIdleInterval)
	}
}

// An allocation that takes usage over the high watermark wakes the
// sleeping loop at once, not at its next idle look a second later.
func TestEvictionLoopWakesWhenPutCrossesWatermark(t *testing.T) {
	m, _ := evictFixture(t, Config{EvictionInterval: time.Millisecond}, 80)
	m.Start()
	defer m.Close()
	time.Sleep(50 * time.Millisecond) // the loop is asleep now
	start := time.Now()
	for i := 80; i < 92; i++ {
		put(t, m, "w", fmt.Sprintf("key%03d", i), MiB)
	}
	for m.Stats().Keys > 90 {
		if time.Since(start) > evictionIdleInterval/2 {
			t.Fatalf("no eviction %s after usage crossed the watermark: %d keys of 1 MiB in 100 MiB (watermark 90%%)", time.Since(start), m.Stats().Keys)
		}
		time.Sleep(time.Millisecond)
	}
	// The count drops as the round removes its victims, shard after
	// shard: the oldest may go a moment after the count is down (1 in
	// 20 runs under -race).
	for present(m, "key000")[0] {
		if time.Since(start) > evictionIdleInterval/2 {
			t.Fatalf("the oldest object survived the watermark round")
		}
		time.Sleep(time.Millisecond)
	}
}
