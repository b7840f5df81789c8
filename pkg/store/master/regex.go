package master

import (
	"context"
	"regexp"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvcache-ops/mc/pkg/store"
	pb "github.com/kvcache-ops/mc/pkg/store/storepb"
)

// compileKeyPattern compiles an RE2 pattern for matching keys. RE2 runs in
// time linear in the key, so no pattern can stall a shard's lock.
func compileKeyPattern(pattern string) (*regexp.Regexp, error) {
	if len(pattern) > store.MaxKeyLength {
		return nil, store.Errorf(store.InvalidParams, "pattern of %d bytes exceeds the limit of %d", len(pattern), store.MaxKeyLength)
	}
	re, err := regexp.Compile(pattern)
	if err != nil {
		return nil, store.Errorf(store.InvalidParams, "pattern %q: %v", pattern, err)
	}
	return re, nil
}

// matchKeys returns the complete keys of scope sc whose user key re
// finds, sorted (stored keys).
func (m *Master) matchKeys(re *regexp.Regexp, sc keyScope) []string {
	var out []string
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		for k, o := range sh.objects {
			if o.state != stateComplete {
				continue
			}
			if u, ok := sc.user(k); ok && re.MatchString(u) {
				out = append(out, k)
			}
		}
		sh.mu.Unlock()
	}
	slices.Sort(out)
	return out
}

// GetReplicaListByRegex lists the complete keys pattern (RE2) finds
// anywhere in them, sorted, the first limit of them with their replicas,
// and how many matched. An admin read: no lease, unlike Mooncake's.
func (m *Master) GetReplicaListByRegex(pattern string, limit int) (keys []string, res []ReplicaResult, matched int, err error) {
	return m.GetReplicaListByRegexIn("", pattern, limit)
}

// GetReplicaListByRegexIn is GetReplicaListByRegex over tenant's keys
// (every key for "" or without multi-tenant mode), matched and listed
// without their scope.
func (m *Master) GetReplicaListByRegexIn(tenant, pattern string, limit int) (keys []string, res []ReplicaResult, matched int, err error) {
	re, err := compileKeyPattern(pattern)
	if err != nil {
		return nil, nil, 0, err
	}
	sc := m.scope(tenant)
	keys = m.matchKeys(re, sc)
	matched = len(keys)
	if len(keys) > limit {
		keys = keys[:limit]
	}
	res = m.BatchQuery(keys)
	return sc.users(keys), res, matched, nil
}

// RegexRemoval is what RemoveByRegex did, or would do with dryRun.
type RegexRemoval struct {
	Removed []string // sorted
	Refused []string // sorted; RefusedErrs[i] says why
	// RefusedErrs: OBJECT_HAS_LEASE (being read, without force),
	// REPLICA_IS_NOT_READY (rewritten meanwhile), OBJECT_NOT_FOUND (gone
	// meanwhile).
	RefusedErrs []error
}

// RemoveByRegex removes the complete keys pattern (RE2) finds anywhere in
// them, each as BatchRemove would: a key being read is refused unless
// force. With dryRun nothing is removed and the answer is what would be.
func (m *Master) RemoveByRegex(pattern string, force, dryRun bool) (RegexRemoval, error) {
	return m.RemoveByRegexIn("", pattern, force, dryRun)
}

// RemoveByRegexIn is RemoveByRegex over tenant's keys (every key for ""
// or without multi-tenant mode); the keys it answers are user keys.
func (m *Master) RemoveByRegexIn(tenant, pattern string, force, dryRun bool) (out RegexRemoval, err error) {
	re, err := compileKeyPattern(pattern)
	if err != nil {
		return out, err
	}
	now := m.now()
	sc := m.scope(tenant)
	defer func() { out.Removed, out.Refused = sc.users(out.Removed), sc.users(out.Refused) }()
	for _, k := range m.matchKeys(re, sc) {
		if dryRun {
			sh := m.shardOf(k)
			sh.mu.Lock()
			err = removable(k, sh.objects[k], force, now)
			sh.mu.Unlock()
		} else {
			err = m.remove(k, force, now, nil)
		}
		if err != nil {
			out.Refused = append(out.Refused, k)
			out.RefusedErrs = append(out.RefusedErrs, err)
			continue
		}
		out.Removed = append(out.Removed, k)
	}
	if !dryRun {
		m.fenceDrops(out.Removed, nil)
	}
	return out, nil
}

// regexListLimit bounds the keys an answer lists (the counts cover all),
// so that it fits a message: MaxBatchSize keys of at most MaxKeyLength
// bytes are 64 MiB, the message limit, only if every key is that long.
const regexListLimit = store.MaxBatchSize

func (s *rpcServer) GetReplicaListByRegex(_ context.Context, r *pb.RegexRequest) (*pb.RegexReplicaListResponse, error) {
	t, err := s.m.ReadTenant(r.Tenant)
	var keys []string
	var res []ReplicaResult
	var matched int
	if err == nil {
		keys, res, matched, err = s.m.GetReplicaListByRegexIn(t, r.Pattern, regexListLimit)
	}
	if err != nil {
		s.m.m.Op("get_replica_list_by_regex", true)
		return nil, invalidPattern(err)
	}
	lists, _ := replicaLists(res)
	s.m.m.Op("get_replica_list_by_regex", false)
	return &pb.RegexReplicaListResponse{Keys: keys, Results: lists.Results, Matched: uint64(matched)}, nil
}

func (s *rpcServer) RemoveByRegex(_ context.Context, r *pb.RemoveByRegexRequest) (*pb.RemoveByRegexResponse, error) {
	t, err := s.m.ReadTenant(r.Tenant)
	var rm RegexRemoval
	if err == nil {
		rm, err = s.m.RemoveByRegexIn(t, r.Pattern, r.Force, r.DryRun)
	}
	if err != nil {
		s.m.m.Op("remove_by_regex", true)
		return nil, invalidPattern(err)
	}
	failed := false
	if !r.DryRun && len(rm.Removed) > 0 {
		// HA: acknowledged removals must be in the op log; if they cannot
		// be committed, they are reported as not done.
		if errs := s.durable(make([]error, len(rm.Removed))); errs[0] != nil {
			rm, failed = uncommitted(rm, errs[0]), true
		}
	}
	// As Mooncake's: a call fails on a bad pattern or a lost change, not
	// for the keys it leaves because they are being read.
	s.m.m.Op("remove_by_regex", failed)
	out := &pb.RemoveByRegexResponse{RemovedCount: uint64(len(rm.Removed)), RefusedCount: uint64(len(rm.Refused))}
	out.Removed = rm.Removed[:min(len(rm.Removed), regexListLimit)]
	for i := range min(len(rm.Refused), regexListLimit) {
		out.Refused = append(out.Refused, rm.Refused[i])
		out.RefusedResults = append(out.RefusedResults, store.ResultToPB(rm.RefusedErrs[i]))
	}
	return out, nil
}

// invalidPattern is the status of a refused pattern; the client reads
// InvalidArgument as INVALID_PARAMS, so the code is not repeated.
func invalidPattern(err error) error {
	msg := err.Error()
	if se, ok := err.(*store.Error); ok {
		msg = se.Msg
	}
	return status.Error(codes.InvalidArgument, msg)
}

// uncommitted moves rm's removals, which the HA op log did not take, to
// its refusals with err, keeping the refusals sorted with their errors.
func uncommitted(rm RegexRemoval, err error) RegexRemoval {
	type refusal struct {
		key string
		err error
	}
	all := make([]refusal, 0, len(rm.Refused)+len(rm.Removed))
	for i, k := range rm.Refused {
		all = append(all, refusal{k, rm.RefusedErrs[i]})
	}
	for _, k := range rm.Removed {
		all = append(all, refusal{k, err})
	}
	slices.SortFunc(all, func(a, b refusal) int { return strings.Compare(a.key, b.key) })
	out := RegexRemoval{Refused: make([]string, len(all)), RefusedErrs: make([]error, len(all))}
	for i, r := range all {
		out.Refused[i], out.RefusedErrs[i] = r.key, r.err
	}
	return out
}
