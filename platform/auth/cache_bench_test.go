package auth

import (
	"context"
	"strconv"
	"testing"
	"time"
)

// BenchmarkCached_miss is the cost of a key the cache does not hold, on a
// full cache: the verifier's answer (free here) is stored and the answer
// expiring soonest is evicted. A hit does not touch the heap.
func BenchmarkCached_miss(b *testing.B) {
	c := newCached(VerifierFunc(func(context.Context, string) (Principal, error) {
		return Principal{Kind: Agent, Agent: "clients/c/agents/a"}, nil
	}), time.Hour, nil, maxCachedKeys, maxCachedRefusals)
	ctx := b.Context()
	keys := make([]string, 4*maxCachedKeys)
	for i := range keys {
		keys[i] = "good" + strconv.Itoa(i)
	}
	for _, k := range keys[:maxCachedKeys] {
		_, _ = c.VerifyKey(ctx, k)
	}
	i := 0
	for b.Loop() {
		_, _ = c.VerifyKey(ctx, keys[i%len(keys)])
		i++
	}
}
