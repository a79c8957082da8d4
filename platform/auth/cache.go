package auth

import (
	"context"
	"errors"
	"sync"
	"time"
)

// maxCached bounds the cache; past it, the cache is emptied (a burst of
// distinct keys costs a round trip each, not memory).
const maxCached = 10_000

// Cached wraps v, remembering each answer, a principal or
// ErrInvalidCredential, for ttl. Entries are keyed by the secret's
// SHA-256, never the secret. Other errors (the verifier is unreachable)
// are not cached. A revoked key is refused at most ttl after revocation.
func Cached(v Verifier, ttl time.Duration, now func() time.Time) Verifier {
	if now == nil {
		now = time.Now
	}
	return &cached{v: v, ttl: ttl, now: now, entries: map[[32]byte]cacheEntry{}}
}

type cached struct {
	v   Verifier
	ttl time.Duration
	now func() time.Time

	mu      sync.Mutex // guards entries
	entries map[[32]byte]cacheEntry
}

type cacheEntry struct {
	p       Principal
	invalid bool
	expires time.Time
}

func (c *cached) VerifyKey(ctx context.Context, secret string) (Principal, error) {
	h := HashSecret(secret)
	t := c.now()
	c.mu.Lock()
	e, ok := c.entries[h]
	c.mu.Unlock()
	if ok && t.Before(e.expires) {
		if e.invalid {
			return Principal{}, ErrInvalidCredential
		}
		return e.p, nil
	}
	p, err := c.v.VerifyKey(ctx, secret)
	if err != nil && !errors.Is(err, ErrInvalidCredential) {
		return Principal{}, err
	}
	c.mu.Lock()
	if len(c.entries) >= maxCached {
		clear(c.entries)
	}
	c.entries[h] = cacheEntry{p: p, invalid: err != nil, expires: t.Add(c.ttl)}
	c.mu.Unlock()
	return p, err
}
