package auth

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Limiter is a token bucket per key (a remote address): Rate tokens per
// second up to Burst. Buckets left full are forgotten by a sweep once a
// minute, and it holds at most maxKeys buckets: a new key past that is
// refused until a sweep frees room, so cycling through addresses (easy with
// IPv6) cannot grow it.
//
// The buckets live in memory, so each replica of a service has its own and
// N replicas allow N times the rate, unless Share moves them to where every
// replica sees them (the service's PostgreSQL database).
type Limiter struct {
	rate    float64
	burst   float64
	now     func() time.Time
	maxKeys int
	shared  atomic.Pointer[sharing] // nil: the buckets in memory decide

	mu      sync.Mutex // guards buckets and swept
	buckets map[string]*bucket
	swept   time.Time
}

// SharedBuckets keeps token buckets where every replica of a service sees
// them (pgdb.DB, in its database), so that a Limiter's rate holds across
// replicas.
type SharedBuckets interface {
	// TakeToken refills the bucket (name, key) at rate tokens per second
	// up to burst (a new bucket starts full), then takes one token from it
	// if it holds one. It reports whether it took one.
	TakeToken(ctx context.Context, name, key string, rate float64, burst int) (bool, error)
	// TokenLeft reports whether the bucket (name, key), refilled, holds a
	// token, without taking it.
	TokenLeft(ctx context.Context, name, key string, rate float64, burst int) (bool, error)
}

// sharing is where a shared Limiter keeps its buckets.
type sharing struct {
	name    string
	buckets SharedBuckets
	logger  *slog.Logger
	timeout time.Duration // bounds each question to buckets (sharedTimeout)

	mu     sync.Mutex // guards logged
	logged time.Time  // the last "shared limit unavailable" warning
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

// Share keeps l's buckets in b, under name (one per limit, the same on
// every replica, as "auth.failures"), from now on.
//
// Allow then takes its token from b. Exhausted asks b only about keys this
// replica took a token for in the last burst/rate seconds or so (its own
// bucket is not yet full and swept): a call from an address that never
// failed here costs no round trip. So an address exhausted elsewhere gets
// one more try on each other replica per such period, and N replicas allow
// about rate × (1 + N/burst), not N × rate.
//
// When b fails (the database is down) or does not answer within
// sharedTimeout (a connection to a database cut off by the network hangs
// until TCP gives up, minutes later), l answers from its buckets in
// memory, so an outage turns the limit back into one per replica instead
// of lifting it or holding every call it checks; logger hears of it at
// most once a minute.
//
// A Limiter shared already stays as it is: in `parley serve` every
// service offers its database, and the first one keeps the buckets.
func (l *Limiter) Share(name string, b SharedBuckets, logger *slog.Logger) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	l.shared.CompareAndSwap(nil, &sharing{name: name, buckets: b, logger: logger, timeout: sharedTimeout})
}

// sharedTimeout bounds one question to the shared buckets: a round trip
// to the database takes about a millisecond, and the question holds the
// call being authenticated (or the registration) while it waits.
const sharedTimeout = time.Second

// Allow takes a token from key's bucket and reports whether there was one.
func (l *Limiter) Allow(ctx context.Context, key string) bool {
	// The bucket in memory takes its token even when shared: it is the
	// answer during an outage, and it tells Exhausted which keys to check.
	local := l.allowLocal(key)
	if sh := l.shared.Load(); sh != nil {
		qctx, cancel := context.WithTimeout(ctx, sh.timeout)
		ok, err := sh.buckets.TakeToken(qctx, sh.name, key, l.rate, int(l.burst))
		cancel()
		if err == nil {
			return ok
		}
		sh.warn(ctx, err)
	}
	return local
}

func (l *Limiter) allowLocal(key string) bool {
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
func (l *Limiter) Exhausted(ctx context.Context, key string) bool {
	exhausted, seen := l.exhaustedLocal(key)
	if sh := l.shared.Load(); sh != nil && seen {
		qctx, cancel := context.WithTimeout(ctx, sh.timeout)
		left, err := sh.buckets.TokenLeft(qctx, sh.name, key, l.rate, int(l.burst))
		cancel()
		if err == nil {
			return !left
		}
		sh.warn(ctx, err)
	}
	return exhausted
}

// exhaustedLocal is Exhausted in memory; seen reports that key has a
// bucket here, or that the cap leaves room for no more (a key past it has
// none and may have failed here).
func (l *Limiter) exhaustedLocal(key string) (exhausted, seen bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.buckets[key]
	if b == nil {
		return false, len(l.buckets) >= l.maxKeys
	}
	b.refill(l.now(), l.rate, l.burst)
	return b.tokens < 1, true
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

// warn logs that the shared buckets failed (or took longer than
// sh.timeout), at most once a minute. A call that ended (ctx, the call's
// own context, done) is not the store's failure.
func (sh *sharing) warn(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return
	}
	sh.mu.Lock()
	now := time.Now()
	if now.Sub(sh.logged) < time.Minute {
		sh.mu.Unlock()
		return
	}
	sh.logged = now
	sh.mu.Unlock()
	sh.logger.WarnContext(ctx, "shared rate limit unavailable; limiting in this replica alone", slog.String("limit", sh.name), slog.Any("err", err))
}
