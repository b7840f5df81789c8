package store

import (
	"context"
	"time"

	"github.com/kvcache-ops/mc/pkg/store/storepb"
)

// SetAfterPutStart makes c call f between each put's grant (PutStart)
// and its transfer: tests stall a writer there.
func SetAfterPutStart(c *Client, f func(keys []string)) { c.afterPutStart = f }

// SetBeforePutStart makes c call f after each put's values are staged,
// before its start is sent: tests spend the caller's time there.
func SetBeforePutStart(c *Client, f func(keys []string)) { c.beforePutStart = f }

// SetAfterRead makes c call f on each value it reads, before the value's
// checksum is checked: tests corrupt it there.
func SetAfterRead(c *Client, f func(key string, b []byte)) { c.afterRead = f }

// SetBeforeTransfer makes c call f before each get's transfer round,
// after its replica lists: tests stall a reader there past its lease.
func SetBeforeTransfer(c *Client, f func()) { c.beforeTransfer = f }

// SetReleaseDelay sets how long a finished staged read waits for the
// reader's next read from its node to carry it back.
func SetReleaseDelay(d time.Duration) { releaseDelay = d }

// SetBeforeStagedRelease stalls (or watches) gets before they hand their
// staged disk reads back.
func SetBeforeStagedRelease(f func(ids []uint64)) { beforeStagedRelease = f }

// WireRemount re-mounts c's segment through its master wire, as its ping
// loop does when the master asks (NEED_REMOUNT).
func WireRemount(ctx context.Context, c *Client) error {
	_, info := c.segment()
	return c.w.remount(ctx, []SegmentInfo{info})
}

// DialTierRead connects to a node's TierRead service (closed with t).
func DialTierRead(t interface{ Cleanup(func()) }, addr string) storepb.TierReadClient {
	var tc tierConns
	t.Cleanup(tc.close)
	cl, _ := tc.get(addr)
	return cl
}

// TierWireExchanges is c's staged reads answered on the nodes' own wire
// (tierwire.go), not through gRPC.
func TierWireExchanges(c *Client) uint64 { return c.tiers.wire.exchanges.Load() }

// SetStreamMin sets the record size above which staged reads stream.
func SetStreamMin(n uint64) { streamMin = n }

// StreamCounts is c's staged chunks moved while a node read on, and the
// keys read wholly so.
func StreamCounts(c *Client) (moves, keys uint64) { return c.streamMoves.Load(), c.streamKeys.Load() }

// SetNoStagedStream makes nodes refuse BatchGetStagedStream as a build
// before it would (Unimplemented).
func SetNoStagedStream(on bool) { noStagedStream = on }

// SessionCalls counts c's data-path calls answered over the master's
// coro_rpc side and over gRPC Session streams.
func SessionCalls(c *Client) (coro, stream uint64) {
	w := c.w.(*grpcWire)
	return w.ses.coroCalls.Load(), w.ses.streamCalls.Load()
}

// SetCoroRecheck sets how long a master address that did not serve mc's
// coro_rpc calls is left on gRPC before it is asked again; it returns
// the old value.
func SetCoroRecheck(d time.Duration) time.Duration {
	old := coroRecheck
	coroRecheck = d
	return old
}

// SetTierDropHook makes every TierNode ask f of each DROP it receives;
// true loses it (nil: none lost).
func SetTierDropHook(f func(key string) bool) {
	if f == nil {
		dropHook.Store(nil)
		return
	}
	dropHook.Store(&f)
}

// SetTierOffloadHook makes every TierNode call f before it writes an
// OFFLOAD's record (nil: none).
func SetTierOffloadHook(f func(key string)) {
	if f == nil {
		offloadHook.Store(nil)
		return
	}
	offloadHook.Store(&f)
}

// SetTierDropAcks makes TierNodes attaching from now on answer DROPs
// (true, the default) or not, as nodes before the answer did.
func SetTierDropAcks(on bool) { dropAcksOff.Store(!on) }

// TierRoster is the pool's disk tiers as c last heard them.
func TierRoster(c *Client) []string { ids, _ := c.roster.list(); return ids }

// FencedTiers is the tiers c last heard are fenced.
func FencedTiers(c *Client) []string { _, f := c.roster.list(); return f }

// HoldPings stops (or resumes) c's ping loop: c hears no roster and does
// not re-mount meanwhile, as a node stalled by SIGSTOP.
func HoldPings(c *Client, on bool) { c.pingsHeld.Store(on) }
