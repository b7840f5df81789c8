// Package ha makes store masters highly available through etcd: leader
// election, an op log every acknowledged change is committed to, warm
// standbys, and failover that loses no acknowledged object.
//
// Election. Every master is a Candidate. It campaigns by creating
// mooncake-store/<cluster_id>/master_view in a transaction that fails if
// the key exists, attached to a lease of Config.LeaseTTL (5 s). The value
// is the plain "<rpc_address>:<rpc_port>" and the view version is the
// revision of the winning transaction, as in Mooncake, so tools reading
// Mooncake's view read this one (Mooncake's own clients included: the
// cluster id loses one trailing '/' in the key, as in theirs). The leader
// renews its lease every third of the TTL; the others watch the key and
// campaign when it goes.
//
// Op log. The leader's master reports every metadata change (mount,
// unmount, put end, remove, evict) through master.Config.OnChange, in
// order. Changes are numbered and queued; one committer goroutine writes
// whatever is queued as one batch, mooncake-store/<cluster_id>/oplog/<seq>
// (seq of the batch's first record, zero-padded so keys sort), in a
// transaction fenced on the view key's create revision: a master that has
// lost its view can never append. The RPC layer acknowledges a PutEnd (and
// a remove, revoke or mount) only after master.Config.Sync reports the
// batch holding it committed, so while a commit is in flight the next
// changes queue and go out together (group commit). A put start's grants
// are committed the same way before they are answered, and a new leader
// restores them as pending puts: it must never place an object over a
// range a writer may still be writing, which is why failover needs no
// segment renewal.
//
// Snapshots. After Config.SnapshotRecords records or Config.SnapshotInterval,
// the leader writes its committed state as chunks under snapshots/<seq>/,
// then, in one fenced transaction, points snapshot at them and deletes the
// log up to that seq and the previous snapshot. Deleted keys free nothing
// in etcd until their revisions are compacted, so it then compacts etcd's
// history up to the previous snapshot's install: etcd holds at most two
// snapshot intervals of log.
//
// Standbys. A candidate that is not leading loads the snapshot and the log
// after it, then tails the log with a watch, applying every batch to a
// warm copy of the metadata (segments, complete objects and where their
// replicas are). It serves no data: its RPC port refuses calls and its
// admin data endpoints answer 503. Nor does it publish KV events: only a
// leader term's master is given the publisher, so routers hear only of
// changes a serving leader made.
//
// Failover. On winning, a candidate reads the log to its end (the old
// leader can no longer append: its fence broke when its view went), then
// builds a fresh master whose Ping reports the new view version, Restores
// the warm objects into it and only then serves. Nodes see NEED_REMOUNT on
// their next ping and re-mount; the re-mount rebuilds each segment's
// allocator around the restored replicas, so no new allocation lands on
// live data. Restore drops a replica that overlaps a newer one (the space
// of a removed object reused before the remove's record was committed).
//
// Stepping down. A leader whose lease renewal has not succeeded within
// the TTL minus a margin, or whose commit fails, stops serving at once
// (its RPCs answer UNAVAILABLE_IN_CURRENT_MODE, admin data endpoints 503),
// drops its master and goes back to being a standby, from the committed
// state: changes applied in memory but never committed were never
// acknowledged either.
//
// Main types: Config, Candidate.
package ha
