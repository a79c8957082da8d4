package cache

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// clock is an injected clock tests move by hand.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func TestCache_ttlAndNegative(t *testing.T) {
	clk := &clock{now: time.Unix(1_800_000_000, 0)}
	errMissing := errors.New("missing")
	c := New[int](time.Minute, clk.Now).WithNegative(10*time.Second, func(err error) bool { return errors.Is(err, errMissing) })
	loads := 0
	load := func(v int, err error) func(context.Context) (int, error) {
		return func(context.Context) (int, error) { loads++; return v, err }
	}
	ctx := t.Context()
	if v, err := c.Get(ctx, "a", load(1, nil)); v != 1 || err != nil {
		t.Fatalf("Get(a) = %d, %v; want 1", v, err)
	}
	if v, _ := c.Get(ctx, "a", load(2, nil)); v != 1 || loads != 1 {
		t.Errorf("Get(a) within TTL = %d after %d loads; want the cached 1 after 1", v, loads)
	}
	if v, ok := c.Peek("a"); !ok || v != 1 {
		t.Errorf("Peek(a) = %d, %v; want 1, true", v, ok)
	}
	clk.advance(time.Minute)
	if v, _ := c.Get(ctx, "a", load(2, nil)); v != 2 || loads != 2 {
		t.Errorf("Get(a) after TTL = %d after %d loads; want a fresh 2", v, loads)
	}
	if _, ok := c.Peek("b"); ok {
		t.Error("Peek(b) found a key never loaded")
	}

	// A negative answer is kept for its own TTL; other errors are not.
	if _, err := c.Get(ctx, "m", load(0, errMissing)); !errors.Is(err, errMissing) {
		t.Fatalf("Get(m) = %v, want errMissing", err)
	}
	if _, err := c.Get(ctx, "m", load(3, nil)); !errors.Is(err, errMissing) {
		t.Errorf("Get(m) within the negative TTL = %v, want the cached errMissing", err)
	}
	clk.advance(10 * time.Second)
	if v, err := c.Get(ctx, "m", load(3, nil)); v != 3 || err != nil {
		t.Errorf("Get(m) after the negative TTL = %d, %v; want 3", v, err)
	}
	boom := errors.New("boom")
	_, _ = c.Get(ctx, "x", load(0, boom))
	if v, err := c.Get(ctx, "x", load(4, nil)); v != 4 || err != nil {
		t.Errorf("Get(x) after a plain error = %d, %v; want a new load (errors are not cached)", v, err)
	}
	c.Forget("a")
	if _, ok := c.Peek("a"); ok {
		t.Error("Peek(a) after Forget found it")
	}
}

func TestExpirySet(t *testing.T) {
	clk := &clock{now: time.Unix(1_800_000_000, 0)}
	s := NewExpirySet(time.Minute, clk.Now)
	s.Add("k")
	if !s.Has("k") || s.Has("other") {
		t.Fatal("Has after Add: want k only")
	}
	clk.advance(time.Minute)
	if s.Has("k") {
		t.Error("Has(k) after its TTL = true, want false")
	}
}
