package store

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
)

// AdminDiskReplica is a replica on a node's disk tier as the admin API
// shows it: Mooncake's LOCAL_DISK fields, then mc's.
type AdminDiskReplica struct {
	ClientID  string `json:"client_id"`
	Size      uint64 `json:"object_size"`
	Endpoint  string `json:"transport_endpoint"`
	Segment   string `json:"segment_name"`
	TierID    string `json:"tier_id"`
	Version   uint64 `json:"version"`
	Connected bool   `json:"connected"`
}

// QueryKeyReplicas reads /query_key: the key's memory replicas and its
// disk replica, if any (no lease).
func (a *Admin) QueryKeyReplicas(ctx context.Context, key string) ([]AdminReplica, []AdminDiskReplica, error) {
	b, code, err := a.get(ctx, "/query_key?key="+queryValue(key))
	if err != nil {
		return nil, nil, err
	}
	if code != http.StatusOK {
		return nil, nil, adminError(a.base+"/query_key", code, b)
	}
	var d struct {
		Data []AdminReplica     `json:"data"`
		Disk []AdminDiskReplica `json:"local_disk_values"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, nil, fmt.Errorf("admin API %s/query_key: %w", a.base, err)
	}
	return d.Data, d.Disk, nil
}

// AdminTier is one node's disk tier in /api/v1/tiers (the master renders
// it, mc store stat reads it).
type AdminTier struct {
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
	// The node's staging pool for disk reads: its size, the bytes
	// holding staged reads now, the reads that waited for room, and the
	// staged reads the TTL freed with readers left (readers that died).
	StagingSize      uint64 `json:"staging_size_bytes"`
	StagingUsed      uint64 `json:"staging_used_bytes"`
	StagingWaits     uint64 `json:"staging_waits"`
	StagingReclaimed uint64 `json:"staging_reclaimed"`
	// Readers' own staged reads handed back to the node, and the
	// batches readers asked the node for directly (not through the
	// master).
	StagingReleased uint64 `json:"staging_released"`
	DirectBatches   uint64 `json:"staging_direct_batches"`
}

// AdminTierTotals are the master's disk-tier counters.
type AdminTierTotals struct {
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
	// Staged reads handed back by their readers, freed by the staging
	// TTL with readers left, and reads that waited for staging room.
	StagedReleased  uint64 `json:"staged_released"`
	StagedReclaimed uint64 `json:"staged_reclaimed"`
	StagingWaits    uint64 `json:"staging_waits"`
	DirectBatches   uint64 `json:"staging_direct_batches"`
}

// Tiers reads /api/v1/tiers (mc masters only: ok is false for a master
// without it, a mooncake_master).
func (a *Admin) Tiers(ctx context.Context) (tiers []AdminTier, totals AdminTierTotals, ok bool, err error) {
	b, code, err := a.get(ctx, "/api/v1/tiers")
	if err != nil {
		return nil, totals, false, err
	}
	if code == http.StatusNotFound {
		return nil, totals, false, nil
	}
	if code != http.StatusOK {
		return nil, totals, false, adminError(a.base+"/api/v1/tiers", code, b)
	}
	var d struct {
		Tiers  []AdminTier     `json:"tiers"`
		Totals AdminTierTotals `json:"totals"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, totals, false, fmt.Errorf("admin API %s/api/v1/tiers: %w", a.base, err)
	}
	return d.Tiers, d.Totals, true, nil
}
