package meta

import (
	"context"
	"fmt"
)

// kvStore is what etcd, the HTTP metadata server and the in-memory map have
// in common: bytes under a key. found is false when the key is absent.
type kvStore interface {
	get(ctx context.Context, key string) (v []byte, found bool, err error)
	put(ctx context.Context, key string, v []byte) error
	del(ctx context.Context, key string) error
	close() error
}

// kvBackend implements Backend once for every key-value store, so Mooncake's
// keys, the codec and the not-found errors are the same whatever holds them.
type kvBackend struct {
	kv        kvStore
	clusterID string
}

func (b *kvBackend) GetSegment(ctx context.Context, name string) (*SegmentDesc, error) {
	key := SegmentKey(b.clusterID, name)
	v, ok, err := b.kv.get(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("segment %q: %w", name, err)
	}
	if !ok {
		return nil, segmentNotFound(name, key)
	}
	d, err := DecodeSegment(v)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	return d, nil
}

func (b *kvBackend) PutSegment(ctx context.Context, d *SegmentDesc) error {
	v, err := EncodeSegment(d)
	if err != nil {
		return err
	}
	return b.kv.put(ctx, SegmentKey(b.clusterID, d.Name), v)
}

func (b *kvBackend) DeleteSegment(ctx context.Context, name string) error {
	return b.kv.del(ctx, SegmentKey(b.clusterID, name))
}

func (b *kvBackend) GetRPCMeta(ctx context.Context, server string) (RPCMeta, error) {
	key := RPCMetaKey(b.clusterID, server)
	v, ok, err := b.kv.get(ctx, key)
	if err != nil {
		return RPCMeta{}, fmt.Errorf("rpc meta of %q: %w", server, err)
	}
	if !ok {
		return RPCMeta{}, rpcMetaNotFound(server, key)
	}
	return DecodeRPCMeta(server, v)
}

func (b *kvBackend) PutRPCMeta(ctx context.Context, server string, m RPCMeta) error {
	v, err := EncodeRPCMeta(m)
	if err != nil {
		return err
	}
	return b.kv.put(ctx, RPCMetaKey(b.clusterID, server), v)
}

func (b *kvBackend) DeleteRPCMeta(ctx context.Context, server string) error {
	return b.kv.del(ctx, RPCMetaKey(b.clusterID, server))
}

func (b *kvBackend) Close() error { return b.kv.close() }
