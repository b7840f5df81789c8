package meta

import (
	"context"
	"sync"
)

// memory is an in-process key-value store: a map of Mooncake keys to the
// JSON that would be stored in etcd, so descriptors go through the same
// encoder and decoder as in production.
type memory struct {
	mu sync.Mutex
	kv map[string][]byte
}

// NewMemory returns an in-process backend for tests of other packages.
func NewMemory() Backend { return &kvBackend{kv: &memory{kv: make(map[string][]byte)}} }

func (m *memory) get(_ context.Context, key string) ([]byte, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.kv[key]
	return v, ok, nil
}

func (m *memory) put(_ context.Context, key string, v []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.kv[key] = v
	return nil
}

func (m *memory) del(_ context.Context, key string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.kv, key)
	return nil
}

func (m *memory) close() error { return nil }
