package master

import (
	"encoding/json"
	"io"
	"net/http"

	"github.com/kvcache-ops/mc/pkg/store"
)

// Mooncake's drain job paths (store.md, "Drain jobs"): the same scripts
// drive mc's master and mooncake_master. mc adds fields Mooncake's
// clients ignore (unmount, force; planned, lost and skipped counts).

// StatusOf renders a job as the query path answers it.
func StatusOf(j DrainJob) store.DrainJobStatus {
	out := store.DrainJobStatus{
		Success: true, JobID: j.ID.String(), Type: 0, TypeName: "DRAIN",
		Status: int(j.Status), StatusName: j.Status.String(),
		CreatedAtMs: j.Created.UnixMilli(), UpdatedAtMs: j.Updated.UnixMilli(),
		Segments: j.Request.Segments, SucceededUnits: j.Succeeded, FailedUnits: j.Failed,
		BlockedUnits: j.Blocked, ActiveUnits: j.Active, MigratedBytes: j.MigratedBytes, Message: j.Message,
		TargetSegments: j.Request.Targets, MaxConcurrency: j.Request.MaxConcurrency, Unmount: j.Request.Unmount, Force: j.Request.Force,
		PlannedUnits: j.Planned, PlannedBytes: j.PlannedBytes, SkippedUnits: j.Skipped,
		LostObjects: j.LostObjects, LostPinned: j.LostPinned, LostBytes: j.LostBytes, Unmounted: j.Unmounted,
	}
	if j.Code != 0 {
		out.ErrorCode, out.ErrorMessage = int32(j.Code), j.Message
	}
	if out.Segments == nil {
		out.Segments = []string{}
	}
	if out.TargetSegments == nil {
		out.TargetSegments = []string{}
	}
	if !j.Finished.IsZero() {
		out.FinishedAtMs = j.Finished.UnixMilli()
	}
	return out
}

// httpStatusOf maps a store error to the HTTP status mooncake_master
// answers it with.
func httpStatusOf(err error) int {
	switch store.CodeOf(err) {
	case store.InvalidParams:
		return http.StatusBadRequest
	case store.JobNotFound, store.SegmentNotFound, store.ObjectNotFound:
		return http.StatusNotFound
	case store.UnavailableInCurrentMode, store.UnavailableInCurrentStatus:
		return http.StatusConflict
	}
	return http.StatusInternalServerError
}

func (a *admin) createDrain(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		writeErr(w, http.StatusBadRequest, store.Errorf(store.InvalidParams, "read body: %v", err))
		return
	}
	var req store.DrainJobRequest
	if err := json.Unmarshal(body, &req); err != nil {
		writeErr(w, http.StatusBadRequest, store.Errorf(store.InvalidParams, "Invalid JSON body: %v", err))
		return
	}
	id, err := a.m.CreateDrainJob(DrainRequest{Segments: req.Segments, Targets: req.TargetSegments, MaxConcurrency: req.MaxConcurrency, Unmount: req.Unmount, Force: req.Force})
	if err != nil {
		writeErr(w, httpStatusOf(err), err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"success": true, "job_id": id.String(), "status": "CREATED", "error_code": 0, "error_message": ""})
}

func (a *admin) jobID(w http.ResponseWriter, r *http.Request) (store.UUID, bool) {
	s := queryParam(r, "job_id", false)
	id, err := store.ParseUUID(s)
	if s == "" || err != nil {
		writeErr(w, http.StatusBadRequest, store.Errorf(store.InvalidParams, "Missing or invalid job_id %q (want first-second, as create answered)", s))
		return store.UUID{}, false
	}
	return id, true
}

func (a *admin) queryDrain(w http.ResponseWriter, r *http.Request) {
	id, ok := a.jobID(w, r)
	if !ok {
		return
	}
	j, err := a.m.QueryDrainJob(id)
	if err != nil {
		writeErr(w, httpStatusOf(err), err)
		return
	}
	writeJSON(w, http.StatusOK, StatusOf(j))
}

func (a *admin) cancelDrain(w http.ResponseWriter, r *http.Request) {
	id, ok := a.jobID(w, r)
	if !ok {
		return
	}
	if err := a.m.CancelDrainJob(id); err != nil {
		writeErr(w, httpStatusOf(err), err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"success": true, "job_id": id.String(), "status": "CANCELED", "error_code": 0, "error_message": ""})
}

func (a *admin) listDrains(w http.ResponseWriter, _ *http.Request) {
	jobs := a.m.DrainJobs()
	out := make([]store.DrainJobStatus, len(jobs))
	for i, j := range jobs {
		out[i] = StatusOf(j)
	}
	writeJSON(w, http.StatusOK, map[string]any{"success": true, "jobs": out})
}
