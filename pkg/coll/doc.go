// Package coll runs collectives (all-reduce, broadcast, all-gather,
// reduce-scatter, all-to-all, reduce, gather, scatter, barrier, send/recv)
// over host memory between ranks that each own a pkg/engine Engine, and
// keeps serving when ranks fail or join: the Go counterpart of Mooncake's
// process-group backend for elastic inference clusters.
//
// # Data path
//
// Each rank registers one inbox with its engine: for every peer, Slots
// mailbox slots of SlotSize bytes plus a "ready" and an "ack" word per
// slot. A message (at most one slot) moves by one engine write of its
// bytes from the sender's registered memory into the receiver's slot; once that write completed (the peer's engine has the bytes in
// memory) the sender writes the slot's ready word (an 8-byte engine
// write of version<<32|sequence). The receiver polls its own ready words
// in local memory, consumes the slot and writes the sender's ack word the
// same way, which frees the slot. The flag follows the completed data
// write, not the same request, because the engine spreads requests over
// several TCP lanes and gives no order between them. With two or more
// slots, the next slot's bytes are in flight while the receiver reduces
// the previous one. Buffers the caller placed in memory registered with
// the engine (as tensors are) are sent from and reduced into in place;
// others go through a registered staging buffer. Polling is of local
// memory only: the rendezvous store is never read on the fast path
// (a store round trip per step would be most of a small collective's
// latency), only when a wait has lasted a few milliseconds (to learn of
// failures found elsewhere) and on membership changes. Large all-reduces run a ring (reduce-scatter then all-gather),
// small ones one round of direct messages reduced in rank order so every
// rank gets the same bits; broadcasts switch from direct sends to a
// pipelined chain.
//
// # Membership
//
// The rendezvous store is the metadata backend's key-value view
// (meta.Store: etcd, HTTP or memory), under "mc-coll/<group>/". It holds
// each rank's inbox address and segment, the group size, and one state
// record per rank (active, epoch). The sum of epochs and the size is the
// view version that flag words carry, so a channel restarts cleanly at
// every membership change and a word from an older view never matches.
// When a peer's writes fail (its engine is gone: killed process, closed
// engine), it stops answering pings, or it makes no progress for Timeout,
// the rank that noticed marks it inactive in the store and fails the
// collective with a *RankError naming it; ranks waiting elsewhere read the
// store after a short wait and fail the same way. The next collective
// installs the new view (waiting for the writes of the old one to land,
// then greeting each peer by resetting its ack words) and runs over the
// survivors. A rank whose context ends mid-collective marks itself
// inactive: its channels are out of step with its peers'.
//
// Survivors need not agree on whether the collective in flight at a
// failure completed: a rank that sent its last message and died at once
// may leave only some peers without it. Callers that retry must realign
// (package collbench runs an all-reduce of completed steps at each
// membership change and skips what a survivor finished).
//
// A group created with MaxWorldSize > WorldSize reserves the extra slots
// (inactive). JoinGroup publishes a rank for a free slot and blocks;
// healthy ranks call GetPeerState and RecoverRanks with the same ranks,
// after which collectives include it. ExtendGroupSizeTo grows the size
// collectives address. NewSubgroup builds a group over some ranks that
// shares the parent's active mask.
//
// Main types: Group, Config, RankError, DType, ReduceOp.
package coll
