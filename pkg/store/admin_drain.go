package store

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
)

// Drain jobs through the admin API: Mooncake's paths (POST
// /api/v1/drain_jobs, GET /api/v1/drain_jobs/query, POST
// /api/v1/drain_jobs/cancel), so the same calls drive mc's master and
// mooncake_master.

// DrainJobRequest is the body of POST /api/v1/drain_jobs.
type DrainJobRequest struct {
	Segments       []string `json:"segments"`
	TargetSegments []string `json:"target_segments"`
	MaxConcurrency int      `json:"max_concurrency"`
	Unmount        bool     `json:"unmount,omitempty"`
	Force          bool     `json:"force,omitempty"`
}

// DrainJobStatus is the body of GET /api/v1/drain_jobs/query: Mooncake's
// fields first, then mc's.
type DrainJobStatus struct {
	Success        bool     `json:"success"`
	JobID          string   `json:"job_id"`
	Type           int      `json:"type"`
	TypeName       string   `json:"type_name"`
	Status         int      `json:"status"`
	StatusName     string   `json:"status_name"`
	CreatedAtMs    int64    `json:"created_at_ms_epoch"`
	UpdatedAtMs    int64    `json:"last_updated_at_ms_epoch"`
	Segments       []string `json:"segments"`
	SucceededUnits int      `json:"succeeded_units"`
	FailedUnits    int      `json:"failed_units"`
	BlockedUnits   int      `json:"blocked_units"`
	ActiveUnits    int      `json:"active_units"`
	MigratedBytes  uint64   `json:"migrated_bytes"`
	Message        string   `json:"message"`
	ErrorCode      int32    `json:"error_code"`
	ErrorMessage   string   `json:"error_message"`

	TargetSegments []string `json:"target_segments"`
	MaxConcurrency int      `json:"max_concurrency"`
	Unmount        bool     `json:"unmount"`
	Force          bool     `json:"force"`
	PlannedUnits   int      `json:"planned_units"`
	PlannedBytes   uint64   `json:"planned_bytes"`
	SkippedUnits   int      `json:"skipped_units"`
	LostObjects    int      `json:"lost_objects"`
	LostPinned     int      `json:"lost_pinned_objects"`
	LostBytes      uint64   `json:"lost_bytes"`
	Unmounted      bool     `json:"unmounted"`
	FinishedAtMs   int64    `json:"finished_at_ms_epoch"`
}

// Drain job status names, as Mooncake numbers them.
var drainStatusNames = []string{"CREATED", "PLANNING", "RUNNING", "SUCCEEDED", "FAILED", "CANCELED"}

// Done reports whether the job has ended.
func (s DrainJobStatus) Done() bool { return s.Status >= 3 }

func (a *Admin) post(ctx context.Context, path string, body []byte) ([]byte, int, error) {
	return a.do(ctx, http.MethodPost, path, bytes.NewReader(body))
}

// CreateDrainJob starts a drain job and returns its id.
func (a *Admin) CreateDrainJob(ctx context.Context, req DrainJobRequest) (string, error) {
	if req.Segments == nil {
		req.Segments = []string{}
	}
	if req.TargetSegments == nil {
		req.TargetSegments = []string{}
	}
	body, err := json.Marshal(req)
	if err != nil {
		return "", err
	}
	const path = "/api/v1/drain_jobs"
	b, code, err := a.post(ctx, path, body)
	if err != nil {
		return "", err
	}
	if code != http.StatusOK {
		return "", adminError(a.base+path, code, b)
	}
	var out struct {
		JobID string `json:"job_id"`
	}
	if err := json.Unmarshal(b, &out); err != nil || out.JobID == "" {
		return "", fmt.Errorf("admin API %s%s: no job_id in %q", a.base, path, truncate(b))
	}
	return out.JobID, nil
}

// QueryDrainJob reads a job's state.
func (a *Admin) QueryDrainJob(ctx context.Context, id string) (DrainJobStatus, error) {
	b, err := a.getOK(ctx, "/api/v1/drain_jobs/query?job_id="+url.QueryEscape(id))
	if err != nil {
		return DrainJobStatus{}, err
	}
	var out DrainJobStatus
	if err := json.Unmarshal(b, &out); err != nil {
		return DrainJobStatus{}, fmt.Errorf("admin API %s: drain job %s: %w", a.base, id, err)
	}
	if out.StatusName == "" && out.Status >= 0 && out.Status < len(drainStatusNames) {
		out.StatusName = drainStatusNames[out.Status]
	}
	return out, nil
}

// CancelDrainJob cancels a job.
func (a *Admin) CancelDrainJob(ctx context.Context, id string) error {
	path := "/api/v1/drain_jobs/cancel?job_id=" + url.QueryEscape(id)
	b, code, err := a.post(ctx, path, nil)
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return adminError(a.base+path, code, b)
	}
	return nil
}

func truncate(b []byte) string {
	if len(b) > 200 {
		return string(b[:200]) + "..."
	}
	return string(b)
}

// SegmentState is a segment's status as GET /api/v1/segments/status
// ?segment=NAME answers it (Mooncake's shape; Status numbered as its
// SegmentStatus enum, OK 1), and POST /api/v1/segments/undrain (mc's
// way back from a drain), which adds the status it had.
type SegmentState struct {
	Success            bool   `json:"success"`
	Segment            string `json:"segment"`
	Status             int    `json:"status"`
	StatusName         string `json:"status_name"`
	PreviousStatus     int    `json:"previous_status"`
	PreviousStatusName string `json:"previous_status_name"`
	ErrorCode          int32  `json:"error_code"`
	ErrorMessage       string `json:"error_message"`
}

// SegmentStatus reads one segment's status (works against
// mooncake_master too).
func (a *Admin) SegmentStatus(ctx context.Context, segment string) (SegmentState, error) {
	b, err := a.getOK(ctx, "/api/v1/segments/status?segment="+url.QueryEscape(segment))
	if err != nil {
		return SegmentState{}, err
	}
	var out SegmentState
	if err := json.Unmarshal(b, &out); err != nil {
		return SegmentState{}, fmt.Errorf("admin API %s: segment %s status: %w", a.base, segment, err)
	}
	return out, nil
}

// UndrainSegment returns a DRAINING or DRAINED segment to service (mc's
// master; a state-changing call, so it carries the admin token).
func (a *Admin) UndrainSegment(ctx context.Context, segment string) (SegmentState, error) {
	path := "/api/v1/segments/undrain?segment=" + url.QueryEscape(segment)
	b, code, err := a.post(ctx, path, nil)
	if err != nil {
		return SegmentState{}, err
	}
	if code == http.StatusNotFound || code == http.StatusMethodNotAllowed {
		// mooncake_master has no such route: its 404 is not a segment's.
		var e struct {
			Code int32 `json:"error_code"`
		}
		if json.Unmarshal(b, &e) != nil || e.Code == 0 {
			return SegmentState{}, fmt.Errorf("admin API %s%s: HTTP %d: this master has no way back from a drain (mooncake_master has none: restart the segment's node)", a.base, path, code)
		}
	}
	if code != http.StatusOK {
		return SegmentState{}, adminError(a.base+path, code, b)
	}
	var out SegmentState
	if err := json.Unmarshal(b, &out); err != nil {
		return SegmentState{}, fmt.Errorf("admin API %s: undrain %s: %w", a.base, segment, err)
	}
	return out, nil
}
