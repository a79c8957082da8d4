// Package cache holds the dispatcher's small in-memory caches: a TTL cache
// with one load in flight per key, and a set of expiring keys.
package cache

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
)

// Cache is a small TTL cache with one load in flight per key. Errors are not
// cached, except those negative() accepts, which are kept for negTTL (so a
// flood of requests for something missing does not reach the loader each
// time).
type Cache[V any] struct {
	ttl time.Duration
	now func() time.Time
	sf  singleflight.Group

	negTTL   time.Duration
	negative func(error) bool

	mu      sync.RWMutex // guards entries and forgets
	entries map[string]entry[V]
	// forgets counts Forget calls. A load notes it when it starts: one
	// begun before a Forget may have read what the key was before the
	// change, so callers after the Forget do not share it and its answer
	// is not cached. The count is per cache, not per key: a Forget also
	// keeps loads of other keys in flight from caching (they load again
	// next time), which is cheap as Forget is rare.
	forgets uint64
}

type entry[V any] struct {
	v       V
	err     error
	expires time.Time
}

// New returns a cache whose entries live for ttl by the clock now.
func New[V any](ttl time.Duration, now func() time.Time) *Cache[V] {
	return &Cache[V]{ttl: ttl, now: now, entries: map[string]entry[V]{}}
}

// Get returns the cached value of key or loads it. The load runs on a
// context detached from the caller's cancellation, since other callers may
// wait on it, bounded by its own timeout.
func (c *Cache[V]) Get(ctx context.Context, key string, load func(context.Context) (V, error)) (V, error) {
	return c.GetShared(ctx, key, key, load)
}

// GetShared is Get where loads in flight are shared only between callers
// with the same flight key, for loads whose outcome depends on more than
// key (a PD resolved from caller-supplied sources). The result is cached
// under key.
func (c *Cache[V]) GetShared(ctx context.Context, key, flight string, load func(context.Context) (V, error)) (V, error) {
	c.mu.RLock()
	e, ok := c.entries[key]
	gen := c.forgets
	c.mu.RUnlock()
	if ok && c.now().Before(e.expires) {
		return e.v, e.err
	}
	ch := c.sf.DoChan(flight+"\x00"+strconv.FormatUint(gen, 10), func() (any, error) {
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		v, err := load(lctx)
		switch {
		case err == nil:
			c.putSince(gen, key, entry[V]{v: v, expires: c.now().Add(c.ttl)})
		case c.negTTL > 0 && c.negative != nil && c.negative(err):
			c.putSince(gen, key, entry[V]{v: v, err: err, expires: c.now().Add(c.negTTL)})
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

// Peek returns key's cached value, if it is cached without error and fresh;
// it never loads.
func (c *Cache[V]) Peek(key string) (V, bool) {
	c.mu.RLock()
	e, ok := c.entries[key]
	c.mu.RUnlock()
	if !ok || e.err != nil || !c.now().Before(e.expires) {
		var zero V
		return zero, false
	}
	return e.v, true
}

// WithNegative makes c keep errors negative accepts for ttl (0: never).
func (c *Cache[V]) WithNegative(ttl time.Duration, negative func(error) bool) *Cache[V] {
	c.negTTL, c.negative = ttl, negative
	return c
}

// putSince caches e under key unless Forget was called since the load
// that found e noted gen.
func (c *Cache[V]) putSince(gen uint64, key string, e entry[V]) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.forgets == gen {
		c.putLocked(key, e)
	}
}

func (c *Cache[V]) putLocked(key string, e entry[V]) {
	if len(c.entries) > 100_000 {
		clear(c.entries) // crude bound: a flood of distinct keys must not grow memory forever
	}
	c.entries[key] = e
}

// Forget drops key, after it changed: loads in flight began before the
// change, so their answers are not cached, and callers from now on load
// afresh rather than share them.
func (c *Cache[V]) Forget(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forgets++
	delete(c.entries, key)
}

// ForgetPrefix is Forget of every key that starts with prefix ("": all).
// It counts as a Forget even when none is cached: a load in flight of such
// a key began before the change and must not be cached or shared.
func (c *Cache[V]) ForgetPrefix(prefix string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forgets++
	for key := range c.entries {
		if strings.HasPrefix(key, prefix) {
			delete(c.entries, key)
		}
	}
}

// Put caches v under key for the cache's TTL.
func (c *Cache[V]) Put(key string, v V) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.putLocked(key, entry[V]{v: v, expires: c.now().Add(c.ttl)})
}

// ExpirySet is a set of keys that each expire ttl after they are added.
type ExpirySet struct {
	ttl time.Duration
	now func() time.Time

	mu sync.Mutex // guards m
	m  map[string]time.Time
}

// NewExpirySet returns an empty set whose keys expire ttl after Add.
func NewExpirySet(ttl time.Duration, now func() time.Time) *ExpirySet {
	return &ExpirySet{ttl: ttl, now: now, m: map[string]time.Time{}}
}

// Add adds key, or renews it.
func (e *ExpirySet) Add(key string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.m) > 100_000 {
		clear(e.m) // crude bound, as in Cache.put
	}
	e.m[key] = e.now().Add(e.ttl)
}

// Has reports whether key was added less than the TTL ago.
func (e *ExpirySet) Has(key string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	exp, ok := e.m[key]
	if ok && !e.now().Before(exp) {
		delete(e.m, key)
		return false
	}
	return ok
}
