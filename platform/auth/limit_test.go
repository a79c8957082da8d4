package auth

import (
	"testing"
	"time"
)

func TestLimiter_refusesPastBurstAndRefills(t *testing.T) {
	now := time.Unix(1000, 0)
	l := NewLimiter(1, 3, func() time.Time { return now })
	for i := range 3 {
		if !l.Allow("a") {
			t.Fatalf("Allow(a) #%d = false, want true within the burst", i+1)
		}
	}
	if l.Allow("a") {
		t.Errorf("Allow(a) past the burst = true, want false")
	}
	if !l.Exhausted("a") {
		t.Errorf("Exhausted(a) = false, want true")
	}
	if !l.Allow("b") {
		t.Errorf("Allow(b) = false, want true: buckets are per key")
	}
	now = now.Add(time.Second)
	if !l.Allow("a") {
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
		if !l.Allow(k) {
			t.Fatalf("Allow(%s) = false, want true below the cap", k)
		}
	}
	if l.Allow("c") {
		t.Errorf("Allow(c) past the cap = true, want false")
	}
	if n := len(l.buckets); n != 2 {
		t.Errorf("buckets after a key past the cap = %d, want 2", n)
	}
	if !l.Allow("a") {
		t.Errorf("Allow(a), a known key, = false, want true")
	}
	now = now.Add(2 * time.Minute) // every bucket refills; the sweep drops them
	if !l.Allow("c") {
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
