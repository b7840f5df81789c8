package meta

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
)

// KeyValue is one key of a metadata store as it was read: what a
// compare-and-delete needs to prove the key unchanged since.
type KeyValue struct {
	Key   string
	Value []byte
	// Revision is etcd's ModRevision of the key; 0 for stores without
	// revisions, where the value itself is compared.
	Revision int64
}

// ErrNoList is matched when a store cannot enumerate its keys: Mooncake's
// HTTP metadata protocol has only GET, PUT and DELETE of one key.
var ErrNoList = errors.New("the HTTP metadata protocol has no list call")

// ErrNoStore is matched when a backend keeps no keys to inspect
// (P2PHANDSHAKE: peers describe themselves over the handshake socket).
var ErrNoStore = errors.New("P2PHANDSHAKE stores no segments")

// Store is the raw key-value view of a storing backend (etcd, HTTP,
// memory), for tools that inventory and clean what engines left behind.
type Store interface {
	// Prefix is where this backend's keys live: "mooncake/" or
	// "mooncake/<cluster>/".
	Prefix() string
	// ClusterID is the MC_METADATA_CLUSTER_ID the backend was opened with.
	ClusterID() string
	// ReadKey returns key's value; found is false when it is absent.
	ReadKey(ctx context.Context, key string) (kv KeyValue, found bool, err error)
	// ListKeys returns every key under prefix, sorted by key. HTTP stores
	// return ErrNoList.
	ListKeys(ctx context.Context, prefix string) ([]KeyValue, error)
	// CompareAndDelete deletes every key of kvs if each still holds what
	// was read (same revision, or same value where there are no
	// revisions); otherwise it deletes nothing and returns false. A key
	// already gone counts as changed.
	CompareAndDelete(ctx context.Context, kvs ...KeyValue) (deleted bool, err error)
	// AtomicDelete reports whether CompareAndDelete is one atomic step
	// (etcd transaction, memory). Over HTTP it is a read, a comparison and
	// a DELETE per key: a write between them is not detected.
	AtomicDelete() bool
	// WriteKey stores value under key, replacing what was there; DeleteKey
	// removes key (absent is not an error). Other subsystems keep their
	// own small records next to the engines' (pkg/coll's rendezvous).
	WriteKey(ctx context.Context, key string, value []byte) error
	DeleteKey(ctx context.Context, key string) error
}

// StoreOf returns the raw store behind b, or an error matching ErrNoStore
// for P2PHANDSHAKE.
func StoreOf(b Backend) (Store, error) {
	if kb, ok := b.(*kvBackend); ok {
		return kb, nil
	}
	return nil, ErrNoStore
}

// KeyPrefix is where Mooncake keeps a cluster's keys: "mooncake/", or
// "mooncake/<cluster>/" with MC_METADATA_CLUSTER_ID.
func KeyPrefix(clusterID string) string { return keyPrefix(clusterID) }

// The optional primitives a kvStore may offer beyond get/put/del.
type (
	kvReader interface {
		read(ctx context.Context, key string) (KeyValue, bool, error)
	}
	kvLister interface {
		list(ctx context.Context, prefix string) ([]KeyValue, error)
	}
	kvCAS interface {
		compareAndDelete(ctx context.Context, kvs []KeyValue) (bool, error)
	}
)

func (b *kvBackend) Prefix() string    { return keyPrefix(b.clusterID) }
func (b *kvBackend) ClusterID() string { return b.clusterID }

func (b *kvBackend) ReadKey(ctx context.Context, key string) (KeyValue, bool, error) {
	if r, ok := b.kv.(kvReader); ok {
		return r.read(ctx, key)
	}
	v, found, err := b.kv.get(ctx, key)
	return KeyValue{Key: key, Value: v}, found, err
}

func (b *kvBackend) WriteKey(ctx context.Context, key string, value []byte) error {
	return b.kv.put(ctx, key, value)
}

func (b *kvBackend) DeleteKey(ctx context.Context, key string) error {
	return b.kv.del(ctx, key)
}

func (b *kvBackend) ListKeys(ctx context.Context, prefix string) ([]KeyValue, error) {
	l, ok := b.kv.(kvLister)
	if !ok {
		return nil, ErrNoList
	}
	return l.list(ctx, prefix)
}

func (b *kvBackend) AtomicDelete() bool {
	_, ok := b.kv.(kvCAS)
	return ok
}

func (b *kvBackend) CompareAndDelete(ctx context.Context, kvs ...KeyValue) (bool, error) {
	if len(kvs) == 0 {
		return false, nil
	}
	if c, ok := b.kv.(kvCAS); ok {
		return c.compareAndDelete(ctx, kvs)
	}
	// No conditional delete in the protocol (HTTP): compare, then delete.
	// This narrows the window to one round trip; it does not close it.
	for _, want := range kvs {
		got, found, err := b.ReadKey(ctx, want.Key)
		if err != nil {
			return false, fmt.Errorf("compare %s: %w", want.Key, err)
		}
		if !found || !bytes.Equal(got.Value, want.Value) {
			return false, nil
		}
	}
	for _, kv := range kvs {
		if err := b.kv.del(ctx, kv.Key); err != nil {
			return false, fmt.Errorf("delete %s: %w", kv.Key, err)
		}
	}
	return true, nil
}

// The in-memory store compares values under its lock: the same
// all-or-nothing semantics as etcd's transaction.

func (m *memory) list(_ context.Context, prefix string) ([]KeyValue, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []KeyValue
	for k, v := range m.kv {
		if strings.HasPrefix(k, prefix) {
			out = append(out, KeyValue{Key: k, Value: v})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

func (m *memory) compareAndDelete(_ context.Context, kvs []KeyValue) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, want := range kvs {
		v, ok := m.kv[want.Key]
		if !ok || !bytes.Equal(v, want.Value) {
			return false, nil
		}
	}
	for _, kv := range kvs {
		delete(m.kv, kv.Key)
	}
	return true, nil
}
