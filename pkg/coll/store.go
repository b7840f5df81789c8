package coll

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/kvcache-ops/mc/pkg/engine/meta"
)

// Keys live under "mc-coll/[<cluster>/]<group>/", outside Mooncake's
// "mooncake/" prefix, so `mc meta ls|gc` never mistake them for segments:
//
//	size            {"initial":W,"size":N}     written at creation, grown by ExtendGroupSizeTo
//	state/<r>       {"active":b,"epoch":e}     absent: active iff r < initial, epoch 0
//	subgroups       {"count":k}                subgroups created so far (a joiner starts there)
//	rank/<r>        rankInfo                   the root group's ranks
//	sub<k>/rank/<i> rankInfo                   subgroup k's members
//	done/<r>        {}                         rank r finished the run (Finish); the last one removes every key
type rendezvous struct {
	st   meta.Store
	root string
}

func newRendezvous(st meta.Store, group string) *rendezvous {
	root := "mc-coll/"
	if c := st.ClusterID(); c != "" {
		root += c + "/"
	}
	return &rendezvous{st: st, root: root + group + "/"}
}

// rankState is one root rank's entry of the active mask. Every change
// (death, recovery) increments epoch, so the sum of epochs plus the size
// is a version that only grows.
type rankState struct {
	Active bool `json:"active"`
	Epoch  int  `json:"epoch"`
}

type sizeRecord struct {
	Initial int `json:"initial"`
	Size    int `json:"size"`
}

// rankInfo is what a rank publishes so peers can write into its inbox.
type rankInfo struct {
	Segment  string `json:"segment"`
	Inbox    uint64 `json:"inbox"`
	InboxLen int    `json:"inbox_len"`
	Capacity int    `json:"capacity"`
	Slots    int    `json:"slots"`
	SlotSize int    `json:"slot_size"`
	// Epoch is the rank's state epoch this record belongs to: a record
	// whose epoch is not the rank's current one is a previous
	// incarnation's (or, one ahead, a joiner waiting to be recovered).
	Epoch int `json:"epoch"`
}

func (z *rendezvous) get(ctx context.Context, key string, v any) (bool, error) {
	kv, found, err := z.st.ReadKey(ctx, z.root+key)
	if err != nil || !found {
		return false, err
	}
	if err := json.Unmarshal(kv.Value, v); err != nil {
		return false, fmt.Errorf("rendezvous key %s%s: %w", z.root, key, err)
	}
	return true, nil
}

func (z *rendezvous) put(ctx context.Context, key string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if err := z.st.WriteKey(ctx, z.root+key, b); err != nil {
		return fmt.Errorf("rendezvous: %w", err)
	}
	return nil
}

func (z *rendezvous) size(ctx context.Context) (sizeRecord, error) {
	var s sizeRecord
	found, err := z.get(ctx, "size", &s)
	if err != nil {
		return s, err
	}
	if !found {
		return s, fmt.Errorf("group %s has no size record: no initial rank created it", strings.TrimSuffix(z.root, "/"))
	}
	return s, nil
}

// records reads prefix<i> for i in [0, n): one consistent list where the
// store can list (etcd, memory), else one read per key (HTTP). Absent
// keys are nil.
func (z *rendezvous) records(ctx context.Context, prefix string, n int) ([][]byte, error) {
	out := make([][]byte, n)
	kvs, err := z.st.ListKeys(ctx, z.root+prefix)
	if errors.Is(err, meta.ErrNoList) {
		for i := range out {
			kv, found, err := z.st.ReadKey(ctx, z.root+prefix+strconv.Itoa(i))
			if err != nil {
				return nil, fmt.Errorf("rendezvous: %w", err)
			}
			if found {
				out[i] = kv.Value
			}
		}
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("rendezvous: %w", err)
	}
	for _, kv := range kvs {
		i, err := strconv.Atoi(strings.TrimPrefix(kv.Key, z.root+prefix))
		if err != nil || i < 0 || i >= n {
			continue
		}
		out[i] = kv.Value
	}
	return out, nil
}

// states reads every root rank's state below capacity.
func (z *rendezvous) states(ctx context.Context, capacity, initial int) ([]rankState, error) {
	recs, err := z.records(ctx, "state/", capacity)
	if err != nil {
		return nil, err
	}
	out := make([]rankState, capacity)
	for r, b := range recs {
		out[r] = rankState{Active: r < initial}
		if b != nil {
			if err := json.Unmarshal(b, &out[r]); err != nil {
				return nil, fmt.Errorf("rendezvous key %sstate/%d: %w", z.root, r, err)
			}
		}
	}
	return out, nil
}

func stateKey(r int) string { return "state/" + strconv.Itoa(r) }

// setState moves root rank r to active (or not) unless it is already
// there. Every rank that notices the same change writes the same record,
// so concurrent writers agree.
func (z *rendezvous) setState(ctx context.Context, r, initial int, active bool) error {
	s := rankState{Active: r < initial}
	if _, err := z.get(ctx, stateKey(r), &s); err != nil {
		return err
	}
	if s.Active == active {
		return nil
	}
	return z.put(ctx, stateKey(r), rankState{Active: active, Epoch: s.Epoch + 1})
}

// removeAll deletes every key of the group: one listing where the store
// can list, else each key the layout above can hold for capacity root
// ranks (the subgroups' count read from its record).
func (z *rendezvous) removeAll(ctx context.Context, capacity int) error {
	var keys []string
	kvs, err := z.st.ListKeys(ctx, z.root)
	switch {
	case errors.Is(err, meta.ErrNoList):
		var n struct {
			Count int `json:"count"`
		}
		if _, err := z.get(ctx, "subgroups", &n); err != nil {
			return err
		}
		keys = append(keys, z.root+"size", z.root+"subgroups")
		for r := range capacity {
			for _, p := range []string{"state/", "rank/", "done/"} {
				keys = append(keys, z.root+p+strconv.Itoa(r))
			}
			for k := range n.Count {
				keys = append(keys, z.root+"sub"+strconv.Itoa(k)+"/rank/"+strconv.Itoa(r))
			}
		}
	case err != nil:
		return fmt.Errorf("rendezvous: %w", err)
	default:
		for _, kv := range kvs {
			keys = append(keys, kv.Key)
		}
	}
	for _, k := range keys {
		if err := z.st.DeleteKey(ctx, k); err != nil {
			return fmt.Errorf("rendezvous: remove %s: %w", k, err)
		}
	}
	return nil
}
