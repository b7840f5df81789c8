package master

// Events is told of the objects a cache-aware router wants to know about
// (KV events, package kvevents): Stored when a key becomes readable or its
// medium changes (a put ends: "cpu"; an offload lands or its DRAM copy
// goes while the disk copy stays: "disk"; a promotion brings it back:
// "cpu"), Removed when it is gone from the pool (remove, remove_all,
// regex remove, eviction, a lost segment or disk), with the medium it
// was last held in. It is called under the key's lock, so one key's
// events come in the order the master applied them; it must not block.
// A drain's copy changes no medium and tells nothing.
type Events interface {
	Stored(key, medium string)
	Removed(key, medium string)
}

// Media of Events.
const (
	mediumCPU  = "cpu"
	mediumDisk = "disk"
)

func (m *Master) eventStored(key, medium string) {
	if m.cfg.Events != nil {
		m.cfg.Events.Stored(key, medium)
	}
}

// eventRemoved reports o gone; call it before o's replicas are dropped.
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
