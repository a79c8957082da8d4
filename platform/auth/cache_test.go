package auth

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestCached_remembersForTTLThenAsksAgain(t *testing.T) {
	now := time.Unix(1000, 0)
	calls := 0
	live := true
	v := Cached(VerifierFunc(func(context.Context, string) (Principal, error) {
		calls++
		if !live {
			return Principal{}, ErrInvalidCredential
		}
		return Principal{Kind: Agent, Agent: "clients/c/agents/a"}, nil
	}), 2*time.Second, func() time.Time { return now })
	ctx := t.Context()
	for range 3 {
		if p, err := v.VerifyKey(ctx, "k"); err != nil || p.Agent != "clients/c/agents/a" {
			t.Fatalf("VerifyKey = %+v, %v", p, err)
		}
	}
	if calls != 1 {
		t.Errorf("verifier called %d times within the ttl, want 1", calls)
	}
	live = false // revoked
	now = now.Add(2 * time.Second)
	if _, err := v.VerifyKey(ctx, "k"); !errors.Is(err, ErrInvalidCredential) {
		t.Errorf("VerifyKey after the ttl, revoked = %v, want ErrInvalidCredential", err)
	}
	if _, err := v.VerifyKey(ctx, "k"); !errors.Is(err, ErrInvalidCredential) || calls != 2 {
		t.Errorf("VerifyKey(revoked, cached) = %v after %d calls, want ErrInvalidCredential from the cache", err, calls)
	}
}

func TestCached_doesNotCacheOutages(t *testing.T) {
	calls := 0
	v := Cached(VerifierFunc(func(context.Context, string) (Principal, error) {
		calls++
		return Principal{}, errors.New("registry down")
	}), time.Minute, nil)
	_, _ = v.VerifyKey(t.Context(), "k")
	_, _ = v.VerifyKey(t.Context(), "k")
	if calls != 2 {
		t.Errorf("verifier called %d times, want 2: outages are not cached", calls)
	}
}

// counting is a verifier that counts its calls per secret: secrets
// starting with "good" are an agent's key, the rest are refused.
type counting map[string]int

func (c counting) VerifyKey(_ context.Context, secret string) (Principal, error) {
	c[secret]++
	if strings.HasPrefix(secret, "good") {
		return Principal{Kind: Agent, Agent: "clients/c/agents/" + secret}, nil
	}
	return Principal{}, ErrInvalidCredential
}

// TestCached_wrongKeysDoNotEvictGoodOnes: a flood of distinct wrong keys
// (anyone can make them) fills only the bound of refused answers; the live
// keys' answers stay cached, so the flood does not turn every honest call
// into a round trip to the registry.
func TestCached_wrongKeysDoNotEvictGoodOnes(t *testing.T) {
	calls := counting{}
	c := newCached(calls, time.Minute, nil, 100, 10)
	ctx := t.Context()
	for i := range 50 {
		if _, err := c.VerifyKey(ctx, fmt.Sprintf("good%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 1000 {
		if _, err := c.VerifyKey(ctx, fmt.Sprintf("wrong%d", i)); !errors.Is(err, ErrInvalidCredential) {
			t.Fatalf("VerifyKey(wrong) = %v, want ErrInvalidCredential", err)
		}
	}
	for i := range 50 {
		key := fmt.Sprintf("good%d", i)
		if _, err := c.VerifyKey(ctx, key); err != nil || calls[key] != 1 {
			t.Errorf("VerifyKey(%s) after a flood of wrong keys = %v, verifier called %d times, want 1 (still cached)", key, err, calls[key])
		}
	}
	if n, bad := c.size(); n > 100 || bad > 10 {
		t.Errorf("cache holds %d answers, %d of them refusals; want at most 100 and 10", n, bad)
	}
}

// TestCached_boundedAndExpired: the cache never holds more answers than
// its bound, keeps the newest when full, and lets go of expired answers
// as new ones come, not only when it is full.
func TestCached_boundedAndExpired(t *testing.T) {
	now := time.Unix(1000, 0)
	calls := counting{}
	c := newCached(calls, 2*time.Second, func() time.Time { return now }, 100, 10)
	ctx := t.Context()
	for i := range 350 {
		if _, err := c.VerifyKey(ctx, fmt.Sprintf("good%d", i)); err != nil {
			t.Fatal(err)
		}
		if n, _ := c.size(); n > 100 {
			t.Fatalf("cache holds %d answers after %d keys, want at most 100", n, i+1)
		}
	}
	if _, err := c.VerifyKey(ctx, "good349"); err != nil || calls["good349"] != 1 {
		t.Errorf("VerifyKey(newest key) = %v after %d calls, want it answered from the cache", err, calls["good349"])
	}
	if _, err := c.VerifyKey(ctx, "good0"); err != nil || calls["good0"] != 2 {
		t.Errorf("VerifyKey(oldest key) = %v after %d calls, want it asked again (evicted)", err, calls["good0"])
	}
	now = now.Add(3 * time.Second) // every answer has expired
	if _, err := c.VerifyKey(ctx, "good-late"); err != nil {
		t.Fatal(err)
	}
	if n, _ := c.size(); n != 1 {
		t.Errorf("cache holds %d answers after all but one expired, want 1", n)
	}
}

// TestCached_zeroTTLAsksEveryTime: a ttl of zero caches nothing.
func TestCached_zeroTTLAsksEveryTime(t *testing.T) {
	calls := counting{}
	v := Cached(calls, 0, nil)
	for range 3 {
		if _, err := v.VerifyKey(t.Context(), "good"); err != nil {
			t.Fatal(err)
		}
	}
	if calls["good"] != 3 {
		t.Errorf("verifier called %d times with ttl 0, want 3", calls["good"])
	}
}

// slowFirst verifies like counting, except that its answer for "good-slow"
// waits for release (after telling started): a call that began earlier
// ends later.
type slowFirst struct {
	mu      sync.Mutex // guards calls
	calls   counting
	started chan struct{}
	release chan struct{}
}

func (s *slowFirst) VerifyKey(ctx context.Context, secret string) (Principal, error) {
	if secret == "good-slow" {
		s.started <- struct{}{}
		<-s.release
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls.VerifyKey(ctx, secret)
}

func (s *slowFirst) count(secret string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[secret]
}

// TestCached_answersArrivingOutOfOrderExpireInOrder: an answer lives ttl
// from when it was asked (so a revoked key is refused at most ttl after
// revocation), and answers can arrive in another order than they were
// asked. The one that expires first must still go first: an expired
// answer that arrived late is dropped before a live one, and a full cache
// evicts the answer expiring soonest, not the one that arrived first.
func TestCached_answersArrivingOutOfOrderExpireInOrder(t *testing.T) {
	var mu sync.Mutex // guards now
	now := time.Unix(1000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	set := func(t time.Time) { mu.Lock(); defer mu.Unlock(); now = t }
	v := &slowFirst{calls: counting{}, started: make(chan struct{}), release: make(chan struct{})}
	c := newCached(v, 10*time.Second, clock, 2, 10)
	ctx := t.Context()
	done := make(chan error)
	go func() { _, err := c.VerifyKey(ctx, "good-slow"); done <- err }() // asked at +0s: expires at +10s
	<-v.started
	set(time.Unix(1001, 0))
	if _, err := c.VerifyKey(ctx, "good-fast"); err != nil { // asked at +1s, arrives first: expires at +11s
		t.Fatal(err)
	}
	close(v.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	set(time.Unix(1010, 500_000_000)) // good-slow has expired, good-fast has not
	if _, err := c.VerifyKey(ctx, "good-new"); err != nil {
		t.Fatal(err)
	}
	if n, _ := c.size(); n != 2 {
		t.Errorf("cache holds %d answers, want 2: good-fast and good-new (good-slow expired)", n)
	}
	if _, err := c.VerifyKey(ctx, "good-fast"); err != nil || v.count("good-fast") != 1 {
		t.Errorf("VerifyKey(good-fast) = %v after %d calls, want it answered from the cache: it expires last but one", err, v.count("good-fast"))
	}
}

// TestCached_aLateAnswerDoesNotReplaceANewerOne: a key asked before its
// revocation whose answer arrives after a refusal asked later keeps the
// refusal cached, not the stale principal.
func TestCached_aLateAnswerDoesNotReplaceANewerOne(t *testing.T) {
	var mu sync.Mutex // guards now, calls
	now, calls := time.Unix(1000, 0), 0
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	started, release := make(chan struct{}), make(chan struct{})
	c := newCached(VerifierFunc(func(context.Context, string) (Principal, error) {
		mu.Lock()
		calls++
		first := calls == 1
		mu.Unlock()
		if first { // asked while the key was live, answered late
			started <- struct{}{}
			<-release
			return Principal{Kind: Agent, Agent: "clients/c/agents/a"}, nil
		}
		return Principal{}, ErrInvalidCredential // revoked meanwhile
	}), 10*time.Second, clock, 10, 10)
	ctx := t.Context()
	done := make(chan error)
	go func() { _, err := c.VerifyKey(ctx, "k"); done <- err }()
	<-started
	mu.Lock()
	now = now.Add(time.Second)
	mu.Unlock()
	if _, err := c.VerifyKey(ctx, "k"); !errors.Is(err, ErrInvalidCredential) {
		t.Fatalf("VerifyKey(revoked) = %v, want ErrInvalidCredential", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := c.VerifyKey(ctx, "k"); !errors.Is(err, ErrInvalidCredential) || calls != 2 {
		t.Errorf("VerifyKey(k) after the late answer = %v after %d calls, want the cached refusal", err, calls)
	}
}
