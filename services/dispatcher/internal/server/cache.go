package server

import (
	"context"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
)

// cache is a small TTL cache with one load in flight per key. Errors are not
// cached.
type cache[V any] struct {
	ttl time.Duration
	now func() time.Time
	sf  singleflight.Group

	mu      sync.RWMutex // guards entries
	entries map[string]cacheEntry[V]
}

type cacheEntry[V any] struct {
	v       V
	expires time.Time
}

func newCache[V any](ttl time.Duration, now func() time.Time) *cache[V] {
	return &cache[V]{ttl: ttl, now: now, entries: map[string]cacheEntry[V]{}}
}

// get returns the cached value of key or loads it. The load runs on a
// context detached from the caller's cancellation, since other callers may
// wait on it, bounded by its own timeout.
func (c *cache[V]) get(ctx context.Context, key string, load func(context.Context) (V, error)) (V, error) {
	c.mu.RLock()
	e, ok := c.entries[key]
	c.mu.RUnlock()
	if ok && c.now().Before(e.expires) {
		return e.v, nil
	}
	ch := c.sf.DoChan(key, func() (any, error) {
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		v, err := load(lctx)
		if err != nil {
			return v, err
		}
		c.put(key, v)
		return v, nil
	})
	select {
	case r := <-ch:
		v, _ := r.Val.(V)
		return v, r.Err
	case <-ctx.Done():
		var zero V
		return zero, ctx.Err()
	}
}

func (c *cache[V]) put(key string, v V) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) > 100_000 {
		clear(c.entries) // crude bound: a flood of distinct keys must not grow memory forever
	}
	c.entries[key] = cacheEntry[V]{v: v, expires: c.now().Add(c.ttl)}
}

func (c *cache[V]) forget(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.entries, key)
}
