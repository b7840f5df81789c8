package master

// Events is told of the objects a cache-aware router wants to know about
// (KV events, package kvevents), exactly where mooncake_master publishes
// them (MasterService::PublishKv* at 3b5a594):
//
//   - Stored when a put ends, in "cpu". Nothing else is stored: an offload
//     to the disk tier, the DRAM copy going while the disk copy stays, a
//     promotion back to DRAM, a drain's copy and a disk tier bringing keys
//     back when it attaches tell nothing (mooncake_master's
//     NotifyOffloadSuccess, AddReplica, NotifyPromotionSuccess and
//     evictions that leave a replica publish nothing).
//   - Removed when the key is gone from the pool. A remove call (remove,
//     remove_all, regex remove, a revoke of an object overwritten in
//     place) reports the medium the key was held in: "cpu" while it has a
//     DRAM copy, else "disk" (Mooncake's MediumForMetadata before the
//     erase). A drop the master makes on its own (eviction, a stale put
//     discarded, a lost segment or disk) reports "cpu": mooncake_master
//     reads the medium after the copies are erased, which says cpu for
//     every eviction.
//
// It is called under the key's lock, so one key's events come in the
// order the master applied them; it must not block.
type Events interface {
	Stored(key, medium string)
	Removed(key, medium string)
}

// Media of Events.
const (
	mediumCPU  = "cpu"
	mediumDisk = "disk"
)

// eventStored reports a put ended.
func (m *Master) eventStored(key string) {
	if m.cfg.Events != nil {
		m.cfg.Events.Stored(key, mediumCPU)
	}
}

// eventRemoved reports o removed by a call; call it before o's replicas
// are dropped.
func (m *Master) eventRemoved(o *Object) {
	if m.cfg.Events == nil {
		return
	}
	medium := mediumCPU
	if len(o.replicas) == 0 && o.tier != nil {
		medium = mediumDisk
	}
	m.cfg.Events.Removed(o.key, medium)
}

// eventDropped reports o dropped by the master itself (eviction, a lost
// segment or disk, a stale put): medium cpu, as mooncake_master's
// evictions.
func (m *Master) eventDropped(o *Object) {
	if m.cfg.Events != nil {
		m.cfg.Events.Removed(o.key, mediumCPU)
	}
}
