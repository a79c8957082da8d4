package auth

import (
	"context"
	"errors"
	"fmt"
	"strings"
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
