package sdk

import (
	"context"
	"sync"
)

// waitingPerHandler bounds the messages taken in but not started, per
// handler allowed at once (NetworkOptions.Concurrency): past it the
// receive loop waits, and the server holds the rest.
const waitingPerHandler = 4

// dialogues runs the handlers of different dialogues concurrently, at most
// limit at a time, and those of one dialogue one at a time, in the order
// taken in. It reports after each handler the watermark: the highest
// cursor at and below which every message taken in is handled, which is
// all that may be acknowledged.
type dialogues struct {
	limit, maxWaiting int
	handle            func(ctx context.Context, m Message)
	finished          func(watermark uint64)

	mu        sync.Mutex
	lanes     map[string]*lane // dialogues with a handler running or messages waiting, by id
	ready     []*lane          // lanes with messages and no handler, longest waiting first
	running   int              // handlers' goroutines
	waiting   int              // messages in lanes, not started
	room      chan struct{}    // closed and replaced when a waiting message starts
	taken     []*taken         // messages taken in, not under the watermark, in cursor order
	watermark uint64
	wg        sync.WaitGroup // the handlers' goroutines
}

// lane is one dialogue's messages waiting for its handler.
type lane struct {
	id   string
	msgs []*taken
}

type taken struct {
	m    Message
	done bool
}

func newDialogues(limit int, handle func(context.Context, Message), finished func(uint64)) *dialogues {
	return &dialogues{
		limit: limit, maxWaiting: waitingPerHandler * limit, handle: handle, finished: finished,
		lanes: map[string]*lane{}, room: make(chan struct{}),
	}
}

// dispatch takes m in: it waits while the waiting messages are at their
// bound (returning ctx's error if ctx ends first), queues m behind its
// dialogue's messages, and starts a handler for the dialogue if none runs
// and fewer than limit do. Handlers run on ctx; once it ends they start no
// more messages. Messages are taken in in cursor order.
func (d *dialogues) dispatch(ctx context.Context, m Message) error {
	d.mu.Lock()
	for d.waiting >= d.maxWaiting {
		room := d.room
		d.mu.Unlock()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-room:
		}
		d.mu.Lock()
	}
	defer d.mu.Unlock()
	t := &taken{m: m}
	d.taken = append(d.taken, t)
	d.waiting++
	if l := d.lanes[m.DialogueID]; l != nil {
		l.msgs = append(l.msgs, t) // its handler, running or ready, takes it
		return nil
	}
	l := &lane{id: m.DialogueID, msgs: []*taken{t}}
	d.lanes[l.id] = l
	if d.running == d.limit {
		d.ready = append(d.ready, l)
		return nil
	}
	d.running++
	d.wg.Go(func() { d.work(ctx, l) })
	return nil
}

// work handles l's messages, then those of ready lanes, until none is
// left or ctx ends. A lane with more waiting goes behind the ready ones
// after each message, so that a busy dialogue does not starve the rest.
func (d *dialogues) work(ctx context.Context, l *lane) {
	for {
		d.mu.Lock()
		if l == nil || ctx.Err() != nil {
			d.running--
			d.mu.Unlock()
			return
		}
		t := l.msgs[0]
		l.msgs[0] = nil
		l.msgs = l.msgs[1:]
		d.waiting--
		close(d.room)
		d.room = make(chan struct{})
		d.mu.Unlock()

		d.handle(ctx, t.m)

		d.mu.Lock()
		t.done = true
		watermark := d.advance()
		switch {
		case len(l.msgs) == 0:
			delete(d.lanes, l.id)
			l = d.next()
		case len(d.ready) > 0:
			d.ready = append(d.ready, l)
			l = d.next()
		}
		d.mu.Unlock()
		d.finished(watermark)
	}
}

// pass takes m in as handled already (its id was seen: a redelivery), so
// that its cursor counts for the watermark once every message taken in
// before it is handled, as the messages it runs with would.
func (d *dialogues) pass(m Message) {
	d.mu.Lock()
	d.taken = append(d.taken, &taken{m: m, done: true})
	watermark := d.advance()
	d.mu.Unlock()
	d.finished(watermark)
}

// advance moves the watermark past the handled messages at the front of
// taken and returns it. d.mu is held.
func (d *dialogues) advance() uint64 {
	n := 0
	for n < len(d.taken) && d.taken[n].done {
		d.watermark = max(d.watermark, d.taken[n].m.Cursor)
		d.taken[n] = nil
		n++
	}
	d.taken = d.taken[n:]
	return d.watermark
}

// next pops the longest-waiting ready lane, or returns nil. d.mu is held.
func (d *dialogues) next() *lane {
	if len(d.ready) == 0 {
		return nil
	}
	l := d.ready[0]
	d.ready[0] = nil
	d.ready = d.ready[1:]
	return l
}

// wait waits until every handler's goroutine has ended: after the context
// given to dispatch ended and dispatch is no longer called.
func (d *dialogues) wait() { d.wg.Wait() }

// drop empties the lanes after wait and returns the messages never
// started, in the order taken in. The watermark stays below them.
func (d *dialogues) drop() []Message {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []Message
	for _, t := range d.taken {
		if !t.done {
			out = append(out, t.m)
		}
	}
	// A message started is done: wait returned.
	d.lanes, d.ready, d.taken, d.waiting = map[string]*lane{}, nil, nil, 0
	return out
}
