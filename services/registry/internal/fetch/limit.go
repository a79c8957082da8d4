package fetch

import (
	"context"
	"sync"
)

// limiter caps fetches in flight: all of them, and those to one host. A
// fetch takes its host's slot first, then a global one, so a slow host
// holds at most perHost global slots while its fetches wait.
type limiter struct {
	global  chan struct{} // one token per fetch in flight
	perHost int

	mu    sync.Mutex // guards hosts
	hosts map[string]*hostSlots
}

// hostSlots are one host's tokens. users counts holders and waiters, so the
// entry is dropped once nobody needs it.
type hostSlots struct {
	tokens chan struct{}
	users  int
}

func newLimiter(global, perHost int) *limiter {
	return &limiter{global: make(chan struct{}, global), perHost: perHost, hosts: map[string]*hostSlots{}}
}

// acquire waits for a slot to host until ctx ends. On success the caller
// must call release; on failure it returns errHostBusy or errGlobalBusy,
// saying which limit was full.
func (l *limiter) acquire(ctx context.Context, host string) (release func(), err error) {
	l.mu.Lock()
	hs := l.hosts[host]
	if hs == nil {
		hs = &hostSlots{tokens: make(chan struct{}, l.perHost)}
		l.hosts[host] = hs
	}
	hs.users++
	l.mu.Unlock()
	leave := func() {
		l.mu.Lock()
		if hs.users--; hs.users == 0 {
			delete(l.hosts, host)
		}
		l.mu.Unlock()
	}
	select {
	case hs.tokens <- struct{}{}:
	case <-ctx.Done():
		leave()
		return nil, errHostBusy
	}
	select {
	case l.global <- struct{}{}:
	case <-ctx.Done():
		<-hs.tokens
		leave()
		return nil, errGlobalBusy
	}
	return func() {
		<-l.global
		<-hs.tokens
		leave()
	}, nil
}
