package master

import "net/http"

// LocalDiskDesc is a disk replica in the admin JSON: Mooncake's
// LOCAL_DISK fields (client_id, object_size, transport_endpoint), then
// mc's (the node's segment, its tier's id, the object version, and
// whether the node is connected).
type LocalDiskDesc struct {
	ClientID  string `json:"client_id"`
	Size      uint64 `json:"object_size"`
	Endpoint  string `json:"transport_endpoint"`
	Segment   string `json:"segment_name"`
	TierID    string `json:"tier_id"`
	Version   uint64 `json:"version"`
	Connected bool   `json:"connected"`
}

func localDiskDescs(d *DiskReplica) []LocalDiskDesc {
	if d == nil {
		return nil
	}
	return []LocalDiskDesc{{ClientID: d.Client.String(), Size: d.Size, Endpoint: d.Endpoint, Segment: d.Segment, TierID: d.Tier, Version: d.Version, Connected: d.Online}}
}

// TierDetail is one node's disk tier in /api/v1/tiers.
type TierDetail struct {
	ID           string `json:"tier_id"`
	Segment      string `json:"segment_name"`
	ClientID     string `json:"client_id"`
	Connected    bool   `json:"connected"`
	Dir          string `json:"dir"`
	ODirect      bool   `json:"o_direct"`
	Capacity     uint64 `json:"capacity_bytes"`
	Used         uint64 `json:"used_bytes"`
	Records      uint64 `json:"records"`
	Files        uint64 `json:"files"`
	DiskReplicas int    `json:"disk_replicas"`
	Offloads     uint64 `json:"offloads"`
	OffloadFull  uint64 `json:"offloads_refused_full"`
	DiskHits     uint64 `json:"disk_hits"`
	Promotions   uint64 `json:"promotions"`
}

// TierSummary is the master's disk-tier counters in /api/v1/tiers.
type TierSummary struct {
	Offloads      uint64 `json:"offloads"`
	OffloadBytes  uint64 `json:"offload_bytes"`
	OffloadFull   uint64 `json:"offloads_refused_full"`
	OffloadFailed uint64 `json:"offloads_failed"`
	DiskHits      uint64 `json:"disk_hits"`
	MemHits       uint64 `json:"mem_hits"`
	Promotions    uint64 `json:"promotions"`
	LoadFailures  uint64 `json:"load_failures"`
	DiskEvicted   uint64 `json:"disk_evicted"`
	InflightBytes int64  `json:"offload_inflight_bytes"`
}

// tiers serves /api/v1/tiers: every node's disk tier and the totals.
func (a *admin) tiers(w http.ResponseWriter, _ *http.Request) {
	ts := a.m.Tiers()
	out := make([]TierDetail, len(ts))
	for i, t := range ts {
		out[i] = TierDetail{ID: t.ID, Segment: t.Segment, ClientID: t.Client.String(), Connected: t.Online, Dir: t.Dir, ODirect: t.Direct,
			Capacity: t.Capacity, Used: t.Used, Records: t.Records, Files: t.Files, DiskReplicas: t.Replicas,
			Offloads: t.Offloads, OffloadFull: t.OffloadFull, DiskHits: t.DiskHits, Promotions: t.Promotions}
	}
	tt := a.m.TierTotals()
	writeJSON(w, http.StatusOK, map[string]any{"success": true, "tiers": out, "totals": TierSummary{
		Offloads: tt.Offloads, OffloadBytes: tt.OffloadBytes, OffloadFull: tt.OffloadFull, OffloadFailed: tt.OffloadFailed,
		DiskHits: tt.DiskHits, MemHits: tt.MemHits, Promotions: tt.Promotions, LoadFailures: tt.LoadFailures,
		DiskEvicted: tt.DiskEvicted, InflightBytes: tt.Inflight,
	}})
}
