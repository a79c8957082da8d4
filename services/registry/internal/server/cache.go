package server

import (
	"sync"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/services/registry/internal/pd"
)

// protocolCache keeps stored protocols in memory. Stored protocols never
// change, so a cached entry is never stale. Cached messages are shared:
// nothing may modify them (clone first).
type protocolCache struct {
	max int64

	mu    sync.RWMutex // guards m and bytes
	m     map[pd.Hash]*registryv1.Protocol
	bytes int64
}

func newProtocolCache(maxBytes int64) *protocolCache {
	return &protocolCache{max: maxBytes, m: map[pd.Hash]*registryv1.Protocol{}}
}

func (c *protocolCache) get(h pd.Hash) *registryv1.Protocol {
	c.mu.RLock()
	p := c.m[h]
	c.mu.RUnlock()
	return p
}

// put adds p, which must carry its content, evicting arbitrary entries to
// stay within the byte budget.
func (c *protocolCache) put(h pd.Hash, p *registryv1.Protocol) {
	size := int64(len(p.GetContent())) + 512 // rough cost of the other fields
	if size > c.max {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[h]; ok {
		return
	}
	for k, v := range c.m { // map order is random enough for eviction
		if c.bytes+size <= c.max {
			break
		}
		c.bytes -= int64(len(v.GetContent())) + 512
		delete(c.m, k)
	}
	c.m[h] = p
	c.bytes += size
}
