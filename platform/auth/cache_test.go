package auth

import (
	"context"
	"errors"
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
