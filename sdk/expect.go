package sdk

import (
	"context"
	"errors"
	"sync"
	"time"
)

// ErrNothingExpected is returned by Expect and ExpectMultiple when the
// timeout passes (or is zero) with no value queued.
var ErrNothingExpected = errors.New("no value arrived in time")

// maxQueued bounds each route's queue of values nobody has taken yet; the
// oldest goes first when it is full.
const maxQueued = 1024

// results holds what one agent's handlers passed back, per route name.
// Each agent has its own: nothing is shared between agents.
type results struct {
	mu      sync.Mutex
	queues  map[string][]any
	changed chan struct{} // closed and replaced on every push
	dropped int           // values pushed out of full queues
}

func newResults() *results {
	return &results{queues: map[string][]any{}, changed: make(chan struct{})}
}

func (r *results) push(name string, v any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	q := r.queues[name]
	if len(q) >= maxQueued {
		q = q[1:]
		r.dropped++
	}
	r.queues[name] = append(q, v)
	close(r.changed)
	r.changed = make(chan struct{})
}

// take pops the first value queued under any of names, in names' order, or
// returns the channel that closes on the next push.
func (r *results) take(names []string) (string, any, bool, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range names {
		if q := r.queues[n]; len(q) > 0 {
			v := q[0]
			q[0] = nil
			r.queues[n] = q[1:]
			return n, v, true, nil
		}
	}
	return "", nil, false, r.changed
}

// expect waits for a value under any of names. timeout 0 returns at once;
// a negative timeout waits until ctx ends.
func (r *results) expect(ctx context.Context, names []string, timeout time.Duration) (string, any, error) {
	if len(names) == 0 {
		return "", nil, errors.New("expect: no route names")
	}
	var expired <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		expired = t.C
	}
	for {
		name, v, ok, changed := r.take(names)
		if ok {
			return name, v, nil
		}
		if timeout == 0 {
			return "", nil, ErrNothingExpected
		}
		select {
		case <-changed:
		case <-expired:
			return "", nil, ErrNothingExpected
		case <-ctx.Done():
			return "", nil, ctx.Err()
		}
	}
}
