package auth

import (
	"container/heap"
	"context"
	"errors"
	"sync"
	"time"
)

// The cache's bounds. Live keys' answers get most of it; refusals, which
// anyone can cause with made-up keys, get their own smaller share, so a
// flood of wrong keys never evicts a live key's answer (the failure rate
// limit slows such a flood too).
const (
	maxCachedKeys     = 10_000
	maxCachedRefusals = 1_000
)

// Cached wraps v, remembering each answer, a principal or
// ErrInvalidCredential, for ttl. Entries are keyed by the secret's
// SHA-256, never the secret. Other errors (the verifier is unreachable)
// are not cached. A revoked key is refused at most ttl after revocation.
// The cache holds at most 10,000 principals and 1,000 refusals; past
// either bound the answer of its kind expiring soonest goes, and expired
// answers go as new ones arrive. A ttl of zero or less caches nothing.
func Cached(v Verifier, ttl time.Duration, now func() time.Time) Verifier {
	if ttl <= 0 {
		return v
	}
	return newCached(v, ttl, now, maxCachedKeys, maxCachedRefusals)
}

func newCached(v Verifier, ttl time.Duration, now func() time.Time, maxKeys, maxRefusals int) *cached {
	if now == nil {
		now = time.Now
	}
	return &cached{
		v: v, ttl: ttl, now: now,
		entries: map[[32]byte]*cacheEntry{},
		keys:    byExpiry{max: maxKeys},
		refused: byExpiry{max: maxRefusals},
	}
}

type cached struct {
	v   Verifier
	ttl time.Duration
	now func() time.Time

	mu sync.Mutex // guards entries, keys and refused
	// entries indexes the answers in keys and refused by hash.
	entries map[[32]byte]*cacheEntry
	// keys and refused hold the answers, each a heap by expiry. An answer
	// lives ttl from when it was asked, and calls end in any order, so
	// answers arrive out of expiry order: a list in arrival order would
	// keep an expired answer behind a live one and evict the wrong one.
	keys, refused byExpiry
}

// byExpiry is one kind of answer, a min-heap on expires (container/heap),
// and its bound.
type byExpiry struct {
	items []*cacheEntry
	max   int
}

func (h byExpiry) Len() int           { return len(h.items) }
func (h byExpiry) Less(i, j int) bool { return h.items[i].expires.Before(h.items[j].expires) }
func (h byExpiry) Swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	h.items[i].index, h.items[j].index = i, j
}

func (h *byExpiry) Push(x any) {
	e := x.(*cacheEntry)
	e.index = len(h.items)
	h.items = append(h.items, e)
}

func (h *byExpiry) Pop() any {
	last := len(h.items) - 1
	e := h.items[last]
	h.items[last] = nil
	h.items = h.items[:last]
	return e
}

type cacheEntry struct {
	hash    [32]byte
	p       Principal
	invalid bool
	expires time.Time
	index   int // in its heap
}

func (c *cached) VerifyKey(ctx context.Context, secret string) (Principal, error) {
	h := HashSecret(secret)
	t := c.now()
	c.mu.Lock()
	if e, ok := c.entries[h]; ok && t.Before(e.expires) {
		c.mu.Unlock()
		if e.invalid {
			return Principal{}, ErrInvalidCredential
		}
		return e.p, nil
	}
	c.mu.Unlock()
	p, err := c.v.VerifyKey(ctx, secret)
	if err != nil && !errors.Is(err, ErrInvalidCredential) {
		return Principal{}, err
	}
	c.mu.Lock()
	c.put(&cacheEntry{hash: h, p: p, invalid: err != nil, expires: t.Add(c.ttl)}, t)
	c.mu.Unlock()
	return p, err
}

// put stores e, replacing an answer for the same key asked no later, then
// drops expired answers and, past a bound, those of e's kind that expire
// soonest. Each answer is dropped once, so a put costs O(log n)
// amortised.
func (c *cached) put(e *cacheEntry, now time.Time) {
	if old, ok := c.entries[e.hash]; ok {
		if old.expires.After(e.expires) {
			return // asked later than e: the newer answer stays
		}
		c.remove(old)
	}
	q := &c.keys
	if e.invalid {
		q = &c.refused
	}
	heap.Push(q, e)
	c.entries[e.hash] = e
	for _, q := range []*byExpiry{&c.keys, &c.refused} {
		for q.Len() > 0 {
			if first := q.items[0]; q.Len() <= q.max && now.Before(first.expires) {
				break
			}
			c.remove(q.items[0])
		}
	}
}

func (c *cached) remove(e *cacheEntry) {
	delete(c.entries, e.hash)
	if e.invalid {
		heap.Remove(&c.refused, e.index)
	} else {
		heap.Remove(&c.keys, e.index)
	}
}

// size reports how many answers the cache holds, and how many of them are
// refusals.
func (c *cached) size() (answers, refusals int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries), c.refused.Len()
}
