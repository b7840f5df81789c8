package store

import (
	"context"
	"fmt"
	"unicode/utf8"

	pb "github.com/kvcache-ops/mc/pkg/store/storepb"
)

// RegexMatch is what GetReplicaListByRegex answers: the first keys the
// pattern found, sorted, with their replicas, and how many it found.
type RegexMatch struct {
	Keys     []string
	Replicas [][]Replica // Replicas[i] are Keys[i]'s
	Matched  uint64      // > len(Keys) when the master listed only some
}

// GetReplicaListByRegex lists the stored keys an RE2 pattern (Go's
// regexp syntax) finds anywhere in them, with their replicas, without a
// lease. The master lists at most MaxBatchSize keys; Matched counts all.
func (c *Client) GetReplicaListByRegex(ctx context.Context, pattern string) (RegexMatch, error) {
	if err := c.enter(); err != nil {
		return RegexMatch{}, err
	}
	defer c.leave()
	if !utf8.ValidString(pattern) {
		// mc's gRPC cannot carry it, and no key (CheckKey) could match it.
		return RegexMatch{}, Errorf(InvalidParams, "pattern %q is not valid UTF-8", pattern)
	}
	return c.w.replicaListByRegex(ctx, pattern)
}

// RegexRemoval is what RemoveByRegex did (or, as a dry run, would do).
type RegexRemoval struct {
	Removed      []string // sorted, at most MaxBatchSize of them
	RemovedCount uint64
	Refused      []string // sorted, at most MaxBatchSize of them
	RefusedErrs  []error  // why each was kept (OBJECT_HAS_LEASE...)
	RefusedCount uint64
}

// RemoveByRegex removes the stored keys an RE2 pattern finds anywhere in
// them, each as Remove would: a key being read is kept unless force.
// With dryRun nothing is removed and the answer says what would be.
func (c *Client) RemoveByRegex(ctx context.Context, pattern string, force, dryRun bool) (RegexRemoval, error) {
	if err := c.enter(); err != nil {
		return RegexRemoval{}, err
	}
	defer c.leave()
	if !utf8.ValidString(pattern) {
		// mc's gRPC cannot carry it, and no key (CheckKey) could match it.
		return RegexRemoval{}, Errorf(InvalidParams, "pattern %q is not valid UTF-8", pattern)
	}
	return c.w.removeByRegex(ctx, pattern, force, dryRun)
}

// replicaListByRegex and removeByRegex over mc's gRPC.

func (w *grpcWire) replicaListByRegex(ctx context.Context, pattern string) (RegexMatch, error) {
	var out RegexMatch
	var resp *pb.RegexReplicaListResponse
	err := w.readCall(ctx, "get replica list by regex", func(ctx context.Context) (err error) {
		resp, err = w.rpc.GetReplicaListByRegex(ctx, &pb.RegexRequest{ClientId: UUIDToPB(w.cfg.id), Pattern: pattern, Tenant: w.cfg.tenant})
		return err
	})
	if err != nil {
		return out, err
	}
	if len(resp.Results) != len(resp.Keys) {
		return out, Errorf(RPCFail, "get replica list by regex: master answered %d replica lists for %d keys", len(resp.Results), len(resp.Keys))
	}
	out.Keys, out.Matched = resp.Keys, resp.Matched
	out.Replicas = make([][]Replica, len(resp.Keys))
	for i, l := range resp.Results {
		// A key removed between the match and the listing has none.
		out.Replicas[i], _, _ = ReplicaListFromPB(l)
	}
	return out, nil
}

func (w *grpcWire) removeByRegex(ctx context.Context, pattern string, force, dryRun bool) (RegexRemoval, error) {
	var out RegexRemoval
	var resp *pb.RemoveByRegexResponse
	what := "remove by regex"
	call := w.call
	if dryRun {
		what, call = "remove by regex (dry run)", w.readCall
	}
	err := call(ctx, what, func(ctx context.Context) (err error) {
		resp, err = w.rpc.RemoveByRegex(ctx, &pb.RemoveByRegexRequest{ClientId: UUIDToPB(w.cfg.id), Pattern: pattern, Force: force, DryRun: dryRun, Tenant: w.cfg.tenant})
		return err
	})
	if err != nil {
		return out, err
	}
	if len(resp.RefusedResults) != len(resp.Refused) {
		return out, Errorf(RPCFail, "%s: master answered %d reasons for %d refused keys", what, len(resp.RefusedResults), len(resp.Refused))
	}
	out = RegexRemoval{Removed: resp.Removed, RemovedCount: resp.RemovedCount, Refused: resp.Refused, RefusedCount: resp.RefusedCount}
	out.RefusedErrs = make([]error, len(resp.Refused))
	for i, r := range resp.RefusedResults {
		if out.RefusedErrs[i] = ResultFromPB(r); out.RefusedErrs[i] == nil {
			out.RefusedErrs[i] = fmt.Errorf("refused without a reason")
		}
	}
	return out, nil
}
