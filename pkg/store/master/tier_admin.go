package master

import (
	"net/http"

	"github.com/kvcache-ops/mc/pkg/store"
)

func localDiskDescs(d *DiskReplica) []store.AdminDiskReplica {
	if d == nil {
		return nil
	}
	return []store.AdminDiskReplica{{ClientID: d.Client.String(), Size: d.Size, Endpoint: d.Endpoint, Segment: d.Segment, TierID: d.Tier, Version: d.Version, Connected: d.Online}}
}

// tiers serves /api/v1/tiers: every node's disk tier and the totals.
func (a *admin) tiers(w http.ResponseWriter, _ *http.Request) {
	ts := a.m.Tiers()
	out := make([]store.AdminTier, len(ts))
	for i, t := range ts {
		out[i] = store.AdminTier{ID: t.ID, Segment: t.Segment, ClientID: t.Client.String(), Connected: t.Online, Dir: t.Dir, ODirect: t.Direct,
			Capacity: t.Capacity, Used: t.Used, Records: t.Records, Files: t.Files, DiskReplicas: t.Replicas,
			Offloads: t.Offloads, OffloadFull: t.OffloadFull, DiskHits: t.DiskHits, Promotions: t.Promotions,
			StagingSize: t.StagingSize, StagingUsed: t.StagingUsed, StagingWaits: t.StagingWaits, StagingReclaimed: t.StagingReclaimed,
			StagingReleased: t.StagingReleased, DirectBatches: t.DirectBatches}
	}
	tt := a.m.TierTotals()
	writeJSON(w, http.StatusOK, map[string]any{"success": true, "tiers": out, "totals": store.AdminTierTotals{
		Offloads: tt.Offloads, OffloadBytes: tt.OffloadBytes, OffloadFull: tt.OffloadFull, OffloadFailed: tt.OffloadFailed,
		DiskHits: tt.DiskHits, MemHits: tt.MemHits, Promotions: tt.Promotions, LoadFailures: tt.LoadFailures,
		DiskEvicted: tt.DiskEvicted, InflightBytes: tt.Inflight,
		StagedReleased: tt.StagedReleased, StagedReclaimed: tt.StagedReclaimed, StagingWaits: tt.StagingWaits, DirectBatches: tt.DirectBatches,
	}})
}
