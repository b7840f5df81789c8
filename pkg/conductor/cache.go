package conductor

import (
	"github.com/kvcache-ops/mc/pkg/store/policy"
)

// Cache is one prefill instance's KV-cache of blocks, by hash id, with a
// capacity in blocks (0 = unbounded) and an eviction policy from
// pkg/store/policy.
type Cache struct {
	capacity int
	p        policy.Policy[int64]
	blocks   map[int64]*policy.Entry[int64]
}

// NewCache makes a cache of capacity blocks (0: unbounded) evicting with
// the named policy.
func NewCache(capacity int, policyName string) (*Cache, error) {
	p, err := policy.New[int64](policyName)
	if err != nil {
		return nil, err
	}
	return &Cache{capacity: capacity, p: p, blocks: make(map[int64]*policy.Entry[int64])}, nil
}

// PrefixLen is how many leading blocks of ids the cache holds: the
// prefix a request can reuse (a later block is useless once one before it
// is missing, since each id chains its prefix).
func (c *Cache) PrefixLen(ids []int64) int {
	for i, id := range ids {
		if _, ok := c.blocks[id]; !ok {
			return i
		}
	}
	return len(ids)
}

// Has reports whether block id is cached.
func (c *Cache) Has(id int64) bool {
	_, ok := c.blocks[id]
	return ok
}

// Use records that a request used ids in order: cached blocks are touched,
// missing ones inserted, evicting per policy when full. It returns how
// many blocks it inserted.
func (c *Cache) Use(ids []int64) (inserted int) {
	for depth, id := range ids {
		if e, ok := c.blocks[id]; ok {
			c.p.Touch(e, depth)
			continue
		}
		if c.capacity > 0 && len(c.blocks) >= c.capacity {
			v := c.p.Victim()
			c.p.Remove(v)
			delete(c.blocks, v.V)
		}
		e := &policy.Entry[int64]{V: id}
		c.p.Add(e, depth)
		c.blocks[id] = e
		inserted++
	}
	return inserted
}

// Len is the number of cached blocks.
func (c *Cache) Len() int { return len(c.blocks) }
