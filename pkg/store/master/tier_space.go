package master

import "github.com/kvcache-ops/mc/pkg/store"

// placeOn allocates size bytes on one segment only, in regions of the
// instance client (a node staging a disk record into its own segment: the
// bytes must land where that node can write them locally). It does not
// evict.
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
	if size < s.regionSize(seg)/2 {
		r, ok = s.inOwnRegions(in, seg, size)
	}
	if !ok {
		r, ok = s.newRegion(in, seg, size)
	}
	// Writers' regions may cover the whole segment with room to spare
	// inside them: borrow it, as a put does when no region is left.
	for i := 0; !ok && i < len(seg.shared); i++ {
		reg := seg.shared[i]
		if reg.alloc == nil || reg.alloc.LargestFree() < size {
			continue
		}
		if addr, err := reg.alloc.Alloc(size); err == nil {
			reg.objects++
			r, ok = replicaRef{reg, addr}, true
		}
	}
	if !ok {
		return replicaRef{}, store.Errorf(store.NoAvailableHandle, "segment %q has no %d free bytes (used %d of %d)", seg.info.Name, size, seg.used.Load(), seg.info.Size)
	}
	seg.used.Add(size)
	s.used.Add(size)
	return r, nil
}
