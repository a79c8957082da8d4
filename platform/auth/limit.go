package auth

import (
	"sync"
	"time"
)

// Limiter is a token bucket per key (a remote address): Rate tokens per
// second up to Burst. Buckets left full are forgotten by a sweep once a
// minute, and it holds at most maxKeys buckets: a new key past that is
// refused until a sweep frees room, so cycling through addresses (easy with
// IPv6) cannot grow it.
type Limiter struct {
	rate    float64
	burst   float64
	now     func() time.Time
	maxKeys int

	mu      sync.Mutex // guards buckets and swept
	buckets map[string]*bucket
	swept   time.Time
}

type bucket struct {
	tokens float64
	at     time.Time
}

// NewLimiter returns a Limiter allowing burst events at once and rate per
// second after that. now is the clock; nil means time.Now.
func NewLimiter(rate float64, burst int, now func() time.Time) *Limiter {
	if now == nil {
		now = time.Now
	}
	return &Limiter{rate: rate, burst: float64(burst), now: now, maxKeys: defaultMaxKeys, buckets: map[string]*bucket{}}
}

// defaultMaxKeys bounds a Limiter's buckets (about 150 bytes each).
const defaultMaxKeys = 100_000

// Allow takes a token from key's bucket and reports whether there was one.
func (l *Limiter) Allow(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := l.now()
	l.sweep(t)
	b := l.buckets[key]
	if b == nil {
		if len(l.buckets) >= l.maxKeys {
			return false
		}
		b = &bucket{tokens: l.burst, at: t}
		l.buckets[key] = b
	}
	b.refill(t, l.rate, l.burst)
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// Exhausted reports whether key's bucket is empty, without taking a token.
func (l *Limiter) Exhausted(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.buckets[key]
	if b == nil {
		return false
	}
	b.refill(l.now(), l.rate, l.burst)
	return b.tokens < 1
}

func (b *bucket) refill(t time.Time, rate, burst float64) {
	if d := t.Sub(b.at).Seconds(); d > 0 {
		b.tokens = min(burst, b.tokens+d*rate)
		b.at = t
	}
}

// sweep drops full buckets, at most once a minute.
func (l *Limiter) sweep(t time.Time) {
	if t.Sub(l.swept) < time.Minute {
		return
	}
	l.swept = t
	for k, b := range l.buckets {
		b.refill(t, l.rate, l.burst)
		if b.tokens >= l.burst {
			delete(l.buckets, k)
		}
	}
}
