package meta

import (
	"context"
	"sync"
)

// memory is an in-process Backend: a map of Mooncake keys to the JSON that
// would be stored in etcd, so descriptors go through the same encoder and
// decoder as in production.
type memory struct {
	mu sync.Mutex
	kv map[string][]byte
}

// NewMemory returns an in-process backend for tests of other packages.
func NewMemory() Backend { return &memory{kv: make(map[string][]byte)} }

func (m *memory) get(key string) ([]byte, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.kv[key]
	return v, ok
}

func (m *memory) put(key string, v []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.kv[key] = v
}

func (m *memory) del(key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.kv, key)
}

func (m *memory) GetSegment(ctx context.Context, name string) (*SegmentDesc, error) {
	key := SegmentKey("", name)
	v, ok := m.get(key)
	if !ok {
		return nil, segmentNotFound(name, key)
	}
	return DecodeSegment(v)
}

func (m *memory) PutSegment(ctx context.Context, d *SegmentDesc) error {
	b, err := EncodeSegment(d)
	if err != nil {
		return err
	}
	m.put(SegmentKey("", d.Name), b)
	return nil
}

func (m *memory) DeleteSegment(ctx context.Context, name string) error {
	m.del(SegmentKey("", name))
	return nil
}

func (m *memory) GetRPCMeta(ctx context.Context, server string) (RPCMeta, error) {
	key := RPCMetaKey("", server)
	v, ok := m.get(key)
	if !ok {
		return RPCMeta{}, rpcMetaNotFound(server, key)
	}
	return DecodeRPCMeta(server, v)
}

func (m *memory) PutRPCMeta(ctx context.Context, server string, r RPCMeta) error {
	b, err := EncodeRPCMeta(r)
	if err != nil {
		return err
	}
	m.put(RPCMetaKey("", server), b)
	return nil
}

func (m *memory) DeleteRPCMeta(ctx context.Context, server string) error {
	m.del(RPCMetaKey("", server))
	return nil
}

func (m *memory) Close() error { return nil }
