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

// A load that began before Forget may have read the old value: a Get after
// Forget loads afresh instead of sharing it, and the older answer, however
// late it comes, is not cached.
func TestCache_forgetDuringLoadLoadsAfresh(t *testing.T) {
	clk := &clock{now: time.Unix(1_800_000_000, 0)}
	errMissing := errors.New("missing")
	c := New[int](time.Minute, clk.Now).WithNegative(10*time.Second, func(err error) bool { return errors.Is(err, errMissing) })
	ctx := t.Context()
	read, fresh := make(chan struct{}), make(chan struct{})
	stale := make(chan error, 1)
	go func() {
		_, err := c.Get(ctx, "k", func(context.Context) (int, error) {
			close(read) // it found no "k", and is slow to say so
			select {
			case <-fresh:
			case <-time.After(5 * time.Second): // a Get sharing this load waits on it: fail, don't hang
			}
			return 0, errMissing
		})
		stale <- err
	}()
	<-read
	c.Forget("k") // "k" was just created
	if v, err := c.Get(ctx, "k", func(context.Context) (int, error) { close(fresh); return 1, nil }); v != 1 || err != nil {
		t.Fatalf("Get(k) after Forget, while a load begun before it runs = %d, %v; want 1 from a fresh load", v, err)
	}
	if err := <-stale; !errors.Is(err, errMissing) {
		t.Errorf("Get(k) begun before Forget = %v, want errMissing (it asked before the change)", err)
	}
	if v, err := c.Get(ctx, "k", func(context.Context) (int, error) { return 2, nil }); v != 1 || err != nil {
		t.Errorf("Get(k) once both loads ended = %d, %v; want the cached 1 (the older answer must not replace it)", v, err)
	}
}

// ForgetPrefix drops the keys under prefix, leaves the others, and, like
// Forget, keeps a load in flight from being shared or cached, even when
// its key was not cached yet.
func TestCache_forgetPrefix(t *testing.T) {
	clk := &clock{now: time.Unix(1_800_000_000, 0)}
	c := New[int](time.Minute, clk.Now)
	ctx := t.Context()
	for key, v := range map[string]int{"a/1": 1, "a/2": 2, "ab/1": 3} {
		c.Put(key, v)
	}
	read, release := make(chan struct{}), make(chan struct{})
	stale := make(chan int, 1)
	go func() {
		v, _ := c.Get(ctx, "a/3", func(context.Context) (int, error) {
			close(read)
			<-release
			return 30, nil
		})
		stale <- v
	}()
	<-read
	c.ForgetPrefix("a/")
	for key, want := range map[string]bool{"a/1": false, "a/2": false, "ab/1": true} {
		if _, ok := c.Peek(key); ok != want {
			t.Errorf("Peek(%q) after ForgetPrefix(a/) = %v, want %v", key, ok, want)
		}
	}
	if v, _ := c.Get(ctx, "a/3", func(context.Context) (int, error) { return 31, nil }); v != 31 {
		t.Errorf("Get(a/3) after ForgetPrefix = %d, want 31 from a fresh load, not the one begun before", v)
	}
	close(release)
	if v := <-stale; v != 30 {
		t.Errorf("Get(a/3) begun before ForgetPrefix = %d, want 30", v)
	}
	if v, ok := c.Peek("a/3"); !ok || v != 31 {
		t.Errorf("Peek(a/3) = %d, %v; want 31 (the older answer not cached over it)", v, ok)
	}
}
