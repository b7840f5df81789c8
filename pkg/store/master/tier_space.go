package master

import "github.com/kvcache-ops/mc/pkg/store"

// stagingAlign is where a staging range of a page or more starts: on a
// 4 KiB boundary, so that the node can read the record's value from its
// disk with O_DIRECT straight into the range (the block alignment
// O_DIRECT needs of memory) instead of through a bounce buffer and a copy.
// A node whose kernel gives huge pages bounces all the same (tier's
// readRecord: faster than a DMA into the segment's small pages); the
// master does not know which kind a node is.
const stagingAlign = 4096

// placeOn allocates size bytes on one segment only, in regions of the
// instance client (a node staging a disk record into its own segment: the
// bytes must land where that node can write them locally), on a
// stagingAlign boundary when size is a page or more. It does not evict.
func (s *space) placeOn(client, segID store.UUID, size uint64) (replicaRef, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	seg := s.segs[segID]
	if seg == nil || seg.status != SegOK {
		return replicaRef{}, store.Errorf(store.SegmentNotFound, "segment %s is not mounted", segID)
	}
	in := s.instances[client]
	if in == nil {
		in = &instance{id: client}
		s.instances[client] = in
	}
	r, ok := replicaRef{}, false
	if size >= stagingAlign {
		r, ok = s.placeIn(in, seg, size, stagingAlign)
	}
	// Alignment only saves the node a copy: a range anywhere will do
	// when no aligned one is to be had (the node reads through a bounce
	// buffer then).
	if !ok {
		r, ok = s.placeIn(in, seg, size, 0)
	}
	if !ok {
		return replicaRef{}, store.Errorf(store.NoAvailableHandle, "segment %q has no %d free bytes (used %d of %d)", seg.info.Name, size, seg.used.Load(), seg.info.Size)
	}
	seg.used.Add(size)
	s.used.Add(size)
	s.noteGrew()
	return r, nil
}

// placeIn places size bytes (on an align boundary, 0 for none) on seg for
// in: in its own regions, a new region, or room borrowed in a writer's.
func (s *space) placeIn(in *instance, seg *segment, size, align uint64) (replicaRef, bool) {
	if size < s.regionSize(seg)/2 {
		if r, ok := s.inOwnRegions(in, seg, size, align); ok {
			return r, true
		}
	}
	if r, ok := s.newRegion(in, seg, size, align); ok {
		return r, true
	}
	// Writers' regions may cover the whole segment with room to spare
	// inside them: borrow it, as a put does when no region is left.
	for _, reg := range seg.shared {
		if reg.alloc == nil || reg.alloc.LargestFree() < size {
			continue
		}
		if addr, err := allocIn(reg.alloc, size, align); err == nil {
			reg.objects++
			return replicaRef{reg, addr}, true
		}
	}
	return replicaRef{}, false
}
