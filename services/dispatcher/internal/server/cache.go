package server

import (
	"context"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
)

// cache is a small TTL cache with one load in flight per key. Errors are not
// cached, except those negative() accepts, which are kept for negTTL (so a
// flood of requests for something missing does not reach the loader each
// time).
type cache[V any] struct {
	ttl time.Duration
	now func() time.Time
	sf  singleflight.Group

	negTTL   time.Duration
	negative func(error) bool

	mu      sync.RWMutex // guards entries
	entries map[string]cacheEntry[V]
}

type cacheEntry[V any] struct {
	v       V
	err     error
	expires time.Time
}

func newCache[V any](ttl time.Duration, now func() time.Time) *cache[V] {
	return &cache[V]{ttl: ttl, now: now, entries: map[string]cacheEntry[V]{}}
}

// get returns the cached value of key or loads it. The load runs on a
// context detached from the caller's cancellation, since other callers may
// wait on it, bounded by its own timeout.
func (c *cache[V]) get(ctx context.Context, key string, load func(context.Context) (V, error)) (V, error) {
	return c.getShared(ctx, key, key, load)
}

// getShared is get where loads in flight are shared only between callers
// with the same flight key, for loads whose outcome depends on more than
// key (a PD resolved from caller-supplied sources). The result is cached
// under key.
func (c *cache[V]) getShared(ctx context.Context, key, flight string, load func(context.Context) (V, error)) (V, error) {
	c.mu.RLock()
	e, ok := c.entries[key]
	c.mu.RUnlock()
	if ok && c.now().Before(e.expires) {
		return e.v, e.err
	}
	ch := c.sf.DoChan(flight, func() (any, error) {
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		v, err := load(lctx)
		switch {
		case err == nil:
			c.put(key, cacheEntry[V]{v: v, expires: c.now().Add(c.ttl)})
		case c.negTTL > 0 && c.negative != nil && c.negative(err):
			c.put(key, cacheEntry[V]{v: v, err: err, expires: c.now().Add(c.negTTL)})
		}
		return v, err
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

// peek returns key's cached value, if it is cached without error and fresh;
// it never loads.
func (c *cache[V]) peek(key string) (V, bool) {
	c.mu.RLock()
	e, ok := c.entries[key]
	c.mu.RUnlock()
	if !ok || e.err != nil || !c.now().Before(e.expires) {
		var zero V
		return zero, false
	}
	return e.v, true
}

// withNegative makes c keep errors negative accepts for ttl (0: never).
func (c *cache[V]) withNegative(ttl time.Duration, negative func(error) bool) *cache[V] {
	c.negTTL, c.negative = ttl, negative
	return c
}

func (c *cache[V]) put(key string, e cacheEntry[V]) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) > 100_000 {
		clear(c.entries) // crude bound: a flood of distinct keys must not grow memory forever
	}
	c.entries[key] = e
}

func (c *cache[V]) forget(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.entries, key)
}

// expirySet is a set of keys that each expire ttl after they are added.
type expirySet struct {
	ttl time.Duration
	now func() time.Time

	mu sync.Mutex // guards m
	m  map[string]time.Time
}

func newExpirySet(ttl time.Duration, now func() time.Time) *expirySet {
	return &expirySet{ttl: ttl, now: now, m: map[string]time.Time{}}
}

func (e *expirySet) add(key string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.m) > 100_000 {
		clear(e.m) // crude bound, as in cache.put
	}
	e.m[key] = e.now().Add(e.ttl)
}

func (e *expirySet) has(key string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	exp, ok := e.m[key]
	if ok && !e.now().Before(exp) {
		delete(e.m, key)
		return false
	}
	return ok
}
