package meta

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// listPage bounds one range read: a cluster's descriptors (RDMA ones carry
// a buffer list each) need not fit in one gRPC message.
const listPage = 256

func (e *etcdBackend) read(ctx context.Context, key string) (KeyValue, bool, error) {
	var resp *clientv3.GetResponse
	err := e.call(ctx, func(ctx context.Context) (err error) {
		resp, err = e.cli.Get(ctx, key)
		return err
	})
	if err != nil {
		return KeyValue{}, false, fmt.Errorf("get %s: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return KeyValue{Key: key}, false, nil
	}
	kv := resp.Kvs[0]
	return KeyValue{Key: key, Value: kv.Value, Revision: kv.ModRevision}, true, nil
}

// list reads the prefix page by page at the revision of the first page, so
// the result is one consistent snapshot.
func (e *etcdBackend) list(ctx context.Context, prefix string) ([]KeyValue, error) {
	end := clientv3.GetPrefixRangeEnd(prefix)
	var out []KeyValue
	var rev int64
	from := prefix
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(listPage), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend)}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		var resp *clientv3.GetResponse
		err := e.call(ctx, func(ctx context.Context) (err error) {
			resp, err = e.cli.Get(ctx, from, opts...)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", prefix, err)
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		for _, kv := range resp.Kvs {
			out = append(out, KeyValue{Key: string(kv.Key), Value: kv.Value, Revision: kv.ModRevision})
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return out, nil
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// compareAndDelete is one transaction: every key still at the revision
// read (or, without one, holding the value read), then delete them all.
func (e *etcdBackend) compareAndDelete(ctx context.Context, kvs []KeyValue) (bool, error) {
	cmps := make([]clientv3.Cmp, 0, len(kvs))
	ops := make([]clientv3.Op, 0, len(kvs))
	for _, kv := range kvs {
		if kv.Revision != 0 {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(kv.Key), "=", kv.Revision))
		} else {
			// Value comparison alone would match an absent key against
			// an empty value; require the key to exist.
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(kv.Key), ">", 0),
				clientv3.Compare(clientv3.Value(kv.Key), "=", string(kv.Value)))
		}
		ops = append(ops, clientv3.OpDelete(kv.Key))
	}
	var resp *clientv3.TxnResponse
	err := e.call(ctx, func(ctx context.Context) (err error) {
		resp, err = e.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
		return err
	})
	if err != nil {
		return false, fmt.Errorf("compare-and-delete %s: %w", kvs[0].Key, err)
	}
	return resp.Succeeded, nil
}
