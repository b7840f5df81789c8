package master

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kvcache-ops/mc/pkg/store"
)

// The way back from a drain (mc store drain --undo): a DRAINED segment
// stays out of service until its node restarts otherwise, and Mooncake
// (3b5a594) has no call for it (its cancel restores the segments only
// while the job runs; /api/v1/segments/status only reads).

// MooncakeCode is the status as Mooncake's SegmentStatus enum numbers it
// (UNDEFINED 0, OK 1, DRAINING 2, DRAINED 3, GRACEFULLY_UNMOUNTING 4,
// UNMOUNTING 5), the number /api/v1/segments/status answers.
func (s SegStatus) MooncakeCode() int { return int(s) + 1 }

// SegmentStatusOf reports the named segment's status.
func (m *Master) SegmentStatusOf(name string) (SegStatus, error) {
	m.space.mu.Lock()
	defer m.space.mu.Unlock()
	seg := m.space.byName[name]
	if seg == nil {
		return 0, store.Errorf(store.SegmentNotFound, "segment %q is not mounted", name)
	}
	return seg.status, nil
}

// UndrainSegment returns the named segment to service (OK) and reports
// the status it had. A DRAINED segment takes new objects again at once.
// A DRAINING one does too, and the job draining it is canceled (copies
// under way finish); a job that drains other segments as well is left
// alone and the call refused, naming the job, since undoing one segment
// would silently change what the job promises for the others. A segment
// already in service is answered OK (the call is idempotent); an
// unmounting one cannot come back (its node remounts it).
func (m *Master) UndrainSegment(name string) (SegStatus, error) {
	m.drains.mu.Lock()
	defer m.drains.mu.Unlock()
	m.space.mu.Lock()
	seg := m.space.byName[name]
	if seg == nil {
		m.space.mu.Unlock()
		return 0, store.Errorf(store.SegmentNotFound, "undo drain: segment %q is not mounted", name)
	}
	prev := seg.status
	var job *drainJob
	switch prev {
	case SegOK:
		m.space.mu.Unlock()
		return prev, nil
	case SegGracefullyUnmounting, SegUnmounting:
		m.space.mu.Unlock()
		return prev, store.Errorf(store.UnavailableInCurrentStatus, "undo drain: segment %q is %s: it cannot return to service; its node mounts it again (restart or remount)", name, prev)
	case SegDraining:
		for _, j := range m.drains.jobs {
			if !j.Status.Done() && slices.Contains(j.segs, seg) {
				job = j
				break
			}
		}
		if job != nil && len(job.segs) > 1 {
			others := make([]string, 0, len(job.segs)-1)
			for _, s := range job.segs {
				if s != seg {
					others = append(others, s.info.Name)
				}
			}
			m.space.mu.Unlock()
			return prev, store.Errorf(store.UnavailableInCurrentStatus, "undo drain: segment %q is being drained by job %s together with %s: cancel the job to return them all (mc store drain --cancel %s), or undo each once it ends",
				name, job.ID, strings.Join(others, ", "), job.ID)
		}
	}
	// endDrain leaves a segment that is no longer DRAINING as it is, so a
	// job ending after this keeps it in service.
	seg.status = SegOK
	m.space.mu.Unlock()
	if job != nil {
		job.cancel = true
		kick(job.kick)
	}
	msg := fmt.Sprintf("segment %s back in service (was %s)", name, prev)
	if job != nil {
		msg += fmt.Sprintf("; drain job %s canceled", job.ID)
	}
	m.log.Info(msg)
	return prev, nil
}

// outOfServiceLocked names the mounted segments a drain keeps from new
// placements (DRAINING or DRAINED), sorted (space.mu held).
func (s *space) outOfServiceLocked() []string {
	var names []string
	for _, seg := range s.order {
		if seg.status == SegDraining || seg.status == SegDrained {
			names = append(names, seg.info.Name)
		}
	}
	slices.Sort(names)
	return names
}

// drainedHint is what a put that found no room adds when drains keep
// segments out of service: those segments, and the way back.
func drainedHint(names []string) string {
	if len(names) == 0 {
		return ""
	}
	list := names
	if len(list) > 4 {
		list = append(slices.Clip(list[:4]), fmt.Sprintf("%d more", len(names)-4))
	}
	verb := "segments are"
	if len(names) == 1 {
		verb = "segment is"
	}
	return fmt.Sprintf(": %d %s draining/drained (%s; mc store drain --undo SEGMENT returns one to service)", len(names), verb, strings.Join(list, ", "))
}
