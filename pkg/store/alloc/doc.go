// Package alloc places objects inside a segment (or a region of one) for the
// store's master: an offset allocator over a range of addresses
// [base, base+size) that it never touches. It hands out numbers only; the
// bytes live in a node's registered memory, on another host.
//
// The allocator is a two-level segregated fit (TLSF): free blocks sit in
// size-class bins, a first level per power of two and 32 linear sub-bins
// under it, with a bitmap per level. Alloc finds a bin whose every block
// fits with two bit scans, splits off the remainder, and Free merges the
// block with free physical neighbours, so both cost O(1) whatever the number
// of live allocations or the size of the space (64-bit addresses throughout;
// spaces of many TiB are fine).
//
// Block bookkeeping lives outside the managed memory, because the master
// cannot touch it: 24-byte nodes in fixed-size chunks (no large copies when
// they grow) and a hash index from allocation offset to node that reuses a
// field a free block needs and an allocated one does not. A live allocation
// costs about 33 bytes of heap at 1M (BenchmarkBytesPerAllocation), and an
// empty allocator 2.7 KiB for 64 MiB to 4.5 KiB for 1 TiB (its bins).
//
// Every allocation is rounded up to a multiple of Align and starts
// Align-aligned relative to base. NewWithUsed rebuilds an allocator around
// ranges that are already in use (the replicas a re-mounted segment still
// holds), so a new master never places an object over live data.
//
// An Allocator is not safe for concurrent use: the master serialises the
// operations on one segment.
package alloc
