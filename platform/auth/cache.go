package auth

import (
	"container/list"
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
// either bound the oldest answer of its kind goes, and expired answers go
// as new ones arrive. A ttl of zero or less caches nothing.
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
		entries: map[[32]byte]*list.Element{},
		keys:    fifo{list.New(), maxKeys},
		refused: fifo{list.New(), maxRefusals},
	}
}

type cached struct {
	v   Verifier
	ttl time.Duration
	now func() time.Time

	mu sync.Mutex // guards entries, keys and refused
	// entries indexes the elements of keys and refused by hash.
	entries map[[32]byte]*list.Element
	// keys and refused hold the answers oldest first. Every answer lives
	// ttl, so the oldest is also the first to expire.
	keys, refused fifo
}

// fifo is one kind of answer, oldest first, and its bound.
type fifo struct {
	*list.List // of *cacheEntry
	max        int
}

type cacheEntry struct {
	hash    [32]byte
	p       Principal
	invalid bool
	expires time.Time
}

func (c *cached) VerifyKey(ctx context.Context, secret string) (Principal, error) {
	h := HashSecret(secret)
	t := c.now()
	c.mu.Lock()
	if el, ok := c.entries[h]; ok {
		e := el.Value.(*cacheEntry)
		if t.Before(e.expires) {
			c.mu.Unlock()
			if e.invalid {
				return Principal{}, ErrInvalidCredential
			}
			return e.p, nil
		}
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

// put stores e, replacing any answer for the same key, then drops expired
// answers and, past a bound, the oldest of e's kind. Each answer is
// dropped once, so a put costs O(1) amortised.
func (c *cached) put(e *cacheEntry, now time.Time) {
	if old, ok := c.entries[e.hash]; ok {
		c.remove(old)
	}
	q := &c.keys
	if e.invalid {
		q = &c.refused
	}
	c.entries[e.hash] = q.PushBack(e)
	for _, q := range []*fifo{&c.keys, &c.refused} {
		for front := q.Front(); front != nil; front = q.Front() {
			if q.Len() <= q.max && now.Before(front.Value.(*cacheEntry).expires) {
				break
			}
			c.remove(front)
		}
	}
}

func (c *cached) remove(el *list.Element) {
	e := el.Value.(*cacheEntry)
	delete(c.entries, e.hash)
	if e.invalid {
		c.refused.Remove(el)
	} else {
		c.keys.Remove(el)
	}
}

// size reports how many answers the cache holds, and how many of them are
// refusals.
func (c *cached) size() (answers, refusals int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries), c.refused.Len()
}
