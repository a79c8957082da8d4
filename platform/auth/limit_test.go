package auth

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

func TestLimiter_refusesPastBurstAndRefills(t *testing.T) {
	now := time.Unix(1000, 0)
	l := NewLimiter(1, 3, func() time.Time { return now })
	for i := range 3 {
		if !l.Allow(t.Context(), "a") {
			t.Fatalf("Allow(a) #%d = false, want true within the burst", i+1)
		}
	}
	if l.Allow(t.Context(), "a") {
		t.Errorf("Allow(a) past the burst = true, want false")
	}
	if !l.Exhausted(t.Context(), "a") {
		t.Errorf("Exhausted(a) = false, want true")
	}
	if !l.Allow(t.Context(), "b") {
		t.Errorf("Allow(b) = false, want true: buckets are per key")
	}
	now = now.Add(time.Second)
	if !l.Allow(t.Context(), "a") {
		t.Errorf("Allow(a) a second later = false, want true (1 token/s)")
	}
}

// Keys cycled faster than buckets refill (many remote addresses) cannot grow
// the limiter past its cap: a new key past it is refused until a sweep
// frees room, and known keys keep their buckets.
func TestLimiter_holdsAtMostMaxKeys(t *testing.T) {
	now := time.Unix(1000, 0)
	l := NewLimiter(1, 3, func() time.Time { return now })
	l.maxKeys = 2
	for _, k := range []string{"a", "b"} {
		if !l.Allow(t.Context(), k) {
			t.Fatalf("Allow(%s) = false, want true below the cap", k)
		}
	}
	if l.Allow(t.Context(), "c") {
		t.Errorf("Allow(c) past the cap = true, want false")
	}
	if n := len(l.buckets); n != 2 {
		t.Errorf("buckets after a key past the cap = %d, want 2", n)
	}
	if !l.Allow(t.Context(), "a") {
		t.Errorf("Allow(a), a known key, = false, want true")
	}
	now = now.Add(2 * time.Minute) // every bucket refills; the sweep drops them
	if !l.Allow(t.Context(), "c") {
		t.Errorf("Allow(c) after a sweep = false, want true")
	}
}

func TestPrincipal_Owns(t *testing.T) {
	agent := Principal{Kind: Agent, Client: "clients/acme", Agent: "clients/acme/agents/bot"}
	client := Principal{Kind: Client, Client: "clients/acme"}
	tests := []struct {
		name string
		p    Principal
		res  string
		want bool
	}{
		{"agent itself", agent, "clients/acme/agents/bot", true},
		{"agent child", agent, "clients/acme/agents/bot/routines/r", true},
		{"agent sibling with shared prefix", agent, "clients/acme/agents/bot2", false},
		{"agent its client", agent, "clients/acme", false},
		{"client itself", client, "clients/acme", true},
		{"client agent", client, "clients/acme/agents/bot/keys/k", true},
		{"client other", client, "clients/acme2/agents/x", false},
		{"client all clients", client, "clients/-", false},
		{"operator", Principal{Kind: Operator}, "clients/x", true},
		{"anonymous", Principal{Kind: Anonymous}, "clients/x", false},
		{"client without name", Principal{Kind: Client}, "/x", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.p.Owns(tt.res); got != tt.want {
				t.Errorf("%v.Owns(%q) = %v, want %v", tt.p, tt.res, got, tt.want)
			}
		})
	}
}

// limiterBuckets is SharedBuckets kept by one more Limiter in memory (what
// the database does for replicas), failing while down is set.
type limiterBuckets struct {
	mu    sync.Mutex
	l     *Limiter
	down  bool
	asked int // TokenLeft calls
}

func (b *limiterBuckets) TakeToken(ctx context.Context, name, key string, _ float64, _ int) (bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.down {
		return false, errors.New("database down")
	}
	return b.l.Allow(ctx, name+"/"+key), nil
}

func (b *limiterBuckets) TokenLeft(ctx context.Context, name, key string, _ float64, _ int) (bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.asked++
	if b.down {
		return false, errors.New("database down")
	}
	return !b.l.Exhausted(ctx, name+"/"+key), nil
}

// Two replicas' Limiters sharing their buckets allow the burst once
// between them; Exhausted asks the shared buckets only about keys that
// took tokens here; while they fail, each replica limits alone.
func TestLimiter_sharedHoldsAcrossReplicas(t *testing.T) {
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	shared := &limiterBuckets{l: NewLimiter(1, 3, clock)}
	a, b := NewLimiter(1, 3, clock), NewLimiter(1, 3, clock)
	a.Share("failures", shared, nil)
	b.Share("failures", shared, nil)
	ctx := t.Context()
	took := 0
	for i := range 6 {
		l := a
		if i%2 == 1 {
			l = b
		}
		if l.Allow(ctx, "x") {
			took++
		}
	}
	if took != 3 {
		t.Errorf("Allow on two sharing replicas took %d tokens, want the burst, 3", took)
	}
	if !a.Exhausted(ctx, "x") || !b.Exhausted(ctx, "x") {
		t.Errorf("Exhausted(x) on A, B = %v, %v; want true on both", a.Exhausted(ctx, "x"), b.Exhausted(ctx, "x"))
	}
	asked := shared.asked
	if a.Exhausted(ctx, "y") {
		t.Errorf("Exhausted(y) = true, want false")
	}
	if shared.asked != asked {
		t.Errorf("Exhausted(y), a key that took no token here, asked the shared buckets")
	}

	shared.down = true
	c := NewLimiter(1, 3, clock)
	c.Share("failures", shared, nil)
	for i := range 3 {
		if !c.Allow(ctx, "z") {
			t.Fatalf("Allow(z) #%d with the shared buckets down = false, want true within the burst in memory", i+1)
		}
	}
	if c.Allow(ctx, "z") || !c.Exhausted(ctx, "z") {
		t.Errorf("past the burst with the shared buckets down: Allow(z) = true or Exhausted(z) = false; want the limit in memory")
	}
}

// hungBuckets is SharedBuckets that never answers: each call waits for its
// context to end (a database behind a dropped network, whose connection
// neither answers nor fails).
type hungBuckets struct{}

func (hungBuckets) TakeToken(ctx context.Context, _, _ string, _ float64, _ int) (bool, error) {
	<-ctx.Done()
	return false, ctx.Err()
}

func (hungBuckets) TokenLeft(ctx context.Context, _, _ string, _ float64, _ int) (bool, error) {
	<-ctx.Done()
	return false, ctx.Err()
}

// Shared buckets that hang do not hang the calls: each question has its
// own deadline, after which the Limiter answers from memory, as when they
// fail. The calls' own contexts here have no deadline.
func TestLimiter_sharedBucketsThatHangAnswerFromMemory(t *testing.T) {
	now := time.Unix(1000, 0)
	l := NewLimiter(1, 2, func() time.Time { return now })
	l.Share("failures", hungBuckets{}, nil)
	l.shared.Load().timeout = time.Millisecond
	ctx := context.Background()
	for i := range 2 {
		if !l.Allow(ctx, "x") {
			t.Fatalf("Allow(x) #%d with the shared buckets hung = false, want true within the burst in memory", i+1)
		}
	}
	if l.Allow(ctx, "x") {
		t.Errorf("Allow(x) past the burst with the shared buckets hung = true, want false (the limit in memory)")
	}
	if !l.Exhausted(ctx, "x") {
		t.Errorf("Exhausted(x) with the shared buckets hung = false, want true (the limit in memory)")
	}
}
